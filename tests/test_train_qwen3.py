"""Acceptance of the training state on the tiny Qwen3-MoE: sharded == single device (loss and grads),
orbax save -> restore -> next loss bit-identical, restore onto another mesh, no recompiles across
packed-tree shapes, and the state built from a config. The loss is a plain next-token NLL over packed rows
(defined here: the production objective is research/rl/objective.py, tested in test_rl_objective.py)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from configs import tiny
from research.models import Qwen3, head_weight, tiny_moe
from research.models.logprobs import token_logprobs
from research.train.checkpoint import Checkpointer
from research.train.optim import default_optim_config, make_optimizer
from research.train.state import (
    abstract_train_state,
    init_train_state,
    make_mesh,
    model_config,
    policy_state_init,
)
from research.train.step import make_train_step

ROWS, T = 4, 32


def make_sft_loss_fn(model_cfg, *, logprob_chunk: int = 1024):
    """Token-mean NLL of `targets` where `loss_mask` (tokens, positions, segment_ids, subtree_end rows)."""

    def loss_fn(params, batch, rng):
        del rng
        hidden = Qwen3(model_cfg).apply({"params": params}, batch["tokens"], batch["positions"],
                                        batch["segment_ids"], batch["subtree_end"])
        logp, ent = token_logprobs(hidden, head_weight(params, model_cfg), batch["targets"], chunk_size=logprob_chunk,
                                   return_entropy=True)
        mask = batch["loss_mask"].astype(jnp.float32)
        n = jnp.maximum(mask.sum(), 1.0)
        nll = -(logp * mask).sum() / n
        return nll, {"nll": nll, "entropy": (ent * mask).sum() / n, "num_tokens": mask.sum()}

    return loss_fn


def _tree_row(rng: np.random.Generator, vocab: int) -> dict[str, np.ndarray]:
    """One packed row: a prefix tree (shared prefix, two branches) then a plain sequence, then padding."""
    p, a, b = rng.integers(3, 8, size=3)
    s = int(rng.integers(2, T - p - a - b - 1))
    n = p + a + b + s
    tokens = np.zeros(T, np.int32)
    tokens[:n] = rng.integers(1, vocab, size=n)
    seg = np.zeros(T, np.int32)
    seg[: p + a + b], seg[p + a + b: n] = 1, 2
    pos = np.zeros(T, np.int32)
    pos[:p + a] = np.arange(p + a)
    pos[p + a: p + a + b] = np.arange(p, p + b)
    pos[p + a + b: n] = np.arange(s)
    end = np.arange(T, dtype=np.int32)
    end[:p], end[p: p + a], end[p + a: p + a + b], end[p + a + b: n] = p + a + b - 1, p + a - 1, p + a + b - 1, n - 1
    targets = np.zeros(T, np.int32)
    mask = np.zeros(T, np.float32)
    targets[: p + a - 1] = tokens[1: p + a]  # prefix continues into branch A
    targets[p + a: p + a + b - 1] = tokens[p + a + 1: p + a + b]
    targets[p + a + b: n - 1] = tokens[p + a + b + 1: n]
    mask[: p + a - 1] = mask[p + a: p + a + b - 1] = mask[p + a + b: n - 1] = 1.0
    return dict(tokens=tokens, positions=pos, segment_ids=seg, subtree_end=end, targets=targets, loss_mask=mask)


def _batch(seed: int, vocab: int = 128) -> dict[str, jax.Array]:
    rng = np.random.default_rng(seed)
    rows = [_tree_row(rng, vocab) for _ in range(ROWS)]
    return {k: jnp.asarray(np.stack([r[k] for r in rows])) for k in rows[0]}


def _init(cfg):
    opt, _ = make_optimizer(_optim())
    return policy_state_init(cfg, opt)


def _optim():
    c = default_optim_config()
    c.learning_rate = 1e-3
    return c


MESH_8 = dict(data=2, fsdp=1, expert=2, tensor=2)


@pytest.mark.slow
def test_sharded_equals_single_device_loss_and_grads():
    single_cfg = tiny_moe()
    sharded_cfg = tiny_moe(expert_parallel=True)
    mesh1 = make_mesh(dict(data=1, fsdp=1, expert=1, tensor=1), jax.devices()[:1])
    mesh8 = make_mesh(MESH_8)
    s1, _ = init_train_state(_init(single_cfg), mesh1, single_cfg.logical_rules, jax.random.PRNGKey(0))
    sh8 = abstract_train_state(_init(sharded_cfg), mesh8, sharded_cfg.logical_rules)
    params8 = jax.tree.map(lambda x, a: jax.device_put(x, a.sharding), s1.params, sh8.params)
    assert params8["layers_0"]["moe"]["wi_gate"].sharding.spec == P(None, "expert", "fsdp", "tensor")
    batch = _batch(0)
    bsh = NamedSharding(mesh8, P(("data", "fsdp", "expert")))
    vg = lambda cfg: jax.value_and_grad(make_sft_loss_fn(cfg, logprob_chunk=32), has_aux=True)
    (l1, m1), g1 = jax.jit(vg(single_cfg))(s1.params, batch, None)
    with jax.set_mesh(mesh8):
        (l8, m8), g8 = jax.jit(vg(sharded_cfg))(params8, jax.device_put(batch, bsh), None)
    assert float(m8["num_tokens"]) == float(m1["num_tokens"]) > 0
    np.testing.assert_allclose(float(l8), float(l1), rtol=1e-5, atol=1e-6)
    for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(g1), jax.tree.leaves(g8)):
        np.testing.assert_allclose(np.asarray(b), np.asarray(a), rtol=1e-5, atol=1e-5,
                                   err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow
def test_train_step_resume_bit_identical_and_other_mesh(tmp_path):
    cfg = tiny_moe(expert_parallel=True)
    mesh = make_mesh(MESH_8)
    init = _init(cfg)
    state, sh = init_train_state(init, mesh, cfg.logical_rules, jax.random.PRNGKey(1))
    loss_fn = make_sft_loss_fn(cfg, logprob_chunk=32)
    bsh = NamedSharding(mesh, P(("data", "fsdp", "expert")))
    step = make_train_step(loss_fn=loss_fn, optimizer=init.optimizer, state_shardings=sh, batch_shardings=bsh)
    losses = []
    with Checkpointer(tmp_path / "ck", save_every=2, keep=1) as ck:
        for i in range(3):
            state, m = step(state, _batch(10 + i))
            losses.append(float(m["loss"]))
            ck.save(int(state.step), state, data_state={"next": i + 1})
        ck.wait()
        assert ck.all_steps() == [2] and step.cache_size() == 1  # 3 different tree shapes, one compile
        restored, data, _ = ck.restore(abstract_train_state(init, mesh, cfg.logical_rules))
        assert data == {"next": 2}
        _, m = step(restored, _batch(12))
        assert float(m["loss"]) == losses[2]  # bit-identical to the uninterrupted run

        # Another mesh (4 devices: fsdp=2, tensor=2, no expert axis) without expert parallelism.
        cfg2 = tiny_moe()
        mesh2 = make_mesh(dict(data=1, fsdp=2, expert=1, tensor=2), jax.devices()[:4])
        init2 = _init(cfg2)
        other, _, _ = ck.restore(abstract_train_state(init2, mesh2, cfg2.logical_rules))
        assert other.params["embedding"].sharding.spec == P("tensor", "fsdp")
        sh2 = jax.tree.map(lambda a: a.sharding, other)
        step2 = make_train_step(loss_fn=make_sft_loss_fn(cfg2, logprob_chunk=32), optimizer=init2.optimizer,
                                state_shardings=sh2, batch_shardings=NamedSharding(mesh2, P(("data", "fsdp"))))
        _, m2 = step2(other, _batch(12))
        np.testing.assert_allclose(float(m2["loss"]), losses[2], rtol=1e-5)


@pytest.mark.slow
def test_train_state_from_tiny_config():
    config = tiny.get_config()
    config.mesh.update(data=2, fsdp=2, expert=1, tensor=2)
    mesh = make_mesh(config.mesh)
    cfg = model_config(config)
    state, sh = init_train_state(policy_state_init(cfg, make_optimizer(config.optim)[0]), mesh, cfg.logical_rules,
                                 jax.random.PRNGKey(0))
    assert cfg == tiny_moe()
    assert state.params["lm_head"].sharding.spec == P("fsdp", "tensor")
    assert state.params["lm_head"].dtype == jnp.float32
    step = make_train_step(loss_fn=make_sft_loss_fn(cfg), optimizer=make_optimizer(config.optim)[0],
                           state_shardings=sh, batch_shardings=NamedSharding(mesh, P(("data", "fsdp"))))
    _, m = step(state, _batch(0))
    assert set(m) >= {"loss", "grad_norm", "param_norm", "update_norm", "learning_rate", "nll", "entropy"}
    assert float(m["learning_rate"]) == 0.0  # warmup starts at 0 (init_lr_ratio=0)
    assert np.isfinite(float(m["loss"])) and float(m["grad_norm"]) > 0


def test_make_mesh_errors():
    with pytest.raises(ValueError, match="needs 16 devices, have 8"):
        make_mesh(dict(data=2, fsdp=2, expert=2, tensor=2), jax.devices()[:8])
    with pytest.raises(ValueError, match="not divisible"):
        make_mesh(dict(data=-1, fsdp=3, expert=1, tensor=1), jax.devices()[:8])
    with pytest.raises(ValueError, match="at most one mesh axis"):
        make_mesh(dict(data=-1, fsdp=-1, expert=1, tensor=1))
