"""Multi-process JAX start-up: one call, the same on a TPU pod, a SLURM/MPI/Kubernetes GPU cluster or one host.

`initialize(config.distributed)` runs `jax.distributed.initialize` with whatever is known, in this order:
  1. the config fields (`coordinator_address`, `num_processes`, `process_id`; "" / 0 / -1 = unset);
  2. the environment: `JAX_COORDINATOR_ADDRESS` (read by JAX itself), `JAX_NUM_PROCESSES`, `JAX_PROCESS_ID`
     (this project's names, for launchers that start N copies of one command line by hand);
  3. JAX's cluster auto-detection for what is still unset (Cloud TPU pods and GKE, SLURM, Open MPI,
     Kubernetes with indexed jobs): on a TPU pod nothing needs to be given at all.
Why not the config dict straight into JAX (as the loop did): process id 0 is a valid id, not "unset", and a
launcher script usually knows the rank only from the environment.

On CPU (tests, the `multihost` bench) the processes talk through the gloo collectives backend
(`jax_cpu_collectives_implementation`), which this sets before initialising.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

import jax

ENV_NUM_PROCESSES = "JAX_NUM_PROCESSES"
ENV_PROCESS_ID = "JAX_PROCESS_ID"
ENV_COORDINATOR = "JAX_COORDINATOR_ADDRESS"


@dataclasses.dataclass(frozen=True)
class DistributedArgs:
    """What `jax.distributed.initialize` gets (None = let JAX detect it)."""

    coordinator_address: str | None = None
    num_processes: int | None = None
    process_id: int | None = None
    initialization_timeout: int = 300


def _set(value: Any) -> Any:
    return None if value in ("", None) or (isinstance(value, int) and value < 0) else value


def resolve(fields: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> DistributedArgs:
    """Config fields, then the environment; `num_processes` 0 and `process_id` -1 mean unset."""
    fields = dict(fields or {})
    env = os.environ if environ is None else environ
    num = _set(fields.get("num_processes"))
    num = None if num == 0 else num
    pid = _set(fields.get("process_id"))
    addr = _set(fields.get("coordinator_address"))
    if addr is None and env.get(ENV_COORDINATOR):
        addr = env[ENV_COORDINATOR]
    if num is None and env.get(ENV_NUM_PROCESSES):
        num = int(env[ENV_NUM_PROCESSES])
    if pid is None and env.get(ENV_PROCESS_ID):
        pid = int(env[ENV_PROCESS_ID])
    if num is not None and pid is not None and not 0 <= pid < num:
        raise ValueError(f"process_id={pid} is not in [0, num_processes={num})")
    timeout = int(fields.get("initialization_timeout") or 300)
    return DistributedArgs(coordinator_address=addr, num_processes=num, process_id=pid,
                           initialization_timeout=timeout)


def initialize(fields: Mapping[str, Any] | None = None, environ: Mapping[str, str] | None = None) -> DistributedArgs:
    """Resolves the arguments and starts JAX's distributed runtime (call before any other JAX work).

    `fields`: e.g. `config.distributed` (its `enabled` flag is the caller's business). Returns what was
    passed to JAX. A single-process run (num_processes == 1) initialises nothing.
    """
    if hasattr(fields, "to_dict"):
        fields = fields.to_dict()
    args = resolve(fields, environ)
    if args.num_processes == 1:
        return args
    if "cpu" in (jax.config.jax_platforms, os.environ.get("JAX_PLATFORMS")):
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
    jax.distributed.initialize(coordinator_address=args.coordinator_address, num_processes=args.num_processes,
                               process_id=args.process_id, initialization_timeout=args.initialization_timeout)
    return args
