"""The web app of the web task family: one stdlib server, many small sites (shop, forms, tables, admin...).

This file is the entry point, copied verbatim into every generated task as `env/app.py` beside a copy of
its package (harness_env/web/webapp/ as `env/webapp/`: tasks are self-contained folders), and run in the
task's web-env sandbox (harness_env/web/env.py) with `/usr/bin/python3 -I` and nothing else: stdlib only.
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

import http.server
import json
import os
import sys

if __package__:  # imported as harness_env.web.site_app (validate.py, the tests)
    from .webapp import Site, make_handler
else:  # run as a task's env/app.py: `-I` leaves the script's folder off sys.path, and the package lies beside it
    sys.dont_write_bytecode = True  # env/ is task content (hashed for the validation cache): no __pycache__ there
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from webapp import Site, make_handler

__all__ = ["Site", "http", "main", "make_handler"]


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
