"""``switchboard check`` says whether sealing at rest is on and which retention rules apply."""

from __future__ import annotations

from pathlib import Path

from switchboard.core.sealing import DATA_KEYS_ENV, new_key
from tests.erase.test_canary import sb


def test_check_reports_sealing_and_retention(base_env: dict[str, str]) -> None:
    off = sb("check", env=base_env)
    assert off.returncode == 0, off.stdout + off.stderr
    assert f"sealing:     off (set {DATA_KEYS_ENV}" in off.stdout
    assert "retention:   no rule (every kind kept as it is)" in off.stdout

    config = Path(base_env["SWITCHBOARD_CONFIG"])
    config.write_text(
        config.read_text() + "retention:\n  defaults: {events: 30d}\n  tenants:\n    acme: {memory: 1w}\n"
    )
    keys = f"{new_key('k2')},{new_key('k1')}"
    on = sb("check", env={**base_env, DATA_KEYS_ENV: keys})
    assert on.returncode == 0, on.stdout + on.stderr
    assert "sealing:     on, current key k2 (2 keys listed)" in on.stdout
    assert "retention:   defaults: events 30d\n             tenant acme: memory 1w\n" in on.stdout
    assert f"{DATA_KEYS_ENV} is not a known setting" not in on.stdout


def test_check_reports_a_malformed_key_list_as_a_problem(base_env: dict[str, str]) -> None:
    bad = sb("check", env={**base_env, DATA_KEYS_ENV: "k1:c2hvcnQ="})
    assert bad.returncode == 1
    assert "sealing:     misconfigured (see problems)" in bad.stdout
    assert f"  - {DATA_KEYS_ENV} key 'k1' must be 32 bytes (it is 5)" in bad.stdout
