"""Sealing sensitive fields at rest: keys from the environment, contexts bound in, rotation."""

from __future__ import annotations

import pytest

from switchboard.core.sealing import DATA_KEYS_ENV, Keyring, SealError, is_sealed, new_key
from switchboard.errors import ConfigError


def test_a_sealed_value_holds_no_plain_text_and_opens_in_its_context_only() -> None:
    ring = Keyring.parse(new_key("k1"))
    sealed = ring.seal("canary-7f3a the customer's address", "memory:acme")
    assert is_sealed(sealed)
    assert "canary" not in sealed
    assert ring.open(sealed, "memory:acme") == "canary-7f3a the customer's address"
    with pytest.raises(SealError):
        ring.open(sealed, "memory:globex")
    assert ring.open("written before sealing", "memory:acme") == "written before sealing"


def test_an_altered_value_or_an_unlisted_key_does_not_open() -> None:
    ring = Keyring.parse(new_key("k1"))
    sealed = ring.seal("secret", "ctx")
    altered = sealed[:-4] + ("AAAA" if not sealed.endswith("AAAA") else "BBBB")
    with pytest.raises(SealError):
        ring.open(altered, "ctx")
    other = Keyring.parse(new_key("k2"))
    with pytest.raises(SealError, match="no longer lists"):
        other.open(sealed, "ctx")


def test_rotation_opens_old_values_and_reseals_with_the_new_key() -> None:
    old = new_key("k1")
    before = Keyring.parse(old)
    sealed = before.seal("text", "ctx")
    after = Keyring.parse(f"{new_key('k2')},{old}")
    assert after.current == "k2"
    assert after.needs_rotation(sealed)
    assert after.needs_rotation("plain")
    resealed = after.reseal(sealed, "ctx")
    assert after.key_of(resealed) == "k2" and not after.needs_rotation(resealed)
    assert after.open(resealed, "ctx") == "text"
    # a query is blinded under every key, so a row indexed under k1 is still found during a rotation
    assert before.blind("invoice", "ctx") in after.blind_all("invoice", "ctx")
    assert after.blind("invoice", "ctx") != after.blind("invoice", "other")


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("nocolon", "is not 'id:base64'"),
        ("k1:not base64!", "not valid base64"),
        ("k1:AAAA", "must be 32 bytes"),
        (f"{new_key('k1')},{new_key('k1')}", "twice"),
        (" , ", "lists no key"),
    ],
    ids=["no-colon", "not-base64", "short", "twice", "empty"],  # fixed ids: xdist workers must collect the same
)
def test_a_bad_key_list_is_a_configuration_error_that_says_what_to_fix(value: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Keyring.parse(value)


def test_unset_keys_mean_sealing_off() -> None:
    assert Keyring.from_env({}) is None
    assert Keyring.from_env({DATA_KEYS_ENV: "  "}) is None
    assert Keyring.from_env({DATA_KEYS_ENV: new_key("a")}) is not None
