"""Train a policy through real agent harnesses (the RL loop of harness_env/rl/loop.py).

    python -m launch.train --config=configs/demo_cpu.py --workdir=/tmp/demo [--config.algo=ppo ...]

Re-running the same command on the same workdir resumes (also after kill -9).

Multi-host (one process per host, or per GPU; research/train/distributed.py): the same command on every
host with `--config.distributed.enabled=True`; the workdir must be shared storage (checkpoints are
written collectively). Where each process learns its rank:
  TPU pod (Cloud TPU / GKE), SLURM (srun), Open MPI (mpirun), Kubernetes indexed Jobs: nothing to give,
      JAX detects coordinator, process count and id;
  anything else: the coordinator's host:port and the count/id, as flags or in the environment:
      --config.distributed.coordinator_address=host0:8476 --config.distributed.num_processes=4 \\
      --config.distributed.process_id=$RANK
      (or JAX_COORDINATOR_ADDRESS=host0:8476 JAX_NUM_PROCESSES=4 JAX_PROCESS_ID=$RANK).
Checked on CPU by `python -m launch.bench --suite=multihost --opt processes=2` (tests/test_multihost.py).
"""

import json

from absl import app, flags
from ml_collections import config_flags

from research.rl.console import quiet_libraries

_CONFIG = config_flags.DEFINE_config_file("config", None, "Run config (a configs/*.py file).", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Run directory (checkpoints, logs, metrics, plots).", required=True)


def main(argv):
    del argv
    quiet_libraries(verbose=flags.FLAGS["verbosity"].present > 0)  # orbax etc. only with --verbosity
    from harness_env.rl.loop import train

    summary = train(_CONFIG.value, _WORKDIR.value)
    print("SUMMARY " + json.dumps(summary))


if __name__ == "__main__":
    app.run(main)
