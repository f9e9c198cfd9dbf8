"""An HTTP-level browser for plans of abstract steps: validates web checkers without Chromium.

Why: every generated web task must be checker-validated (its reference plan scores 1.0, doing nothing
0.0, a plausible wrong plan 0.0). Running Chromium for hundreds of variants would take minutes on a
2-core machine; these sites are plain server-rendered HTML forms, so a few hundred lines of stdlib
(html.parser, urllib with cookies and 303 redirects) execute the same steps by the same accessible
names in ~10 ms each. The real browsers run the same plans through the harnesses
(harness_env/web/policy.py); this is the fast, exhaustive half of the validation.

Steps (solution/plan.json): goto {url} | fill {label, value} | select {label, value (option text)} |
check / uncheck {role: radio|checkbox, name (label text)} | click {role: link|button, name}.
"""

from __future__ import annotations

import dataclasses
import html.parser
import http.cookiejar
import urllib.error
import urllib.parse
import urllib.request


class StepError(RuntimeError):
    """A step's element is not on the page (the plan does not fit the site)."""


@dataclasses.dataclass
class Control:
    tag: str  # input | select | textarea | button
    name: str = ""
    type: str = "text"
    value: str = ""
    checked: bool = False
    id: str = ""
    label: str = ""
    options: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # select: (value, text)
    form: int = -1


@dataclasses.dataclass
class Form:
    action: str
    method: str


class _Parser(html.parser.HTMLParser):
    """Collects forms, their controls (with label text), buttons and links (with accessible names)."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.forms: list[Form] = []
        self.controls: list[Control] = []
        self.links: list[tuple[str, str]] = []
        self.labels_for: dict[str, str] = {}
        self._form = -1
        self._text: list[tuple[str, object, list[str]]] = []  # open elements whose text we collect
        self.title = ""

    def handle_starttag(self, tag, attrs):
        a = {k: (v or "") for k, v in attrs}
        if tag == "form":
            self.forms.append(Form(a.get("action", ""), a.get("method", "get").lower()))
            self._form = len(self.forms) - 1
        elif tag == "input":
            c = Control(
                "input",
                a.get("name", ""),
                a.get("type", "text").lower(),
                a.get("value", ""),
                "checked" in a,
                a.get("id", ""),
                form=self._form,
            )
            self.controls.append(c)
            for kind, obj, _ in self._text:
                if kind == "label" and isinstance(obj, list):
                    obj.append(c)  # a control wrapped by its label
        elif tag in ("select", "textarea", "button"):
            c = Control(
                tag,
                a.get("name", ""),
                a.get("type", "submit") if tag == "button" else tag,
                "",
                False,
                a.get("id", ""),
                a.get("aria-label", ""),
                form=self._form,
            )
            self.controls.append(c)
            self._text.append((tag, c, []))
        elif tag == "option":
            self._text.append(("option", {"value": a.get("value"), "selected": "selected" in a}, []))
        elif tag == "a":
            self._text.append(("a", {"href": a.get("href", ""), "aria": a.get("aria-label", "")}, []))
        elif tag == "label":
            self._text.append(("label", [], [a.get("for", "")]))
        elif tag == "title":
            self._text.append(("title", None, []))

    def handle_data(self, data):
        for _, _, buf in self._text:
            buf.append(data)

    def handle_endtag(self, tag):
        if tag == "form":
            self._form = -1
            return
        idx = next((i for i in range(len(self._text) - 1, -1, -1) if self._text[i][0] == tag), None)
        if idx is None:
            return
        kind, obj, buf = self._text.pop(idx)
        text = " ".join("".join(buf[1:] if kind == "label" else buf).split())
        if kind == "option":
            sel = next((c for c in reversed(self.controls) if c.tag == "select"), None)
            if sel is not None:
                sel.options.append((obj["value"] if obj["value"] is not None else text, text))
                if obj["selected"]:
                    sel.value = sel.options[-1][0]
        elif kind in ("button", "textarea"):
            if kind == "button":
                obj.label = obj.label or text
            else:
                obj.value = "".join(buf)
        elif kind == "select":
            if not obj.value and obj.options:
                obj.value = obj.options[0][0]
        elif kind == "a":
            self.links.append((obj["href"], obj["aria"] or text))
        elif kind == "label":
            target = buf[0]
            if target:
                self.labels_for[target] = text
            for c in obj:
                c.label = text
        elif kind == "title":
            self.title = text

    def finish(self):
        for c in self.controls:
            if c.id in self.labels_for and not c.label:
                c.label = self.labels_for[c.id]


class MiniBrowser:
    def __init__(self, base: str):
        self.base = base.rstrip("/")
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar))
        self.url = ""
        self.status = 0
        self.page: _Parser | None = None

    def _open(self, url: str, data: bytes | None = None) -> None:
        try:
            with self.opener.open(urllib.request.Request(url, data=data), timeout=10) as r:
                body, self.status, self.url = r.read().decode(), r.status, r.geturl()
        except urllib.error.HTTPError as e:  # 4xx/5xx pages are pages too (a form re-rendered with its error)
            body, self.status, self.url = e.read().decode(), e.code, url
        p = _Parser()
        p.feed(body)
        p.finish()
        self.page = p

    def _absolute(self, url: str) -> str:
        return urllib.parse.urljoin(self.url or self.base + "/", url)

    def _control(self, pred, what: str) -> Control:
        hits = [c for c in self.page.controls if pred(c)]
        if len(hits) != 1:
            raise StepError(f"{what}: {len(hits)} matches on {self.url}")
        return hits[0]

    def step(self, s: dict) -> None:
        op = s["op"]
        if op == "goto":
            self._open(self._absolute(s["url"]))
            return
        if self.page is None:
            raise StepError(f"{op} before any page was opened")
        if op == "fill":
            c = self._control(
                lambda c: (
                    c.label == s["label"]
                    and c.tag in ("input", "textarea")
                    and c.type not in ("radio", "checkbox", "hidden", "submit")
                ),
                f"textbox {s['label']!r}",
            )
            c.value = s["value"]
        elif op == "select":
            c = self._control(lambda c: c.tag == "select" and c.label == s["label"], f"combobox {s['label']!r}")
            val = next((v for v, t in c.options if t == s["value"]), None)
            if val is None:
                raise StepError(f"combobox {s['label']!r} has no option {s['value']!r}")
            c.value = val
        elif op in ("check", "uncheck"):
            c = self._control(
                lambda c: c.tag == "input" and c.type == s["role"] and c.label == s["name"],
                f"{s['role']} {s['name']!r}",
            )
            if c.type == "radio":
                for o in self.page.controls:
                    if o.type == "radio" and o.name == c.name and o.form == c.form:
                        o.checked = False
            c.checked = op == "check"
        elif op == "click" and s["role"] == "link":
            hits = [h for h, name in self.page.links if name == s["name"]]
            if len(hits) != 1:
                raise StepError(f"link {s['name']!r}: {len(hits)} matches on {self.url}")
            self._open(self._absolute(hits[0]))
        elif op == "click":
            self.submit(self._control(lambda c: c.tag == "button" and c.label == s["name"], f"button {s['name']!r}"))
        else:
            raise StepError(f"unknown step op {op!r}")

    def submit(self, button: Control) -> None:
        if button.form < 0:
            raise StepError(f"button {button.label!r} is not in a form")
        form = self.page.forms[button.form]
        pairs = []
        for c in self.page.controls:
            if c.form != button.form or not c.name or c.tag == "button":
                continue
            if c.type in ("radio", "checkbox") and not c.checked:
                continue
            pairs.append((c.name, c.value if c.type not in ("radio", "checkbox") or c.value else "on"))
        body = urllib.parse.urlencode(pairs)
        url = self._absolute(form.action or self.url)
        if form.method == "post":
            self._open(url, body.encode())
        else:
            self._open(url.split("?")[0] + "?" + body)


def run_plan(base: str, steps: list[dict]) -> MiniBrowser:
    b = MiniBrowser(base)
    for s in steps:
        b.step(s)
    return b
