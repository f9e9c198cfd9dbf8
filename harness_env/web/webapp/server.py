"""The HTTP side of the site app: form parsing and the request handler that serves a `Site`.

Requests are served one at a time under the site's lock (the state file is rewritten after each one), every
request except the runner's readiness probe is logged with its form fields (passwords masked), and bodies
over FORM_LIMIT are refused: the agent reaches the state only through ordinary, bounded requests.
"""

import http.cookies
import http.server
import urllib.parse

PROBE_HEADER = "X-HRL-Probe"  # the runner's readiness probe: answered, not logged
FORM_LIMIT = 64 << 10


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
