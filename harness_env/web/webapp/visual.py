"""Kinds whose answer is on the screen only: colour swatches, server status lights, icons.

Each item's control is named by its position or name ("Choose swatch 3", "Restart db-2", "Choose icon 4"); its
colour or shape is drawn (an inline style, an inline SVG) and hidden from the accessibility tree, and no reply
names it. So a policy that reads the accessibility text cannot tell the items apart; one that sees the
screenshot can. The page HTML still carries the drawing (a hex colour, an SVG path), as any real site's does.
"""

from .render import action_button, esc, redirect, table

SHAPES = {  # inline SVG bodies on a 48x48 canvas
    "star": '<polygon points="24,3 30,18 46,18 33,28 38,45 24,35 10,45 15,28 2,18 18,18"/>',
    "heart": '<path d="M24 44 L6 26 A10 10 0 0 1 24 10 A10 10 0 0 1 42 26 Z"/>',
    "circle": '<circle cx="24" cy="24" r="19"/>',
    "triangle": '<polygon points="24,4 45,43 3,43"/>',
    "square": '<rect x="6" y="6" width="36" height="36" rx="3"/>',
    "diamond": '<polygon points="24,2 46,24 24,46 2,24"/>',
}


def _choose(what: str, n: int) -> str:
    """The card's button (named by position only) and the card's end."""
    return action_button(f"/{what}/{n}", f"Choose {what} {n}") + "</div>"


class VisualPages:
    """Handlers of the visual kinds (a mixin of `Site`: needs SiteBase's page/f)."""

    def _done_note(self, text: str) -> str:
        return f'<p class="note" role="status">{esc(text)}</p>' if text else ""

    # ---- palette: choose a swatch ---------------------------------------------------------------------
    def swatches(self):
        cards = "".join(
            f'<div class="card"><span class="swatch" aria-hidden="true" style="background:{esc(s["rgb"])}"></span>'
            + _choose("swatch", s["id"]) for s in self.config["swatches"])
        note = self._done_note(f"You chose swatch {self.data['chosen'][-1]}." if self.data["chosen"] else "")
        raise self.page("Pick a colour", f'{note}<div class="grid">{cards}</div>')

    def swatch_pick(self, sid):
        if not any(str(s["id"]) == sid for s in self.config["swatches"]):
            raise self.page("Not found", "", 404, "No such swatch.")
        self.data["chosen"].append(int(sid))
        raise redirect("/")

    # ---- servers: restart the ones whose light shows a state --------------------------------------------
    def servers(self):
        rows = [[esc(s["name"]),
                 f'<span class="light" aria-hidden="true" style="background:{esc(s["rgb"])}"></span>',
                 action_button(f"/servers/{s['id']}/restart", f"Restart {s['name']}")]
                for s in self.config["servers"]]
        done = [s["name"] for s in self.config["servers"] if s["id"] in self.data["restarted"]]
        note = self._done_note(f"Restarted: {', '.join(done)}." if done else "")
        raise self.page("Servers", note + table(["Server", "Status", "Action"], rows))

    def server_restart(self, sid):
        if not any(str(s["id"]) == sid for s in self.config["servers"]):
            raise self.page("Not found", "", 404, "No such server.")
        self.data["restarted"] = sorted(set(self.data["restarted"]) | {int(sid)})  # a set: the order is not the task
        raise redirect("/")

    # ---- icons: choose the one of a shape --------------------------------------------------------------
    def icons(self):
        cards = "".join(
            f'<div class="card"><svg class="icon" aria-hidden="true" width="64" height="64" viewBox="0 0 48 48" '
            f'fill="{esc(i["rgb"])}">{SHAPES[i["shape"]]}</svg>'
            + _choose("icon", i["id"]) for i in self.config["icons"])
        note = self._done_note(f"You chose icon {self.data['chosen'][-1]}." if self.data["chosen"] else "")
        raise self.page("Pick an icon", f'{note}<div class="grid">{cards}</div>')

    def icon_pick(self, iid):
        if not any(str(i["id"]) == iid for i in self.config["icons"]):
            raise self.page("Not found", "", 404, "No such icon.")
        self.data["chosen"].append(int(iid))
        raise redirect("/")
