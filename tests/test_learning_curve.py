"""`first_crossing` (research/benchmarks/learning.py), which the learning tests (tests/test_rl_learning.py,
tests/test_learning_through_cli.py) hold to a margin before the end of their budget, on fixed curves: the curves
recorded when those margins were set (bandits: one run each of the tests' configurations, rounded to 3 decimals;
multi-turn and Codex: the runs of docs/experiments/, as printed there) and hand-made ones for its edges."""

import pytest

from research.benchmarks.learning import first_crossing

# mean reward per step, before that step's update
GRPO_15 = [0.128, 0.133, 0.148, 0.221, 0.286, 0.424, 0.581, 0.742, 0.839, 0.911, 0.961, 0.984, 0.997, 0.995, 0.997]
PPO_18 = [0.128, 0.133, 0.135, 0.159, 0.125, 0.107, 0.164, 0.195, 0.273, 0.336, 0.484, 0.552, 0.716, 0.781, 0.846,
          0.930, 0.951, 0.977]
NEGATED_12 = [0.128, 0.115, 0.102, 0.099, 0.060, 0.044, 0.036, 0.018, 0.018, 0.013, 0.010, 0.005]
T07_12 = [0.125, 0.138, 0.182, 0.305, 0.461, 0.659, 0.833, 0.945, 0.969, 0.995, 0.992, 1.0]


def test_the_recorded_curves_cross_where_the_learning_tests_say():
    assert first_crossing(GRPO_15, 0.8) == 10  # the test asks for <= 12 (3 steps before the end)
    assert first_crossing(PPO_18, 0.8) == 16  # <= 17
    assert first_crossing(T07_12, 0.8) == 8  # <= 10
    assert first_crossing(NEGATED_12, 0.03, falling=True) == 9  # <= 10 (its first 10 steps: the 10-step run's)
    assert first_crossing(NEGATED_12, 0.02, falling=True) == 10  # at 0.02: step 10, no slack under the <= 10


# docs/experiments/2026-12-03-demo-seeds.md section 6: the multi-turn loop test's per-step training reward
MULTI_TURN_SEED0 = [0.09, 0.12, 0.03, 0.19, 0.41, 0.53, 0.44, 0.72, 0.75, 0.72, 0.81, 0.84, 0.88, 0.84, 0.91, 0.97,
                    0.97, 0.94, 0.94, 0.91]
MULTI_TURN_SEED1 = [0.06, 0.03, 0.16, 0.22, 0.50, 0.72, 0.66, 0.91, 0.88, 0.81, 0.91, 0.97, 1.00, 0.97, 0.91, 1.00,
                    0.97, 0.94, 0.97, 1.00]
MULTI_TURN_NEGATED = [0.09, 0.06, 0.00, 0.00, 0.00, 0.03, 0.00, 0.00, 0.00, 0.00]
# docs/experiments/2026-12-03-codex-learning.md (seed 0, the CI test's run) and 2026-12-03-codex-seeds.md (seeds 1-3)
CODEX_16 = {0: [0.19, 0.31, 0.19, 0.31, 0.44, 0.56, 0.62, 0.50, 0.25, 0.62, 0.44, 0.69, 0.69, 0.62, 0.56, 0.44],
            1: [0.06, 0.12, 0.25, 0.19, 0.38, 0.50, 0.62, 0.38, 0.62, 0.38, 0.56, 0.69, 0.75, 0.69, 0.50, 0.38],
            2: [0.06, 0.25, 0.19, 0.19, 0.25, 0.38, 0.44, 0.31, 0.38, 0.50, 0.44, 0.44, 0.62, 0.81, 0.56, 0.69],
            3: [0.12, 0.25, 0.25, 0.38, 0.50, 0.44, 0.38, 0.31, 0.31, 0.38, 0.44, 0.25, 0.50, 0.38, 0.62, 0.69]}
CODEX_NEGATED_8 = {0: [0.06, 0.00, 0.00, 0.06, 0.00, 0.00, 0.00, 0.00],
                   1: [0.06, 0.00, 0.19, 0.00, 0.06, 0.00, 0.00, 0.00],
                   2: [0.06, 0.12, 0.00, 0.06, 0.06, 0.12, 0.00, 0.00],
                   3: [0.06, 0.19, 0.06, 0.06, 0.00, 0.00, 0.00, 0.06]}


def test_the_recorded_harness_curves_cross_where_the_learning_tests_say():
    assert first_crossing(MULTI_TURN_SEED0, 0.8) == 13  # the test asks for <= 16 (4 steps before the end)
    assert first_crossing(MULTI_TURN_SEED1, 0.8) == 9
    assert first_crossing(MULTI_TURN_NEGATED, 0.06, falling=True) == 3  # <= 5 (before the judged second half)
    assert {s: first_crossing(c, 0.4) for s, c in CODEX_16.items()} == {0: 6, 1: 7, 2: 11, 3: 6}  # <= 12 (before
    # the end's 4-step window; the test runs seed 0, the other seeds show how far one run can wander)
    neg = {s: first_crossing(c, 0.08, falling=True) for s, c in CODEX_NEGATED_8.items()}
    assert neg == {0: 3, 1: 4, 2: 3, 3: 5}  # <= 5 (before the end's 3-step window)


def test_one_lucky_step_is_not_a_crossing():
    assert first_crossing([0.1, 1.0, 0.1, 0.1, 0.1], 0.8) is None
    assert first_crossing([0.1, 0.9, 0.9, 0.9], 0.8) == 4  # the first window wholly above: steps 2-4
    assert first_crossing([0.1, 1.0, 0.1], 0.8, window=1) == 2


def test_a_curve_that_ends_too_soon_never_crosses():
    assert first_crossing([0.9, 0.9], 0.8) is None  # shorter than the window
    assert first_crossing([], 0.8) is None
    assert first_crossing([0.5, 0.4, 0.3], 0.5, falling=True) == 3  # falling: at or below
    assert first_crossing([0.5, 0.4, 0.3], 0.45) is None
    with pytest.raises(ValueError, match="window=0"):
        first_crossing([1.0], 0.5, window=0)
