"""The shop kind: a paged, sortable catalog, a cart and a three-step checkout (address, method, review).

The checkout keeps its draft in `data["draft"]` (part of the state) between steps, so an agent that skips
a step is sent back to it rather than placing a half-filled order.
"""

import urllib.parse

from .render import action_button, esc, field, form, link, pager, radios, redirect, table

SHIPPING = (("full_name", "Full name"), ("street", "Street address"), ("city", "City"), ("zip", "ZIP code"))


class ShopPages:
    """Handlers of the shop kind (a mixin of `Site`: needs SiteBase's page/q/f/page_of)."""

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
