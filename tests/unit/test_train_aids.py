"""The trainer's test aids (docs/trainer.md#test-aids), parsed from their environment variables' text: one line for a
value they cannot take."""
import math

import pytest

from clusterctl.train.balanced import slowdown, step_floor
from clusterctl.train.config import ConfigError


def test_the_step_floor_is_seconds_or_nothing():
    assert step_floor("") == 0.0 and step_floor("0.5") == 0.5 and step_floor(" 2 ") == 2.0 and step_floor("0") == 0.0
    for bad in ("-1", "soon", "nan", "inf"):
        with pytest.raises(ConfigError, match=r"^CLUSTERCTL_TRAIN_STEP_S=.*: the seconds a step lasts at least"):
            step_floor(bad)


def test_the_slowdown_is_a_factor_with_an_optional_window_of_steps():
    assert slowdown("") == (1.0, 0, math.inf) and slowdown("3") == (3.0, 0, math.inf)
    assert slowdown("3@10-45") == (3.0, 10, 45) and slowdown("2@5-") == (2.0, 5, math.inf)
    for bad in ("0.5", "3@45-10", "3@x-", "3@10"):
        with pytest.raises(ConfigError, match=r"^CLUSTERCTL_TRAIN_SLOWDOWN=.*: a factor of 1 or more"):
            slowdown(bad)
