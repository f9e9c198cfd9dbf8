"""browser-use with its screenshots sent to the policy (`browser_use_vision`: its documented `use_vision=True`,
nothing patched) through a vision policy's shim (Qwen3-VL's image processor) with the scripted web policy: the
task is solved, each call carries the page's screenshot as image tokens that match its grid, every screenshot is
stored once by content beside the capture log, the step screenshots land in the rollout's output, and the same
agent with vision off (the control, in the same run) sends none."""

import hashlib
import io

import pytest
from PIL import Image
from rollout_kit import logs_of, run_rollouts

from harness_env.runner import RolloutSpec
from harness_env.tasks import web_family as wf
from harness_env.web import browser
from harness_env.web.policy import WebOracle, web_script
from research.models import image_processor as ip
from research.serving.replay import ReplayEngine
from research.shim.session import ShimOptions
from research.trees.builder import build_tree

pytestmark = [pytest.mark.slow, pytest.mark.harness]
PROCESSOR = ip.ImageProcessorConfig()  # Qwen3-VL's preprocessor_config.json: patch 16, 2x2 merge


@pytest.mark.timeout(900)
@pytest.mark.parametrize("backend_name", ["bwrap", pytest.param("docker", marks=pytest.mark.docker)])
def test_browser_use_with_vision_sends_each_screenshot_as_image_tokens(tmp_path, qwen3_tokenizer_dir, backend_name):
    from harness_env.sandbox import get_backend
    from research.models.tokenizer import load_tokenizer

    for ok, why in (browser.chromium_available(), get_backend(backend_name).available()):
        if not ok:
            pytest.skip(why)
    backend = None if backend_name == "bwrap" else get_backend(backend_name)
    tok = load_tokenizer(qwen3_tokenizer_dir)
    task = wf.write_task(tmp_path / "tasks", "todo", 0)
    engine = ReplayEngine(web_script(WebOracle([task]), tok.decode), tok)
    specs = [RolloutSpec(task, "browser_use_vision", 0), RolloutSpec(task, "browser_use", 0)]
    results, calls = run_rollouts(tmp_path, engine, tok, specs, backend=backend, concurrency=2, timeout_s=240,
                                  max_turns=40, shim_options=ShimOptions(vision=PROCESSOR))
    by_harness = {r.harness: r for r in results}
    for r in results:
        assert (r.status, r.reward) == ("ok", 1.0), f"{r.rollout_id}: {r.message}\n{logs_of(tmp_path, r.rollout_id)}"
        shots = tmp_path / "run" / "rollouts" / r.rollout_id / "logs" / "home" / browser.SCREENSHOTS
        assert r.meta["web"]["screenshots"] >= 1 and sorted(p.name for p in shots.glob("step_*.png"))
    seen = [c for c in calls if c.rollout_id == by_harness["browser_use_vision"].rollout_id]
    blind = [c for c in calls if c.rollout_id == by_harness["browser_use"].rollout_id]
    assert len(seen) >= 3 and len(blind) >= 3
    assert all("images" not in c.meta for c in blind)  # the control: vision off sends no pictures
    pad = tok.token_to_id("<|image_pad|>")
    store = tmp_path / "capture.jsonl.images"
    shas = set()
    for c in seen:
        named = c.meta.get("images", [])
        assert named, f"call {c.call_index} of the vision run carries no screenshot"
        grids = [tuple(int(x) for x in n.split(":")[1].split("x")) for n in named]
        # the prompt's image tokens are exactly its images' grids' (t*h*w / merge^2 each): token-in, token-out
        assert c.prompt_ids.count(pad) == sum(ip.num_tokens(g, PROCESSOR) for g in grids)
        shas |= {n.split(":")[0] for n in named}
    stored = {p.stem: p for p in store.rglob("*") if p.is_file()}
    assert set(stored) == shas  # each distinct screenshot stored once, named by its content
    for sha, p in stored.items():
        data = p.read_bytes()
        assert hashlib.sha256(data).hexdigest() == sha
        w, h = Image.open(io.BytesIO(data)).size
        assert w >= 640 and h >= 400  # a browser viewport, not a thumbnail
    assert len(shas) >= 2  # the page changed as the agent acted, and the policy saw it change
    tree = build_tree(seen, [by_harness["browser_use_vision"]])
    assert tree.num_nodes < sum(len(c.prompt_ids) + len(c.completion_ids) for c in seen)
    print(f"\n[browser-use vision] {len(seen)} calls, {len(shas)} distinct screenshots, "
          f"{sum(c.prompt_ids.count(pad) for c in seen)} image tokens; control {len(blind)} calls")


@pytest.mark.timeout(900)
def test_screenshot_tree_bench_keys_and_savings(qwen3_tokenizer_dir):
    """`launch.bench --suite=screenshot_tree` at group 4: its keys, the tower runs once per distinct screenshot
    (fewer than a flat trainer's one per image per call), 1,000 image tokens per 1280x800 screenshot, and the
    text-only peer sends none."""
    from harness_env.benchmarks import screenshot_tree

    if not browser.chromium_available()[0]:
        pytest.skip("no Chromium")
    r = screenshot_tree.run(group=4, tokenizer_dir=str(qwen3_tokenizer_dir))
    keys = {"flat_tokens", "tree_tokens", "tree_vs_flat", "images_flat", "images_tree", "image_tokens_per_call",
            "calls", "first_prompt", "reward_mean"}
    assert {f"{p}_{k}" for p in ("vision", "text") for k in keys} | {"vision_vs_text"} <= set(r)
    assert r["vision_image_tokens_per_call"] == 1000.0 and r["text_images_flat"] == 0
    assert 2 <= r["vision_images_tree"] < r["vision_images_flat"]
    assert r["vision_tree_vs_flat"] > 2 and r["text_tree_vs_flat"] > 2
