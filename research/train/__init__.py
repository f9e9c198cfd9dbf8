"""Training state, optimizer, train step and checkpoints (issue 2 items 7, 9, 10).

  optim.py       optax AdamW + schedule registry + clipping, from `config.optim`
  state.py       TrainState; sharded init via eval_shape -> logical rules -> jit(out_shardings)
  step.py        make_train_step: one jitted pure step with explicit shardings/donation; sft_loss_fn
  checkpoint.py  orbax CheckpointManager of state + data-iterator JSON + meta; restore on any mesh
"""
