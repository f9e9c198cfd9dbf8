"""The learner side of RL: typed run config, the one objective, batches, the RL update and its diagnostics,
run bookkeeping, metrics, weight sync. The loop that drives it through harnesses is harness_env/rl."""
