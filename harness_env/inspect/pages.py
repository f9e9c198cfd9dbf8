"""Server-side HTML of the viewer's pages: plain HTML, a little inline CSS and script, nothing fetched.

Every value from the workdir (ids, transcripts, tool output, file names) goes through `esc` (html.escape): a
policy's output is untrusted text and must never become markup in the page of the person reading it.
"""

from __future__ import annotations

import html
import json
import math
from collections.abc import Iterable
from urllib.parse import urlencode

from harness_env.inspect import queries as Q
from harness_env.inspect.index import Row, Run, Source

PER_PAGE = 50
esc = html.escape

CSS = """
body{font:13px/1.45 system-ui,sans-serif;margin:0;color:#222;background:#fff}
header{background:#2b3a4a;color:#fff;padding:6px 14px;display:flex;gap:16px;align-items:center}
header a{color:#cfe3ff;text-decoration:none}header b{margin-right:10px}
main{padding:10px 16px}h1{font-size:18px;margin:8px 0}h2{font-size:15px;margin:18px 0 6px}
table{border-collapse:collapse;margin:4px 0}td,th{border:1px solid #ddd;padding:3px 7px;text-align:left;
vertical-align:top}th{background:#f3f5f7}tr:nth-child(even) td{background:#fbfbfb}
.num{text-align:right;font-variant-numeric:tabular-nums}.muted{color:#777}
.st-ok{color:#137333}.st-bad{color:#b3261e;font-weight:600}.pass{background:#e6f4ea!important}
.fail{background:#fce8e6!important}pre{white-space:pre-wrap;word-break:break-word;margin:2px 0;
background:#f6f8fa;padding:5px;border-radius:3px;max-height:420px;overflow:auto}
.msg{border-left:3px solid #ccc;padding:2px 8px;margin:6px 0}.msg.user{border-color:#1a73e8}
.msg.assistant{border-color:#137333}.msg.tool{border-color:#e37400}.role{font-weight:600}
form.filters{display:flex;flex-wrap:wrap;gap:8px;align-items:end;margin:6px 0}
form.filters label{display:flex;flex-direction:column;font-size:11px;color:#555}
.pager{margin:6px 0}.pager a,.pager span{margin-right:10px}
.chart{display:inline-block;vertical-align:top;margin:6px 12px 6px 0}.chart svg text{font-size:10px;fill:#555}
figcaption{font-weight:600}.empty{color:#999;width:440px;height:150px;padding-top:40px;text-align:center;
background:#fafafa}
ul.tree{list-style:none;padding-left:18px;margin:0;border-left:1px dotted #bbb}
ul.tree.top{border:none;padding-left:0}
.tnode{display:inline-block;margin:2px 0;padding:2px 6px;border:1px solid #ccc;border-radius:4px;max-width:900px}
.tnode.ctx{background:#f1f3f4}.tnode.gen{background:#e8f0fe}.tnode .txt{color:#444;font-family:monospace}
.tokens{font-family:monospace;white-space:pre-wrap;word-break:break-all;line-height:1.7}
.seg{margin:6px 0;padding:4px;border:1px solid #eee}.seghead{font:11px system-ui;color:#666}
.tok.ctx{color:#777}.by-lp .tok.gen{background:var(--lp)}.by-ad .tok.gen{background:var(--ad)}
.by-dl .tok.gen{background:var(--dl)}
.tok:hover{outline:1px solid #333}.ans{max-height:140px;overflow:auto;white-space:pre-wrap;font-family:monospace}
img.shot{max-width:420px;border:1px solid #ccc;margin:4px}.small svg{width:350px;height:auto}
.small .empty{width:350px}.row{display:flex;gap:24px;flex-wrap:wrap;align-items:flex-start}
"""

LIVE_JS = """
(function(){var b=document.getElementById('live');if(!b)return;b.checked=localStorage.getItem('hrl-live')==='1';
b.onchange=function(){localStorage.setItem('hrl-live',b.checked?'1':'0');};
setInterval(function(){if(b.checked)location.reload();},5000);})();
"""


def url(route: str, **params) -> str:
    q = urlencode({k: v for k, v in params.items() if v is not None and v != ""})
    return f"{route}?{q}" if q else route


def link(href: str, text: str) -> str:
    return f'<a href="{esc(href)}">{esc(text)}</a>'


def fmt(x) -> str:  # noqa: ANN001
    if x is None:
        return "—"
    if isinstance(x, float):
        return "nan" if math.isnan(x) else f"{x:.4g}"
    return str(x)


def status_html(status: str) -> str:
    return f'<span class="{"st-ok" if status == "ok" else "st-bad"}">{esc(status)}</span>'


def table(headers: list[str], rows: Iterable[list[str]], cls: str = "") -> str:
    """Headers are escaped here; cells are HTML already (escape values with esc/fmt before)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in headers)
    body = "".join(r if isinstance(r, str) else "<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    return f'<table class="{esc(cls)}"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def kv_table(d: dict) -> str:
    if not d:
        return '<p class="muted">none</p>'
    return table(["key", "value"], ([esc(str(k)), f'<span class="num">{esc(fmt(v))}</span>'
                                     if isinstance(v, int | float) else esc(json.dumps(v) if not isinstance(v, str)
                                                                            else v)] for k, v in d.items()))


def layout(title: str, body: str, run: Run | None = None, multi: bool = False) -> str:
    nav = [link("/", "runs")] if multi else []
    if run is not None:
        r = run.name
        nav += [link(url("/run", run=r), "run"), link(url("/rollouts", run=r), "rollouts"),
                link(url("/heldout", run=r), "held-out"), link(url("/metrics", run=r), "metrics")]
    return (f'<!doctype html><html><head><meta charset="utf-8"><title>{esc(title)}</title>'
            f'<style>{CSS}</style></head><body><header><b>harness-rl inspect</b>{" ".join(nav)}'
            f'<span style="margin-left:auto"><label><input type="checkbox" id="live"> live (5 s)</label></span>'
            f'</header><main><h1>{esc(title)}</h1>{body}</main><script>{LIVE_JS}</script></body></html>')


def run_title(run: Run) -> str:
    return run.dir.name if run.name == "." else run.name


def updates_text(s: Q.Summary) -> str:
    """Which update steps trained on (or dropped) these rollouts (ledger.jsonl)."""
    return ", ".join(f"{fate} at {step}: {n}" for (step, fate), n in sorted(s.updates.items()))


def error_page(status: int, message: str) -> str:
    return layout(f"{status}", f'<p class="st-bad">{esc(message)}</p><p>{link("/", "back to the runs")}</p>')


def pager(path: str, params: dict, page: int, total: int, per: int = PER_PAGE) -> str:
    pages = max(1, -(-total // per))
    lo, hi = page * per + 1, min(total, (page + 1) * per)
    shown = f"rows {lo}–{hi} of {total}" if lo <= hi else f"no rows here: {total} in all"
    out = [f'<div class="pager"><span>{shown} (page {page + 1}/{pages})</span>']
    if page > 0:
        out.append(link(url(path, **params, page=page - 1), "‹ prev"))
    if page + 1 < pages:
        out.append(link(url(path, **params, page=page + 1), "next ›"))
    return "".join(out) + "</div>"


# ---------------------------------------------------------------------------------------------- runs, steps
def runs_page(runs: list[Run]) -> str:
    rows = []
    for r in runs:
        n = sum(len(s.rows) for s in r.sources.values())
        last = next((m for m in reversed(r.metrics) if m.get("kind") == "train"), {})
        rows.append([link(url("/run", run=r.name), run_title(r)), esc(str(r.dir)), f'<span class="num">{n}</span>',
                     esc(", ".join(s.label for s in r.sources.values())), esc(fmt(last.get("step"))),
                     esc(fmt(last.get("rollout/all/reward")))])
    return layout("runs", table(["run", "dir", "rollouts", "logs", "last train step", "reward"], rows), multi=True)


def run_page(run: Run, summaries: list[Q.Summary], page: int, multi: bool, curves: str = "") -> str:
    cfg = run.config
    facts = {"dir": str(run.dir), "config": cfg.get("name"), "algo": cfg.get("algo"),
             "estimator": (cfg.get("rl") or {}).get("estimator"), **run.summary}
    last = {k: v for k, v in (next((m for m in reversed(run.metrics) if m.get("kind") == "eval"), {})).items()
            if k in ("step", "eval/all/pass_rate", "eval/all/reward")}
    srcs = [[esc(s.key), esc(s.label), f'<span class="num">{len(s.rows)}</span>',
             f'<span class="num">{len(s.calls_by_group)}</span>',
             f'<span class="num">{sum(map(len, s.calls_by_group.values()))}</span>',
             esc(str(s.capture or "none")), f'<span class="num">{s.bad_lines}</span>'] for s in run.sources.values()]
    body = ['<div class="row"><div>', kv_table({k: v for k, v in facts.items() if v is not None}),
            "<h2>latest held-out eval</h2>" + kv_table(last), f'</div><div class="small">{curves}</div></div>',
            "<h2>rollout logs</h2>" + table(["dir", "kind", "rollouts", "groups", "calls", "capture log",
                                              "unreadable lines"], srcs),
            "<h2>steps</h2>" + steps_table(run, summaries[page * PER_PAGE:(page + 1) * PER_PAGE]),
            pager("/run", {"run": run.name}, page, len(summaries))]
    return layout(f"run {run_title(run)}", "".join(body), run, multi)


def steps_table(run: Run, summaries: list[Q.Summary]) -> str:
    rows = []
    for s in summaries:
        src, step = s.key
        rows.append([esc(run.sources[src].label), link(url("/step", run=run.name, source=src, step=step),
                                                       fmt(step) if step >= 0 else "all"),
                     f'<span class="num">{len(s.groups)}</span>', f'<span class="num">{s.rollouts}</span>',
                     f'<span class="num">{fmt(s.mean_reward)}</span>',
                     f'<span class="num">{fmt(s.passed / s.rollouts if s.rollouts else None)}</span>',
                     esc(", ".join(f"{k} {v}" for k, v in sorted(s.statuses.items()))),
                     esc(", ".join(sorted(s.harnesses))), esc(updates_text(s))])
    return table(["log", "step", "groups", "rollouts", "mean reward (ok)", "pass rate", "statuses", "harnesses",
                  "update (ledger)"], rows, "steps")


def step_page(run: Run, src: Source, step: int | None, summaries: list[Q.Summary], page: int, multi: bool) -> str:
    rows = []
    for s in summaries[page * PER_PAGE:(page + 1) * PER_PAGE]:
        gid, task, harness = s.key
        rows.append(f'<tr class="group" data-group="{esc(gid)}"><td>'
                    + link(url("/group", run=run.name, source=src.key, group=gid), gid) + "</td>"
                    + "".join(f"<td>{c}</td>" for c in [
                        esc(task), esc(harness), f'<span class="num">{s.rollouts}</span>',
                        esc(" ".join(fmt(r) for r in s.rewards)), f'<span class="num">{fmt(s.mean_reward)}</span>',
                        esc(", ".join(f"{k} {v}" for k, v in sorted(s.statuses.items()))),
                        esc(updates_text(s))]) + "</tr>")
    title = f"{src.label} step {step if step is not None and step >= 0 else 'all'}"
    more = link(url("/rollouts", run=run.name, source=src.key, step=step), "its rollouts")
    nav = pager("/step", {"run": run.name, "source": src.key, "step": step}, page, len(summaries))
    return layout(title, f"<p>{more}</p>" + nav + table(["group", "task", "harness", "rollouts", "rewards (ok)",
                                                         "mean", "statuses", "update (ledger)"], rows, "groups"),
                  run, multi)


# ---------------------------------------------------------------------------------------------- rollout lists
def rollout_rows(run: Run, rows: list[Row]) -> str:
    out = []
    for r in rows:
        cls = "pass" if Q.passed(r) else ""
        cells = [link(url("/rollout", run=run.name, source=r.source, id=r.rid), r.rid),
                 link(url("/group", run=run.name, source=r.source, group=r.gid), r.gid), esc(r.harness),
                 esc(r.task), status_html(r.status), f'<span class="num">{fmt(r.reward)}</span>',
                 esc(r.cause), f'<span class="num">{fmt(r.total_s)}</span>']
        out.append(f'<tr class="rollout {cls}" data-id="{esc(r.rid)}">' + "".join(f"<td>{c}</td>" for c in cells)
                   + "</tr>")
    return table(["rollout", "group", "harness", "task", "status", "reward", "cause", "total s"], out, "rollouts")


def _select(name: str, values: list[str], current: str | None) -> str:
    opts = ['<option value="">any</option>'] + [
        f'<option value="{esc(v)}"{" selected" if v == current else ""}>{esc(v)}</option>' for v in values]
    return f'<label>{esc(name)}<select name="{esc(name)}">{"".join(opts)}</select></label>'


def _input(name: str, value, size: int = 8) -> str:  # noqa: ANN001
    return (f'<label>{esc(name)}<input name="{esc(name)}" size="{size}" '
            f'value="{esc("" if value is None else str(value))}"></label>')


def rollouts_page(run: Run, rows: list[Row], flt: Q.Filter, page: int, multi: bool) -> str:
    opts = Q.options(run)
    form = ('<form class="filters" method="get" action="/rollouts">'
            f'<input type="hidden" name="run" value="{esc(run.name)}">'
            + _select("source", opts["source"], flt.source) + _select("harness", opts["harness"], flt.harness)
            + _select("status", opts["status"], flt.status) + _input("task", flt.task, 20) + _input("step", flt.step, 6)
            + _input("group", flt.group, 30) + _input("rmin", flt.rmin, 5) + _input("rmax", flt.rmax, 5)
            + '<button type="submit">filter</button></form>')
    shown = rows[page * PER_PAGE:(page + 1) * PER_PAGE]
    params = {"run": run.name, **flt.query()}
    return layout("rollouts", form + pager("/rollouts", params, page, len(rows)) + rollout_rows(run, shown)
                  + pager("/rollouts", params, page, len(rows)), run, multi)


# ---------------------------------------------------------------------------------------------- held-out, metrics
def heldout_page(run: Run, h: Q.Heldout, versions: list[int] | None, changed: bool, page: int, multi: bool) -> str:
    """Task x version; `versions`: the columns (default: the first and the latest five); `changed`: only the rows
    whose verdict differs between the shown versions."""
    if not h.keys:
        return layout("held-out answers", '<p class="muted">no held-out eval rollouts yet</p>', run, multi)
    shown = [v for v in versions if v in h.versions] if versions else (
        h.versions if len(h.versions) <= 6 else [h.versions[0], *h.versions[-5:]])
    verdicts = lambda k: {Q.passed(r) for v in shown for r in h.cells.get((*k, v), [])}
    keys = [k for k in h.keys if not changed or len(verdicts(k)) > 1]
    rows = []
    for task, harness in keys[page * PER_PAGE:(page + 1) * PER_PAGE]:
        cells = [esc(task), esc(harness)]
        for v in shown:
            rs = h.cells.get((task, harness, v), [])
            cells.append("".join(_heldout_cell(run, r, v) for r in rs) or '<span class="muted">—</span>')
        rows.append(cells)
    totals = ["<b>pass rate</b>", f"{len(keys)} rows"] + [
        fmt(sum(Q.passed(r) for k in keys for r in h.cells.get((*k, v), []))
            / max(1, sum(len(h.cells.get((*k, v), [])) for k in keys))) for v in shown]
    form = ('<form class="filters" method="get" action="/heldout">'
            f'<input type="hidden" name="run" value="{esc(run.name)}">'
            + _input("versions", ",".join(map(str, shown)), 24)
            + f'<label>verdict changed<input type="checkbox" name="changed" value="1"{" checked" if changed else ""}>'
            f'</label><button type="submit">show</button></form>'
            f'<p class="muted">versions with held-out evals: {esc(", ".join(map(str, h.versions)))}</p>')
    params = {"run": run.name, "versions": ",".join(map(str, shown)), "changed": "1" if changed else None}
    head = ["task", "harness"] + [f"v{v}" if v >= 0 else "all" for v in shown]
    return layout("held-out answers", form + pager("/heldout", params, page, len(keys))
                  + table(head, [*rows, totals], "heldout"), run, multi)


def _heldout_cell(run: Run, r: Row, version: int) -> str:
    ok = Q.passed(r)
    rlink = link(url("/rollout", run=run.name, source=r.source, id=r.rid), fmt(r.reward))
    return (f'<div class="cell {"pass" if ok else "fail"}" data-task="{esc(r.task)}" data-harness="{esc(r.harness)}" '
            f'data-version="{version}" data-id="{esc(r.rid)}">{"PASS" if ok else "fail"} · {rlink} · '
            f'{status_html(r.status)}<div class="ans">{esc(r.answer)}</div></div>')


def metrics_page(run: Run, charts_html: str, keys: list[tuple[str, str]], multi: bool) -> str:
    picker = "".join(f'<option value="{esc(k)}:{esc(n)}">{esc(k)}: {esc(n)}</option>' for k, n in keys)
    form = (f'<form class="filters" method="get" action="/metrics"><input type="hidden" name="run" '
            f'value="{esc(run.name)}"><label>add a chart<select name="key">{picker}</select></label>'
            '<button type="submit">plot</button></form>')
    n = {k: sum(1 for m in run.metrics if m.get("kind") == k) for k in ("sft", "train", "eval")}
    return layout("metrics", f'<p class="muted">{esc(json.dumps(n))} records in metrics.jsonl</p>' + form
                  + charts_html, run, multi)
