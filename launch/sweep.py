"""A seed sweep of one config: per seed SFT once, then RL and the SFT-only control from that SFT checkpoint.

    python -m launch.sweep --config=configs/demo_cpu.py --seeds=0,1,2,3,4 --workdir=workdirs/sweep

Writes WORKDIR/sweep.json, sweep.csv and sweep.png (harness_env/rl/sweep.py); re-running the same command
resumes, also after kill -9. `--nocontrol` skips the control runs.
"""

import json

from absl import app, flags
from ml_collections import config_flags

from research.rl.console import quiet_libraries

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config (a configs/*.py file).", lock_config=True)
_SEEDS = flags.DEFINE_list("seeds", ["0", "1", "2", "3", "4"], "config.seed of each run")
_WORKDIR = flags.DEFINE_string("workdir", None, "Sweep directory (one folder per seed).", required=True)
_CONTROL = flags.DEFINE_bool("control", True, "also run each seed's SFT-only control at equal minutes")
_MIN_GAIN = flags.DEFINE_float("min_gain", 0.25, "a seed passes when held-out pass rises by this much above its RL "
                               "start (or reaches 0.95) and ends above its control")


def main(argv):
    del argv
    quiet_libraries(verbose=flags.FLAGS["verbosity"].present > 0)  # orbax etc. only with --verbosity
    from harness_env.rl.sweep import run_sweep

    summary = run_sweep(_CONFIG.value, [int(s) for s in _SEEDS.value], _WORKDIR.value, control=_CONTROL.value,
                        min_gain=_MIN_GAIN.value)
    print("SWEEP " + json.dumps({k: v for k, v in summary.items() if k != "table"}))


if __name__ == "__main__":
    app.run(main)
