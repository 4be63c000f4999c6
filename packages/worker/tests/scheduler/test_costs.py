"""Learned per-(model, batch size) costs."""

from __future__ import annotations

import pytest

from reactantserver.worker.runtime.probe import RunKey
from reactantserver.worker.scheduler.costs import CostTable


def test_spec_example() -> None:
    costs = CostTable(alpha=0.2)
    assert costs.record("m", 4, 0.04) == 0.04
    for _ in range(50):
        costs.record("m", 4, 0.01)
    assert costs.get("m", 4) == pytest.approx(0.0100004, abs=5e-8)
    assert costs.get("m", 4) == pytest.approx(0.01 + 0.03 * 0.8**50)


def test_default_when_unmeasured() -> None:
    costs = CostTable()
    assert costs.alpha == 0.2
    assert costs.get("m", 1) == 0.01
    assert costs.measured("m", 1) is None
    assert costs.of_model("m") == {}


def test_first_measurement_replaces_the_default() -> None:
    costs = CostTable()
    costs.record("m", 2, 0.5)
    assert costs.get("m", 2) == 0.5
    assert costs.measured("m", 2) == 0.5
    # Other sizes and models stay unmeasured.
    assert costs.measured("m", 4) is None
    assert costs.measured("other", 2) is None


def test_ema_update() -> None:
    costs = CostTable(alpha=0.2)
    costs.record("m", 1, 1.0)
    assert costs.record("m", 1, 2.0) == pytest.approx(0.2 * 2.0 + 0.8 * 1.0)


def test_custom_default() -> None:
    assert CostTable(default=0.5).get("m", 1) == 0.5


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5])
def test_alpha_out_of_range(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha must be in"):
        CostTable(alpha=alpha)


def test_alpha_one_keeps_the_last_sample() -> None:
    costs = CostTable(alpha=1.0)
    costs.record("m", 1, 1.0)
    assert costs.record("m", 1, 3.0) == 3.0


def test_seed_keeps_the_largest_variant_of_each_size() -> None:
    costs = CostTable()
    costs.seed(
        {
            RunKey("m", 0, 4): 0.02,
            RunKey("m", 1, 4): 0.03,
            RunKey("m", 2, 4): 0.025,
            RunKey("m", None, 1): 0.004,
            RunKey("n", "v", 8): 0.5,
        }
    )
    assert costs.measured("m", 4) == 0.03
    assert costs.of_model("m") == {4: 0.03, 1: 0.004}
    assert costs.of_model("n") == {8: 0.5}


def test_seed_replaces_the_default_and_later_samples_fold_in() -> None:
    costs = CostTable(alpha=0.2)
    costs.seed({RunKey("m", None, 2): 1.0})
    assert costs.get("m", 2) == 1.0
    assert costs.record("m", 2, 2.0) == pytest.approx(1.2)


def test_forget_drops_only_that_model() -> None:
    costs = CostTable()
    costs.record("m", 1, 0.1)
    costs.record("m", 4, 0.2)
    costs.record("n", 1, 0.3)
    costs.forget("m")
    costs.forget("unknown")
    assert costs.of_model("m") == {}
    assert costs.get("m", 1) == 0.01
    assert costs.of_model("n") == {1: 0.3}


def test_meta_models_record_under_batch_zero() -> None:
    costs = CostTable()
    costs.record("meta", 0, 0.7)
    assert costs.of_model("meta") == {0: 0.7}
