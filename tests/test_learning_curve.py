"""`first_crossing` (research/benchmarks/learning.py), which tests/test_rl_learning.py's bandit tests hold to a
margin before the end of their budget, on fixed curves: the curves recorded when those margins were set (one run
each of the tests' configurations, rounded to 3 decimals) and hand-made ones for its edges."""

import pytest

from research.benchmarks.learning import first_crossing

# mean reward per step, before that step's update
GRPO_15 = [0.128, 0.133, 0.148, 0.221, 0.286, 0.424, 0.581, 0.742, 0.839, 0.911, 0.961, 0.984, 0.997, 0.995, 0.997]
PPO_18 = [0.128, 0.133, 0.135, 0.159, 0.125, 0.107, 0.164, 0.195, 0.273, 0.336, 0.484, 0.552, 0.716, 0.781, 0.846,
          0.930, 0.951, 0.977]
NEGATED_10 = [0.128, 0.115, 0.102, 0.099, 0.060, 0.044, 0.036, 0.018, 0.018, 0.013]
T07_12 = [0.125, 0.138, 0.182, 0.305, 0.461, 0.659, 0.833, 0.945, 0.969, 0.995, 0.992, 1.0]


def test_the_recorded_curves_cross_where_the_learning_tests_say():
    assert first_crossing(GRPO_15, 0.8) == 10  # the test asks for <= 12 (3 steps before the end)
    assert first_crossing(PPO_18, 0.8) == 16  # <= 17
    assert first_crossing(T07_12, 0.8) == 8  # <= 10
    assert first_crossing(NEGATED_10, 0.03, falling=True) == 9  # <= 9
    assert first_crossing(NEGATED_10, 0.02, falling=True) == 10  # at 0.02 only the last step: no margin left


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
