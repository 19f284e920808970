"""The web chat's in-process token cache: a looked-up token saves a Redis round trip, for a bounded time only."""

from __future__ import annotations

from switchboard.queue.keys import GlobalKeys
from switchboard.web.webchat import access

from .conftest import Chat


def _cache(chat: Chat) -> access.TokenCache:
    return chat.app[access.TOKENS]


async def test_a_deleted_token_is_refused_once_its_cache_entry_lapses(chat: Chat) -> None:
    _, token = await chat.new_session()
    await chat.send(token, "first")  # looked up in Redis, then cached
    await chat.redis.delete(GlobalKeys().web_token(access.hash_token(token)))
    assert (await chat.post(token, {"text": "still trusted"})).status == 202  # within TOKEN_CACHE_S
    entries = _cache(chat)._entries
    for token_hash, (session, _until) in list(entries.items()):
        entries[token_hash] = (session, 0.0)  # TOKEN_CACHE_S has passed
    assert (await chat.post(token, {"text": "refused"})).status == 401


async def test_a_wrong_token_is_never_cached(chat: Chat) -> None:
    await chat.new_session()
    assert (await chat.post("not-a-token", {"text": "hi"})).status == 401
    assert _cache(chat)._entries == {}


def test_the_cache_keeps_at_most_its_bound_dropping_the_oldest() -> None:
    cache = access.TokenCache(60.0, 2)
    for name in ("a", "b", "c"):
        cache.put(name, name)  # type: ignore[arg-type]
    assert cache.get("a") is None and cache.get("b") == "b" and cache.get("c") == "c"
