"""AOT: the real Qwen3-30B-A3B train step lowers + compiles from abstract inputs on a fake 8-device mesh,
and its per-device memory is reported (nothing is allocated: ShapeDtypeStructs with shardings only)."""

import os
import subprocess
import sys

import pytest

from configs import qwen3_30b_a3b
from research.train.aot import GiB, aot_compile, format_report

BATCH_ARRAYS = 6  # tokens, positions, segment_ids, subtree_end, targets (int32), loss_mask (fp32)


def _check(rep: dict, config) -> None:
    rows_per_device = config.train.batch_rows // 8
    batch_bytes = rows_per_device * config.train.row_len * 4 * BATCH_ARRAYS
    # Donation works: the whole state is aliased in->out (XLA may skip a few unchanged scalars), so the
    # only extra argument memory is the batch.
    assert 0 <= rep["state_bytes_per_device"] - rep["alias_bytes"] < 1024
    assert 0 <= rep["argument_bytes"] - rep["alias_bytes"] - batch_bytes < 1024
    assert rep["temp_bytes"] > 0 and rep["peak_bytes"] > rep["argument_bytes"]
    assert rep["largest_arrays"] and all(b > 0 for _, b in rep["largest_arrays"])
    assert rep["params_total"] == 30_532_122_624 or rep["num_layers"] < 48


def test_aot_full_model_gpu_mesh():
    """All 48 layers at real width on the 8xH200 mesh (data=1, fsdp=1, expert=8, tensor=1); with scanned
    layers this compiles as fast as 2 layers. State per device = fp32 params + 2 Adam moments / sharding."""
    config = qwen3_30b_a3b.get_config("gpu")
    rep = aot_compile(config)
    print(format_report(rep))
    _check(rep, config)
    assert rep["mesh"] == {"data": 1, "fsdp": 1, "expert": 8, "tensor": 1}
    assert rep["num_layers"] == 48 and rep["params_total"] == 30_532_122_624
    # 12 bytes/param: experts split 8 ways; the rest (embeddings, attention, router, norms) replicated;
    # plus a few replicated scalars (step, rng, optimizer counters/hyperparameters).
    L, D, E, I, V = 48, 2048, 128, 768, 151936
    experts = L * 3 * E * D * I
    rest = 2 * V * D + D + L * (D * 128 * (2 * 32 + 2 * 4) + 2 * 128 + 2 * D + D * E)
    assert 0 <= rep["state_bytes_per_device"] - 12 * (experts // 8 + rest) < 256
    assert 57 * GiB < rep["state_bytes_per_device"] < 58 * GiB


@pytest.mark.slow
def test_aot_cli_tpu_mesh_16_fake_devices():
    """The TPU v5p-32 mesh needs 16 devices: the CLI forces 16 fake CPU devices in a fresh process."""
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run(
        [sys.executable, "-m", "research.train.aot", "--config=configs/qwen3_30b_a3b.py:tpu", "--fake_devices=16",
         "--num_layers=2"],
        capture_output=True, text=True, timeout=600, env=env,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    assert out.returncode == 0, out.stderr[-3000:]
    line = [x for x in out.stdout.splitlines() if x.startswith("AOT ")][-1]
    import json

    rep = json.loads(line[4:])
    assert rep["mesh"] == {"data": 1, "fsdp": 2, "expert": 8, "tensor": 1} and rep["peak_bytes"] > 0
    assert 0 <= rep["state_bytes_per_device"] - rep["alias_bytes"] < 1024
