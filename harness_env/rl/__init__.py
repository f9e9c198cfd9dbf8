"""The RL loop through harnesses: rollouts (shim + sandbox + harness) feeding the learner of research/rl.

This package sits above both halves: it wires harness_env's runner, tasks and experts to research's
learner, engine and shim. research/ never imports harness_env (tests/test_layering.py).
"""
