"""The read-only run viewer (harness_env/inspect, `python -m launch.inspect`) on a real `demo_cpu:test` run.

One run per module (2 SFT steps, 2 RL steps, held-out evals after each RL step: two versions; an entropy bonus and
a KL penalty, and no skip of signal-free steps, so that the random policy's updates move its log-probs), the
viewer in a thread on a free port, pages fetched with aiohttp and compared with what the workdir's logs say, read
with the project's own readers (research.capture.read_log, research.trees.builder.build_tree): rollouts per step,
the prefix tree's node and segment counts, one token span per tree node in DFS order, the Δlogprob of each token
against a flat forward of the checkpoint the update wrote, the held-out table's answers, the metrics charts. A
real `launch.eval --out` dir (oracle policy, two harnesses) for the harness filter and the workspace changes.
Headless Chromium proves the page's script draws the tree and that the token spans and held-out cells reach the
browser's DOM, and takes screenshots of the main views (docs/inspect/ holds one per view; HRL_WRITE_DOCS=1 writes
them there).
"""

import asyncio
import collections
import hashlib
import html
import json
import os
import pathlib
import re
import shutil
import struct
import subprocess
import sys

import aiohttp
import numpy as np
import pytest

from harness_env.inspect.index import ANSWER_CHARS, ID_RE, WorkdirIndex, answer_of
from harness_env.inspect.server import Background
from harness_env.sandbox import get_backend
from harness_env.web import browser
from research.capture import CallRecord, RolloutResult, read_log
from research.trees.builder import build_tree
from research.trees.targets import rollout_advantages

pytestmark = pytest.mark.slow
ROOT = pathlib.Path(__file__).resolve().parents[1]
SHOTS = ROOT / "docs" / "inspect"
GROUPS_PER_STEP, GROUP_SIZE = 2, 2  # demo_cpu:test's rollout.groups_per_step / group_size
HARNESSES = ("reference", "reference_bash")  # the eval dir's
VIEWS = ("overview", "rollout", "tree", "heldout", "metrics")  # the screenshots, one per file of docs/inspect/


@pytest.fixture(scope="module")
def run_cfg():
    from configs import demo_cpu

    cfg = demo_cpu.get_config("test")
    assert (cfg.rollout.groups_per_step, cfg.rollout.group_size) == (GROUPS_PER_STEP, GROUP_SIZE)
    cfg.sft.steps = 2
    cfg.train.steps = 2
    cfg.train.skip_empty = False  # the random policy's groups carry no GRPO signal: the bonus and KL still step
    cfg.rl.update(entropy_coef=0.05, kl_coef=0.01)
    cfg.eval.update(every=1, num_tasks=2)
    return cfg


@pytest.fixture(scope="module")
def workdir(tmp_path_factory, run_cfg) -> pathlib.Path:
    from harness_env.rl.loop import train

    ok, why = get_backend("bwrap").available()
    if not ok:
        pytest.skip(why)
    wd = tmp_path_factory.mktemp("inspect") / "run"
    train(run_cfg, wd)
    return wd


@pytest.fixture(scope="module")
def eval_out(tmp_path_factory) -> pathlib.Path:
    """A real `launch.eval --out` dir: 2 held-out make_file tasks x 2 harnesses x k=2, oracle policy, workspaces
    kept (the test compares the recorded workspace changes with them)."""
    from harness_env.eval.run import build_engine, evaluate, task_dirs
    from harness_env.runner import RunnerConfig
    from research.models.tokenizer import load_tokenizer

    ok, why = get_backend("bwrap").available()
    if not ok:
        pytest.skip(why)
    tmp = tmp_path_factory.mktemp("inspect_eval")
    tok = load_tokenizer(None)
    cfg = RunnerConfig(out_dir=tmp / "out", concurrency=4, timeout_s=60, progress=False, keep_workspaces=True)
    asyncio.run(evaluate(tasks=task_dirs("family:heldout:2", tmp), harnesses=list(HARNESSES), k=2,
                         engine=build_engine("oracle", tok), tok=tok, out=tmp / "out", cfg=cfg))
    return tmp / "out"


@pytest.fixture(scope="module")
def url(workdir):
    with Background(workdir) as base:
        yield base


def get(url: str) -> tuple[int, str, str]:
    async def go():
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            return r.status, r.headers.get("Content-Type", ""), await r.text(errors="replace")

    return asyncio.run(go())


def get_with_headers(url: str) -> tuple[int, dict[str, str], str]:
    async def go():
        async with aiohttp.ClientSession() as s, s.get(url) as r:
            return r.status, dict(r.headers), await r.text(errors="replace")

    return asyncio.run(go())


def page(base: str, path: str) -> str:
    status, _, body = get(base + path)
    assert status == 200, body[-2000:]
    return body


def q(**kw) -> str:
    from urllib.parse import urlencode

    return urlencode(kw)


def results(path: pathlib.Path) -> list[RolloutResult]:
    return [r for r in read_log(path) if isinstance(r, RolloutResult)]


def group_calls(capture: pathlib.Path) -> dict[str, list[CallRecord]]:
    out = collections.defaultdict(list)
    for c in read_log(capture):
        if isinstance(c, CallRecord):
            out[c.group_id].append(c)
    return out


def expected_segments(tree) -> int:
    """Segments per harness_env/inspect/tree_view.py's definition, counted independently of it."""
    kids = collections.Counter(int(p) for p in tree.parent if p >= 0)
    gen, ends = tree.is_generated(), {c.end_node for c in tree.calls}
    return sum(1 for n in range(tree.num_nodes) if tree.parent[n] < 0 or kids[int(tree.parent[n])] != 1
               or int(tree.parent[n]) in ends or gen[n] != gen[int(tree.parent[n])])


def rollouts_through(tree) -> list[set[str]]:
    """Per node, the rollouts with a call whose token path (root .. the call's last token) holds it."""
    out = [set() for _ in range(tree.num_nodes)]
    for c in tree.calls:
        n = int(c.end_node)
        while n >= 0:
            out[n].add(c.rollout_id)
            n = int(tree.parent[n])
    return out


def check_segment_rewards(segs: list[dict], labels: dict[str, str], tree, reward: dict[str, float]) -> int:
    """Each segment's reward in the tree's JSON is the mean reward (per RolloutResult) of the rollouts whose calls
    pass through its nodes, and its rollouts are those; returns how many distinct segment rewards were seen."""
    through = rollouts_through(tree)
    for s in segs:
        a, b = s["start"], s["start"] + s["len"] - 1
        assert through[a] == through[b] and through[a], s  # a segment is a chain: the same rollouts throughout
        assert sorted(labels[x] for x in s["rollouts"]) == sorted(through[a]), s
        assert s["reward"] == pytest.approx(float(np.mean([reward[r] for r in through[a]])), abs=1e-4), s
    return len({s["reward"] for s in segs})


def verifier_rows(body: str) -> dict[str, float]:
    """The rollout page's verifier sub-scores table as {key: value}; {} where the page says none."""
    sec = re.search(r"<h2>verifier sub-scores</h2>(.*?)<h2>timings", body, re.S)[1]
    if sec == '<p class="muted">none</p>':
        return {}
    rows = re.findall(r'<tr><td>([^<]*)</td><td><span class="num">([^<]*)</span></td></tr>', sec)
    assert len(rows) == sec.count("<tr>") - 1, sec  # every row but the header is a key and a number
    return {html.unescape(k): float(v) for k, v in rows}


def shown_tool_calls(body: str) -> list[tuple[str, str]]:
    """(name, arguments) of each tool-call block of the rollout page's transcript, in page order."""
    blocks = re.findall(r'<div class="call">tool call <b>([^<]*)</b><pre>(.*?)</pre></div>', body, re.S)
    assert len(blocks) == body.count('<div class="call">')
    return [(html.unescape(n), html.unescape(a)) for n, a in blocks]


def transcript_tool_calls(transcript: list) -> list[tuple[str, str]]:
    """(name, the command or the JSON arguments) of each OpenAI-style tool call of a harness transcript."""
    out = []
    for m in transcript:
        for c in m.get("tool_calls") or []:
            args = json.loads(c["function"]["arguments"])
            out.append((c["function"]["name"], args["command"] if set(args) == {"command"} else
                        json.dumps(args, indent=1, ensure_ascii=False)))
    return out


def check_rollout_page(body: str, r: RolloutResult) -> int:
    """The page's verifier sub-scores are the result's, and it has a tool-call block per transcript tool call
    (name and command); returns the number of tool calls."""
    assert verifier_rows(body) == pytest.approx(r.sub_scores, rel=5e-4, abs=1e-9)
    assert set(verifier_rows(body)) == set(r.sub_scores)
    want = transcript_tool_calls(r.meta["harness_meta"]["transcript"])
    assert shown_tool_calls(body) == want
    return len(want)


def test_steps_list_every_rollout_of_the_run(workdir, url):
    train = results(workdir / "rollouts" / "results.jsonl")
    by_step = collections.defaultdict(set)
    for r in train:
        by_step[int(ID_RE.match(r.rollout_id).group(2))].add(r.rollout_id)
    assert len(by_step) == 2 and all(len(v) == GROUPS_PER_STEP * GROUP_SIZE for v in by_step.values())
    overview = page(url, "/")
    assert overview.count('<polyline class="series"') >= 2  # the run page's reward and pass-rate curves
    for step, ids in by_step.items():
        assert f'href="/step?run=.&amp;source=rollouts&amp;step={step}"' in overview
        body = page(url, f"/rollouts?{q(source='rollouts', step=step)}")
        listed = re.findall(r'<tr class="rollout[^"]*" data-id="([^"]+)"', body)
        assert len(listed) == GROUPS_PER_STEP * GROUP_SIZE and set(listed) == ids
        body = page(url, f"/step?{q(source='rollouts', step=step)}")
        groups = re.findall(r'<tr class="group" data-group="([^"]+)"', body)
        assert sorted(groups) == sorted({r.group_id for r in train if r.rollout_id in ids})
    everything = page(url, "/rollouts")
    n = sum(len(results(p)) for p in workdir.glob("**/results.jsonl"))
    assert f"of {n} (page 1/1)" in everything and everything.count('<tr class="rollout') == n
    ok = re.findall(r'data-id="([^"]+)"', page(url, f"/rollouts?{q(source='rollouts', status='ok', rmin=0, rmax=0)}"))
    assert set(ok) == {r.rollout_id for r in train if r.status == "ok" and r.reward == 0.0}


def test_group_tree_and_token_view_match_build_tree(workdir, url):
    res = {r.rollout_id: r for r in results(workdir / "rollouts" / "results.jsonl")}
    calls = group_calls(workdir / "capture.jsonl")
    checked = 0
    for gid, cs in sorted(calls.items()):
        ok = [r for r in res.values() if r.group_id == gid and r.status == "ok"]
        use = [c for c in cs if c.rollout_id in {r.rollout_id for r in ok} and c.status == "ok"]
        tree = build_tree(use, ok)
        body = page(url, f"/group?{q(source='rollouts', group=gid)}")
        assert f'data-nodes="{tree.num_nodes}" data-segments="{expected_segments(tree)}"' in body
        data = json.loads(re.search(r'<script type="application/json" id="tree-data">(.*?)</script>', body, re.S)[1])
        segs = data["segments"]
        assert len(segs) == expected_segments(tree) and sum(s["len"] for s in segs) == tree.num_nodes
        assert sum(s["len"] for s in segs if s["gen"]) == int(tree.is_generated().sum())
        assert max(s["calls"] for s in segs) == len(tree.calls) > 1  # the group's calls share their prompt
        spans = re.findall(r'<span class="tok (gen|ctx)"[^>]*title="node (\d+) · id (\d+)', body)
        assert len(spans) == tree.num_nodes  # one span per node: the tree's token count
        assert [int(n) for _, n, _ in spans] == list(range(tree.num_nodes))
        assert [int(t) for _, _, t in spans] == tree.tokens.tolist()
        assert [k == "gen" for k, _, _ in spans] == tree.is_generated().tolist()
        reward = {r.rollout_id: r.reward for r in ok}
        check_segment_rewards(segs, data["labels"], tree, reward)
        (adv,) = rollout_advantages([tree], estimator="grpo")
        by_call = {ci: float(a) for ci, a in zip(tree.occ_call.tolist(), adv.tolist())}
        own = [s for s in segs if s["gen"] and len(s["ends"]) == 1]  # a call's own completion: its rollout's adv
        assert len(own) == len(tree.calls)
        for s in own:
            ci = next(i for i, c in enumerate(tree.calls) if c.end_node == s["start"] + s["len"] - 1)
            assert s["adv"] == pytest.approx(by_call[ci], abs=1e-4)
        checked += 1
    assert checked == 2 * GROUPS_PER_STEP


def flat_logp(params, model_cfg, ids: list[int]) -> np.ndarray:
    """log p(ids[t] | ids[:t]) for t = 1.. by a plain causal forward of the sequence (no tree, no packing)."""
    import jax
    import jax.numpy as jnp

    from research.models import Qwen3
    from research.models.qwen3 import logits

    n = len(ids)
    tok = jnp.asarray([ids], jnp.int32)
    hidden = Qwen3(model_cfg).apply({"params": params}, tok, jnp.arange(n, dtype=jnp.int32)[None],
                                    jnp.ones((1, n), jnp.int32), jnp.full((1, n), n - 1, jnp.int32))
    lp = jax.nn.log_softmax(logits(params, model_cfg, hidden)[0, :-1].astype(jnp.float32), axis=-1)
    return np.asarray(jnp.take_along_axis(lp, tok[0, 1:, None], axis=1)[:, 0])


def test_token_view_dlogp_is_the_updates_new_minus_behaviour_logp(workdir, url, run_cfg):
    """Each generated token's Δlogprob on the group page equals log p under the checkpoint its update wrote (a flat
    forward of each call, independent of the trainer's tree code) minus the engine's log-prob in the capture."""
    from research.rl.trainer import Learner
    from research.train.checkpoint import Checkpointer

    res = {r.rollout_id: r for r in results(workdir / "rollouts" / "results.jsonl")}
    calls = group_calls(workdir / "capture.jsonl")
    updates = [json.loads(line) for line in (workdir / "ledger.jsonl").read_text().splitlines()]
    updates = [u for u in updates if u["phase"] == "rl"]
    assert len(updates) == 2
    learner = Learner(run_cfg)
    checked, biggest = 0, 0.0
    with Checkpointer(workdir / "checkpoints") as ck:
        for u in updates:
            params = ck.restore(learner.abstract, step=u["step"])[0].params
            for gid in sorted({res[r].group_id for r in u["trained"]}):
                ok = [r for r in res.values() if r.group_id == gid and r.status == "ok"]
                use = [c for c in calls[gid] if c.rollout_id in {r.rollout_id for r in ok} and c.status == "ok"]
                tree = build_tree(use, ok)
                by_key = {(c.rollout_id, c.session_id, c.call_index): c for c in use}
                want = np.full(tree.num_nodes, np.nan)
                for ci, info in enumerate(tree.calls):
                    c = by_key[(info.rollout_id, info.session_id, info.call_index)]
                    d = flat_logp(params, learner.model_cfg, c.prompt_ids + c.completion_ids)[len(c.prompt_ids) - 1:]
                    d = d - np.asarray(c.logprobs, np.float32)
                    occ = np.flatnonzero(tree.occ_call == ci)
                    want[tree.occ_node[occ]] = d[tree.occ_pos[occ]]
                body = page(url, f"/group?{q(source='rollouts', group=gid)}")
                got = {int(n): float(v) for v, n in re.findall(r'<span class="tok gen"[^>]*data-dl="([^"]+)" '
                                                                r'title="node (\d+) ', body)}
                gen = np.flatnonzero(tree.is_generated())
                assert sorted(got) == gen.tolist()  # every generated token has its Δlogprob
                np.testing.assert_allclose([got[n] for n in gen], want[gen], rtol=0, atol=5e-5)
                assert f"update {u['step']}: new - behaviour log-prob of {len(gen)} of {len(gen)}" in body
                assert re.search(r'<input type="radio" name="colour" value="dl">', body)  # offered, not disabled
                biggest = max(biggest, float(np.abs(want[gen]).max()))
                checked += 1
    assert checked == 2 * GROUPS_PER_STEP and biggest > 1e-3  # the updates moved the log-probs


def test_rollout_page_shows_transcript_verifier_and_calls(workdir, url):
    r = results(workdir / "rollouts" / "results.jsonl")[0]
    n_calls = sum(c.rollout_id == r.rollout_id for cs in group_calls(workdir / "capture.jsonl").values() for c in cs)
    body = page(url, f"/rollout?{q(source='rollouts', id=r.rollout_id)}")
    transcript = r.meta["harness_meta"]["transcript"]
    assert body.count('<div class="msg ') == len(transcript) >= 2
    for m in transcript:
        assert html.escape(m["content"]) in body
    for key in r.timings:
        assert f"<td>{key}</td>" in body
    assert r.sub_scores == {} and '<h2>verifier sub-scores</h2><p class="muted">none</p>' in body  # make_file: none
    check_rollout_page(body, r)
    n_tools = 0  # every rollout of the run, the oracle's demos (tool calls) included
    for src in ("rollouts", "demos/rollouts", "eval"):
        for x in results(workdir / src / "results.jsonl"):
            n_tools += check_rollout_page(page(url, f"/rollout?{q(source=src, id=x.rollout_id)}"), x)
    demos = results(workdir / "demos" / "rollouts" / "results.jsonl")
    assert n_tools >= len(demos) > 0 and all(transcript_tool_calls(x.meta["harness_meta"]["transcript"])
                                             for x in demos)
    assert re.search(r'<table class="calls">.*?</table>', body, re.S)[0].count("<tr>") == n_calls + 1
    assert "harness logs" in body and "logs/stdout.txt" in body
    status, ctype, text = get(url + f"/file?{q(source='rollouts', id=r.rollout_id, path='logs/invocation.json')}")
    assert status == 200 and ctype.startswith("text/plain") and '"argv"' in text
    for bad in ("../../../config.json", "/etc/passwd", ""):
        assert get(url + f"/file?{q(source='rollouts', id=r.rollout_id, path=bad)}")[0] == 404


def test_heldout_table_shows_each_versions_final_answer(workdir, url):
    evals = results(workdir / "eval" / "results.jsonl")
    versions = {int(ID_RE.match(r.rollout_id).group(2)) for r in evals}
    assert len(versions) == 2 and len(evals) == 2 * 2  # 2 tasks x 2 versions, one harness
    body = page(url, "/heldout")
    cells = re.findall(r'<div class="cell (pass|fail)" data-task="([^"]*)" data-harness="([^"]*)" '
                       r'data-version="(\d+)" data-id="([^"]*)">.*?<div class="ans">(.*?)</div></div>', body, re.S)
    assert len(cells) == len(evals)
    by_id = {r.rollout_id: r for r in evals}
    for verdict, task, harness, version, rid, ans in cells:
        r = by_id[html.unescape(rid)]
        assert (html.unescape(task), html.unescape(harness)) == (r.meta["task_id"], r.harness)
        assert int(version) == int(ID_RE.match(r.rollout_id).group(2))
        assert verdict == ("pass" if r.success() else "fail")
        final = r.meta.get("final_message") or ""
        assert html.unescape(ans) == (final[:ANSWER_CHARS] if final.strip() else answer_of(r.meta))
    assert [f"<th>v{v}</th>" in body for v in sorted(versions)] == [True, True]


def test_metrics_curves_have_a_point_per_record(workdir, url):
    recs = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    body = page(url, "/metrics")
    reward = re.search(r"<figcaption>reward</figcaption>(.*?)</figure>", body, re.S)[1]
    points = dict(re.findall(r'data-name="([^"]+)" data-points="(\d+)"', reward))
    assert int(points["train"]) == sum(r["kind"] == "train" for r in recs) == 2
    assert int(points["held-out"]) == sum(r["kind"] == "eval" for r in recs) == 2
    charts = {"KL": [("kl_ref", "train", "kl_ref"), ("kl_old_new", "train", "kl_old_new"),
                     ("mismatch_k3", "train", "mismatch_k3")],
              "clip fraction": [("clip_frac", "train", "clip_frac")],
              "entropy": [("rl", "train", "entropy"), ("sft", "sft", "entropy")],
              "signal groups": [("signal_groups", "train", "signal_groups"), ("groups", "train", "groups")]}
    for title, spec in charts.items():
        fig = re.search(rf"<figcaption>{title}</figcaption>(.*?)</figure>", body, re.S)[1]
        points = dict(re.findall(r'data-name="([^"]+)" data-points="(\d+)"', fig))
        for name, kind, key in spec:
            want = sum(r["kind"] == kind and isinstance(r.get(key), int | float) for r in recs)
            assert want == 2 and int(points.get(name, 0)) == want, (title, name)
    extra = page(url, f"/metrics?{q(key='train:tree_s')}")
    assert "<figcaption>train: tree_s</figcaption>" in extra


@pytest.fixture(scope="module")
def eval_url(eval_out):
    with Background(eval_out) as base:
        yield base


def test_a_launch_eval_dir_with_two_harnesses_and_the_harness_filter(eval_out, eval_url):
    res = results(eval_out / "results.jsonl")
    assert sorted({r.harness for r in res}) == list(HARNESSES) and len(res) == 2 * len(HARNESSES) * 2
    form = page(eval_url, "/rollouts")
    offered = re.findall(r'<option value="([^"]*)"', re.search(r'<select name="harness">(.*?)</select>', form)[1])
    assert offered == ["", *HARNESSES]
    for h in HARNESSES:
        listed = re.findall(r'<tr class="rollout[^"]*" data-id="([^"]+)"', page(eval_url, f"/rollouts?{q(harness=h)}"))
        assert sorted(listed) == sorted(r.rollout_id for r in res if r.harness == h)
    body = page(eval_url, f"/rollouts?{q(harness=HARNESSES[0], task=res[0].meta['task_id'])}")
    assert body.count('<tr class="rollout') == sum(r.harness == HARNESSES[0] and r.meta["task_id"] ==
                                                    res[0].meta["task_id"] for r in res) == 2
    held = page(eval_url, "/heldout")  # a launch.eval dir: one column, a row per (task, harness)
    assert "<th>all</th>" in held and held.count('<div class="cell pass"') == len(res)
    rows = re.findall(r"<tr><td>([^<]+)</td><td>([^<]+)</td>", held)
    assert sorted(rows) == sorted({(r.meta["task_id"], r.harness) for r in res})
    calls = group_calls(eval_out / "capture.jsonl")
    for gid in sorted({r.group_id for r in res}):
        tree = build_tree(calls[gid], [r for r in res if r.group_id == gid])
        body = page(eval_url, f"/group?{q(source='.', group=gid)}")
        assert f'data-nodes="{tree.num_nodes}"' in body and len(tree.calls) == 2 * 2  # k=2 x the oracle's 2 calls
        assert "Δlogprob: no RL update trains on results rollouts" in body
        assert '<input type="radio" name="colour" value="dl" disabled>' in body


def test_rollout_page_lists_the_files_the_agent_left(eval_out, eval_url):
    """The runner's workspace changes against the kept workspace on disk: path, size and sha256 of each file the
    oracle wrote (the make_file tasks have no inputs: everything there but the grader's reward/ is created)."""
    for r in results(eval_out / "results.jsonl"):
        ws = eval_out / "rollouts" / r.rollout_id / "workspace"
        files = sorted((p.relative_to(ws).as_posix(), p) for p in ws.rglob("*")
                       if p.is_file() and p.relative_to(ws).parts[0] != "reward")
        assert files and r.meta["inputs_changed"] == [] and r.success()
        want = [("created", rel, "file", str(p.stat().st_size), hashlib.sha256(p.read_bytes()).hexdigest()[:12])
                for rel, p in files]
        body = page(eval_url, f"/rollout?{q(source='.', id=r.rollout_id)}")
        tab = re.search(r'<table class="changes">.*?</table>', body, re.S)[0]
        got = re.findall(r'<tr class="change (\w+)" data-path="[^"]*"><td>\w+</td><td>([^<]*)</td><td>(\w+)</td>'
                         r'<td class="num">(\d+)</td><td><code>(\w+)</code></td></tr>', tab)
        assert [(c, html.unescape(path), k, n, h) for c, path, k, n, h in got] == want
        assert "kept workspace: " in body and "workspace/" + files[0][0] in body


def test_errors_are_precise_pages(url):
    status, _, body = get(url + f"/rollout?{q(source='rollouts', id='no.such.rollout')}")
    assert status == 404 and "no.such.rollout" in body
    status, _, body = get(url + f"/run?{q(run='elsewhere')}")
    assert status == 404 and "elsewhere" in body
    status, _, body = get(url + f"/rollouts?{q(rmin='high')}")
    assert status == 400 and "rmin" in body
    status, _, body = get(url + "/no/such/page")
    assert status == 404 and "/no/such/page" in body
    with pytest.raises(FileNotFoundError, match="does not exist"):
        WorkdirIndex("/nonexistent/run")
    r = subprocess.run([sys.executable, "-m", "launch.inspect", "--workdir=/nonexistent/run", "--port=0"], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode != 0 and "workdir /nonexistent/run does not exist" in r.stderr, r.stderr[-2000:]


def test_pages_load_nothing_from_elsewhere(workdir, url):
    """Offline, no CDN: every main view is served under a policy that allows nothing but inline style/script and
    same-origin images, and no page names an external resource."""
    r = results(workdir / "rollouts" / "results.jsonl")[0]
    demo = results(workdir / "demos" / "rollouts" / "results.jsonl")[0]
    views = ["/", f"/run?{q(run='.')}", "/rollouts", f"/step?{q(source='rollouts', step=0)}",
             f"/rollout?{q(source='rollouts', id=r.rollout_id)}",
             f"/rollout?{q(source='demos/rollouts', id=demo.rollout_id)}",
             f"/group?{q(source='rollouts', group=r.group_id)}", "/heldout", "/metrics",
             f"/metrics?{q(key='train:tree_s')}"]
    external = re.compile(r"""(?:\bsrc|\bhref|\baction)\s*=\s*["']?\s*(?:https?:)?//"""
                          r"""|url\(\s*["']?\s*(?:https?:)?//|@import""", re.I)
    for path in [*views, "/no/such/page"]:
        status, headers, body = get_with_headers(url + path)
        assert status == (404 if path == "/no/such/page" else 200), path
        csp = headers.get("Content-Security-Policy", "")
        assert csp.startswith("default-src 'none'") and "http" not in csp, (path, csp)
        assert 'src="http' not in body and 'href="http' not in body, path
        assert not external.search(body), (path, external.search(body))
    logs = f"/file?{q(source='rollouts', id=r.rollout_id, path='logs/stdout.txt')}"
    status, headers, _ = get_with_headers(url + logs)
    assert status == 200 and headers["Content-Security-Policy"].startswith("default-src 'none'")


def test_viewer_follows_appended_lines_and_never_writes(workdir, tmp_path):
    """A copy of the run whose results arrive while the viewer is up; a torn last line waits for its newline."""
    run = tmp_path / "live"
    shutil.copytree(workdir, run, ignore=shutil.ignore_patterns("checkpoints", "shards", "*.sock", "tb"))
    lines = (workdir / "rollouts" / "results.jsonl").read_bytes().splitlines(keepends=True)
    (run / "rollouts" / "results.jsonl").write_bytes(b"".join(lines[:2]))
    before = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}
    with Background(run) as base:
        count = lambda: page(base, f"/rollouts?{q(source='rollouts')}").count('<tr class="rollout')
        assert count() == 2
        with open(run / "rollouts" / "results.jsonl", "ab") as f:
            f.write(b"".join(lines[2:-1]) + lines[-1][:40])  # the last one torn
        assert count() == len(lines) - 1
        with open(run / "rollouts" / "results.jsonl", "ab") as f:
            f.write(lines[-1][40:])
        assert count() == len(lines)
        grown = run / "rollouts" / "results.jsonl"
        gid = results(grown)[0].group_id
        for p in ["/", "/rollouts", "/heldout", "/metrics", f"/group?{q(source='rollouts', group=gid)}"]:
            page(base, p)
        after = {p: (p.stat().st_size, p.stat().st_mtime_ns) for p in run.rglob("*") if p.is_file()}
    assert {p: v for p, v in after.items() if p != grown} == {p: v for p, v in before.items() if p != grown}


def _chromium(*args: str, timeout: int = 90) -> subprocess.CompletedProcess:
    ok, why = browser.chromium_available()
    if not ok:
        pytest.skip(why)
    profile = f"/tmp/hrl-inspect-chromium-{os.getpid()}"
    cmd = [browser.CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
           f"--user-data-dir={profile}", *args]
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    finally:
        shutil.rmtree(profile, ignore_errors=True)


def test_chromium_draws_the_tree_from_the_pages_script(workdir, url):
    res = results(workdir / "rollouts" / "results.jsonl")
    gid = res[0].group_id
    tree = build_tree([c for c in group_calls(workdir / "capture.jsonl")[gid] if c.status == "ok"],
                      [r for r in res if r.group_id == gid])
    path = f"/group?{q(source='rollouts', group=gid)}"
    assert 'class="tnode' not in page(url, path)  # the served HTML has no nodes: the script must draw them
    dom = _chromium("--dump-dom", url + path).stdout
    nodes = re.findall(r'<div class="tnode (gen|ctx)" data-seg="(\d+)" data-tokens="(\d+)"', dom)
    assert len(nodes) == expected_segments(tree) and sum(int(n) for *_, n in nodes) == tree.num_nodes
    assert f"{len(nodes)} segments drawn, {tree.num_nodes} token nodes" in dom
    spans = re.findall(r'<span class="tok (gen|ctx)"[^>]*title="node (\d+) · id (\d+)', dom)  # the token view
    assert [int(n) for _, n, _ in spans] == list(range(tree.num_nodes))
    assert [int(t) for _, _, t in spans] == tree.tokens.tolist()
    assert [k == "gen" for k, _, _ in spans] == tree.is_generated().tolist()


def test_chromium_shows_each_heldout_cell_and_answer(workdir, url):
    evals = {r.rollout_id: r for r in results(workdir / "eval" / "results.jsonl")}
    dom = _chromium("--dump-dom", url + "/heldout").stdout
    cells = re.findall(r'<div class="cell (pass|fail)" data-task="[^"]*" data-harness="[^"]*" data-version="(\d+)" '
                       r'data-id="([^"]*)">.*?<div class="ans">(.*?)</div></div>', dom, re.S)
    assert sorted(html.unescape(rid) for *_, rid, _ in cells) == sorted(evals)
    for verdict, version, rid, ans in cells:
        r = evals[html.unescape(rid)]
        assert verdict == ("pass" if r.success() else "fail") and int(version) == int(ID_RE.match(r.rollout_id)[2])
        final = r.meta.get("final_message") or ""
        assert html.unescape(ans) == (final[:ANSWER_CHARS] if final.strip() else answer_of(r.meta))


def test_screenshots_of_the_main_views(workdir, url, tmp_path):
    """Into tmp_path; HRL_WRITE_DOCS=1 writes them to docs/inspect/ (the README's pictures) instead."""
    r = results(workdir / "rollouts" / "results.jsonl")[0]
    shots = SHOTS if os.environ.get("HRL_WRITE_DOCS") == "1" else tmp_path
    shots.mkdir(parents=True, exist_ok=True)
    views = {"overview": "/", "rollout": f"/rollout?{q(source='rollouts', id=r.rollout_id)}",
             "tree": f"/group?{q(source='rollouts', group=r.group_id)}", "heldout": "/heldout", "metrics": "/metrics"}
    assert tuple(views) == VIEWS and {p.stem for p in SHOTS.glob("*.png")} == set(VIEWS)  # the docs show each
    for name, path in views.items():
        out = shots / f"{name}.png"
        out.unlink(missing_ok=True)
        _chromium(f"--screenshot={out}", "--window-size=1280,900", "--hide-scrollbars", url + path)
        data = out.read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and struct.unpack(">II", data[16:24]) == (1280, 900), name
        assert len(data) > 20_000, f"{name}: {len(data)} bytes, a blank page?"


def test_large_run_is_paginated_and_reindexed_by_appended_bytes(tmp_path, monkeypatch):
    """The bench's synthetic run (two-call rollouts whose second prompt is a prompt_ref), two of them side by side."""
    from harness_env.benchmarks.viewer import GROUPS_PER_STEP as G
    from harness_env.benchmarks.viewer import SyntheticRun
    from harness_env.inspect import index as I

    runs = [SyntheticRun(tmp_path / name, group_size=4, prompt=40, completion=8, seed=i)
            for i, name in enumerate(["a", "b"])]
    for w in runs:
        for s in range(8):
            w.step(s)
        w.evals(tasks=8, versions=[0, 8])
    n = 8 * G * 4
    out = tmp_path / "c_eval_out"  # a launch.eval --out dir: results.jsonl and capture.jsonl side by side
    out.mkdir()
    shutil.copy(tmp_path / "a" / "eval" / "results.jsonl", out / "results.jsonl")
    shutil.copy(tmp_path / "a" / "eval_capture.jsonl", out / "capture.jsonl")
    rid = results(tmp_path / "a" / "rollouts" / "results.jsonl")[0].rollout_id
    shot = tmp_path / "a" / "rollouts" / "rollouts" / rid / "logs" / "home" / ".hrl" / "screenshots" / "step_000.png"
    shot.parent.mkdir(parents=True)
    shot.write_bytes(b"\x89PNG\r\n\x1a\n" + bytes(64))
    with Background(tmp_path) as base:
        assert re.findall(r'href="/run\?run=(\w+)"', page(base, "/")) == ["a", "b", "c_eval_out"]  # a folder of runs
        body = page(base, f"/heldout?{q(run='c_eval_out')}")
        assert body.count('<div class="cell ') == 2 * 8
        assert page(base, f"/heldout?{q(run='a', versions='8')}").count('<div class="cell ') == 8
        evals = results(tmp_path / "a" / "eval" / "results.jsonl")
        verdicts = collections.defaultdict(set)
        for r in evals:
            verdicts[r.meta["task_id"]].add(r.success())
        changed = re.findall(r'<tr><td>(held\d+)</td>', page(base, f"/heldout?{q(run='a', changed=1)}"))
        assert changed == sorted(t for t, v in verdicts.items() if len(v) > 1) and 0 < len(changed) < 8
        body = page(base, f"/group?{q(run='c_eval_out', source='.', group='eval00008/held001/reference')}")
        assert 'id="tree-data"' in body
        body = page(base, f"/rollout?{q(run='a', source='rollouts', id=rid)}")
        train = results(tmp_path / "a" / "rollouts" / "results.jsonl")
        first = train[0]
        assert first.rollout_id == rid and first.status == "ok" and set(first.sub_scores) == {"file"}
        assert check_rollout_page(body, first) == 1  # its verifier sub-score and its one bash call
        assert "<tr><td>cause</td>" not in body and "<tr><td>why</td>" not in body  # an ok rollout: no attribution
        failed = [x for x in train if x.status != "ok"]
        assert failed and all((x.status, x.meta["cause"], x.meta["cause_why"]) == ("timeout", "policy", "timeout")
                              for x in failed)
        for x in failed[:2]:  # a failed rollout: its status and its attribution (cause, why) on its page
            fbody = page(base, f"/rollout?{q(run='a', source='rollouts', id=x.rollout_id)}")
            facts = re.search(r'<div class="row"><div><table class="">(.*?)</table>', fbody, re.S)[1]
            rows = dict(re.findall(r"<tr><td>([^<]*)</td><td>(.*?)</td></tr>", facts))
            assert (rows["status"], rows["cause"], rows["why"]) == ("timeout", "policy", "timeout"), rows
            assert "reward" not in rows and fbody.count('<span class="st-bad">timeout</span>') >= 1
            assert re.search(r'<p><span class="st-bad">timeout</span> · <a href="/group\?', fbody)
            assert check_rollout_page(fbody, x) == 1 and verifier_rows(fbody) == {}
        src = html.unescape(re.search(r'<img class="shot" alt="[^"]*" src="([^"]+)"', body)[1])
        status, ctype, _ = get(base + src)
        assert status == 200 and ctype == "image/png"
        sizes = [page(base, f"/rollouts?{q(run='a', source='rollouts', page=p)}").count('<tr class="rollout')
                 for p in range(3)]
        assert sizes == [50, 50, n - 100]
        assert get(base + f"/rollouts?{q(run='a', page=3)}")[0] == 200  # past the end: an empty page
        for flt, want in [(dict(status="ok", rmin=0.5), lambda r: r.status == "ok" and r.reward >= 0.5),
                          (dict(status="timeout"), lambda r: r.status == "timeout"),
                          (dict(task="task01", rmax=0.5), lambda r: "task01" in r.group_id and r.reward is not None
                           and r.reward <= 0.5)]:
            body = page(base, f"/rollouts?{q(run='a', source='rollouts', **flt)}")
            n_want = sum(map(want, train))
            assert 0 < n_want < n and (f" of {n_want} (page" in body), flt
        gid = "train00002/task009/reference"
        tree = build_tree([c for c in group_calls(tmp_path / "a" / "capture.jsonl")[gid]],
                          [r for r in results(tmp_path / "a" / "rollouts" / "results.jsonl") if r.group_id == gid])
        assert len(tree.calls) == 2 * 4  # both calls of each rollout, prompt_refs resolved
        body = page(base, f"/group?{q(run='a', source='rollouts', group=gid)}")
        assert f'data-nodes="{tree.num_nodes}" data-segments="{expected_segments(tree)}"' in body
        assert len(re.findall(r'<span class="tok ', body)) == tree.num_nodes
        data = json.loads(re.search(r'<script type="application/json" id="tree-data">(.*?)</script>', body, re.S)[1])
        reward = {r.rollout_id: r.reward for r in train}
        assert sorted(reward[x] for x in {c.rollout_id for c in tree.calls}) == [0.0, 1.0, 1.0, 1.0]  # mixed
        assert check_segment_rewards(data["segments"], data["labels"], tree, reward) >= 2
        gid = failed[0].group_id  # a group with a timeout: the tree and its rewards are of its ok rollouts
        ok = [r for r in train if r.group_id == gid and r.status == "ok"]
        tree = build_tree([c for c in group_calls(tmp_path / "a" / "capture.jsonl")[gid]
                           if c.rollout_id in {r.rollout_id for r in ok}], ok)
        body = page(base, f"/group?{q(run='a', source='rollouts', group=gid)}")
        assert f"<li>{failed[0].rollout_id}: status timeout</li>" in body
        data = json.loads(re.search(r'<script type="application/json" id="tree-data">(.*?)</script>', body, re.S)[1])
        assert len(ok) == 3 and check_segment_rewards(data["segments"], data["labels"], tree, reward) >= 1
        parsed = []
        real = I.parse_result
        monkeypatch.setattr(I, "parse_result", lambda line, off, src: parsed.append(off) or real(line, off, src))
        old_size = (tmp_path / "a" / "rollouts" / "results.jsonl").stat().st_size
        runs[0].step(8)  # one more step while the viewer runs: only its lines are read
        assert f"of {n + G * 4} " in page(base, f"/rollouts?{q(run='a', source='rollouts')}")
        assert len(parsed) == G * 4 and min(parsed) == old_size
