"""Checkpoint interval advice (stoker.store.checkpoint_advice): Young's and Daly's formulas against hand-computed
values, the MTBF's sources, and the advice's words."""

from __future__ import annotations

import math

import pytest

from stoker.errors import ConfigError
from stoker.store.checkpoint_advice import (
    advice_line,
    advise,
    daly,
    duration,
    env_mtbf_hours,
    expected_loss,
    given_mtbf,
    steps_for,
    young,
)


def test_young_is_the_square_root_of_twice_save_times_mtbf():
    assert young(2, 100) == 20.0  # sqrt(2 * 2 * 100) = sqrt(400)
    assert young(8, 100) == 40.0  # sqrt(1600)
    assert young(12, 4 * 3600) == pytest.approx(587.8775, abs=1e-4)  # sqrt(345600)


def test_daly_by_hand():
    # delta 2 s, M 100 s: x = delta / 2M = 0.01, sqrt(x) = 0.1
    # tau = 20 * (1 + 0.1/3 + 0.01/9) - 2 = 20 + 2/3 + 2/90 - 2 = 18 + 62/90
    assert daly(2, 100) == pytest.approx(18 + 62 / 90, rel=1e-12)
    # delta 12 s, M 4 h: x = 12 / 28800; 587.8775 * (1 + 0.020412/3 + 0.00041667/9) - 12 = 579.9048
    assert daly(12, 4 * 3600) == pytest.approx(579.9048, abs=1e-4)
    # delta 1.75 s, M 190 s: sqrt(665) = 25.78759; x = 0.0046053; 25.78759 * 1.0231331 - 1.75 = 24.6341
    assert daly(1.75, 190) == pytest.approx(24.6341, abs=1e-4)


def test_daly_is_mtbf_once_the_save_takes_twice_as_long_and_young_below_it():
    assert daly(10, 5) == 5 and daly(10, 5.0) == 5.0  # delta >= 2M
    assert daly(9.99, 5) < 5.01
    for delta, m in ((1, 1e4), (30, 3600), (0.1, 86400)):
        assert daly(delta, m) < young(delta, m)  # the save time is subtracted, the correction is small
        assert daly(delta, m) == pytest.approx(young(delta, m) - delta, rel=0.05)
    assert daly(0, 100) == 0.0


def test_the_advised_interval_minimises_the_expected_loss():
    delta, m = 12.0, 4 * 3600.0
    best = daly(delta, m)
    loss = expected_loss(best, delta, m)
    assert loss == pytest.approx(delta / (best + delta) + (best + delta) / (2 * m))
    for other in (best / 2, best * 0.8, best * 1.25, best * 2):
        assert expected_loss(other, delta, m) > loss


def test_bad_inputs_are_refused():
    for save, m in ((-1, 10), (1, 0), (1, -5), (math.nan, 10), (1, math.inf)):
        with pytest.raises(ValueError):
            daly(save, m)
    with pytest.raises(ValueError):
        steps_for(10, 0)
    assert steps_for(18.69, 0.5) == 37 and steps_for(0.01, 5) == 1


def test_the_mtbf_comes_from_the_setting_else_the_environment_else_24_h_per_node():
    assert given_mtbf(8, 2, {"STOKER_MTBF_HOURS": "6"}) == (
        4 * 3600.0, "setting", "given (checkpoint.mtbf_hours=8 h per node / 2 nodes)")
    assert given_mtbf(0, 1, {"STOKER_MTBF_HOURS": "6"}) == (6 * 3600.0, "env", "given ($STOKER_MTBF_HOURS=6 h)")
    assert given_mtbf(0, 4, {}) == (6 * 3600.0, "assumed", "assumed (24 h per node / 4 nodes)")
    assert given_mtbf(0, 1, {})[2] == "assumed (24 h per node)"
    assert env_mtbf_hours({}) is None and env_mtbf_hours({"STOKER_MTBF_HOURS": " 2.5 "}) == 2.5
    for bad in ("x", "0", "-3", "nan"):
        with pytest.raises(ConfigError, match="STOKER_MTBF_HOURS"):
            env_mtbf_hours({"STOKER_MTBF_HOURS": bad})


def test_the_advice_and_its_line():
    a = advise(12, 9.6, 4 * 3600, source="observed", mtbf_note="observed from 3 failures", every_steps=50,
               failures=3)
    assert a["every_steps"] == round(daly(12, 4 * 3600) / 9.6) == 60
    assert a["interval_s"] == pytest.approx(60 * 9.6) and a["current_interval_s"] == pytest.approx(480)
    assert a["young_s"] == pytest.approx(587.8775, abs=1e-4) and a["method"] == "daly"
    assert advice_line(a) == ("checkpoint every 50 steps (8.0 min); advised every 60 steps (9.6 min; Daly, save 12 s "
                              "blocking, MTBF 4.0 h observed from 3 failures); expected loss 4.1 % vs 4.1 % now")
    end = advise(2, 0.5, 100, source="assumed", mtbf_note="assumed (24 h per node)")
    assert end["every_steps"] == 37 and end["current_expected_loss"] is None
    assert advice_line(end).startswith("checkpoint only at the end; advised every 37 steps (18 s;")
    auto = advise(2, 0.5, 100, source="assumed", mtbf_note="assumed", every_steps=40)
    assert advice_line(auto, auto=True).startswith("checkpoint every 40 steps (20 s, chosen by every=auto); advised")
    assert [duration(s) for s in (0.25, 1.75, 12, 480, 14400)] == ["0.25 s", "1.8 s", "12 s", "8.0 min", "4.0 h"]
