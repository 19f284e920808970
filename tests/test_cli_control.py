"""The operators' commands (approvals, reconcile, dead-letters, takeover, say, handback) as subprocesses."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import redis.asyncio as aioredis

from switchboard.core.approvals.records import ApprovalRecord, ApprovalRequest, new_approval_id
from switchboard.core.messages import ConversationRef, InboundMessage, OperatorActed, Sender
from switchboard.core.tools.effects import EffectRecord
from switchboard.queue.approvals import RedisApprovals
from switchboard.queue.connection import async_client
from switchboard.queue.effects import RedisEffects
from switchboard.queue.ingest import Ingestor
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import Lease
from switchboard.settings import load_settings
from switchboard.types import SESSION_STATES, SessionKey
from tests.console.conversation import QUESTION, conversation_ref, drain, user_says


def sb(*args: str, env: dict[str, str], timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


async def a_session(redis: aioredis.Redis, env: dict[str, str]) -> SessionKey:
    settings = load_settings(env)
    message = InboundMessage(
        dedup_key="evt-1",
        conversation=ConversationRef(agent="assistant", channel="web", conversation="s1"),
        sender=Sender(id="s1"),
        text="hello",
    )
    await Ingestor(redis, settings.queue).ingest(message)
    session = message.session_key
    await redis.delete(SessionKeys(session).inbox)  # as if answered: the commands' messages are the only ones
    return session


async def inbox(redis: aioredis.Redis, session: SessionKey) -> list[InboundMessage]:
    keys = SessionKeys(session)
    ids = [i.decode() for i in await redis.lrange(keys.inbox, 0, -1)]
    return [InboundMessage.model_validate_json(await redis.hget(keys.messages, i)) for i in ids]


async def test_approvals_are_listed_and_decided_by_id(base_env: dict[str, str], redis_url: str) -> None:
    redis = async_client(redis_url)
    try:
        session = await a_session(redis, base_env)
        lease = await Lease(redis, worker_id="w1", lease_ms=60_000).acquire(session)
        assert lease is not None
        now = time.time()
        record = ApprovalRecord(
            id=new_approval_id(),
            session=session,
            tenant="default",
            agent="assistant",
            channel="web",
            run_id="run-1",
            requested_by="web:s1",
            requested_at=now,
            expires_at=now + 600,
            request=ApprovalRequest(
                tool="send_file",
                arguments={"path": "a.txt"},
                action_sha256="ab" * 32,
                idempotency_key="k",
                reason="sends a file to the user",
                rule="default:write",
                policy_version="v1",
            ),
            state_sha256="00" * 32,
            approvers=("requester", "operators"),
        )
        await RedisApprovals(redis, session, lease.token, lease.epoch).approval_open(record)

        listed = sb("approvals", "list", env=base_env)
        assert listed.returncode == 0, listed.stderr
        assert record.id in listed.stdout and "send_file" in listed.stdout and session in listed.stdout

        approved = sb("approvals", "approve", record.id, "--operator", "ops", env=base_env)
        assert approved.returncode == 0, approved.stderr
        [queued] = await inbox(redis, session)
        assert queued.event == OperatorActed(
            action="decide", operator="console:ops", approval_id=record.id, verdict="approve"
        )

        unknown = sb("approvals", "deny", "nosuchid1", env=base_env)
        assert unknown.returncode == 1 and "no pending approval nosuchid1" in unknown.stderr
        assert "Traceback" not in unknown.stderr
    finally:
        await redis.aclose()


async def test_takeover_say_and_handback_reach_the_session_in_order(base_env: dict[str, str], redis_url: str) -> None:
    redis = async_client(redis_url)
    try:
        session = await a_session(redis, base_env)
        for args in (("takeover", session), ("say", session, "Hello from a person"), ("handback", session)):
            result = sb(*args, "--operator", "bea", env=base_env)
            assert result.returncode == 0, result.stderr

        queued = await inbox(redis, session)
        events = [m.event for m in queued]
        assert [e.action for e in events if isinstance(e, OperatorActed)] == ["take_over", "say", "hand_back"]
        assert {m.sender.id for m in queued} == {"console:bea"}
        assert queued[1].text == "Hello from a person"

        empty = sb("say", session, "   ", env=base_env)
        assert empty.returncode == 1 and "1 to 4000 characters" in empty.stderr
        ghost = sb("takeover", "default/assistant/web/default/ghost", env=base_env)
        assert ghost.returncode == 1 and "no such session" in ghost.stderr
        assert len(await inbox(redis, session)) == 3
    finally:
        await redis.aclose()


async def test_reconcile_lists_and_resolves_an_effect_in_doubt(base_env: dict[str, str], redis_url: str) -> None:
    redis = async_client(redis_url)
    try:
        session = await a_session(redis, base_env)
        lease = await Lease(redis, worker_id="w1", lease_ms=60_000).acquire(session)
        assert lease is not None
        effects = RedisEffects(redis, session, lease.token, lease.epoch)
        claim = EffectRecord(action_sha256="cd" * 32)
        await effects.effect_begin("key-9", claim)
        await effects.effect_doubt("key-9", claim, {"tool": "send_file", "run_id": "run-3"})

        listed = sb("reconcile", "list", env=base_env)
        assert listed.returncode == 0 and "key-9" in listed.stdout and "tool=send_file" in listed.stdout

        resolved = sb("reconcile", "resolve", session, "key-9", "done", "--operator", "ops", env=base_env)
        assert resolved.returncode == 0, resolved.stderr
        assert "marked done by console:ops" in resolved.stdout
        assert "no effects awaiting reconciliation" in sb("reconcile", "list", env=base_env).stdout
        assert "resolved=done" in sb("reconcile", "list", "--all", env=base_env).stdout
        again = sb("reconcile", "resolve", session, "key-9", "failed", env=base_env)
        assert again.returncode == 1 and "already resolved" in again.stderr
        found = await effects.effect_begin("key-9", claim)
        assert found is not None and found.status == "done" and found.outcome is not None and found.outcome["ok"]
        bad = sb("reconcile", "resolve", session, "key-9", "maybe", env=base_env)
        assert bad.returncode == 2 and "invalid choice" in bad.stderr
    finally:
        await redis.aclose()


def test_operator_commands_refuse_missing_arguments(base_env: dict[str, str]) -> None:
    for args, needs in (
        (("approvals", "approve"), "needs an ID"),
        (("reconcile", "resolve"), "needs session"),
        (("dead-letters", "requeue", "a/b/web/c/d"), "needs an ID"),
    ):
        result = sb(*args, env=base_env)
        assert result.returncode == 2 and needs in result.stderr and "Traceback" not in result.stderr
    assert "no dead letters" in sb("dead-letters", "list", env=base_env).stdout


# ---- sessions: the console's states and the transcript (issue #21)


async def test_sessions_list_and_show_print_the_console_states_and_the_transcript(
    base_env: dict[str, str], redis_url: str, tmp_path: Path
) -> None:
    redis = async_client(redis_url)
    try:
        answered = await user_says(redis, conversation_ref(conversation="answered"), QUESTION, "evt-a")
        await drain(redis, answered, tmp_path / "ws")
        waiting = await user_says(redis, conversation_ref(channel="web", conversation="w"), "hi \x1b[31m", "evt-w")
    finally:
        await redis.aclose()
    listed = sb("sessions", "list", env=base_env)
    assert listed.returncode == 0, listed.stderr
    states = {line.split()[0]: line.split("state=")[1].split()[0] for line in listed.stdout.splitlines()}
    assert states == {answered: "done", waiting: "queued"}  # the console's words: never idle or running
    assert set(states.values()) <= set(SESSION_STATES)
    only_web = sb("sessions", "list", "--channel", "web", env=base_env)
    assert [line.split()[0] for line in only_web.stdout.splitlines()] == [waiting]
    only_done = sb("sessions", "list", "--state", "done", env=base_env)
    assert [line.split()[0] for line in only_done.stdout.splitlines()] == [answered]
    assert sb("sessions", "list", "--state", "idle", env=base_env).returncode == 2

    shown = sb("sessions", "show", answered, env=base_env)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout
    assert "state=done" in out
    assert f"user 42: {QUESTION}" in out
    assert 'tool lookup({"city": "Paris"}) ok' in out and "result (untrusted):" in out and "12:00 in Paris" in out
    assert "agent: lookup returned:" in out
    assert out.index("user 42") < out.index("tool lookup") < out.index("agent: lookup returned")
    assert "events: message_received, run_queued" in out
    raw = sb("sessions", "show", waiting, "--events", env=base_env)
    assert raw.returncode == 0 and "message_received" in raw.stdout
    terminal = sb("sessions", "show", waiting, env=base_env)
    assert "\x1b" not in terminal.stdout and "user 42: hi \ufffd[31m" in terminal.stdout
