"""The web app of the web task family: one stdlib server, many small sites (shop, forms, tables, admin...).

Copied verbatim into every generated task as `env/app.py` (tasks are self-contained folders) and run in
the task's web-env sandbox (harness_env/web/env.py) with /usr/bin/python3 and nothing else: stdlib only.
`site.json` beside it says which site (`kind`), its fixed content (`config`) and its initial mutable
data (`data`). The server state is `{"kind", "data", "log"}`: `data` is what the checker compares, `log`
every request (method, path, status, form fields) for behaviour analytics. It is rewritten atomically
after every request into $HRL_STATE_DIR/state.json, a directory the agent's sandbox never sees, so the
state the verifier reads is exactly what the app did: the agent can change it only by using the site.

Pages are plain server-rendered HTML with real labels and unique accessible names (every button that
acts on an item names the item), so an accessibility snapshot identifies every control as text. Posts
redirect (303) on success and re-render with a `role=alert` error and status 400/401 on bad input: a
failed action the agent has to notice and recover from.
"""

import html
import http.cookies
import http.server
import json
import os
import re
import secrets
import sys
import threading
import urllib.parse

LOG_LIMIT = 5000  # requests kept in the state's log (the rest counted): an agent must not grow it unbounded
PROBE_HEADER = "X-HRL-Probe"  # the runner's readiness probe: answered, not logged
FORM_LIMIT = 64 << 10


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


class Site:
    """Routes of every kind; each handler reads `self.data` / `self.config` and raises a Reply."""

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
            f'</title></head><body><header><p>{esc(self.title)}</p><nav aria-label="Main">{nav}</nav></header>'
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

    # ---- contact ---------------------------------------------------------------------------------
    def contact_form(self, error="", status=200):
        body = form(
            "/contact",
            field("Name", "name", self.f("name"))
            + field("Email", "email", self.f("email"))
            + select("Topic", "topic", self.config["topics"], self.f("topic"))
            + field("Message", "message", self.f("message"), "textarea"),
            "Send message",
        )
        raise self.page("Contact us", body, status, error)

    def contact_post(self):
        vals = {k: self.f(k) for k in ("name", "email", "topic", "message")}
        missing = [k for k, v in vals.items() if not v]
        if missing:
            self.contact_form(f"Please fill in: {', '.join(missing)}.", 400)
        if "@" not in vals["email"] or vals["topic"] not in self.config["topics"]:
            self.contact_form("Please enter a valid email address and topic.", 400)
        self.data["messages"].append(vals)
        raise redirect("/contact/sent")

    def contact_sent(self):
        raise self.page("Message sent", "<p>Thank you, your message was sent.</p>")

    # ---- shop (catalog, cart, checkout) ----------------------------------------------------------
    def product(self, sku):
        return next((p for p in self.config["products"] if p["sku"] == sku), None)

    def products(self):
        items = list(self.config["products"])
        cat, sort = self.q("category"), self.q("sort")
        if cat:
            items = [p for p in items if p["category"] == cat]
        if sort == "price":
            items.sort(key=lambda p: (p["price"], p["name"]))
        elif sort == "name":
            items.sort(key=lambda p: p["name"])
        shown, page, pages = self.page_of(items, self.config.get("per_page", 5))
        rows = [
            [
                esc(p["name"]),
                esc(p["category"]),
                f"${p['price']:.2f}",
                action_button("/cart/add", f"Add {p['name']} to cart", {"sku": p["sku"]}),
            ]
            for p in shown
        ]
        extra = (f"&category={urllib.parse.quote(cat)}" if cat else "") + (f"&sort={sort}" if sort else "")
        cats = sorted({p["category"] for p in self.config["products"]})
        filters = " | ".join(
            [link("/products?sort=price", "Sort by price (low to high)"), link("/products?sort=name", "Sort by name")]
            + [link(f"/products?category={urllib.parse.quote(c)}", f"Show only {c}") for c in cats]
        )
        raise self.page(
            "Products",
            f"<p>{filters}</p>"
            + table(["Product", "Category", "Price", ""], rows)
            + pager("/products", page, pages, extra),
        )

    def cart_add(self):
        p = self.product(self.f("sku"))
        if p is None:
            raise self.page("Cart", "<p>No such product.</p>", 400, "Unknown product.")
        cart = self.data["cart"]
        cart[p["sku"]] = cart.get(p["sku"], 0) + 1
        raise redirect("/cart")

    def cart_remove(self):
        sku = self.f("sku")
        if sku in self.data["cart"]:
            self.data["cart"][sku] -= 1
            if self.data["cart"][sku] <= 0:
                del self.data["cart"][sku]
        raise redirect("/cart")

    def cart(self):
        rows = []
        for sku, qty in self.data["cart"].items():
            p = self.product(sku) or {"name": sku, "price": 0.0}
            rows.append(
                [
                    esc(p["name"]),
                    str(qty),
                    f"${p['price'] * qty:.2f}",
                    action_button("/cart/remove", f"Remove one {p['name']}", {"sku": sku}),
                ]
            )
        body = table(["Product", "Quantity", "Subtotal", ""], rows) if rows else "<p>Your cart is empty.</p>"
        if rows:
            body += f"<p>{link('/checkout', 'Proceed to checkout')}</p>"
        raise self.page("Your cart", body)

    def checkout(self, error="", status=200):
        if not self.data["cart"]:
            raise self.page("Checkout", "<p>Your cart is empty.</p>", 400, "Your cart is empty.")
        d = self.data.setdefault("draft", {}).get("shipping", {})
        body = form(
            "/checkout", "".join(field(lbl, k, self.f(k) or d.get(k, "")) for k, lbl in SHIPPING), "Continue to payment"
        )
        raise self.page("Shipping address", body, status, error)

    def checkout_post(self):
        vals = {k: self.f(k) for k, _ in SHIPPING}
        if not all(vals.values()):
            self.checkout("Please fill in every address field.", 400)
        self.data["draft"] = {"shipping": vals}
        raise redirect("/checkout/payment")

    def payment(self, error="", status=200):
        if "shipping" not in self.data.get("draft", {}):
            raise redirect("/checkout")
        body = form(
            "/checkout/payment", radios("Shipping method", "method", self.config["methods"]), "Continue to review"
        )
        raise self.page("Shipping method", body, status, error)

    def payment_post(self):
        if self.f("method") not in self.config["methods"]:
            self.payment("Please choose a shipping method.", 400)
        self.data.setdefault("draft", {})["method"] = self.f("method")
        raise redirect("/checkout/review")

    def review(self):
        draft = self.data.get("draft", {})
        if "method" not in draft or not self.data["cart"]:
            raise redirect("/checkout")
        s = draft["shipping"]
        items = ", ".join(f"{q} x {(self.product(k) or {'name': k})['name']}" for k, q in self.data["cart"].items())
        body = (
            f"<p>Items: {esc(items)}</p><p>Ship to: {esc(s['full_name'])}, {esc(s['street'])}, {esc(s['city'])} "
            f"{esc(s['zip'])}</p><p>Method: {esc(draft['method'])}</p>"
            + action_button("/checkout/place", "Place order")
        )
        raise self.page("Review your order", body)

    def place(self):
        draft = self.data.get("draft", {})
        if "method" not in draft or not self.data["cart"]:
            raise self.page("Review your order", "", 400, "Nothing to order yet.")
        number = 1001 + len(self.data["orders"])
        self.data["orders"].append({"number": number, "items": dict(self.data["cart"]), **draft})
        self.data["cart"], self.data["draft"] = {}, {}
        raise redirect(f"/checkout/done?number={number}")

    def done(self):
        raise self.page("Order placed", f"<p>Thank you! Your order number is {esc(self.q('number'))}.</p>")

    # ---- inventory table + answer box --------------------------------------------------------------
    def inventory(self):
        shown, page, pages = self.page_of(self.config["items"], self.config.get("per_page", 10))
        rows = [[esc(i["name"]), esc(i["sku"]), str(i["stock"])] for i in shown]
        raise self.page("Inventory", table(["Item", "SKU", "In stock"], rows) + pager("/inventory", page, pages))

    def answer(self, error="", status=200):
        raise self.page(
            "Submit an answer",
            form("/answer", field("Answer", "answer", self.f("answer")), "Submit answer"),
            status,
            error,
        )

    def answer_post(self):
        if not self.f("answer"):
            self.answer("Please enter an answer.", 400)
        self.data["answers"].append(self.f("answer"))
        raise redirect("/answer/sent")

    def answer_sent(self):
        raise self.page("Answer received", "<p>Your answer was recorded.</p>")

    # ---- account: login, settings, profile ---------------------------------------------------------
    def authed(self):
        sid = self.req["cookies"].get("sid")
        if sid not in self.sessions:
            raise redirect("/login")

    def login(self, error="", status=200):
        body = form(
            "/login",
            field("Username", "username", self.f("username")) + field("Password", "password", "", "password"),
            "Sign in",
        )
        raise self.page("Sign in", body, status, error)

    def login_post(self):
        if (self.f("username"), self.req["form"].get("password", "")) != (
            self.config["username"],
            self.config["password"],
        ):
            self.login("Wrong username or password.", 401)
        sid = secrets.token_hex(16)
        self.sessions.add(sid)
        self.data["logins"] += 1
        self.req["cookie_out"] = sid
        raise redirect("/account")

    def account(self):
        self.authed()
        raise self.page(
            "Your account", f"<ul><li>{link('/settings', 'Settings')}</li><li>{link('/profile', 'Profile')}</li></ul>"
        )

    def settings(self):
        self.authed()
        s = self.data["settings"]
        body = form(
            "/settings",
            field("Display name", "display_name", s["display_name"])
            + checkbox("Email newsletter", "newsletter", s["newsletter"])
            + checkbox("Dark mode", "dark_mode", s["dark_mode"])
            + select("Language", "language", self.config["languages"], s["language"]),
            "Save settings",
        )
        raise self.page("Settings", ("<p>Settings saved.</p>" if self.q("saved") else "") + body)

    def settings_post(self):
        self.authed()
        if not self.f("display_name") or self.f("language") not in self.config["languages"]:
            raise self.page("Settings", "", 400, "Display name and language are required.")
        self.data["settings"] = {
            "display_name": self.f("display_name"),
            "newsletter": "newsletter" in self.req["form"],
            "dark_mode": "dark_mode" in self.req["form"],
            "language": self.f("language"),
        }
        raise redirect("/settings?saved=1")

    def profile(self):
        self.authed()
        p = self.data["profile"]
        body = form(
            "/profile",
            field("Phone", "phone", p["phone"])
            + field("City", "city", p["city"])
            + field("Bio", "bio", p["bio"], "textarea"),
            "Save profile",
        )
        raise self.page("Profile", ("<p>Profile saved.</p>" if self.q("saved") else "") + body)

    def profile_post(self):
        self.authed()
        self.data["profile"] = {k: self.f(k) for k in ("phone", "city", "bio")}
        raise redirect("/profile?saved=1")

    # ---- articles: search, bookmark ----------------------------------------------------------------
    def search(self):
        q = self.q("q").strip()
        box = form("/search", field("Search articles", "q", q), "Search", method="get")
        if not q:
            raise self.page("Search", box)
        hits = [a for a in self.config["articles"] if q.lower() in a["title"].lower()]
        items = "".join(f"<li>{link('/article/' + str(a['id']), a['title'])} by {esc(a['author'])}</li>" for a in hits)
        raise self.page("Search", box + (f"<ul>{items}</ul>" if hits else "<p>No results.</p>"))

    def article(self, aid):
        a = next((a for a in self.config["articles"] if str(a["id"]) == aid), None)
        if a is None:
            raise self.page("Not found", "<p>No such article.</p>", 404)
        marked = a["id"] in self.data["bookmarks"]
        btn = action_button(f"/article/{aid}/bookmark", "Remove bookmark" if marked else "Bookmark this article")
        raise self.page(a["title"], f"<p>By {esc(a['author'])}</p><p>{esc(a['body'])}</p>{btn}")

    def bookmark(self, aid):
        a = next((a for a in self.config["articles"] if str(a["id"]) == aid), None)
        if a is None:
            raise self.page("Not found", "", 404, "No such article.")
        b = self.data["bookmarks"]
        if a["id"] in b:
            b.remove(a["id"])
        else:
            b.append(a["id"])
        raise redirect(f"/article/{aid}")

    def bookmarks(self):
        titles = {a["id"]: a["title"] for a in self.config["articles"]}
        items = "".join(f"<li>{link('/article/' + str(i), titles.get(i, i))}</li>" for i in self.data["bookmarks"])
        raise self.page("Bookmarks", f"<ul>{items}</ul>" if items else "<p>No bookmarks yet.</p>")

    # ---- todo ------------------------------------------------------------------------------------
    def todos(self, error="", status=200):
        rows = []
        for t in self.data["todos"]:
            state = "done" if t["done"] else "open"
            verb = f"Mark {t['title']} as not done" if t["done"] else f"Mark {t['title']} as done"
            toggle = action_button(f"/todo/{t['id']}/toggle", verb)
            delete = action_button(f"/todo/{t['id']}/delete", "Delete " + t["title"])
            rows.append(f"<li>{esc(t['title'])} ({state}) {toggle}{delete}</li>")
        body = f"<ul>{''.join(rows)}</ul>" + form("/todo/add", field("New item", "title"), "Add item")
        raise self.page("To-do list", body, status, error)

    def todo_add(self):
        if not self.f("title"):
            self.todos("Please enter a title for the new item.", 400)
        self.data["todos"].append(
            {"id": max([t["id"] for t in self.data["todos"]] + [0]) + 1, "title": self.f("title"), "done": False}
        )
        raise redirect("/")

    def todo_item(self, tid):
        t = next((t for t in self.data["todos"] if str(t["id"]) == tid), None)
        if t is None:
            self.todos("No such item.", 404)
        return t

    def todo_toggle(self, tid):
        t = self.todo_item(tid)
        t["done"] = not t["done"]
        raise redirect("/")

    def todo_delete(self, tid):
        self.data["todos"].remove(self.todo_item(tid))
        raise redirect("/")

    # ---- booking ---------------------------------------------------------------------------------
    def book(self, error="", status=200):
        body = form(
            "/book",
            field("Name", "name", self.f("name"))
            + select("Date", "date", self.config["dates"], self.f("date"))
            + radios("Time", "time", self.config["times"], self.f("time"))
            + field("Party size", "party", self.f("party"), "number", ' min="1" max="12"'),
            "Book table",
        )
        raise self.page("Book a table", body, status, error)

    def book_post(self):
        vals = {k: self.f(k) for k in ("name", "date", "time", "party")}
        ok = vals["date"] in self.config["dates"] and vals["time"] in self.config["times"] and vals["name"]
        if not ok or not vals["party"].isdigit() or not 1 <= int(vals["party"]) <= 12:
            self.book("Please give a name, a date, a time and a party size from 1 to 12.", 400)
        self.data["bookings"].append({**vals, "party": int(vals["party"])})
        raise redirect("/book/confirmed")

    def booked(self):
        raise self.page("Booking confirmed", "<p>Your table is booked.</p>")

    # ---- forum -----------------------------------------------------------------------------------
    def forum(self):
        items = "".join(f"<li>{esc(p['title'])} ({esc(p['category'])})</li>" for p in self.data["posts"])
        raise self.page("Forum", f"<ul>{items}</ul>")

    def new_post(self, error="", status=200):
        body = form(
            "/new",
            field("Title", "title", self.f("title"))
            + select("Category", "category", self.config["categories"], self.f("category"))
            + field("Body", "body", self.f("body"), "textarea"),
            "Publish post",
        )
        raise self.page("New post", body, status, error)

    def new_post_post(self):
        vals = {k: self.f(k) for k in ("title", "category", "body")}
        if not all(vals.values()) or vals["category"] not in self.config["categories"]:
            self.new_post("Title, category and body are required.", 400)
        self.data["posts"].append({"id": len(self.data["posts"]) + 1, **vals})
        raise redirect("/")

    # ---- admin: users ----------------------------------------------------------------------------
    def users(self):
        rows = [
            [esc(u["name"]), esc(u["email"]), esc(u["role"]), link(f"/users/{u['id']}/delete", f"Delete {u['email']}")]
            for u in self.data["users"]
        ]
        raise self.page("Users", table(["Name", "Email", "Role", ""], rows))

    def user(self, uid):
        u = next((u for u in self.data["users"] if str(u["id"]) == uid), None)
        if u is None:
            raise self.page("Not found", "<p>No such user.</p>", 404)
        return u

    def user_delete(self, uid):
        u = self.user(uid)
        raise self.page(
            "Delete user",
            f"<p>Delete {esc(u['name'])} ({esc(u['email'])})?</p>"
            + action_button(f"/users/{uid}/delete", "Confirm delete")
            + link("/users", "Cancel"),
        )

    def user_delete_post(self, uid):
        self.data["users"].remove(self.user(uid))
        raise redirect("/users")

    # ---- survey ----------------------------------------------------------------------------------
    def survey(self, error="", status=200):
        feats = "".join(checkbox(f, "feature", False, f) for f in self.config["features"])
        body = form(
            "/survey",
            radios("Overall rating", "rating", self.config["ratings"])
            + f"<fieldset><legend>Which features do you use?</legend>{feats}</fieldset>"
            + field("Comments", "comments", self.f("comments"), "textarea"),
            "Submit survey",
        )
        raise self.page("Customer survey", body, status, error)

    def survey_post(self):
        if self.f("rating") not in self.config["ratings"]:
            self.survey("Please choose an overall rating.", 400)
        feats = sorted(set(self.req["form"].getlist("feature")) & set(self.config["features"]))
        self.data["responses"].append({"rating": self.f("rating"), "features": feats, "comments": self.f("comments")})
        raise redirect("/survey/thanks")

    def survey_thanks(self):
        raise self.page("Thank you", "<p>Your answers were recorded.</p>")

    # ---- orders ----------------------------------------------------------------------------------
    def orders(self):
        shown, page, pages = self.page_of(self.data["orders"], self.config.get("per_page", 8))
        rows = [
            [
                str(o["id"]),
                esc(o["customer"]),
                f"${o['total']:.2f}",
                esc(o["status"]),
                link(f"/orders/{o['id']}", f"Open order {o['id']}"),
            ]
            for o in shown
        ]
        raise self.page(
            "Orders", table(["Order", "Customer", "Total", "Status", ""], rows) + pager("/orders", page, pages)
        )

    def order(self, oid, error="", status=200):
        o = next((o for o in self.data["orders"] if str(o["id"]) == oid), None)
        if o is None:
            raise self.page("Not found", "<p>No such order.</p>", 404)
        body = f"<p>Customer: {esc(o['customer'])}</p><p>Status: {esc(o['status'])}</p>" + form(
            f"/orders/{oid}", select("New status", "status", self.config["statuses"]), "Update status"
        )
        return o, self.page(f"Order {oid}", body, status, error)

    def order_get(self, oid):
        raise self.order(oid)[1]

    def order_post(self, oid):
        o, _ = self.order(oid)
        if self.f("status") not in self.config["statuses"]:
            raise self.order(oid, "Please choose a status.", 400)[1]
        o["status"] = self.f("status")
        raise redirect(f"/orders/{oid}")


SHIPPING = (("full_name", "Full name"), ("street", "Street address"), ("city", "City"), ("zip", "ZIP code"))
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
}


class Form(dict):
    """Form fields: the first value per name (as `dict`), all of them via getlist (checkbox groups)."""

    def __init__(self, pairs):
        super().__init__()
        self.pairs = pairs
        for k, v in pairs:
            self.setdefault(k, v)

    def getlist(self, key):
        return [v for k, v in self.pairs if k == key]


def make_handler(site):
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # the state's log is the record; stderr stays quiet
            pass

        def _serve(self, method):
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            pairs = []
            if method == "POST":
                n = int(self.headers.get("Content-Length") or 0)
                if n > FORM_LIMIT:
                    self.send_error(413)
                    return
                pairs = urllib.parse.parse_qsl(self.rfile.read(n).decode("utf-8", "replace"), keep_blank_values=True)
            cookies = {k: m.value for k, m in http.cookies.SimpleCookie(self.headers.get("Cookie", "")).items()}
            with site.lock:
                reply, sid = site.handle(method, url.path, query, Form(pairs), cookies)
                if not self.headers.get(PROBE_HEADER):
                    secret = {"password"}
                    site.record(
                        {
                            "method": method,
                            "path": url.path,
                            "query": url.query,
                            "status": reply.status,
                            "form": {k: ("***" if k in secret else v[:500]) for k, v in pairs},
                        }
                    )
            body = reply.body.encode()
            self.send_response(reply.status)
            if reply.location:
                self.send_header("Location", reply.location)
            if sid:
                self.send_header("Set-Cookie", f"sid={sid}; Path=/; HttpOnly")
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self):
            self._serve("GET")

        def do_POST(self):
            self._serve("POST")

    return Handler


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    with open(os.path.join(here, "site.json")) as fh:
        spec = json.load(fh)
    state_dir = os.environ.get("HRL_STATE_DIR") or sys.exit("app.py: HRL_STATE_DIR is not set")
    port = int(os.environ.get("PORT", "8000"))
    site = Site(spec, state_dir)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), make_handler(site))
    print(f"app: {site.kind} on 127.0.0.1:{server.server_address[1]}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
