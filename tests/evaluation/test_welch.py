"""The Welch comparison the generalization suite judges amago_app against the original with: the difference of
two means and its 95% interval, checked against values computed independently (scipy.stats.ttest_ind with
equal_var=False gives the same t statistic and degrees of freedom)."""

from __future__ import annotations

import math

import pytest

from amago_app.evaluation.evaluate import welch


def test_difference_interval_and_degrees_of_freedom_match_the_reference():
    # three seeds a side; reference: scipy's Welch t = 4.45, dof 3.9713; t_0.975 at floor(dof) = 3 is 3.182
    w = welch([1.59, 1.73, 1.72], [1.48, 1.35, 1.32])
    assert w["diff"] == pytest.approx(0.29667, abs=1e-5)
    assert w["diff"] / (w["halfwidth"] / 3.182) == pytest.approx(4.45, abs=1e-3)
    assert w["dof"] == pytest.approx(3.97131, abs=1e-4)
    assert w["halfwidth"] == pytest.approx(0.21216, abs=1e-4)


def test_unequal_sizes_and_the_sign_follow_the_first_sample():
    # reference (scipy): t = -4.3058, dof 4.1906 -> t_0.975 at 4 = 2.776
    w = welch([1.0, 2.0, 3.0], [4.0, 5.0, 6.5, 4.5, 5.5])
    assert w["diff"] == pytest.approx(-3.1, abs=1e-9)
    assert w["dof"] == pytest.approx(4.1906, abs=1e-3)
    assert w["halfwidth"] == pytest.approx(2.776 * 3.1 / 4.3058, rel=1e-3)


def test_one_value_on_a_side_gives_no_interval_and_identical_values_a_zero_one():
    assert welch([1.0], [1.0, 2.0]) is None
    assert welch([1.0, 2.0], []) is None
    w = welch([1.0, 1.0], [0.5, 0.5])
    assert w["diff"] == 0.5 and w["halfwidth"] == 0.0 and math.isinf(w["dof"])
