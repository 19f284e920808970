"""Attacks on linking accounts (``/link`` codes), budget and price configuration, and the speech provider's answer."""

from __future__ import annotations

import math

import pytest
import redis.asyncio as aioredis
from aiohttp import web
from aiohttp.test_utils import TestServer
from pydantic import ValidationError

from switchboard.core.budgets import BudgetRule
from switchboard.core.events import PersonLinked, PersonUnlinked
from switchboard.core.providers import oggopus
from switchboard.core.providers.oggopus import opus_duration, silent_opus
from switchboard.core.providers.speech import MAX_SPEECH_BYTES, OpenAISpeech
from switchboard.errors import SpeechError
from switchboard.queue import people as people_module
from switchboard.queue.budgets import Budgets
from switchboard.queue.people import TENANT_WRONG_CODES_PER_HOUR, LinkRefused, People
from switchboard.settings import FileConfig

TENANT = "default"


async def test_cycling_accounts_cannot_keep_guessing_link_codes(async_redis: aioredis.Redis) -> None:
    """On an open bot anyone can make new accounts: wrong codes are capped per tenant too, not just per account."""
    people = People(async_redis)
    code = await people.issue_code(TENANT, "telegram:1", ttl_s=600, per_hour=5)
    assert code is not None
    wrong = f"{(int(code) + 1) % 10**8:08d}"
    for attempt in range(TENANT_WRONG_CODES_PER_HOUR):
        refused = await people.redeem(TENANT, f"web:attacker{attempt // 5}", wrong, per_hour=5)
        assert isinstance(refused, LinkRefused)
    lucky = await people.redeem(TENANT, "web:attacker-fresh", code, per_hour=5)  # a fresh account guessing right
    assert isinstance(lucky, LinkRefused) and "try again" in lucky.reason
    assert await people.everyone(TENANT) == {}
    other = await people.redeem("other", "web:someone", "12345678", per_hour=5)  # another tenant is not locked
    assert isinstance(other, LinkRefused) and "wrong" in other.reason


async def test_a_right_code_links_below_the_tenant_cap(async_redis: aioredis.Redis) -> None:
    people = People(async_redis)
    code = await people.issue_code(TENANT, "telegram:1", ttl_s=600, per_hour=5)
    assert code is not None
    for attempt in range(TENANT_WRONG_CODES_PER_HOUR - 1):
        await people.redeem(TENANT, f"web:typo{attempt}", "00000000" if code != "00000000" else "1", per_hour=5)
    linked = await people.redeem(TENANT, "slack:U1", code, per_hour=5)
    assert isinstance(linked, PersonLinked)


@pytest.mark.parametrize("price", [math.nan, math.inf, -1.0])
def test_a_price_that_is_not_a_finite_non_negative_number_is_a_config_error(price: float) -> None:
    with pytest.raises(ValidationError, match="prices"):
        FileConfig.model_validate({"prices": {"openai:gpt-4.1-mini": {"input": price, "output": 1.0}}})


@pytest.mark.parametrize("credits", [math.inf, "inf", "nan", -5, 0])
def test_a_budget_of_infinite_or_no_credits_is_a_config_error(credits: object) -> None:
    with pytest.raises(ValidationError, match="credits"):
        BudgetRule.model_validate({"scope": "tenant", "credits": credits})


async def test_a_huge_speech_answer_is_not_read_into_memory() -> None:
    """A provider streaming far more than a voice note is cut off near the cap, not buffered whole."""
    sent = 0
    total = 64 * 2**20

    async def speech(request: web.Request) -> web.StreamResponse:
        nonlocal sent
        response = web.StreamResponse(headers={"content-type": "audio/ogg"})
        await response.prepare(request)
        chunk = b"O" * 2**16
        try:
            while sent < total:
                await response.write(chunk)
                sent += len(chunk)
        except (ConnectionError, RuntimeError):
            pass
        return response

    app = web.Application()
    app.router.add_post("/v1/audio/speech", speech)
    server = TestServer(app)
    await server.start_server()
    client = OpenAISpeech(model="tts-1", voice="alloy", api_key="sk-x", base_url=str(server.make_url("/v1")))
    try:
        with pytest.raises(SpeechError, match="limit"):
            await client.speak("hello")
    finally:
        await client.aclose()
        await server.close()
    assert sent < MAX_SPEECH_BYTES + 16 * 2**20


async def test_a_rule_naming_one_user_gives_that_user_more_and_counts_once(async_redis: aioredis.Redis) -> None:
    """The documented "one user gets more": the general user rule and the one naming a user name the same counter."""
    rules = [
        BudgetRule(scope="user", credits=300),
        BudgetRule(scope="user", user="telegram:42", credits=5000),
        BudgetRule(scope="agent", credits=100_000),
        BudgetRule(scope="agent", agent="demo", credits=50_000),
    ]
    budgets = Budgets(async_redis, rules)
    counters = budgets.counters(TENANT, "demo", "telegram:42", "telegram:42")
    assert len({c.key for c in counters}) == len(counters)  # no counter is charged twice by one run
    assert sorted(c.subject.rule.credits for c in counters) == [5000, 50_000]
    await budgets.charge(counters, 1000)
    admission = await budgets.admit(TENANT, "demo", "telegram:42", "telegram:42")
    assert admission.refused is None and admission.credits_left == pytest.approx(4000)
    others = await budgets.admit(TENANT, "demo", "telegram:7", "telegram:7")  # everyone else keeps the general rule
    assert others.refused is None and others.credits_left == pytest.approx(300)


def test_the_largest_voice_note_is_measured_and_a_flipped_bit_refused() -> None:
    """Every page's checksum is checked (on the worker's loop, so in C: ``docs/voice.md``), up to the size cap."""
    audio = silent_opus(18_000)  # five hours of silence, just under the cap
    assert len(audio) <= MAX_SPEECH_BYTES
    assert opus_duration(audio) == pytest.approx(18_000, abs=0.02)
    corrupted = bytearray(audio)
    corrupted[len(audio) // 2] ^= 0x01
    with pytest.raises(SpeechError, match="intact"):
        opus_duration(bytes(corrupted))


@pytest.mark.parametrize("data", [b"", b"OggS", b"123456789", bytes(range(256)) * 3])
def test_the_page_checksum_is_oggs_crc(data: bytes) -> None:
    """RFC 3533's CRC, bit by bit: polynomial 0x04C11DB7, not reflected, initial value 0, no final XOR."""
    crc = 0
    for byte in data:
        crc ^= byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) & 0xFFFFFFFF if crc & 0x80000000 else (crc << 1) & 0xFFFFFFFF
    assert oggopus._crc(data) == crc


async def test_a_new_code_never_takes_over_a_live_one(
    async_redis: aioredis.Redis, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Codes are random: one drawn equal to a live code must not replace it (its sender would be linked instead)."""
    draws = iter([12_345_678, 12_345_678, 87_654_321])
    monkeypatch.setattr(people_module.secrets, "randbelow", lambda _n: next(draws))
    people = People(async_redis)
    victim = await people.issue_code(TENANT, "telegram:1", ttl_s=600, per_hour=5)
    attacker = await people.issue_code(TENANT, "web:attacker", ttl_s=600, per_hour=5)
    assert victim == "12345678" and attacker == "87654321"
    linked = await people.redeem(TENANT, "slack:U1", victim, per_hour=5)
    assert isinstance(linked, PersonLinked) and set(linked.principals) == {"telegram:1", "slack:U1"}


async def test_the_unlink_fact_names_the_principal_as_written(async_redis: aioredis.Redis) -> None:
    """The log's unlink fact is filled in by a script: a principal holding its placeholder must not be rewritten."""
    people = People(async_redis)
    linked = await people.link(TENANT, ["web:__PERSON__", "telegram:1"], "alice", by="cli")
    assert isinstance(linked, PersonLinked)
    gone = await people.unlink(TENANT, "web:__PERSON__", by="cli")
    assert gone is not None and gone.person == "alice" and gone.principal == "web:__PERSON__"
    [logged, _linked] = await people.log(TENANT)
    assert isinstance(logged, PersonUnlinked)
    assert (logged.principal, logged.person) == ("web:__PERSON__", "alice")
