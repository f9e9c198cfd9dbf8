"""Exact numbers for the advantage estimators on tiny hand examples, and GAE on a hand path."""

import numpy as np
import pytest

from research import advantages as A


def test_grpo_hand_example():
    adv = A.group_advantages("grpo", rewards_N=np.array([1.0, 0.0, 0.0, 1.0, 3.0, 1.0]),
                             group_ids_N=np.array([0, 0, 0, 0, 1, 1]), num_groups=2, eps=0.0)
    np.testing.assert_allclose(np.asarray(adv), [1.0, -1.0, -1.0, 1.0, 1.0, -1.0], rtol=1e-6)


def test_dr_grpo_hand_example():
    adv = A.group_advantages("dr_grpo", rewards_N=np.array([1.0, 0.0, 0.0, 1.0, 3.0, 1.0]),
                             group_ids_N=np.array([0, 0, 0, 0, 1, 1]), num_groups=2)
    np.testing.assert_allclose(np.asarray(adv), [0.5, -0.5, -0.5, 0.5, 1.0, -1.0], rtol=1e-6)


def test_rloo_hand_example():
    adv = A.group_advantages("rloo", rewards_N=np.array([1.0, 0.0, 0.0, 1.0, 2.0]),
                             group_ids_N=np.array([0, 0, 0, 0, 1]), num_groups=2)
    np.testing.assert_allclose(np.asarray(adv), [2 / 3, -2 / 3, -2 / 3, 2 / 3, 0.0], rtol=1e-6)


def test_negated_grpo_is_exactly_minus_grpo():
    r = np.array([1.0, 0.0, 0.3, 0.3, 1.0, 0.0], np.float32)
    g = np.array([0, 0, 0, 1, 1, 1], np.int32)
    a = np.asarray(A.group_advantages("grpo", rewards_N=r, group_ids_N=g, num_groups=2))
    n = np.asarray(A.group_advantages("negated_grpo", rewards_N=r, group_ids_N=g, num_groups=2))
    np.testing.assert_array_equal(n, -a)
    np.testing.assert_allclose(n[:3], -(r[:3] - r[:3].mean()) / (r[:3].std() + 1e-6), rtol=1e-6)


def test_constant_group_gives_zero_not_nan():
    adv = A.group_advantages("grpo", rewards_N=np.array([1.0, 1.0]), group_ids_N=np.array([0, 0]), num_groups=1)
    np.testing.assert_array_equal(np.asarray(adv), [0.0, 0.0])


def test_unknown_estimator():
    with pytest.raises(ValueError, match="unknown advantage estimator 'nope'"):
        A.group_advantages("nope", rewards_N=np.zeros(1), group_ids_N=np.zeros(1, int), num_groups=1)


def test_gae_hand_path():
    # path 1: values [1, 2], reward 3 at the end; path 2: value [0.5], reward 1. gamma=0.9, lam=0.5
    adv, ret = A.segment_gae(values_O=np.array([1.0, 2.0, 0.5]), rewards_O=np.array([0.0, 3.0, 1.0]),
                             last_O=np.array([False, True, True]), gamma=0.9, lam=0.5)
    d0, d1 = 0.0 + 0.9 * 2.0 - 1.0, 3.0 - 2.0
    np.testing.assert_allclose(np.asarray(adv), [d0 + 0.45 * d1, d1, 0.5], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ret), np.asarray(adv) + [1.0, 2.0, 0.5], rtol=1e-6)
