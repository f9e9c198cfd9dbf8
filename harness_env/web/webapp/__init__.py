"""The web task family's site app as a package: one stdlib server, many small sites (shop, forms, tables...).

Stdlib only, imported relatively: the task's env/app.py (harness_env/web/site_app.py) runs it in the web-env
sandbox with a bare /usr/bin/python3 from a copy of this folder (env/webapp/), and this repo imports it as
harness_env.web.webapp. render.py builds the HTML; base.py routes (which kind has which pages), lays out
and keeps the state; shop.py, forms.py, records.py and visual.py hold each kind's pages
(style.py: the look); server.py speaks HTTP.
"""

from .base import LOG_LIMIT, SiteBase
from .forms import FormPages
from .records import RecordPages
from .render import Reply, redirect
from .server import FORM_LIMIT, PROBE_HEADER, Form, make_handler
from .shop import ShopPages
from .visual import VisualPages

__all__ = ["FORM_LIMIT", "LOG_LIMIT", "PROBE_HEADER", "Form", "Reply", "Site", "make_handler", "redirect"]


class Site(ShopPages, FormPages, RecordPages, VisualPages, SiteBase):
    """A site of `spec["kind"]` serving its state from `state_dir`: every kind's handlers, routed per kind."""
