"""Every `launch.bench` suite runs in CI at a tiny size, through the launcher, and prints its keys.

A suite nobody runs rots: `--suite=rl_loop` crashed with KeyError: 'tokens' for weeks because no test ran it.
Every suite is run here (tiny options, a subprocess of `python -m launch.bench`, exit 0, a final `BENCH {json}`
line holding the keys the README and the issue notes quote): a test that calls `run()` directly passes while
the launcher's option parsing or JSON printing breaks. The suites in COVERED are also exercised more deeply by
the named test file. A new suite not in TINY fails `test_every_suite_is_run_by_a_test`.
"""

import json
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("research/benchmarks", "harness_env/benchmarks")

# suite -> (tiny --opt values, keys its BENCH line must hold)
TINY = {
    "attention": (["prefix=64", "sessions=2", "turns=2", "turn_min=8", "turn_max=16", "block=32", "repeats=1"],
                  {"auto_impl", "flat_speedup", "skip_speedup", "visible_block_fraction", "tree_tokens",
                   "pallas_lowers_tpu", "pallas_lowers_cuda"}),
    "model": (["layers=1", "d=64", "experts=4", "vocab=256", "seq=32", "batch=1", "iters=1", "warmup=1"],
              {"loss", "loss_transformers", "ours_tokens_per_s", "transformers_tokens_per_s", "ratio"}),
    "tree_vs_flat": (["turns=2", "sessions=2", "prefix=64", "gen=[4,8]", "tool=[4,8]", "scale=1.0", "flat_steps=1",
                      "loss_calls=4"], {"speedup_2", "tokens_ratio_2", "loss_rel_diff_2", "tree_tokens_2"}),
    "sandbox": (["n_start=2", "levels=2", "docker_levels=2"],
                {"bwrap_start_ms_p50", "bwrap_vs_bare_ratio", "docker_vs_bwrap_ratio", "bwrap_rollouts_per_s"}),
    "harnesses": (["harnesses=codex"], {"reference_reward", "codex_reward", "codex_calls", "codex_vs_reference"}),
    "redteam": (["attacks=rel_link,fifo"], {"attacks", "defended", "sheltered", "paid", "control_reward",
                                            "grade_s_max_vs_honest"}),
    "rl_loop": (["steps=2", "groups_per_step=2", "group_size=2", "reps=1"],
                {"rollout_s", "tree_s", "train_s", "sync_s", "step_s", "rollouts_per_min", "compact_head_speedup"}),
    "harness_learning": (["harnesses=codex", "sft_steps=2", "rl_steps=2"],
                         {"lift_codex", "end_codex", "steps_to_80_codex", "rollout_s_codex", "train_s_codex",
                          "tree_vs_flat_tokens", "prefill_reuse"}),
    "vlm": (["d=64", "depth=1", "width=320", "height=240", "iters=1", "group=2", "turns=2"],
            {"hf_parity_max", "image_tokens_per_s", "text_tokens_per_s", "image_vs_text", "tree_vs_flat_tokens",
             "tower_images_tree", "tower_images_flat"}),
    # one SFT part and two RL arms of configs/branching.py's test variant (~1 min)
    "branching": (["variant=test", "sft_steps=2", "rl_steps=2"],
                  {"pass_start", "pass_branching", "pass_trajectory", "branching_minus_trajectory", "recovery_before",
                   "recovery_after", "replay_match_rate", "children_per_step", "rollout_s_branching",
                   "pass_control", "trajectory_minus_control"}),
    "viewer": (["rollouts=300", "requests=5"], {"index_s", "page_ms_p50", "static_ms_p50", "page_vs_static",
                                                "reindex_s", "reindex_vs_full", "tree_first_ms", "page_ms_max"}),
    # XLA's ops (kernels=false): the CPU decode kernels' own path is tests/test_engine_bench.py's
    "engine": (["new_tokens=4", "prompt_len=8", "concurrency=[1,8]", "layers=1", "hidden=64", "vocab=512", "reps=1",
                "hf_threads=[1]", "kernels=false"],
               {"tokens_per_s_c1", "tokens_per_s_c8", "transformers_tokens_per_s_c1", "transformers_tokens_per_s_c8",
                "ratio_c1", "ratio_c8", "greedy_match", "cpu_kernels"}),
    "shim": (["sessions=1", "turns=3", "prompt_tokens=400", "concurrent=3", "calls_per_session=2", "long_turns=2"],
             {"overhead_ms_p50", "overhead_ms_p50_minus_fsync", "fsync_ms_p50", "calls_per_s", "calls_per_s_20k",
              "ratio_20k_vs_bare", "capture_to_json_speedup"}),
    "harness_tree": (["harnesses=codex", "group=2"],
                     {"codex_first_prompt", "codex_flat_tokens", "codex_tree_tokens", "codex_tree_vs_flat",
                      "codex_vs_reference", "reference_tree_vs_flat"}),
    "screenshot_tree": (["group=2"], {"vision_tree_vs_flat", "vision_images_flat", "vision_images_tree",
                                      "vision_image_tokens_per_call", "text_tree_vs_flat", "vision_vs_text"}),
    # the attention part also parses a JSON list option; train_step (~50 s here) runs in tests/test_gpu_check.py
    "gpu_check": (['parts=["env","attention"]'],
                  {"backend", "device_count", "ok", "auto_impl", "pallas_mode", "pallas_lowers_cuda",
                   "pallas_gpu_out_max_err", "part_s_attention"}),
    # three bandit runs (GRPO, PPO, negated), each compiling a Learner and an engine: 50-90 s even at one step
    "learning": (["steps=1"], {"steps", "grpo_reward_start", "grpo_reward_end", "ppo_reward_end",
                               "negated_reward_end", "logp_maxdiff"}),
    # two 1- and 2-process jobs, each compiling its step: 45-95 s at one step without the checkpoint exchange
    "multihost": (["processes=2", "steps=1", "crossover=false"],
                  {"loss_rel_diff", "param_max_diff", "step_s_1proc", "step_s_2proc", "data_resume_ok"}),
}
# suite -> the test file that also runs its run() at more depth (its numbers, not only its keys)
COVERED = {
    "engine": "tests/test_engine_bench.py",
    "shim": "tests/test_shim_bench.py",
    "harness_tree": "tests/test_bench_harness_tree.py",
    "screenshot_tree": "tests/test_browser_use_vision.py",
    "gpu_check": "tests/test_gpu_check.py",
    "learning": "tests/test_rl_learning.py",
    "multihost": "tests/test_multihost.py",
}
SLOW = {"rl_loop", "harness_learning", "learning", "multihost", "branching"}


def _suites() -> set[str]:
    """Modules of the two benchmark packages with a top-level `def run(` (helpers such as shim_load have none)."""
    return {p.stem for pkg in PACKAGES for p in (ROOT / pkg).glob("*.py")
            if not p.stem.startswith("_") and "\ndef run(" in p.read_text()}


def test_every_suite_is_run_by_a_test():
    assert _suites() == set(TINY), "a bench suite not run through the launcher: add its tiny options to TINY"
    assert set(COVERED) <= set(TINY)
    for name, path in COVERED.items():
        assert f"{name}.run(" in (ROOT / path).read_text(), f"{path} does not call {name}.run("


def test_a_helper_module_is_not_a_suite():
    r = subprocess.run([sys.executable, "-m", "launch.bench", "--suite=shim_load"], cwd=ROOT, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode != 0 and "no module of that name with a run()" in r.stderr, r.stderr[-2000:]


@pytest.mark.parametrize("name", [pytest.param(n, marks=[pytest.mark.slow] if n in SLOW else []) for n in TINY])
@pytest.mark.timeout(900)
def test_suite_runs_tiny_through_the_launcher(name):
    opts, keys = TINY[name]
    r = subprocess.run([sys.executable, "-m", "launch.bench", f"--suite={name}", *(f"--opt={o}" for o in opts)],
                       cwd=ROOT, capture_output=True, text=True, timeout=850)
    assert r.returncode == 0, r.stderr[-4000:]
    last = r.stdout.strip().splitlines()[-1]
    assert last.startswith("BENCH "), r.stdout[-2000:]
    out = json.loads(last[len("BENCH "):])
    assert out["suite"] == name and keys <= set(out), sorted(keys - set(out))
    if name == "viewer":  # every page answers within a second, the slowest (the first tree, warm-ups) included:
        assert out["page_ms_p50"] < 1000 and out["page_ms_max"] < 1000, out  # the server warms before it answers
