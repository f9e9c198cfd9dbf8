"""HTML building blocks of the site app: fields with real labels, one-button forms, tables, a pager.

Every control gets a label tied to it by id and every button that acts on an item names the item, so an
accessibility snapshot (what a browser harness shows the agent) identifies each control as text. Handlers
end by raising a `Reply`, so a helper deep in a handler (a failed check re-rendering its form) can answer.
"""

import html
import re


def esc(x) -> str:
    return html.escape(str(x), quote=True)


def fid(name: str) -> str:
    return "f-" + re.sub(r"[^a-zA-Z0-9_-]", "-", name)


def field(label, name, value="", kind="text", extra=""):
    if kind == "textarea":
        ctl = f'<textarea id="{fid(name)}" name="{esc(name)}" rows="4" cols="40">{esc(value)}</textarea>'
    else:
        ctl = f'<input id="{fid(name)}" name="{esc(name)}" type="{kind}" value="{esc(value)}"{extra}>'
    return f'<p><label for="{fid(name)}">{esc(label)}</label> {ctl}</p>'


def select(label, name, options, selected=""):
    opts = "".join(
        f'<option value="{esc(o)}"{" selected" if o == selected else ""}>{esc(o or "-- choose --")}</option>'
        for o in ["", *options]
    )
    sel = f'<select id="{fid(name)}" name="{esc(name)}">{opts}</select>'
    return f'<p><label for="{fid(name)}">{esc(label)}</label> {sel}</p>'


def radios(legend, name, options, selected=""):
    items = "".join(
        f'<label><input type="radio" name="{esc(name)}" value="{esc(o)}"{" checked" if o == selected else ""}>'
        f" {esc(o)}</label><br>"
        for o in options
    )
    return f"<fieldset><legend>{esc(legend)}</legend>{items}</fieldset>"


def checkbox(label, name, checked=False, value="on"):
    return (
        f'<p><label><input type="checkbox" name="{esc(name)}" value="{esc(value)}"{" checked" if checked else ""}>'
        f" {esc(label)}</label></p>"
    )


def form(action, inner, button, method="post"):
    submit = f'<p><button type="submit">{esc(button)}</button></p>'
    return f'<form method="{method}" action="{esc(action)}">{inner}{submit}</form>'


def action_button(action, label, hidden=None):
    """A one-button form (a POST that acts on one item); `label` is the button's unique accessible name."""
    fields = "".join(f'<input type="hidden" name="{esc(k)}" value="{esc(v)}">' for k, v in (hidden or {}).items())
    submit = f'<button type="submit">{esc(label)}</button>'
    return f'<form method="post" action="{esc(action)}" class="inline">{fields}{submit}</form>'


def link(href, text):
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def table(headers, rows):
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def pager(base, page, pages, extra=""):
    parts = [f"Page {page} of {pages}"]
    if page > 1:
        parts.append(link(f"{base}?page={page - 1}{extra}", "Previous page"))
    if page < pages:
        parts.append(link(f"{base}?page={page + 1}{extra}", "Next page"))
    return '<nav aria-label="Pagination">' + " | ".join(parts) + "</nav>"


class Reply(Exception):
    """Raised by handlers: an HTML page (status 200/4xx) or a redirect (303)."""

    def __init__(self, status, body="", location=None):
        super().__init__(status)
        self.status, self.body, self.location = status, body, location


def redirect(location):
    return Reply(303, location=location)
