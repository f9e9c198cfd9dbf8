"""Train a policy through real agent harnesses (the RL loop of harness_env/rl/loop.py).

    python -m launch.train --config=configs/demo_cpu.py --workdir=/tmp/demo [--config.algo=ppo ...]

Re-running the same command on the same workdir resumes (also after kill -9).
"""

import json
import logging

from absl import app, flags
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config (a configs/*.py file).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, logs, metrics, plots).", required=True)


def main(argv):
    del argv
    logging.getLogger().setLevel(logging.INFO)
    from harness_env.rl.loop import train

    summary = train(_CONFIG.value, _WORKDIR.value)
    print("SUMMARY " + json.dumps(summary))


if __name__ == "__main__":
    app.run(main)
