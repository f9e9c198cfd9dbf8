"""The site's plumbing, shared by every kind: routing, the page layout, form/query access and the state file.

ROUTES (method, path regex, handler name) and NAV (the menu) say which pages each kind has: a kind is a
subset of the handlers, and one look at the table shows every URL an agent can reach on it. Paths are
matched whole (`\\Z` appended); regex groups are the handler's arguments.

The state (`{"kind", "data", "log", "log_dropped"}`) is rewritten atomically after every request so the
verifier reads exactly what the app did; the log is capped (LOG_LIMIT) so an agent cannot grow it unbounded.
"""

import json
import os
import re
import threading

from .render import Reply, esc, link
from .style import head_style, logo

LOG_LIMIT = 5000  # requests kept in the state's log (the rest counted): an agent must not grow it unbounded


class SiteBase:
    """Routes of every kind; each handler reads `self.data` / `self.config` and raises a Reply. The handlers
    themselves live in the page mixins (shop.py, forms.py, records.py), composed into `Site`."""

    def __init__(self, spec, state_dir):
        self.kind, self.title, self.config = spec["kind"], spec.get("title", "Site"), spec.get("config", {})
        self.data = json.loads(json.dumps(spec.get("data", {})))
        self.state_dir, self.log, self.dropped = state_dir, [], 0
        self.sessions = set()
        self.lock = threading.Lock()
        self.routes = [(m, re.compile(p + r"\Z"), getattr(self, f)) for m, p, f in ROUTES[self.kind] + COMMON]
        self.save()

    # ---- plumbing ------------------------------------------------------------------------------
    def page(self, heading, body, status=200, error=""):
        nav = " | ".join(link(h, t) for h, t in NAV.get(self.kind, [("/", "Home")]))
        alert = f'<div role="alert"><p>{esc(error)}</p></div>' if error else ""
        doc = (
            f'<!doctype html><html lang="en"><head><meta charset="utf-8"><title>{esc(heading)} - {esc(self.title)}'
            f'</title>{head_style(self.title)}</head><body><header>{logo(self.title)}<p>{esc(self.title)}</p>'
            f'<nav aria-label="Main">{nav}</nav></header>'
            f"<main><h1>{esc(heading)}</h1>{alert}{body}</main></body></html>"
        )
        return Reply(status, doc)

    def handle(self, method, path, query, form_data, cookies):
        for m, rx, fn in self.routes:
            hit = rx.match(path)
            if hit and m == method:
                self.req = {"query": query, "form": form_data, "cookies": cookies, "cookie_out": None}
                try:
                    fn(*hit.groups())
                except Reply as r:
                    return r, self.req["cookie_out"]
                except Exception as e:  # a bug in a handler: a 500 page, the server goes on
                    return self.page("Server error", f"<p>{esc(type(e).__name__)}</p>", 500), None
                return self.page("Server error", "<p>No reply.</p>", 500), None
        return self.page("Not found", "<p>There is no such page.</p>", 404), None

    def q(self, key, default=""):
        return self.req["query"].get(key, default)

    def f(self, key, default=""):
        return self.req["form"].get(key, default).strip()

    def record(self, entry):
        if len(self.log) < LOG_LIMIT:
            self.log.append(entry)
        else:
            self.dropped += 1
        self.save()

    def save(self):
        state = {"kind": self.kind, "data": self.data, "log": self.log, "log_dropped": self.dropped}
        tmp = os.path.join(self.state_dir, ".state.json.tmp")
        with open(tmp, "w") as fh:
            json.dump(state, fh)
        os.replace(tmp, os.path.join(self.state_dir, "state.json"))

    def page_of(self, items, per_page):
        pages = max(1, -(-len(items) // per_page))
        try:
            page = min(max(1, int(self.q("page", "1"))), pages)
        except ValueError:
            page = 1
        return items[(page - 1) * per_page : page * per_page], page, pages

    def home(self):
        raise self.page(self.title, "<p>Welcome. Use the menu above.</p>")


COMMON = [("GET", "/", "home")]
ROUTES = {
    "contact": [
        ("GET", "/contact", "contact_form"),
        ("POST", "/contact", "contact_post"),
        ("GET", "/contact/sent", "contact_sent"),
    ],
    "shop": [
        ("GET", "/products", "products"),
        ("POST", "/cart/add", "cart_add"),
        ("POST", "/cart/remove", "cart_remove"),
        ("GET", "/cart", "cart"),
        ("GET", "/checkout", "checkout"),
        ("POST", "/checkout", "checkout_post"),
        ("GET", "/checkout/payment", "payment"),
        ("POST", "/checkout/payment", "payment_post"),
        ("GET", "/checkout/review", "review"),
        ("POST", "/checkout/place", "place"),
        ("GET", "/checkout/done", "done"),
    ],
    "inventory": [
        ("GET", "/inventory", "inventory"),
        ("GET", "/answer", "answer"),
        ("POST", "/answer", "answer_post"),
        ("GET", "/answer/sent", "answer_sent"),
    ],
    "account": [
        ("GET", "/login", "login"),
        ("POST", "/login", "login_post"),
        ("GET", "/account", "account"),
        ("GET", "/settings", "settings"),
        ("POST", "/settings", "settings_post"),
        ("GET", "/profile", "profile"),
        ("POST", "/profile", "profile_post"),
    ],
    "articles": [
        ("GET", "/search", "search"),
        ("GET", r"/article/(\d+)", "article"),
        ("POST", r"/article/(\d+)/bookmark", "bookmark"),
        ("GET", "/bookmarks", "bookmarks"),
    ],
    "todo": [
        ("GET", "/", "todos"),
        ("POST", "/todo/add", "todo_add"),
        ("POST", r"/todo/(\d+)/toggle", "todo_toggle"),
        ("POST", r"/todo/(\d+)/delete", "todo_delete"),
    ],
    "booking": [("GET", "/book", "book"), ("POST", "/book", "book_post"), ("GET", "/book/confirmed", "booked")],
    "forum": [("GET", "/", "forum"), ("GET", "/new", "new_post"), ("POST", "/new", "new_post_post")],
    "admin": [
        ("GET", "/users", "users"),
        ("GET", r"/users/(\d+)/delete", "user_delete"),
        ("POST", r"/users/(\d+)/delete", "user_delete_post"),
    ],
    "survey": [
        ("GET", "/survey", "survey"),
        ("POST", "/survey", "survey_post"),
        ("GET", "/survey/thanks", "survey_thanks"),
    ],
    "palette": [("GET", "/", "swatches"), ("POST", r"/swatch/(\d+)", "swatch_pick")],
    "servers": [("GET", "/", "servers"), ("POST", r"/servers/(\d+)/restart", "server_restart")],
    "icons": [("GET", "/", "icons"), ("POST", r"/icon/(\d+)", "icon_pick")],
    "orders": [
        ("GET", "/orders", "orders"),
        ("GET", r"/orders/(\d+)", "order_get"),
        ("POST", r"/orders/(\d+)", "order_post"),
    ],
}
NAV = {
    "contact": [("/", "Home"), ("/contact", "Contact us")],
    "shop": [("/", "Home"), ("/products", "Products"), ("/cart", "Cart")],
    "inventory": [("/", "Home"), ("/inventory", "Inventory"), ("/answer", "Submit an answer")],
    "account": [("/", "Home"), ("/login", "Sign in"), ("/account", "Account")],
    "articles": [("/", "Home"), ("/search", "Search"), ("/bookmarks", "Bookmarks")],
    "todo": [("/", "To-do list")],
    "booking": [("/", "Home"), ("/book", "Book a table")],
    "forum": [("/", "Forum"), ("/new", "New post")],
    "admin": [("/", "Home"), ("/users", "Manage users")],
    "survey": [("/", "Home"), ("/survey", "Take the survey")],
    "orders": [("/", "Home"), ("/orders", "Orders")],
    "palette": [("/", "Swatches")],
    "servers": [("/", "Servers")],
    "icons": [("/", "Icons")],
}
