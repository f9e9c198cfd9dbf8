"""Kinds that are one form to get right: contact, inventory's answer box, account, booking, forum, survey.

Each form handler takes `(error, status)` so its POST can re-render it with the agent's input kept and a
`role=alert` error (400/401): a failed action the agent has to notice and recover from. The account kind
adds a signed-in session (a cookie the handler sets through `self.req["cookie_out"]`).
"""

import secrets

from .render import checkbox, esc, field, form, link, pager, radios, redirect, select, table


class FormPages:
    """Handlers of the form kinds (a mixin of `Site`: needs SiteBase's page/q/f/page_of)."""

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
