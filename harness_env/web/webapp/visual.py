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


def _swatch(item: dict) -> str:
    return f'<span class="swatch" aria-hidden="true" style="background:{esc(item["rgb"])}"></span>'


def _icon(item: dict) -> str:
    return (f'<svg class="icon" aria-hidden="true" width="64" height="64" viewBox="0 0 48 48" '
            f'fill="{esc(item["rgb"])}">{SHAPES[item["shape"]]}</svg>')


def _card(what: str, item: dict, drawing) -> str:  # noqa: ANN001 - item -> HTML
    """One card: the item drawn, and its button, named by position only."""
    n = item["id"]
    return f'<div class="card">{drawing(item)}' + action_button(f"/{what}/{n}", f"Choose {what} {n}") + "</div>"


class VisualPages:
    """Handlers of the visual kinds (a mixin of `Site`: needs SiteBase's page/f)."""

    def _done_note(self, text: str) -> str:
        return f'<p class="note" role="status">{esc(text)}</p>' if text else ""

    def _item(self, items: str, iid: str, what: str) -> dict:
        """config[items]'s item of id `iid`, else a 404 page naming `what`."""
        found = next((i for i in self.config[items] if str(i["id"]) == iid), None)
        if found is None:
            raise self.page("Not found", "", 404, f"No such {what}.")
        return found

    # ---- palette and icons: choose one card, each drawn and named by its position only -----------------------
    def _cards(self, heading: str, items: str, what: str, drawing) -> None:  # noqa: ANN001 - item -> HTML
        cards = "".join(_card(what, i, drawing) for i in self.config[items])
        note = self._done_note(f"You chose {what} {self.data['chosen'][-1]}." if self.data["chosen"] else "")
        raise self.page(heading, f'{note}<div class="grid">{cards}</div>')

    def _choose(self, items: str, iid: str, what: str) -> None:
        self.data["chosen"].append(self._item(items, iid, what)["id"])
        raise redirect("/")

    def swatches(self):
        self._cards("Pick a colour", "swatches", "swatch", _swatch)

    def swatch_pick(self, sid):
        self._choose("swatches", sid, "swatch")

    def icons(self):
        self._cards("Pick an icon", "icons", "icon", _icon)

    def icon_pick(self, iid):
        self._choose("icons", iid, "icon")

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
        sid = self._item("servers", sid, "server")["id"]
        self.data["restarted"] = sorted(set(self.data["restarted"]) | {sid})  # a set: the order is not the task
        raise redirect("/")
