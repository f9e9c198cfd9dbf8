"""The viewer's HTTP server (aiohttp): read-only pages over a run's workdir, 127.0.0.1 by default.

Every page request first refreshes the index (only bytes appended since the previous request are read, in a
worker thread), so the pages follow a live run. Trees are rebuilt with the trainer's code in a worker thread and
cached per group until the group's logs grow. The tokenizer and the tree code load before the server answers, so
no page pays for them (the first group page took 2.07 s). Nothing here opens a workdir file for writing.

Why a Content-Security-Policy that allows nothing from elsewhere: the page must work offline, and a policy's
output is shown verbatim; even if an escape were missed, no outside script, style or image could load.
"""

from __future__ import annotations

import asyncio
import collections
import importlib
import logging
import mimetypes
import os
import pathlib
import threading

from aiohttp import web

from harness_env.inspect import charts, detail, pages
from harness_env.inspect import queries as Q
from harness_env.inspect import tree_view as T
from harness_env.inspect.index import Run, Source, WorkdirIndex
from research.rl import dlogp

log = logging.getLogger(__name__)
CSP = ("default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'; img-src 'self'; "
       "form-action 'self'; base-uri 'none'")
TEXT_SUFFIXES = {".txt", ".log", ".json", ".jsonl", ".md", ".py", ".sh", ".csv", ".yaml", ".yml", ""}
MAX_FILE = 20 << 20
TREE_CACHE = 16
DLOGP_CACHE = 8


class NotFound(Exception):
    """A run, log, rollout, group or file that the workdir does not have (answered 404 with the reason)."""


class BadRequest(ValueError):
    """A query parameter that does not parse (answered 400 with the reason)."""


class Viewer:
    """The index, tokenizers and built trees behind one app."""

    def __init__(self, root: str | os.PathLike):
        self.index = WorkdirIndex(root)
        self._toks: dict[str, object] = {}
        self._trees: collections.OrderedDict = collections.OrderedDict()
        self._dlogp: dict[pathlib.Path, tuple[float, dict]] = {}  # dlogp file -> (mtime, its calls)

    def run(self, name: str | None) -> Run:
        try:
            return self.index.run(name)
        except KeyError as e:
            raise NotFound(e.args[0]) from None

    @staticmethod
    def source(run: Run, key: str | None) -> Source:
        try:
            return Q.source_of(run, key)
        except KeyError as e:
            raise NotFound(e.args[0]) from None

    @property
    def multi(self) -> bool:
        return len(self.index.runs) > 1

    async def text(self, run: Run) -> T.TokenText:
        """Token texts with the run's tokenizer (config.json `tokenizer_dir`, "" = packaged Qwen3); ids if none."""
        name = str(run.config.get("tokenizer_dir") or "")
        if name not in self._toks:
            from research.models.tokenizer import TokenizerLoadError, load_tokenizer

            try:
                self._toks[name] = T.TokenText(await asyncio.to_thread(load_tokenizer, name or None))
            except (TokenizerLoadError, OSError) as e:
                log.warning("inspect: tokenizer %r unavailable (%s); showing token ids", name, e)
                self._toks[name] = T.TokenText(None)
        return self._toks[name]

    async def warm(self) -> None:
        """What the first group pages would otherwise pay (measured: 2.07 s, mostly the tokenizer): the tree code's
        imports (JAX, via the advantage estimators), the estimator compiled for the group sizes of every run found
        at start (tree_view.occurrence_advantages) and each run's tokenizer."""
        await asyncio.to_thread(importlib.import_module, "research.trees.targets")
        for run in list(self.index.runs.values()):
            await self.text(run)
            per_group = [collections.Counter(r.gid for r in s.rows.values()) for s in run.sources.values()]
            sizes = {n for c in per_group for n in c.values()}
            est = (run.config.get("rl") or {}).get("estimator", "grpo")
            await asyncio.to_thread(T.warm_estimator, est if est in _group_estimators() else "grpo", sizes)

    async def tree(self, run: Run, src: Source, gid: str, rows: list) -> tuple[T.TreeView | None, str]:
        refs = list(src.calls_by_group.get(gid, []))
        trained = sorted({run.ledger[r.rid][0] for r in rows if run.ledger.get(r.rid, (0, ""))[1] == "trained"})
        dl_path = dlogp.path_of(run.dir, trained[-1]) if trained else None
        dl_mtime = _mtime(dl_path)
        key = (run.name, src.key, gid, len(refs), tuple((r.rid, r.status, r.reward) for r in rows), dl_path, dl_mtime)
        if key in self._trees:
            self._trees.move_to_end(key)
            return self._trees[key]
        rl = run.config.get("rl") or {}
        by_id = dict(src.call_by_id)

        def build() -> tuple[T.TreeView | None, str]:
            if src.capture is None or not refs:
                return None, "no captured model calls for this group"
            try:
                results = [Q.read_result(src, r) for r in rows]
                calls = T.read_calls(src.capture, refs, by_id.get)
                view = T.build_view(calls, results, estimator=rl.get("estimator", "grpo"),
                                    aggregation=rl.get("aggregation", "token_mean"))
            except (ValueError, OSError) as e:  # CaptureError (a prompt_ref that does not resolve), a vanished log
                return None, f"{type(e).__name__}: {e}"
            if dl_path is not None:
                self._attach_dlogp(view, dl_path, dl_mtime, trained[-1])
            elif src.label != "train":
                view.dlogp_note = f"no RL update trains on {src.label} rollouts"
            return view, ""

        out = self._trees[key] = await asyncio.to_thread(build)
        while len(self._trees) > TREE_CACHE:
            self._trees.popitem(last=False)
        return out


    def _attach_dlogp(self, view: T.TreeView, path: pathlib.Path, mtime: float | None, step: int) -> None:
        """The Δlogprob of update `step` on the view (its file read once per mtime, kept for DLOGP_CACHE files)."""
        if mtime is None:
            view.dlogp_note = (f"update {step} wrote no {path.relative_to(path.parents[1])}: a step skipped (no loss "
                               "token had an advantage), train.diagnostics off, or more loss tokens than "
                               "metrics.dlogp_tokens")
            return
        hit = self._dlogp.get(path)
        if hit is None or hit[0] != mtime:
            try:
                hit = self._dlogp[path] = (mtime, dlogp.load(path))
            except (OSError, ValueError, KeyError) as e:
                view.dlogp_note = f"{path}: unreadable ({type(e).__name__}: {e})"
                return
            while len(self._dlogp) > DLOGP_CACHE:
                self._dlogp.pop(next(iter(self._dlogp)))
        T.attach_dlogp(view, hit[1].get((view.tree.group_id, view.tree.harness), {}), step)


def _group_estimators() -> set[str]:
    from research.advantages import GROUP_ESTIMATORS

    return set(GROUP_ESTIMATORS)


def _mtime(path: pathlib.Path | None) -> float | None:
    try:
        return path.stat().st_mtime if path is not None else None
    except OSError:
        return None


VIEWER = web.AppKey("viewer", Viewer)


def _int(req: web.Request, name: str, default: int | None = None) -> int | None:
    v = req.query.get(name, "")
    if v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise BadRequest(f"{name}={v!r} is not an integer") from None


def _html(text: str, status: int = 200) -> web.Response:
    return web.Response(text=text, status=status, content_type="text/html", charset="utf-8")


@web.middleware
async def _errors(request: web.Request, handler):  # noqa: ANN001, ANN202
    try:
        resp = await handler(request)
    except NotFound as e:
        resp = _html(pages.error_page(404, str(e)), 404)
    except web.HTTPNotFound:
        resp = _html(pages.error_page(404, f"no page {request.path!r}"), 404)
    except BadRequest as e:
        resp = _html(pages.error_page(400, str(e)), 400)
    resp.headers["Content-Security-Policy"] = CSP
    resp.headers["X-Content-Type-Options"] = "nosniff"
    return resp


def _viewer(req: web.Request) -> Viewer:
    return req.app[VIEWER]


async def _fresh(req: web.Request) -> Viewer:
    v = _viewer(req)
    await v.index.refresh()
    return v


async def index_page(req: web.Request) -> web.Response:
    v = await _fresh(req)
    if not v.index.runs:
        return _html(pages.layout("no run yet", f"<p>no run under {pages.esc(str(v.index.root))} yet (a run has "
                                  "metrics.jsonl or results.jsonl); this page follows it once it starts.</p>"))
    if not v.multi:
        return _run_page(v, req)
    return _html(pages.runs_page([v.index.runs[k] for k in sorted(v.index.runs)]))


async def run_page(req: web.Request) -> web.Response:
    return _run_page(await _fresh(req), req)


def _run_page(v: Viewer, req: web.Request) -> web.Response:
    run = v.run(req.query.get("run"))
    curves = charts.metric_charts(run.metrics, only=("reward", "pass rate"))
    return _html(pages.run_page(run, Q.steps(run), _int(req, "page", 0), v.multi, curves))


async def rollouts_page(req: web.Request) -> web.Response:
    v = await _fresh(req)
    run = v.run(req.query.get("run"))
    try:
        flt = Q.Filter.from_query(req.query)
    except ValueError as e:
        raise BadRequest(str(e)) from None
    return _html(pages.rollouts_page(run, Q.filter_rows(run, flt), flt, _int(req, "page", 0), v.multi))


async def step_page(req: web.Request) -> web.Response:
    v = await _fresh(req)
    run = v.run(req.query.get("run"))
    src = v.source(run, req.query.get("source"))
    step = _int(req, "step")
    gs = Q.groups(run, src.key, step)
    if not gs:
        raise NotFound(f"{src.label} log of run {run.name!r} has no rollouts at step {step}")
    return _html(pages.step_page(run, src, step, gs, _int(req, "page", 0), v.multi))


async def group_page(req: web.Request) -> web.Response:
    v = await _fresh(req)
    run = v.run(req.query.get("run"))
    src = v.source(run, req.query.get("source"))
    gid = req.query.get("group", "")
    rows = sorted((r for r in src.rows.values() if r.gid == gid), key=lambda r: r.rid)
    if not rows and gid not in src.calls_by_group:
        raise NotFound(f"no group {gid!r} in the {src.label} log of run {run.name!r}")
    view, why = await v.tree(run, src, gid, rows)
    tpage = _int(req, "tpage", 0)
    if view is not None and not 0 <= tpage < T.token_pages(view):
        raise NotFound(f"token page {tpage} of group {gid!r}: it has {T.token_pages(view)}")
    text = await v.text(run) if view is not None else T.TokenText(None)
    return _html(detail.group_page(run, src, gid, rows, view, why, text, tpage, v.multi))


async def rollout_page(req: web.Request) -> web.Response:
    v = await _fresh(req)
    run = v.run(req.query.get("run"))
    src = v.source(run, req.query.get("source"))
    rid = req.query.get("id", "")
    row = src.rows.get(rid)
    if row is None:
        raise NotFound(f"no rollout {rid!r} in the {src.label} log of run {run.name!r}")
    res = await asyncio.to_thread(Q.read_result, src, row)
    files = await asyncio.to_thread(detail.list_files, src.rollout_dir(rid))
    calls = sorted(src.calls_by_rollout.get(rid, []), key=lambda c: (c.call_index, c.offset))
    return _html(detail.rollout_page(run, src, row, res, calls, files, v.multi))


async def heldout_page(req: web.Request) -> web.Response:
    v = await _fresh(req)
    run = v.run(req.query.get("run"))
    raw = req.query.get("versions", "").replace(" ", "")
    try:
        versions = [int(x) for x in raw.split(",") if x] or None
    except ValueError:
        raise BadRequest(f"versions={raw!r}: expected comma-separated version numbers") from None
    return _html(pages.heldout_page(run, Q.heldout(run), versions, req.query.get("changed") == "1",
                                    _int(req, "page", 0), v.multi))


async def metrics_page(req: web.Request) -> web.Response:
    v = await _fresh(req)
    run = v.run(req.query.get("run"))
    keys = charts.numeric_keys(run.metrics)
    extra = [tuple(k.split(":", 1)) for k in req.query.getall("key", []) if ":" in k]
    return _html(pages.metrics_page(run, charts.metric_charts(run.metrics, extra), keys, v.multi))


async def file_view(req: web.Request) -> web.StreamResponse:
    """A file of one rollout's dir (a log, a screenshot): only regular files inside that dir, text as plain text."""
    v = await _fresh(req)
    run = v.run(req.query.get("run"))
    src = v.source(run, req.query.get("source"))
    rid, rel = req.query.get("id", ""), req.query.get("path", "")
    if rid not in src.rows:
        raise NotFound(f"no rollout {rid!r} in the {src.label} log of run {run.name!r}")
    base = src.rollout_dir(rid).resolve()
    path = (base / rel).resolve()
    if not rel or not path.is_relative_to(base) or not path.is_file():
        raise NotFound(f"rollout {rid!r} has no file {rel!r}")
    if path.stat().st_size > MAX_FILE:
        raise NotFound(f"{rel}: larger than {MAX_FILE >> 20} MiB; open it from the workdir")
    data = await asyncio.to_thread(path.read_bytes)
    kind = mimetypes.guess_type(path.name)[0] or ""
    if kind.startswith("image/") and kind != "image/svg+xml":
        return web.Response(body=data, content_type=kind)
    return web.Response(text=data.decode("utf-8", "replace"), content_type="text/plain", charset="utf-8")


async def static_css(req: web.Request) -> web.Response:
    """The stylesheet as a bare static response (the bench's baseline for a page's cost)."""
    return web.Response(text=pages.CSS, content_type="text/css")


def make_app(root: str | os.PathLike) -> web.Application:
    """The viewer over `root` (a run, a launch.eval --out dir, or a folder of runs); FileNotFoundError if missing."""
    app = web.Application(middlewares=[_errors])
    app[VIEWER] = Viewer(root)
    for path, h in [("/", index_page), ("/run", run_page), ("/rollouts", rollouts_page), ("/step", step_page),
                    ("/group", group_page), ("/rollout", rollout_page), ("/heldout", heldout_page),
                    ("/metrics", metrics_page), ("/file", file_view), ("/static/viewer.css", static_css)]:
        app.router.add_get(path, h)
    return app


async def start(root: str | os.PathLike, host: str = "127.0.0.1", port: int = 0) -> tuple[web.AppRunner, str]:
    """Starts the viewer in the running loop; (runner, base URL). `port=0`: a free port. Stop: runner.cleanup()."""
    app = make_app(root)
    await app[VIEWER].index.refresh()
    await app[VIEWER].warm()
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    h, p = runner.addresses[0][:2]
    return runner, f"http://{'127.0.0.1' if h in ('0.0.0.0', '::') else h}:{p}"


class Background:
    """The viewer on a free port in a thread of its own (tests, the bench): `with Background(root) as url: ...`."""

    def __init__(self, root: str | os.PathLike, host: str = "127.0.0.1"):
        self.root, self.host = root, host
        self.loop = asyncio.new_event_loop()
        self.runner: web.AppRunner | None = None
        self.url = ""
        self._thread = threading.Thread(target=self.loop.run_forever, name="inspect-server", daemon=True)

    def __enter__(self) -> str:
        self._thread.start()
        self.runner, self.url = asyncio.run_coroutine_threadsafe(start(self.root, self.host), self.loop).result(120)
        return self.url

    def __exit__(self, *exc) -> None:
        if self.runner is not None:
            asyncio.run_coroutine_threadsafe(self.runner.cleanup(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(60)
        self.loop.close()


def serve(root: str | os.PathLike, host: str = "127.0.0.1", port: int = 8765) -> None:
    """Serves until interrupted (the launcher's one call)."""
    root = pathlib.Path(root)

    async def main() -> None:
        runner, base = await start(root, host, port)
        runs = sorted(runner.app[VIEWER].index.runs)
        print(f"inspect: {root} ({len(runs)} run(s){': ' + ', '.join(runs[:5]) if runs else ', waiting for one'}) "
              f"at {base}/", flush=True)
        try:
            await asyncio.Event().wait()
        finally:
            await runner.cleanup()

    try:
        asyncio.run(main())
    except KeyboardInterrupt:
        pass
