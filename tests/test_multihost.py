"""Multi-process JAX on this machine: per-process data shares, global batches, distributed start-up, and real
2- and 4-process training (research/benchmarks/multihost.py) equal to one process, checkpoints crossing over."""

import dataclasses
import pathlib
import subprocess
import sys

import grain
import jax
import numpy as np
import pytest
from jax.sharding import Mesh

from research.data import per_process
from research.data.pipeline import PipelineConfig, to_tree
from research.data.shards import GroupRecord
from research.rl.batches import BatchConfig, pack
from research.train import checkpoint as ckpt_lib
from research.train import distributed
from research.trees import synthetic

REPO = pathlib.Path(__file__).resolve().parents[1]


def test_process_share_is_a_disjoint_cover():
    items = list(range(11))
    shares = [per_process.process_share(items, index=i, count=3) for i in range(3)]
    assert sorted(x for s in shares for x in s) == items and [len(s) for s in shares] == [4, 4, 3]
    assert per_process.process_share(items) == items  # one process: everything
    with pytest.raises(ValueError, match="process index 3 is not in"):
        per_process.process_share(items, index=3, count=3)


def test_shard_dataset_equal_lengths_and_disjoint():
    ds = grain.MapDataset.range(10).shuffle(seed=1)
    shares = [list(per_process.shard_dataset(ds, index=i, count=3)) for i in range(3)]
    assert [len(s) for s in shares] == [3, 3, 3]  # the tail record is dropped: nobody waits on a straggler
    flat = [x for s in shares for x in s]
    assert len(set(flat)) == 9 and set(flat) <= set(range(10))
    # round-robin over one shuffled order: step k of every process together = records [k*3, k*3+3) of it
    order = list(ds)
    assert [shares[i][1] for i in range(3)] == order[3:6]
    with pytest.raises(ValueError, match="cannot give each of 4 processes one"):
        per_process.shard_dataset(grain.MapDataset.range(3), index=0, count=4)


def _packed(rows: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    recs = []
    for g in range(2):
        calls, results = synthetic.make_group(rng, group_id=f"t{g}", sessions=3, turns=2, vocab=64, p_trunc=0.0,
                                              routed_shape=(2, 2))
        recs.append(GroupRecord(group_id=f"t{g}", harness="codex", calls=calls, results=results))
    trees = [to_tree(r, PipelineConfig(vocab_size=64)).tree for r in recs]
    out = pack(trees, BatchConfig(row_len=128, num_rows=rows))
    from research.trees.packing import pack_routed_experts

    out["expert_ids"] = pack_routed_experts(trees, out)
    return {k: v for k, v in out.items() if isinstance(v, np.ndarray) and v.dtype != object and v.ndim >= 1}


def test_pad_batch_equals_the_packers_own_empty_rows():
    small, big = _packed(rows=3), _packed(rows=5)
    padded = per_process.pad_batch(small, rows=5)
    assert padded.keys() == big.keys()
    for k in big:
        np.testing.assert_array_equal(padded[k], big[k], err_msg=k)
    small.update(loss_idx=np.ones((3, 4), np.int32), loss_valid=np.ones((3, 4), bool))
    p = per_process.pad_batch(small, rows=4, slots=6)
    assert p["loss_idx"].shape == (4, 6) and p["loss_valid"][:, 4:].sum() == 0 and p["loss_valid"][3].sum() == 0
    with pytest.raises(ValueError, match="cannot pad a batch of 3 rows down to 2"):
        per_process.pad_batch(small, rows=2)
    with pytest.raises(KeyError, match="'extra'"):  # no padding is known for it: refused, not zero-filled
        per_process.pad_batch({**small, "extra": np.ones((3, 128), np.float32)}, rows=4)


def test_global_batch_one_process_shards_rows_over_the_mesh():
    mesh = Mesh(np.asarray(jax.devices()[:8]).reshape(1, 4, 2, 1), ("data", "fsdp", "expert", "tensor"))
    dev = _packed(rows=5)
    dev.update(loss_idx=np.arange(15, dtype=np.int32).reshape(5, 3), loss_valid=np.ones((5, 3), bool))
    out = per_process.global_batch(dev, mesh, ("data", "fsdp"))
    assert out["tokens"].shape == (8, 128)  # 5 rows rounded up to a multiple of the 4 row blocks
    assert out["tokens"].sharding.spec == jax.sharding.PartitionSpec(("data", "fsdp"))
    want = per_process.pad_batch(dev, rows=8)
    for k, v in out.items():
        np.testing.assert_array_equal(np.asarray(v), want[k], err_msg=k)
        np.testing.assert_array_equal(per_process.local_rows(v), want[k])
    with pytest.raises(ValueError, match="has no packed rows"):
        per_process.global_batch({}, mesh, ("data",))


def test_distributed_resolve_config_then_environment():
    env = {"JAX_COORDINATOR_ADDRESS": "h0:1", "JAX_NUM_PROCESSES": "4", "JAX_PROCESS_ID": "3"}
    a = distributed.resolve({"coordinator_address": "", "num_processes": 0, "process_id": -1}, env)
    assert (a.coordinator_address, a.num_processes, a.process_id) == ("h0:1", 4, 3)
    # process id 0 is an id, not "unset" (the loop used to drop it)
    b = distributed.resolve({"coordinator_address": "c:9", "num_processes": 2, "process_id": 0}, env)
    assert (b.coordinator_address, b.num_processes, b.process_id) == ("c:9", 2, 0)
    c = distributed.resolve({"enabled": True}, {})
    assert (c.coordinator_address, c.num_processes, c.process_id) == (None, None, None)  # JAX auto-detects
    with pytest.raises(ValueError, match="process_id=2 is not in"):
        distributed.resolve({"num_processes": 2, "process_id": 2}, {})
    assert distributed.initialize({"num_processes": 1}, {}).num_processes == 1  # one process: nothing started


def test_checkpoint_data_state_of_each_process():
    per = {ckpt_lib.PER_PROCESS_KEY: [{"next": 3}]}
    assert ckpt_lib._own_item(per) == {"next": 3}
    two = {ckpt_lib.PER_PROCESS_KEY: [{"next": 3}, {"next": 4}]}
    assert ckpt_lib._own_item(two) == two  # saved by 2, restored by 1: the caller maps the positions
    assert ckpt_lib._gather_per_process({"a": 1}) == {"a": 1}


def test_train_launcher_documents_the_multi_host_command_line():
    out = subprocess.run([sys.executable, "-m", "launch.train", "--help"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    text = out.stdout + out.stderr
    for needle in ("--config.distributed.coordinator_address", "JAX_PROCESS_ID", "SLURM", "TPU pod"):
        assert needle in text, needle


def _check_run(r: dict, processes: int) -> None:
    from research.benchmarks import multihost

    assert r["processes"] == processes and r["mesh"]["fsdp"] == processes
    assert r["loss_rel_diff"] <= 1e-5 and r["param_max_diff"] <= 1e-5, r
    assert all(np.isfinite(r["losses_1proc"])) and r["losses_1proc"][0] > 0
    assert r["data_resume_ok"]
    assert r["step_s_1proc"] > 0 and r[f"step_s_{processes}proc"] > 0
    assert multihost.REPO == REPO


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_two_processes_train_like_one_and_checkpoints_cross_over(tmp_path):
    from research.benchmarks import multihost

    r = multihost.run(processes=2, steps=2, workdir=str(tmp_path), timeout_s=420)
    _check_run(r, 2)
    # saved by 1 -> restored by 2, saved by 2 (collectively) -> restored by 1: bit-exact params
    assert r["restore_1to2_max_diff"] == 0.0 and r["restore_2to1_max_diff"] == 0.0 and r["restored_step"] == 2
    assert r["restored_data_processes"] == 2  # both processes' iterator positions are in the checkpoint
    groups = [pathlib.Path(f"{tmp_path}/many.json.groups{i}").read_text() for i in range(2)]
    assert groups[0] != groups[1]  # each process read its own share


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_four_processes_train_like_one(tmp_path):
    from research.benchmarks import multihost

    r = multihost.run(processes=4, steps=2, crossover=False, workdir=str(tmp_path), timeout_s=600)
    _check_run(r, 4)


def test_worker_config_is_the_loops_learner_config():
    """The bench trains the loop's own Learner config (demo_cpu:test), only shrunk and re-meshed."""
    from research.benchmarks import multihost

    cfg = multihost.worker_config(devices=4, groups_per_step=8, moe=True)
    assert cfg.algo == "grpo" and cfg.model.num_experts == 8 and cfg.train.batch_rows == 4
    assert dict(cfg.mesh) == {"data": 1, "fsdp": -1, "expert": 1, "tensor": 1}
    assert dataclasses.is_dataclass(distributed.DistributedArgs)
