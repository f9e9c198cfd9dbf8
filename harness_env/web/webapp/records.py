"""Kinds that act on items of a list: articles (search, bookmark), todo, admin users, orders.

Every per-item control names its item ("Delete alice@corp.test", "Open order 5012"), and a missing item is
a 404 page: the agent has to find the right one, not guess a URL.
"""

from .render import action_button, esc, field, form, link, pager, redirect, select, table


class RecordPages:
    """Handlers of the list kinds (a mixin of `Site`: needs SiteBase's page/q/f/page_of)."""

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
