"""The web task family: 14 templates of small-site chores (WebArena / Mind2Web style), seeded variants.

Each task is a ClawGym-format folder plus `env/` (harness_env/web/env.py): the site server
(harness_env/web/site_app.py as env/app.py, its package webapp/ as env/webapp/), its `site.json` and
`env.json`. The agent works in a browser on http://127.0.0.1:8000/; the checker (`reward/check.py`)
compares the app's server-side state (`reward/env_state/state.json`, written by the app outside the
agent's reach) with `reward/expected.json`: all-or-nothing, with one sub-score per check.

A variant is (template, index): a seeded draw of names, products, values and page positions. The split
is every 5th index of each template (20% held out, at a per-template hashed offset), so every template
appears in both splits and
held-out success measures the skill on unseen data, not memorised answers. `solution/plan.json` is the
reference solution as abstract browser steps (goto / fill / select / check / click by accessible name),
run by the scripted oracle policy (harness_env/web/policy.py) through any browser harness and by the
HTTP-level mini browser (harness_env/web/minibrowser.py) that validates every checker: the plan scores
1.0, doing nothing 0.0, `solution/wrong_plan.json` (a plausible mistake) 0.0.
"""

from __future__ import annotations

import json
import pathlib
import random
import shutil
from collections.abc import Callable

from harness_env.tasks.loader import new_task_dir
from harness_env.tasks.templated import held_out, pairs, round_robin

CATEGORY = "web"
PORT = 8000
START = f"http://127.0.0.1:{PORT}"
APP_SOURCE = pathlib.Path(__file__).resolve().parents[1] / "web" / "site_app.py"
APP_PACKAGE = APP_SOURCE.parent / "webapp"  # imported by app.py, so shipped beside it
CHECK_PY = pathlib.Path(__file__).resolve().parents[1] / "web" / "check.py"

FIRST = ("Alice", "Bruno", "Chen", "Dana", "Emeka", "Farah", "Goran", "Hana", "Ivan", "Julia", "Kofi", "Lena")
LAST = ("Martin", "Novak", "Okafor", "Patel", "Quinn", "Rossi", "Sato", "Tanaka", "Ueda", "Vargas", "Weber", "Young")
CITIES = ("Lisbon", "Oslo", "Kyoto", "Austin", "Nairobi", "Porto", "Dublin", "Quito", "Perth", "Tallinn")
STREETS = ("Elm Street", "Harbor Road", "Maple Avenue", "Station Lane", "Hill Road", "Park Way")
PRODUCTS = {
    "Kitchen": ("Blue Mug", "Tea Kettle", "Cutting Board", "Chef Knife", "Salad Bowl", "Pepper Mill", "Oven Mitt"),
    "Office": ("Desk Lamp", "Notebook", "Stapler", "Fountain Pen", "Paper Tray", "Desk Mat", "Sticky Notes"),
    "Garden": ("Watering Can", "Garden Gloves", "Seed Pack", "Hand Trowel", "Plant Pot", "Hose Nozzle"),
}
TOPICS = ("Billing", "Shipping", "Returns", "Technical support", "Other")
WORDS = ("solar", "river", "market", "winter", "robot", "garden", "ocean", "violin", "mountain", "coffee")
FEATURES = ("Search", "Wishlist", "Dark mode", "Notifications", "Reviews", "Gift cards")


def pick(rng: random.Random, seq, k: int | None = None):
    return rng.choice(seq) if k is None else rng.sample(list(seq), k)


def person(rng: random.Random) -> str:
    return f"{pick(rng, FIRST)} {pick(rng, LAST)}"


def email_of(name: str, domain: str = "example.com") -> str:
    return name.lower().replace(" ", ".") + "@" + domain


def catalog(rng: random.Random, n: int) -> list[dict]:
    names = [(c, p) for c, ps in PRODUCTS.items() for p in ps]
    chosen = rng.sample(names, n)
    prices = rng.sample(range(300, 6000, 25), n)  # distinct prices: "the cheapest" is unique
    return [
        {"sku": f"SKU-{100 + i}", "name": p, "category": c, "price": prices[i] / 100} for i, (c, p) in enumerate(chosen)
    ]


def site(kind: str, title: str, config: dict, data: dict) -> dict:
    return {"kind": kind, "title": title, "config": config, "data": data}


def eq(path: str, value) -> dict:
    """A check: the state's value at dotted `path` (under `data`) equals `value`."""
    return {"path": path, "equals": value}


# Each template: (rng) -> dict(site, query, checks, plan, wrong). Plans use accessible names only.
def t_contact(rng):
    name, topic = person(rng), pick(rng, TOPICS)
    msg = f"My order number is {rng.randint(10000, 99999)}. Please call me back."
    wrong_topic = pick(rng, [t for t in TOPICS if t != topic])
    s = site("contact", "Acme Support", {"topics": list(TOPICS)}, {"messages": []})
    fill = [("fill", "Name", name), ("fill", "Email", email_of(name)), ("fill", "Message", msg)]
    plan = [
        ("goto", "/"),
        ("click", "link", "Contact us"),
        *fill,
        ("select", "Topic", topic),
        ("click", "button", "Send message"),
    ]
    wrong = [*plan[:-2], ("select", "Topic", wrong_topic), plan[-1]]
    q = (
        f'Use the contact form of the site at {START}/ to send a message with topic "{topic}" as {name} '
        f"(email {email_of(name)}). The message text must be exactly: {msg}"
    )
    exp = {"name": name, "email": email_of(name), "topic": topic, "message": msg}
    return dict(site=s, query=q, checks=[eq("messages", [exp])], plan=plan, wrong=wrong)


def t_add_to_cart(rng):
    products = catalog(rng, 12)
    target = pick(rng, products)
    page = products.index(target) // 4
    other = pick(rng, [p for p in products[page * 4 : page * 4 + 4] if p is not target])  # on the same page
    n = rng.randint(1, 3)
    s = site(
        "shop",
        "Corner Shop",
        {"products": products, "per_page": 4, "methods": ["Standard", "Express"]},
        {"cart": {}, "orders": []},
    )
    nav = [("goto", "/"), ("click", "link", "Products")] + [("click", "link", "Next page")] * page
    plan = (nav + [("click", "button", f"Add {target['name']} to cart")]) * n  # adding lands on the cart page
    wrong = (nav + [("click", "button", f"Add {other['name']} to cart")]) * n
    q = f'On the shop at {START}/, add {n} x "{target["name"]}" to the cart (and nothing else).'
    return dict(site=s, query=q, checks=[eq("cart", {target["sku"]: n})], plan=plan, wrong=wrong)


def t_cheapest(rng):
    products = catalog(rng, 14)
    cat = pick(rng, sorted({p["category"] for p in products}))
    in_cat = sorted((p for p in products if p["category"] == cat), key=lambda p: p["price"])
    cheapest, pricier = in_cat[0], in_cat[1]
    s = site(
        "shop",
        "Bargain Bin",
        {"products": products, "per_page": 5, "methods": ["Standard"]},
        {"cart": {}, "orders": []},
    )
    plan = [
        ("goto", "/products"),
        ("click", "link", f"Show only {cat}"),
        ("goto", f"/products?category={cat}&sort=price"),
        ("click", "button", f"Add {cheapest['name']} to cart"),
    ]
    wrong = [*plan[:3], ("click", "button", f"Add {pricier['name']} to cart")]  # the second cheapest
    q = f'On the shop at {START}/, find the cheapest product in the category "{cat}" and add one of it to the cart.'
    return dict(site=s, query=q, checks=[eq("cart", {cheapest["sku"]: 1})], plan=plan, wrong=wrong)


def t_checkout(rng):
    products = catalog(rng, 6)
    cart = {p["sku"]: rng.randint(1, 2) for p in pick(rng, products, 2)}
    name, city, street = person(rng), pick(rng, CITIES), f"{rng.randint(1, 99)} {pick(rng, STREETS)}"
    zipc, method = str(rng.randint(10000, 99999)), pick(rng, ["Standard", "Express", "Overnight"])
    s = site(
        "shop",
        "Home Goods",
        {"products": products, "per_page": 6, "methods": ["Standard", "Express", "Overnight"]},
        {"cart": cart, "orders": []},
    )
    ship = [
        ("fill", "Full name", name),
        ("fill", "Street address", street),
        ("fill", "City", city),
        ("fill", "ZIP code", zipc),
    ]
    plan = [
        ("goto", "/cart"),
        ("click", "link", "Proceed to checkout"),
        *ship,
        ("click", "button", "Continue to payment"),
        ("check", "radio", method),
        ("click", "button", "Continue to review"),
        ("click", "button", "Place order"),
    ]
    wrong = plan[:-1]  # everything but the last click: the order is never placed
    q = (
        f"The cart on {START}/cart is already filled. Check out and place the order, shipping to {name}, {street}, "
        f"{city}, ZIP {zipc}, with the {method} shipping method."
    )
    exp = {
        "number": 1001,
        "items": cart,
        "shipping": {"full_name": name, "street": street, "city": city, "zip": zipc},
        "method": method,
    }
    return dict(site=s, query=q, checks=[eq("orders", [exp]), eq("cart", {})], plan=plan, wrong=wrong)


def t_table_lookup(rng):
    names = [f"{w.title()} {k}" for w in WORDS for k in ("Valve", "Panel", "Bracket", "Sensor")]
    rows = [
        {"name": n, "sku": f"IN-{1000 + i}", "stock": rng.randint(0, 500)} for i, n in enumerate(rng.sample(names, 36))
    ]
    idx = rng.randrange(10, 36)  # never on the first page
    target = rows[idx]
    neighbour = next(r for r in rows[idx - 1 :: -1] + rows[idx + 1 :] if r["stock"] != target["stock"])
    s = site("inventory", "Warehouse", {"items": rows, "per_page": 10}, {"answers": []})
    plan = (
        [("goto", "/inventory")]
        + [("click", "link", "Next page")] * (idx // 10)
        + [("goto", "/answer"), ("fill", "Answer", str(target["stock"])), ("click", "button", "Submit answer")]
    )
    wrong = [("goto", "/answer"), ("fill", "Answer", str(neighbour["stock"])), ("click", "button", "Submit answer")]
    q = (
        f'The inventory at {START}/inventory spans several pages. Find how many units of "{target["name"]}" '
        f'(SKU {target["sku"]}) are in stock and submit that number (digits only) once on the "Submit an answer" page.'
    )
    return dict(site=s, query=q, checks=[eq("answers", [str(target["stock"])])], plan=plan, wrong=wrong)


def account_site(rng, title):
    user = pick(rng, FIRST).lower() + str(rng.randint(10, 99))
    pw = f"{pick(rng, WORDS)}-{rng.randint(100, 999)}"
    settings = {
        "display_name": user.title(),
        "newsletter": rng.random() < 0.5,
        "dark_mode": rng.random() < 0.5,
        "language": "English",
    }
    profile = {"phone": f"555-{rng.randint(1000, 9999)}", "city": pick(rng, CITIES), "bio": "Hello!"}
    s = site(
        "account",
        title,
        {"username": user, "password": pw, "languages": ["English", "Deutsch", "Français", "Español"]},
        {"settings": settings, "profile": profile, "logins": 0},
    )
    login = [("goto", "/login"), ("fill", "Username", user), ("fill", "Password", pw), ("click", "button", "Sign in")]
    return s, user, pw, login


def t_settings(rng):
    s, user, pw, login = account_site(rng, "Member Area")
    cur = s["data"]["settings"]
    lang = pick(rng, ["Deutsch", "Français", "Español"])
    want = {**cur, "newsletter": not cur["newsletter"], "language": lang}
    toggle = ("check" if want["newsletter"] else "uncheck", "checkbox", "Email newsletter")
    plan = [
        *login,
        ("click", "link", "Settings"),
        toggle,
        ("select", "Language", lang),
        ("click", "button", "Save settings"),
    ]
    dark = ("uncheck" if cur["dark_mode"] else "check", "checkbox", "Dark mode")
    wrong = [
        *login,
        ("click", "link", "Settings"),
        dark,
        ("select", "Language", lang),
        ("click", "button", "Save settings"),
    ]
    verb = "subscribe to" if want["newsletter"] else "unsubscribe from"
    q = (
        f"Sign in at {START}/login as {user} (password {pw}), then in Settings {verb} the email newsletter and set the "
        f"language to {lang}. Leave every other setting as it is."
    )
    return dict(site=s, query=q, checks=[eq("settings", want)], plan=plan, wrong=wrong)


def t_profile(rng):
    s, user, pw, login = account_site(rng, "Community Portal")
    cur = s["data"]["profile"]
    phone = f"555-{rng.randint(1000, 9999)}"
    plan = [*login, ("click", "link", "Profile"), ("fill", "Phone", phone), ("click", "button", "Save profile")]
    wrong = [*login, ("click", "link", "Profile"), ("fill", "City", phone), ("click", "button", "Save profile")]
    q = (
        f"Sign in at {START}/login as {user} (password {pw}) and change the phone number in your profile to {phone}. "
        "Do not change anything else."
    )
    return dict(site=s, query=q, checks=[eq("profile", {**cur, "phone": phone})], plan=plan, wrong=wrong)


def t_bookmark(rng):
    words = pick(rng, WORDS, 4)
    arts, i = [], 1
    for w in words:
        for kind in ("Guide to", "History of", "Myths about"):
            arts.append({"id": i, "title": f"The {kind} {w.title()}", "author": person(rng), "body": f"All about {w}."})
            i += 1
    target = pick(rng, arts)
    word = target["title"].split()[-1]
    sibling = pick(rng, [a for a in arts if a["title"].endswith(word) and a["id"] != target["id"]])
    s = site("articles", "Daily Reader", {"articles": arts}, {"bookmarks": []})
    plan = [
        ("goto", "/search"),
        ("fill", "Search articles", word),
        ("click", "button", "Search"),
        ("click", "link", target["title"]),
        ("click", "button", "Bookmark this article"),
    ]
    wrong = [*plan[:3], ("click", "link", sibling["title"]), plan[-1]]
    q = f'On {START}/, search for articles about "{word}" and bookmark the one titled "{target["title"]}".'
    return dict(site=s, query=q, checks=[eq("bookmarks", [target["id"]])], plan=plan, wrong=wrong)


def t_todo(rng):
    titles = pick(
        rng,
        [
            "Buy milk",
            "Call the bank",
            "Water the plants",
            "Pay rent",
            "Book dentist",
            "Fix the bike",
            "Email Sam",
            "Renew passport",
        ],
        5,
    )
    todos = [{"id": i + 1, "title": t, "done": False} for i, t in enumerate(titles)]
    target, other = pick(rng, todos, 2)
    new = f"Plan {pick(rng, WORDS)} trip"
    s = site("todo", "Tasks", {}, {"todos": todos})
    plan = [
        ("goto", "/"),
        ("click", "button", f"Mark {target['title']} as done"),
        ("fill", "New item", new),
        ("click", "button", "Add item"),
    ]
    wrong = [("goto", "/"), ("click", "button", f"Mark {other['title']} as done"), *plan[2:]]
    want = [{**t, "done": t["id"] == target["id"]} for t in todos] + [{"id": 6, "title": new, "done": False}]
    q = f'In the to-do list at {START}/, mark "{target["title"]}" as done and add a new item "{new}".'
    return dict(site=s, query=q, checks=[eq("todos", want)], plan=plan, wrong=wrong)


def t_booking(rng):
    dates = [f"2026-0{m}-{d:02d}" for m, d in sorted({(rng.randint(3, 9), rng.randint(1, 28)) for _ in range(5)})]
    times = ["18:00", "18:30", "19:00", "19:30", "20:00", "20:30"]
    name, date, time, party = person(rng), pick(rng, dates), pick(rng, times), rng.randint(2, 8)
    wrong_time = times[(times.index(time) + 1) % len(times)]
    s = site("booking", "Trattoria", {"dates": dates, "times": times}, {"bookings": []})
    plan = [
        ("goto", "/"),
        ("click", "link", "Book a table"),
        ("fill", "Name", name),
        ("select", "Date", date),
        ("check", "radio", time),
        ("fill", "Party size", str(party)),
        ("click", "button", "Book table"),
    ]
    wrong = [*plan[:4], ("check", "radio", wrong_time), *plan[5:]]
    q = f"Book a table at {START}/ for {party} people on {date} at {time}, under the name {name}."
    exp = {"name": name, "date": date, "time": time, "party": party}
    return dict(site=s, query=q, checks=[eq("bookings", [exp])], plan=plan, wrong=wrong)


def t_forum(rng):
    cats = ["General", "Help", "Announcements", "Off-topic"]
    posts = [
        {"id": i + 1, "title": f"Welcome thread {i + 1}", "category": "General", "body": "Hi all"} for i in range(3)
    ]
    title = f"Question about {pick(rng, WORDS)} settings"
    cat = pick(rng, cats[1:])
    body = f"How do I change the {pick(rng, WORDS)} option? Thanks, {pick(rng, FIRST)}"
    s = site("forum", "Community Forum", {"categories": cats}, {"posts": posts})
    plan = [
        ("goto", "/"),
        ("click", "link", "New post"),
        ("fill", "Title", title),
        ("select", "Category", cat),
        ("fill", "Body", body),
        ("click", "button", "Publish post"),
    ]
    wrong = [*plan[:3], ("select", "Category", "General"), *plan[4:]]
    q = f'On the forum at {START}/, publish a new post in the "{cat}" category titled "{title}" with the body: {body}'
    want = posts + [{"id": 4, "title": title, "category": cat, "body": body}]
    return dict(site=s, query=q, checks=[eq("posts", want)], plan=plan, wrong=wrong)


def t_admin(rng):
    names = list(dict.fromkeys(person(rng) for _ in range(12)))[:7]
    users = [
        {"id": i + 1, "name": n, "email": email_of(n, "corp.test"), "role": pick(rng, ["admin", "editor", "viewer"])}
        for i, n in enumerate(names)
    ]
    target, other = pick(rng, users, 2)
    s = site("admin", "Admin Console", {}, {"users": users})
    plan = [
        ("goto", "/"),
        ("click", "link", "Manage users"),
        ("click", "link", f"Delete {target['email']}"),
        ("click", "button", "Confirm delete"),
    ]
    wrong = [*plan[:2], ("click", "link", f"Delete {other['email']}"), plan[-1]]
    q = f"In the admin console at {START}/, delete the user account with the email {target['email']} (only that one)."
    return dict(site=s, query=q, checks=[eq("users", [u for u in users if u is not target])], plan=plan, wrong=wrong)


def t_survey(rng):
    ratings = ["1 - Poor", "2 - Fair", "3 - Good", "4 - Very good", "5 - Excellent"]
    rating, feats = pick(rng, ratings), sorted(pick(rng, FEATURES, 2))
    s = site("survey", "Feedback", {"ratings": ratings, "features": list(FEATURES)}, {"responses": []})
    plan = [("goto", "/survey"), ("check", "radio", rating)] + [("check", "checkbox", f) for f in feats]
    plan.append(("click", "button", "Submit survey"))
    wrong_feats = [feats[0], pick(rng, [f for f in FEATURES if f not in feats])]
    wrong = [("goto", "/survey"), ("check", "radio", rating)] + [("check", "checkbox", f) for f in wrong_feats]
    wrong.append(("click", "button", "Submit survey"))
    q = (
        f'Fill in the survey at {START}/survey: overall rating "{rating}", and tick exactly these features: '
        f"{' and '.join(feats)}. Leave the comments empty and submit it."
    )
    exp = {"rating": rating, "features": feats, "comments": ""}
    return dict(site=s, query=q, checks=[eq("responses", [exp])], plan=plan, wrong=wrong)


def t_order_status(rng):
    statuses = ["Pending", "Shipped", "Delivered", "Cancelled"]
    orders = [
        {"id": 5000 + i, "customer": person(rng), "total": rng.randint(1000, 30000) / 100, "status": "Pending"}
        for i in range(24)
    ]
    idx = rng.randrange(8, 24)
    target = orders[idx]
    s = site("orders", "Order Desk", {"statuses": statuses, "per_page": 8}, {"orders": orders})
    plan = (
        [("goto", "/orders")]
        + [("click", "link", "Next page")] * (idx // 8)
        + [
            ("click", "link", f"Open order {target['id']}"),
            ("select", "New status", "Shipped"),
            ("click", "button", "Update status"),
        ]
    )
    wrong = [*plan[:-2], ("select", "New status", "Delivered"), plan[-1]]
    want = [{**o, "status": "Shipped" if o is target else o["status"]} for o in orders]
    q = (f"In the order desk at {START}/orders, find order {target['id']} (customer {target['customer']}) "
         "and mark it as Shipped.")
    return dict(site=s, query=q, checks=[eq("orders", want)], plan=plan, wrong=wrong)


TEMPLATES: dict[str, Callable[[random.Random], dict]] = {
    "contact_form": t_contact,
    "add_to_cart": t_add_to_cart,
    "cheapest_item": t_cheapest,
    "checkout": t_checkout,
    "table_lookup": t_table_lookup,
    "change_settings": t_settings,
    "update_profile": t_profile,
    "search_bookmark": t_bookmark,
    "todo": t_todo,
    "book_table": t_booking,
    "forum_post": t_forum,
    "delete_user": t_admin,
    "survey": t_survey,
    "order_status": t_order_status,
}


def split_of(template: str, index: int) -> str:
    """Every 5th variant index of a template is held out, at a per-template offset (a stable hash): 20% of
    each template, so every template is in both splits."""
    return held_out("web", template, index)


def variant(template: str, index: int) -> dict:
    """The task of (template, index): a pure function of both (its own seeded RNG)."""
    if template not in TEMPLATES:
        raise ValueError(f"unknown web template {template!r}; known: {sorted(TEMPLATES)}")
    rng = random.Random(f"{template}/{index}")
    return TEMPLATES[template](rng)


def plan_json(steps) -> list[dict]:
    out = []
    for op, *args in steps:
        if op == "goto":
            out.append({"op": "goto", "url": START + args[0]})
        elif op == "click":
            out.append({"op": "click", "role": args[0], "name": args[1]})
        elif op in ("check", "uncheck"):
            out.append({"op": op, "role": args[0], "name": args[1]})
        else:  # fill, select
            out.append({"op": op, "label": args[0], "value": args[1]})
    return out


def task_id(template: str, index: int) -> str:
    return f"web-{template}-{index:03d}"


def write_task(out_dir: str | pathlib.Path, template: str, index: int) -> pathlib.Path:
    meta = {"category": CATEGORY, "template": template, "index": index, "split": split_of(template, index)}
    return write_site_task(out_dir, task_id(template, index), variant(template, index), meta)


def write_site_task(out_dir: str | pathlib.Path, tid: str, v: dict, metadata: dict) -> pathlib.Path:
    """A task folder serving the site app with `v` (site, query, checks, plan, wrong): the web family's and the
    visual family's (harness_env/tasks/visual_family.py) writer."""
    d = new_task_dir(out_dir, tid, ("env", "reward", "solution"))
    entry = {
        "task_id": tid,
        "user_query": v["query"] + " When you are done, reply with a one-line summary.",
        "metadata": {**metadata, "start_url": START + "/"},
    }
    (d / "data_entry.json").write_text(json.dumps(entry, indent=2) + "\n")
    shutil.copyfile(APP_SOURCE, d / "env" / "app.py")
    shutil.rmtree(d / "env" / APP_PACKAGE.name, ignore_errors=True)  # a rewrite leaves no stale module behind
    shutil.copytree(APP_PACKAGE, d / "env" / APP_PACKAGE.name, ignore=shutil.ignore_patterns("__pycache__"))
    (d / "env" / "site.json").write_text(json.dumps(v["site"], indent=1) + "\n")
    env = {"command": ["/usr/bin/python3", "-I", "app.py"], "port": PORT, "ready_path": "/", "start_path": "/"}
    (d / "env" / "env.json").write_text(json.dumps(env, indent=1) + "\n")
    shutil.copyfile(CHECK_PY, d / "reward" / "check.py")
    (d / "reward" / "expected.json").write_text(json.dumps({"checks": v["checks"]}, indent=1) + "\n")
    (d / "reward" / "reward.sh").write_text('#!/bin/bash\ncd "$(dirname "$0")" && exec /usr/bin/python3 -I check.py\n')
    (d / "reward" / "reward.sh").chmod(0o755)
    (d / "solution" / "plan.json").write_text(json.dumps(plan_json(v["plan"]), indent=1) + "\n")
    (d / "solution" / "wrong_plan.json").write_text(json.dumps(plan_json(v["wrong"]), indent=1) + "\n")
    return d


def variants(split: str, per_template: int) -> list[tuple[str, int]]:
    return pairs(TEMPLATES, split_of, split, per_template)


def generate(
    out_dir: str | pathlib.Path, split: str = "train", n: int | None = None, seed: int = 0, per_template: int = 10
) -> list[pathlib.Path]:
    """Writes n tasks of `split` (all of them when None) drawn from `per_template` variants of every template,
    in an order shuffled by `seed` (round-robin over templates first, so a small n still covers them)."""
    order = round_robin(variants(split, per_template), seed, per_template)
    return [write_task(out_dir, t, i) for t, i in order[: n if n is not None else len(order)]]

