"""Echo redaction: a substituted value comes back as its placeholder, literal, in any case, or encoded."""

from __future__ import annotations

import base64
from urllib.parse import quote

import pytest
from pydantic import SecretStr

from switchboard.egress.placeholders import MIN_ENCODED, Secret, Substitution, echo_pattern, placeholder

VALUE = "ghp_Zx9/+Secret=Value-42"
SHOWN = placeholder("GITHUB_TOKEN").encode()


def _redact(data: bytes, value: str = VALUE) -> bytes:
    secret = Secret("GITHUB_TOKEN", SecretStr(value), ("api.example.test",))
    return Substitution(headers=[], used=(secret,)).redact(data)


def _forms(value: bytes) -> list[bytes]:
    forms = [value, value.upper(), value.lower(), value.swapcase(), quote(value, safe="").encode()]
    forms += [value.hex().encode(), value.hex().upper().encode()]
    for prefix in (b"", b"B", b"Be", b"Bearer ", b"user:"):  # every alignment of the value in the encoded input
        for suffix in (b"", b"x", b"xy"):
            forms += [base64.b64encode(prefix + value + suffix), base64.urlsafe_b64encode(prefix + value + suffix)]
    return forms


@pytest.mark.parametrize("form", _forms(VALUE.encode()))
def test_every_known_form_of_an_echo_is_redacted(form: bytes) -> None:
    shown = _redact(b'{"echo": "' + form + b'", "n": 1}')
    assert form not in shown
    assert shown.startswith(b'{"echo": "') and shown.endswith(b'", "n": 1}')
    assert SHOWN in shown or b"A" * 8 in shown  # text forms: the placeholder; base64: zero bits, still decodable


@pytest.mark.parametrize("prefix", [b"", b"B", b"Be", b"Bearer ", b"user:"])
def test_base64_stays_decodable_without_the_value(prefix: bytes) -> None:
    for encode, decode in ((base64.b64encode, base64.b64decode), (base64.urlsafe_b64encode, base64.urlsafe_b64decode)):
        decoded = decode(_redact(encode(prefix + VALUE.encode() + b"!")))
        assert VALUE.encode() not in decoded
        assert decoded.startswith(prefix[:-1]) and len(decoded) == len(prefix) + len(VALUE) + 1


def test_text_without_the_secret_is_left_alone() -> None:
    text = b"HTTP says hello; ghp_ is a prefix, " + base64.b64encode(b"something else entirely")
    assert _redact(text) == text


def test_short_values_are_redacted_literally_and_in_case_only() -> None:
    short = "k9Z"
    assert len(short) < MIN_ENCODED
    assert _redact(b"a K9z b k9z", short) == b"a " + SHOWN + b" b " + SHOWN
    assert _redact(short.encode().hex().encode(), short) == short.encode().hex().encode()


def test_the_pattern_is_a_fixed_number_of_alternatives() -> None:
    """Bounded cost: one scan of the response, whatever the value's length (the proxy caps the response)."""
    assert echo_pattern(b"x" * 4096).pattern.count(b"|") <= 12  # 3 text forms, 6 base64 fragments
