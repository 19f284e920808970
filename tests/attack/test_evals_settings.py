"""``SWITCHBOARD_EVALS__*``: a bad value is a config error at start-up that names the variable and the fix."""

from __future__ import annotations

import pytest

from switchboard.errors import ConfigError
from switchboard.settings import load_settings


@pytest.mark.parametrize(
    ("name", "value", "said"),
    [
        ("SAMPLE_RATE", "2", "SWITCHBOARD_EVALS__SAMPLE_RATE: Input should be less than or equal to 1"),
        ("SAMPLE_RATE", "-1", "SWITCHBOARD_EVALS__SAMPLE_RATE: Input should be greater than or equal to 0"),
        ("SAMPLE_RATE", "abc", "SWITCHBOARD_EVALS__SAMPLE_RATE: Input should be a valid number"),
        ("SAMPLE_RATE", "nan", "SWITCHBOARD_EVALS__SAMPLE_RATE: Input should be a finite number"),
        ("AGENT_RATES", '{"support": 2}', "SWITCHBOARD_EVALS__AGENT_RATES__SUPPORT: Input should be less than"),
        ("MAX_PER_TENANT", "0", "SWITCHBOARD_EVALS__MAX_PER_TENANT: Input should be greater than or equal to 1"),
        ("EXCLUDE_TENANTS", "acme", "SWITCHBOARD_EVALS__EXCLUDE_TENANTS is not valid JSON: write lists"),
        ("AGENT_RATES", "support=0.2", "SWITCHBOARD_EVALS__AGENT_RATES is not valid JSON: write lists"),
    ],
)
def test_a_bad_sampling_setting_is_a_clear_config_error(name: str, value: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings({f"SWITCHBOARD_EVALS__{name}": value})
    assert said in str(caught.value)
