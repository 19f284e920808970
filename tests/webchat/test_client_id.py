"""A web chat ``client_id`` is an idempotency key: the same text is the same message, another text is a 409.

Before, reusing a ``client_id`` with a different text answered 202 with the first message's id and silently dropped
the new text. A platform's dedup key stays a plain duplicate check (its retries carry identical payloads).
"""

from __future__ import annotations

from switchboard.outbound import webstream
from switchboard.queue.keys import SessionKeys
from switchboard.web.appkeys import INGESTOR
from tests.queue.conftest import make_message

from .conftest import Chat


async def test_a_client_id_reused_with_another_text_is_409_and_writes_nothing(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    first = await chat.send(token, "hello", client_id="c-1")
    before = await chat.snapshot()
    web_before = await chat.redis.xlen(SessionKeys(session).web)

    resp = await chat.post(token, {"text": "goodbye", "client_id": "c-1"})

    assert resp.status == 409
    body = await resp.json()
    assert body["ok"] is False and body["error"]["code"] == "client_id_reused", body
    assert await chat.snapshot() == before
    assert await chat.redis.xlen(SessionKeys(session).web) == web_before
    assert [m.decode() for m in await chat.redis.lrange(SessionKeys(session).inbox, 0, -1)] == [first]
    # the same text under the same client_id is still the same message
    assert await chat.send(token, "hello", client_id="c-1") == first


async def test_the_echo_of_an_idempotent_message_still_names_its_message_id(chat: Chat) -> None:
    _, token = await chat.new_session()
    session = await chat.session_key(token)
    message_id = await chat.send(token, "hello", client_id="c-2")
    users = [e for e in await webstream.replay(chat.redis, session, None) if e.type == "user"]
    assert [e.data.get("message_id") for e in users] == [message_id]


async def test_a_platform_retry_with_another_payload_stays_a_duplicate(chat: Chat) -> None:
    ingestor = chat.app[INGESTOR]
    first = await ingestor.ingest(make_message("hello", dedup="update-7"))
    again = await ingestor.ingest(make_message("edited", dedup="update-7"))
    assert again.duplicate and not again.reused and again.message_id == first.message_id
