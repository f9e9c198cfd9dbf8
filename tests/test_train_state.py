"""TrainState creation, the train step and orbax checkpoints on a tiny logically-partitioned module.

The model-independent contract (shardings from logical names, optimizer moments mirror params,
metrics, microbatching, critic, no recompiles, save/restore/other mesh) is tested here on a toy
module so it fails for *this* code; tests/test_train_qwen3.py repeats the acceptance on tiny Qwen3.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from research.train.checkpoint import Checkpointer, CheckpointError
from research.train.optim import default_optim_config, make_optimizer
from research.train.state import StateInit, abstract_train_state, init_train_state
from research.train.step import make_train_step

AXES = ("data", "fsdp", "expert", "tensor")
RULES = [("embed", "fsdp"), ("mlp", "tensor")]


class Toy(nn.Module):
    @nn.compact
    def __call__(self, x_BxD):
        w = self.param("w", nn.with_logical_partitioning(nn.initializers.normal(0.5), ("embed", "mlp")), (16, 32))
        b = self.param("b", nn.with_logical_partitioning(nn.initializers.normal(0.1), ("mlp",)), (32,))
        return jnp.tanh(x_BxD @ w + b).sum(-1)


class Critic(nn.Module):
    @nn.compact
    def __call__(self, x_BxD):
        return nn.Dense(1, kernel_init=nn.with_logical_partitioning(nn.initializers.normal(0.5), ("embed", None)))(
            x_BxD
        )[:, 0]


def _mesh(shape, n=None):
    devs = np.array(jax.devices()[: n or int(np.prod(shape))]).reshape(shape)
    return Mesh(devs, AXES)


def _opt(lr=1e-2):
    cfg = default_optim_config()
    cfg.learning_rate = lr
    return make_optimizer(cfg)[0]


def _init(critic=False):
    x = jnp.zeros((1, 16))
    kw = {}
    if critic:
        kw = dict(critic_init_fn=lambda r: Critic().init(r, x)["params"], critic_optimizer=_opt(1e-1))
    return StateInit(init_fn=lambda r: Toy().init(r, x)["params"], optimizer=_opt(), **kw)


def loss_fn(params, batch, rng, critic_params=None):
    pred = Toy().apply({"params": params}, batch["x"])
    loss = jnp.mean((pred - batch["y"]) ** 2)
    metrics = {"mse": loss, "noise": jax.random.uniform(rng)}
    if critic_params is not None:
        v = Critic().apply({"params": critic_params}, batch["x"])
        vloss = jnp.mean((v - batch["y"]) ** 2)
        metrics["value_loss"] = vloss
        loss = loss + vloss
    return loss, metrics


def _batch(seed=0, n=8):
    k1, k2 = jax.random.split(jax.random.PRNGKey(seed))
    return {"x": jax.random.normal(k1, (n, 16)), "y": jax.random.normal(k2, (n,))}


def test_shardings_follow_logical_rules_and_abstract_matches():
    mesh = _mesh((2, 2, 1, 2))
    state, shardings = init_train_state(_init(), mesh, RULES, jax.random.PRNGKey(0))
    assert state.params["w"].sharding.spec == P("fsdp", "tensor")
    assert state.params["b"].sharding.spec == P("tensor")
    adam = [s for s in jax.tree.leaves(state.opt_state, is_leaf=lambda x: isinstance(x, optax.ScaleByAdamState))
            if isinstance(s, optax.ScaleByAdamState)][0]
    assert adam.mu["w"].sharding.spec == P("fsdp", "tensor") and adam.nu["b"].sharding.spec == P("tensor")
    assert state.params["w"].dtype == jnp.float32 and state.step.dtype == jnp.int32
    abstract = abstract_train_state(_init(), mesh, RULES)
    real = jax.tree.map(lambda a: (a.shape, a.dtype, a.sharding.spec), state)
    assert jax.tree.map(lambda a: (a.shape, a.dtype, a.sharding.spec), abstract) == real
    assert jax.tree.map(lambda s: s.spec, shardings) == jax.tree.map(lambda a: a.sharding.spec, state)


def test_step_metrics_update_and_no_recompile():
    mesh = _mesh((2, 2, 1, 2))
    state, shardings = init_train_state(_init(), mesh, RULES, jax.random.PRNGKey(0))
    step = make_train_step(loss_fn=loss_fn, optimizer=_opt(), state_shardings=shardings,
                           batch_shardings=NamedSharding(mesh, P(("data", "fsdp"))))
    w0 = np.asarray(state.params["w"])
    new, metrics = step(state, _batch(0))
    assert state.params["w"].is_deleted()  # donated
    assert set(metrics) == {"loss", "grad_norm", "param_norm", "update_norm", "learning_rate", "mse", "noise"}
    assert int(new.step) == 1 and not np.allclose(np.asarray(new.params["w"]), w0)
    assert float(metrics["learning_rate"]) == pytest.approx(1e-2)
    assert float(metrics["param_norm"]) == pytest.approx(float(jnp.sqrt(sum(jnp.sum(x**2) for x in
                                                                              jax.tree.leaves(new.params)))))
    assert new.params["w"].sharding.spec == P("fsdp", "tensor")
    new2, m2 = step(new, _batch(1))
    assert float(m2["noise"]) != float(metrics["noise"])  # rng advances
    assert step.cache_size() == 1


def test_microbatches_equal_full_batch():
    mesh = _mesh((2, 2, 1, 2))
    init = _init()
    s1, sh = init_train_state(init, mesh, RULES, jax.random.PRNGKey(0))
    s2, _ = init_train_state(init, mesh, RULES, jax.random.PRNGKey(0))
    bsh = NamedSharding(mesh, P(("data", "fsdp")))
    full = make_train_step(loss_fn=loss_fn, optimizer=_opt(), state_shardings=sh, batch_shardings=bsh)
    micro = make_train_step(loss_fn=loss_fn, optimizer=_opt(), state_shardings=sh, batch_shardings=bsh,
                            num_microbatches=4)
    batch = _batch(3, n=16)
    a, ma = full(s1, batch)
    b, mb = micro(s2, batch)
    for k in ("loss", "mse", "grad_norm", "update_norm", "param_norm"):
        np.testing.assert_allclose(float(ma[k]), float(mb[k]), rtol=1e-5, err_msg=k)
    # Adam's first step moves each element by ~lr * g / (|g| + eps): an element whose gradient is summed in another
    # order over the microbatches can differ by a small fraction of lr (measured 1.0e-5 = lr / 1000 on one of 512);
    # a lost or doubled microbatch moves the loss and grad_norm above, and elements by whole steps
    np.testing.assert_allclose(np.asarray(a.params["w"]), np.asarray(b.params["w"]), rtol=1e-5, atol=1e-4)
    with pytest.raises(ValueError, match="num_microbatches"):
        make_train_step(loss_fn=loss_fn, optimizer=_opt(), state_shardings=sh, batch_shardings=bsh,
                        num_microbatches=0)


def test_critic_trained_with_its_own_optimizer():
    mesh = _mesh((2, 2, 1, 2))
    init = _init(critic=True)
    state, sh = init_train_state(init, mesh, RULES, jax.random.PRNGKey(0))
    assert state.has_critic and state.critic_params["Dense_0"]["kernel"].sharding.spec == P("fsdp", None)
    with pytest.raises(ValueError, match="critic_optimizer"):
        make_train_step(loss_fn=loss_fn, optimizer=init.optimizer, state_shardings=sh, batch_shardings=None)
    step = make_train_step(loss_fn=loss_fn, optimizer=init.optimizer, critic_optimizer=init.critic_optimizer,
                           state_shardings=sh, batch_shardings=NamedSharding(mesh, P(("data", "fsdp"))))
    c0 = np.asarray(state.critic_params["Dense_0"]["kernel"])
    new, m = step(state, _batch(0))
    assert float(m["critic_learning_rate"]) == pytest.approx(0.1) and float(m["learning_rate"]) == pytest.approx(1e-2)
    assert "value_loss" in m and float(m["critic_grad_norm"]) > 0
    assert not np.allclose(np.asarray(new.critic_params["Dense_0"]["kernel"]), c0)


def _train(state, step, seeds):
    losses = []
    for s in seeds:
        state, m = step(state, _batch(s))
        losses.append(float(m["loss"]))
    return state, losses


def test_checkpoint_resume_is_bit_identical_and_restores_on_other_mesh(tmp_path):
    mesh = _mesh((2, 2, 1, 2))
    init = _init(critic=True)
    bsh = NamedSharding(mesh, P(("data", "fsdp")))
    state, sh = init_train_state(init, mesh, RULES, jax.random.PRNGKey(0))
    step = make_train_step(loss_fn=loss_fn, optimizer=init.optimizer, critic_optimizer=init.critic_optimizer,
                           state_shardings=sh, batch_shardings=bsh)
    ck = Checkpointer(tmp_path / "ckpt", save_every=2, keep=2)
    losses = []
    for i in range(5):
        state, m = step(state, _batch(i))
        losses.append(float(m["loss"]))
        ck.save(int(state.step), state, data_state={"position": i + 1}, meta={"consumed": [f"r{i}"]})
    ck.wait()
    assert ck.all_steps() == [2, 4]

    # Resume from step 4 on the same mesh: the 5th loss is bit-identical to the uninterrupted run.
    restored, data_state, meta = ck.restore(abstract_train_state(init, mesh, RULES))
    assert int(restored.step) == 4 and data_state == {"position": 4} and meta == {"consumed": ["r3"]}
    w4 = np.asarray(restored.params["w"])
    _, again = _train(restored, step, [4])
    assert again[0] == losses[4]

    # Restore onto a different mesh (4 devices, all fsdp): same values, new shardings, same next loss.
    mesh2 = _mesh((1, 4, 1, 1))
    other, _, _ = ck.restore(abstract_train_state(init, mesh2, RULES), step=4)
    assert other.params["w"].sharding.mesh.shape["fsdp"] == 4 and len(other.params["w"].sharding.device_set) == 4
    np.testing.assert_array_equal(np.asarray(other.params["w"]), w4)
    sh2 = jax.tree.map(lambda a: a.sharding, other)
    step2 = make_train_step(loss_fn=loss_fn, optimizer=init.optimizer, critic_optimizer=init.critic_optimizer,
                            state_shardings=sh2, batch_shardings=NamedSharding(mesh2, P(("data", "fsdp"))))
    _, on_other = _train(other, step2, [4])
    np.testing.assert_allclose(on_other[0], losses[4], rtol=1e-6)
    with pytest.raises(CheckpointError, match="no checkpoint step 3"):
        ck.restore(abstract_train_state(init, mesh, RULES), step=3)
    ck.close()


def test_checkpoint_bytes_data_state_and_errors(tmp_path):
    mesh = _mesh((1, 1, 1, 1), n=1)
    init = _init()
    state, _ = init_train_state(init, mesh, RULES, jax.random.PRNGKey(0))
    with Checkpointer(tmp_path / "c", keep=None) as ck:
        with pytest.raises(CheckpointError, match="no checkpoint in"):
            ck.restore(abstract_train_state(init, mesh, RULES))
        ck.save(0, state, data_state=b'{"grain": 1}')
        ck.wait()
        _, ds, meta = ck.restore(abstract_train_state(init, mesh, RULES))
        assert ds == b'{"grain": 1}' and meta == {}
        no_sharding = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype), state)
        with pytest.raises(CheckpointError, match="has no sharding"):
            ck.restore(no_sharding)


_KILLED_SAVER = """
import os, signal, sys
import jax.numpy as jnp
from research.train.checkpoint import Checkpointer
from research.train.state import TrainState
state = lambda v: TrainState(step=jnp.int32(v), params={"w": jnp.full((2048, 2048), float(v))}, opt_state=(),
                             rng=jnp.zeros(2, jnp.uint32))
ck = Checkpointer(sys.argv[1], save_every=1)
ck.save(1, state(1))
ck.wait()
ck.save(2, state(2))
os.kill(os.getpid(), signal.SIGKILL)  # mid (async) save of step 2
"""


def test_kill_9_during_save_leaves_a_restorable_checkpoint(tmp_path):
    import os
    import subprocess
    import sys

    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": repo}
    proc = subprocess.run([sys.executable, "-c", _KILLED_SAVER, str(tmp_path / "ck")], env=env, timeout=300,
                          capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    mesh = _mesh((1, 1, 1, 1), n=1)
    rep = NamedSharding(mesh, P())
    with Checkpointer(tmp_path / "ck") as ck:
        steps = ck.all_steps()
        assert steps in ([1], [1, 2])  # step 2 is either complete or invisible, never half-read
        abstract = jax.tree.map(lambda a: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=rep),
                                jax.eval_shape(lambda: _killed_state(0)))
        restored, _, _ = ck.restore(abstract)
        assert float(restored.params["w"][0, 0]) == float(steps[-1]) == float(restored.step)
        if steps == [1]:
            assert ck.save(2, _killed_state(2), force=True)  # the interrupted step can be written again
            ck.wait()
        assert ck.all_steps() == [1, 2] and float(ck.restore(abstract)[0].params["w"][-1, -1]) == 2.0


def _killed_state(v):
    from research.train.state import TrainState

    return TrainState(step=jnp.int32(v), params={"w": jnp.full((2048, 2048), float(v))}, opt_state=(),
                      rng=jnp.zeros(2, jnp.uint32))
