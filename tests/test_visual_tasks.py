"""The visual web family (harness_env/tasks/visual_family.py) and the styled site app: every checker validated
(plan 1.0, nothing 0.0, the plausible mistake 0.0), the accessibility text cannot tell the answer (it is the
same whatever the answer, and names no colour or shape), the screenshot can (the target's colour is in it), and
browser-use with vision solves a task through a real Chromium with every screenshot reaching the shim."""

import html.parser
import io
import json
import urllib.request

import numpy as np
import pytest
from PIL import Image

from harness_env.tasks import visual_family as vf
from harness_env.tasks import web_family as wf
from harness_env.tasks.select import select_tasks
from harness_env.web import validate as validate_mod


class _A11yText(html.parser.HTMLParser):
    """The page's text as an accessibility tree exposes it: text and the naming attributes (aria-label, title,
    alt, value), outside <style> and aria-hidden subtrees."""

    VOID = {"input", "br", "meta", "img", "hr", "link"}

    def __init__(self):
        super().__init__()
        self.hidden_depth, self.depth, self.parts = None, 0, []

    def handle_starttag(self, tag, attrs):
        if self.hidden_depth is None:
            self.parts += [v for k, v in attrs if k in ("aria-label", "title", "alt", "value") and v]
        if tag in self.VOID:
            return
        self.depth += 1
        if self.hidden_depth is None and (tag == "style" or dict(attrs).get("aria-hidden") == "true"):
            self.hidden_depth = self.depth

    def handle_endtag(self, tag):
        if tag in self.VOID:
            return
        if self.hidden_depth == self.depth:
            self.hidden_depth = None
        self.depth -= 1

    def handle_data(self, data):
        if self.hidden_depth is None and data.strip():
            self.parts.append(data.strip())


def _page(task, tmp_path, path="/"):
    srv, base = validate_mod.serve(task, tmp_path / "state")
    try:
        with urllib.request.urlopen(base + path, timeout=10) as r:
            return r.read().decode()
    finally:
        srv.shutdown()


def _a11y(doc: str) -> str:
    p = _A11yText()
    p.feed(doc)
    return " ".join(p.parts)


def test_family_split_and_determinism(tmp_path):
    tr, ho = vf.variants("train", 20), vf.variants("heldout", 20)
    assert not set(tr) & set(ho) and len(ho) / (len(tr) + len(ho)) == 0.2 and {t for t, _ in ho} == set(vf.TEMPLATES)
    a, b = vf.write_task(tmp_path / "a", "pick_colour", 3), vf.write_task(tmp_path / "b", "pick_colour", 3)
    assert (a / "env/site.json").read_text() == (b / "env/site.json").read_text()
    dirs = select_tasks("visual", split="heldout", scratch=tmp_path / "s")
    assert len(dirs) == len(ho) and all(d.name.startswith("visual-") for d in dirs)
    entry = json.loads((dirs[0] / "data_entry.json").read_text())
    assert entry["metadata"]["category"] == "visual" and entry["metadata"]["split"] == "heldout"


@pytest.mark.parametrize("template", sorted(vf.TEMPLATES))
def test_checker_validated(template, tmp_path):
    for index in range(5):
        v = validate_mod.validate(vf.write_task(tmp_path / "tasks", template, index))
        assert (v.solution, v.nothing, v.wrong, v.ok) == (1.0, 0.0, 0.0, True), (template, index, v.message)


@pytest.mark.parametrize("template", ["pick_colour", "pick_icon"])
def test_the_accessibility_text_is_the_same_whatever_the_answer(template, tmp_path):
    """Across 20 variants the answers differ, the pages differ (their drawings), and the text the accessibility
    tree shows is one and the same: reading it, the best an agent can do is guess 1 in 6."""
    texts, answers, docs = set(), set(), set()
    for i in range(20):
        task = vf.write_task(tmp_path / "t", template, i)
        doc = _page(task, tmp_path / str(i))
        docs.add(doc)
        texts.add(_a11y(doc))
        answers.add(json.loads((task / "solution/plan.json").read_text())[-1]["name"])
    assert len(texts) == 1 and len(answers) >= 4 and len(docs) >= 15, (texts, answers)
    words = set(vf.COLOURS) | set(vf.SHAPES)
    assert not words & set(texts.pop().lower().replace(".", " ").split())


def test_restart_red_names_no_light(tmp_path):
    for i in range(10):
        task = vf.write_task(tmp_path / "t", "restart_red", i)
        text = _a11y(_page(task, tmp_path / str(i))).lower().split()
        assert not {"red", "green", "amber"} & set(text)
        assert text.count("restart") == 6  # one button per server, named by the server only


def test_every_site_is_styled_and_keeps_its_accessible_names(tmp_path):
    """Every web and visual site ships the inline stylesheet and a decorative logo (aria-hidden), and loads
    nothing from elsewhere; the web family's checkers still validate (their plans use the same names)."""
    for fam, tpl in ((wf, "checkout"), (wf, "todo"), (vf, "restart_red")):
        task = fam.write_task(tmp_path / "t", tpl, 0)
        doc = _page(task, tmp_path / tpl)
        assert "<style>:root{--accent:" in doc and '<svg aria-hidden="true"' in doc
        assert "http://" not in doc.split("<body>")[0] and "url(" not in doc and "@import" not in doc
        assert validate_mod.validate(task).ok


@pytest.mark.slow
@pytest.mark.harness
@pytest.mark.timeout(900)
def test_browser_use_vision_solves_a_visual_task_and_sees_the_colour(tmp_path, qwen3_tokenizer_dir):
    """browser_use_vision on pick_colour in bwrap, the scripted oracle playing the plan: solved, and the
    screenshots that reached the shim hold the target swatch's colour (a patch of exactly its RGB)."""
    from rollout_kit import logs_of, run_rollouts

    from harness_env.runner import RolloutSpec
    from harness_env.sandbox import get_backend
    from harness_env.web import browser
    from harness_env.web.policy import WebOracle, web_script
    from research.models import image_processor as ip
    from research.models.tokenizer import load_tokenizer
    from research.serving.replay import ReplayEngine
    from research.shim.session import ShimOptions

    for ok, why in (browser.chromium_available(), get_backend("bwrap").available()):
        if not ok:
            pytest.skip(why)
    tok = load_tokenizer(qwen3_tokenizer_dir)
    task = vf.write_task(tmp_path / "tasks", "pick_colour", 1)
    v = vf.variant("pick_colour", 1)
    target = int(v["plan"][-1][2].split()[-1])
    rgb = next(s["rgb"] for s in v["site"]["config"]["swatches"] if s["id"] == target)
    engine = ReplayEngine(web_script(WebOracle([task]), tok.decode), tok)
    (r,), calls = run_rollouts(tmp_path, engine, tok, [RolloutSpec(task, "browser_use_vision", 0)], timeout_s=240,
                               max_turns=20, shim_options=ShimOptions(vision=ip.ImageProcessorConfig()))
    assert (r.status, r.reward) == ("ok", 1.0), f"{r.message}\n{logs_of(tmp_path, r.rollout_id)}"
    assert all(c.meta.get("images") for c in calls)
    want = np.array([int(rgb[i:i + 2], 16) for i in (1, 3, 5)], np.uint8)
    first = calls[0].meta["images"][0].split(":")[0]
    shot = np.asarray(Image.open(io.BytesIO((tmp_path / "capture.jsonl.images").rglob(f"{first}.*").__next__()
                                            .read_bytes())).convert("RGB"))
    assert (shot == want).all(-1).sum() > 5000  # the 120x80 swatch, less its border
