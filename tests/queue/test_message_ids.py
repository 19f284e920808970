"""Gateway message ids: time-sortable, unique, and never repeated by a forked process (RQ work-horses fork)."""

from __future__ import annotations

import json
import os
import time

import pytest
import redis.asyncio as aioredis

from switchboard.core.messages import CommandIssued, InboundMessage, Posted
from switchboard.queue.cancellation import is_stop
from switchboard.queue.ingest import Ingestor, new_message_id
from switchboard.queue.keys import SessionKeys

from .conftest import make_message


def _random_part(message_id: str) -> str:
    return message_id[12:]


def test_ids_are_millisecond_prefixed_hex_and_unique_across_many_bulk_reads() -> None:
    now = time.time()
    ids = [new_message_id(now) for _ in range(5000)]  # ~10 reads of the OS's random bytes
    assert len(set(ids)) == len(ids)
    assert all(len(i) == 28 and int(i, 16) >= 0 for i in ids)
    assert {i[:12] for i in ids} == {f"{int(now * 1000):012x}"}
    assert len({i[12:24] for i in ids}) == len(ids)  # the drain job id takes the first 48 random bits: unique too
    assert new_message_id(now + 1) > ids[0]


def test_a_forked_child_never_hands_out_its_parents_random_bytes() -> None:
    new_message_id()  # the parent holds unread random bytes now
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: report the ids it makes, then leave without running the parent's cleanup
        try:
            os.close(read_end)
            os.write(write_end, " ".join(_random_part(new_message_id()) for _ in range(200)).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    chunks = []
    while chunk := os.read(read_end, 65536):
        chunks.append(chunk)
    os.close(read_end)
    os.waitpid(pid, 0)
    child = set(b"".join(chunks).decode().split())
    parent = {_random_part(new_message_id()) for _ in range(200)}
    assert len(child) == 200
    assert not child & parent


async def test_the_stored_record_is_the_draft_with_its_id_and_arrival_time(
    ingestor: Ingestor, client: aioredis.Redis
) -> None:
    msg = make_message('hello ünïcode \u2028 "quoted" \\ end')
    result = await ingestor.ingest(msg)
    stored = await client.hget(SessionKeys(msg.session_key).messages, result.message_id)
    record = InboundMessage.model_validate_json(stored)
    assert record == msg.model_copy(update={"id": result.message_id, "received_at": record.received_at})
    assert abs(json.loads(stored)["received_at"] - time.time()) < 60


@pytest.mark.parametrize(
    "text",
    ["/stop", " /STOP \n", "/Cancel", "\u00a0/stop\u2028", "/stop now", "/stopp", "İ/stop", "/stoİ", "x" * 5000, ""],
)
@pytest.mark.parametrize("event", [Posted(), CommandIssued(name="stop"), CommandIssued(name="ask")])
def test_the_ingest_stop_check_answers_as_is_stop(ingestor: Ingestor, text: str, event: Posted | CommandIssued) -> None:
    """The ingest checks a posted text for ``/stop`` without lower-casing a long one: same answer as ``is_stop``."""
    message = make_message(text).model_copy(update={"event": event})
    _id, _session, stop, _keys, _args = ingestor._script_call(message, "sequential", None, False)
    assert stop == is_stop(message)
