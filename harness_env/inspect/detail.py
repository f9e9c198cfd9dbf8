"""The two detail pages: one rollout (transcript, verifier, files, screenshots, calls) and one group (its tree).

Why the group's tree is drawn by a script from embedded JSON while the token view is plain HTML: a tree's shape
wants a layout pass (nesting, folding) that HTML lists + a few lines of script do well, and the JSON is the same
data the tests compare with build_tree; the token view is long text, cheapest as server-rendered spans.
"""

from __future__ import annotations

import json
import pathlib

from harness_env.inspect import tree_view as T
from harness_env.inspect.index import CallRef, Row, Run, Source
from harness_env.inspect.pages import esc, fmt, kv_table, layout, link, rollout_rows, status_html, table, url
from research.capture import RolloutResult

TREE_JS = """
(function(){
var d=JSON.parse(document.getElementById('tree-data').textContent),kids={};
d.segments.forEach(function(s){(kids[s.parent]=kids[s.parent]||[]).push(s);});
function f(x){return x===null||x===undefined?'—':(+x).toPrecision(3);}
function node(s){
  var li=document.createElement('li'),div=document.createElement('div');
  div.className='tnode '+(s.gen?'gen':'ctx');div.dataset.seg=s.id;div.dataset.tokens=s.len;
  var a=document.createElement('a');a.href='?'+new URLSearchParams(Object.assign(Object.fromEntries(
    new URLSearchParams(location.search)),{tpage:s.page})).toString()+'#seg-'+s.id;
  a.textContent=(s.gen?'generated':'context')+' · '+s.len+' tok';div.appendChild(a);
  var info=' · '+s.calls+' calls · '+s.rollouts.join(',')+' · reward '+f(s.reward);
  if(s.gen)info+=' · adv '+f(s.adv)+' · push '+f(s.push)+' · logp '+f(s.lp)+(s.dl===null?'':' · Δlogp '+f(s.dl));
  if(s.ends.length)info+=' · ends '+s.ends.join(',');
  div.appendChild(document.createTextNode(info));
  if(s.gen&&s.adv!==null)div.style.borderColor=s.adv>0?'#2a9d4b':(s.adv<0?'#d33':'#ccc');
  var t=document.createElement('div');t.className='txt';t.textContent=s.text;div.appendChild(t);
  li.appendChild(div);var ks=kids[s.id];
  if(ks){var ul=document.createElement('ul');ul.className='tree';ks.forEach(function(k){ul.appendChild(node(k));});
    li.appendChild(ul);}
  return li;}
var root=document.getElementById('tree'),ul=document.createElement('ul');ul.className='tree top';
(kids[-1]||[]).forEach(function(s){ul.appendChild(node(s));});root.appendChild(ul);
document.getElementById('tree-count').textContent=d.segments.length+' segments drawn, '+d.nodes+' token nodes';
var v=document.getElementById('tokview');document.querySelectorAll('input[name=colour]').forEach(function(r){
  r.onchange=function(){v.className='tokens by-'+r.value;};});
})();
"""


def _content(c) -> str:  # noqa: ANN001 - str, or a harness's list of content blocks
    return c if isinstance(c, str) else json.dumps(c, indent=1, ensure_ascii=False)


def _tool_call(call) -> str:  # noqa: ANN001
    fn = call.get("function", call) if isinstance(call, dict) else {}
    name, args = fn.get("name", "?"), fn.get("arguments", fn.get("input", ""))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            pass
    if isinstance(args, dict) and set(args) == {"command"}:
        args = args["command"]
    body = args if isinstance(args, str) else json.dumps(args, indent=1, ensure_ascii=False)
    return f'<div class="call">tool call <b>{esc(str(name))}</b><pre>{esc(body)}</pre></div>'


def transcript_html(transcript: list) -> str:
    out = []
    for i, m in enumerate(transcript):
        if not isinstance(m, dict):
            out.append(f"<pre>{esc(_content(m))}</pre>")
            continue
        role = str(m.get("role", "?"))
        extra = f' · call {esc(str(m["tool_call_id"]))}' if m.get("tool_call_id") else ""
        if "ok" in m:
            extra += " · ok" if m["ok"] else ' · <span class="st-bad">failed</span>'
        body = f"<pre>{esc(_content(m.get('content', '')))}</pre>" if m.get("content") not in (None, "") else ""
        calls = "".join(_tool_call(c) for c in m.get("tool_calls") or [])
        out.append(f'<div class="msg {esc(role)}" data-i="{i}"><span class="role">{esc(role)}</span>{extra}'
                   f"{body}{calls}</div>")
    return "".join(out) or '<p class="muted">empty transcript</p>'


def rollout_page(run: Run, src: Source, row: Row, res: RolloutResult, calls: list[CallRef], files: list[str],
                 multi: bool) -> str:
    meta = dict(res.meta or {})
    hm = meta.pop("harness_meta", {}) or {}
    transcript = hm.get("transcript") if isinstance(hm, dict) else None
    facts = {"status": res.status, "reward": res.reward, "cause": meta.get("cause"), "why": meta.get("cause_why"),
             "message": res.message or None, "group": res.group_id, "harness": res.harness, "log": src.label,
             "step": row.step if row.step >= 0 else None,
             "update (ledger)": "{1} at step {0}".format(*run.ledger[row.rid]) if row.rid in run.ledger else None,
             **{k: meta.get(k) for k in (
                 "task_id", "category", "sample", "attempts", "calls", "num_turns", "exit_code", "oom_killed",
                 "backend", "serving_faults")}}
    body = [f"<p>{status_html(res.status)} · "
            + link(url("/group", run=run.name, source=src.key, group=res.group_id), "group tree") + "</p>",
            '<div class="row"><div>', kv_table({k: v for k, v in facts.items() if v is not None}), "</div><div>",
            "<h2>verifier sub-scores</h2>" + kv_table(res.sub_scores), "<h2>timings (s)</h2>" + kv_table(res.timings),
            "</div></div>"]
    body.append("<h2>transcript</h2>" + (transcript_html(transcript) if isinstance(transcript, list) else
                                        '<p class="muted">the harness recorded no transcript; see its logs</p>'))
    if meta.get("final_message"):
        body.append(f'<h2>final answer</h2><pre class="final">{esc(str(meta["final_message"]))}</pre>')
    tools = hm.get("tool_calls") if isinstance(hm, dict) else None
    if tools:
        body.append(f"<p>tools used: {esc(', '.join(map(str, tools)))}</p>")
    body.append(_files_html(run, src, res, meta, files))
    body.append("<h2>model calls</h2>" + table(
        ["call", "prompt tok", "completion tok", "weight version", "finish", "status", "latency s"],
        ([f'<span class="num">{c.call_index}</span>', f'<span class="num">{c.prompt_len}</span>',
          f'<span class="num">{c.completion_len}</span>', f'<span class="num">{c.version}</span>', esc(c.finish),
          status_html(c.status), f'<span class="num">{fmt(c.latency_s)}</span>'] for c in calls), "calls"))
    rest = {k: v for k, v in meta.items() if k not in facts}
    body.append("<details><summary>all meta</summary><pre>"
                + esc(json.dumps(rest, indent=1, ensure_ascii=False, default=str)) + "</pre></details>")
    return layout(f"rollout {res.rollout_id}", "".join(body), run, multi)


def _files_html(run: Run, src: Source, res: RolloutResult, meta: dict, files: list[str]) -> str:
    out = ["<h2>workspace changes</h2>", _changes_table(meta)]
    changed = meta.get("inputs_changed") or []
    out.append(f"<p>input files changed: {esc(', '.join(map(str, changed))) if changed else 'none'}</p>")
    if meta.get("tampered"):
        out.append(f'<p class="st-bad">tampered: {esc(json.dumps(meta["tampered"]))}</p>')
    ws = [f for f in files if f.startswith("workspace/")]
    if ws:
        out.append("<p>kept workspace: " + ", ".join(_file_link(run, src, res, f) for f in ws) + "</p>")
    if meta.get("web"):
        out.append("<h2>web</h2>" + kv_table(meta["web"]))
    shots = [f for f in files if f.endswith(".png")]
    if shots:
        out.append("<h2>screenshots</h2>" + "".join(
            f'<a href="{esc(_file_url(run, src, res, f))}"><img class="shot" alt="{esc(f)}" '
            f'src="{esc(_file_url(run, src, res, f))}"></a>' for f in shots))
    logs = [f for f in files if not f.startswith("workspace/") and not f.endswith(".png")]
    out.append("<h2>harness logs</h2>" + (" · ".join(_file_link(run, src, res, f) for f in logs) if logs else
                                          '<p class="muted">none kept</p>'))
    return "".join(out)


def _changes_table(meta: dict) -> str:
    """The runner's `workspace_changes` (harness_env/workspace_changes.py): created / modified / deleted files."""
    ch = meta.get("workspace_changes")
    if not isinstance(ch, list):
        return '<p class="muted">the runner recorded no workspace changes (a result from before they were kept)</p>'
    if not ch:
        return "<p>the agent left the workspace as it found it</p>"
    rows = (f'<tr class="change {esc(str(c.get("change")))}" data-path="{esc(str(c.get("path")))}">'
            f'<td>{esc(str(c.get("change")))}</td><td>{esc(str(c.get("path")))}</td><td>{esc(str(c.get("kind")))}</td>'
            f'<td class="num">{esc(fmt(c.get("size")))}</td><td><code>{esc(str(c.get("sha256") or "—"))}</code></td>'
            "</tr>" for c in ch if isinstance(c, dict))
    more = meta.get("workspace_changes_more")
    tail = f'<p class="muted">and {esc(fmt(more))} more, not listed</p>' if more else ""
    return table(["change", "path", "kind", "bytes", "sha256"], rows, "changes") + tail


def _file_url(run: Run, src: Source, res: RolloutResult, rel: str) -> str:
    return url("/file", run=run.name, source=src.key, id=res.rollout_id, path=rel)


def _file_link(run: Run, src: Source, res: RolloutResult, rel: str) -> str:
    return link(_file_url(run, src, res, rel), rel)


def list_files(rdir: pathlib.Path, limit: int = 300) -> list[str]:
    """Files of a rollout's dir (logs, screenshots, a kept workspace), relative, never following links."""
    out: list[str] = []
    if not rdir.is_dir():
        return out
    for p in sorted(rdir.rglob("*")):
        if p.is_file() and not p.is_symlink():
            out.append(p.relative_to(rdir).as_posix())
            if len(out) >= limit:
                break
    return out


def group_page(run: Run, src: Source, gid: str, rows: list[Row], view: T.TreeView | None, why: str,
               text: T.TokenText, tpage: int, multi: bool) -> str:

    if view is None:
        body = [f'<p class="st-bad">no tree: {esc(why)}</p>', rollout_rows(run, rows)]
        return layout(f"group {gid}", "".join(body), run, multi)
    t = view.tree
    facts = (f"{t.num_nodes} token nodes · {view.num_segments} segments · {len(t.calls)} calls of "
             f"{len(view.labels)} rollouts · {view.flat_tokens} flat tokens "
             f"({view.flat_tokens / max(1, t.num_nodes):.2f}x) · advantages: {view.estimator}")
    out = "".join(f"<li>{esc(k)}: {esc(v)}</li>" for k, v in view.excluded.items())
    labels = " · ".join(f"{esc(lab)} = {link(url('/rollout', run=run.name, source=src.key, id=r), r)}"
                        for r, lab in view.labels.items())
    pages = T.token_pages(view)
    nav = " ".join(link(url("/group", run=run.name, source=src.key, group=gid, tpage=p), str(p + 1))
                   if p != tpage else f"<b>{p + 1}</b>" for p in range(pages))
    body = [f'<p class="facts" data-nodes="{t.num_nodes}" data-segments="{view.num_segments}">{esc(facts)}</p>',
            f"<p>{labels}</p>", f"<p>not in the tree:</p><ul>{out}</ul>" if out else "",
            '<h2>prefix tree</h2><p class="muted" id="tree-count">the tree is drawn by the page\'s script</p>'
            '<div id="tree"></div>',
            f'<script type="application/json" id="tree-data">{T.tree_json(view, text)}</script>',
            '<h2>tokens</h2><p>colour generated tokens by <label><input type="radio" name="colour" value="lp" '
            'checked> behaviour logprob</label> <label><input type="radio" name="colour" value="ad"> advantage'
            '</label> <label><input type="radio" name="colour" value="dl"'
            f'{"" if view.node_dlogp is not None else " disabled"}> Δlogprob (after the step)</label> · token page '
            f'{nav}</p><p class="muted" id="dlogp-note">Δlogprob: {esc(view.dlogp_note)}</p>',
            f'<div id="tokview" class="tokens by-lp" data-page="{tpage}">{T.token_html(view, text, tpage)}</div>',
            "<h2>rollouts</h2>" + rollout_rows(run, rows), f"<script>{TREE_JS}</script>"]
    return layout(f"group {gid}", "".join(body), run, multi)
