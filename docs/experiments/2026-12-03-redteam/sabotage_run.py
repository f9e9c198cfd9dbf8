"""Sabotage experiment: same SFT checkpoint, GRPO with attribution scoring vs with the policy's failures dropped."""
import json
import pathlib
import sys

sys.path.insert(0, "/work/main")
sys.path.insert(0, "/work/main/tests")
import test_rl_learning as T

from harness_env.rl.sweep import run_part
from research.rl.metrics import read_metrics

tmp = pathlib.Path("/work/scratch/sabexp/w")
seed = int(sys.argv[1]) if len(sys.argv) > 1 else 0
base = tmp / f"seed{seed}"
sft = T._multi_turn_config(tmp, seed)
sft.algo = "sft"
run_part(sft, base / "sft")
out = {}
for name, causes in (("scored", ("policy",)), ("dropped", ())):
    cfg = T._multi_turn_config(tmp, seed, T.SABOTAGE_CHECK, scored_causes=causes)
    run_part(cfg, base / name, source=base / "sft")
    recs = [m for m in read_metrics(base / name) if m["kind"] == "train"]
    out[name] = {"sabotage": [round(m.get("rollout/status/reward_error", 0) / m["rollout/all/count"], 3) for m in recs],
                 "reward": [round(m["rollout/all/reward"], 3) for m in recs]}
    print(name, json.dumps(out[name]), flush=True)
(base / "result.json").write_text(json.dumps(out))
