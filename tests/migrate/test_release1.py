"""``switchboard migrate`` on a data directory the release before the sharded layout wrote (tests/migrate/data).

A copy of that directory is served by the embedded server; ``switchboard migrate`` runs as a user runs it; then a
real ``switchboard worker`` (offline model) must answer every message that was waiting, exactly once and in order
per session. The checks are invariants over whatever the data holds (no key of a layout-1 shape remains, every
waiting message answered once in order), so the later steps (shard indexes, tenant tags, drain queue) pass the same
test unchanged.
"""

from __future__ import annotations

import collections
import json
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from switchboard.queue.embedded import EmbeddedRedis
from switchboard.queue.keys import FENCED_FIELD, GlobalKeys, Layout1Keys, SessionKeys, ShardKeys
from switchboard.queue.migrations import LEGACY, MIGRATING, read_layout
from switchboard.queue.migrations.sessions import rename_session_keys

DATA = Path(__file__).resolve().parent / "data" / "appendonlydir"
OLD = Layout1Keys()
CLEARED = ("lease", "drain")
"""Session keys the drain-queue step clears rather than keeps: nothing runs while migrating, and a session with
messages waiting gets a new drain flag naming its new entry."""
LAYOUT = GlobalKeys().layout


def sb(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "switchboard", *args], env=env, capture_output=True, text=True, timeout=timeout
    )


@pytest.fixture
def release1(tmp_path: Path) -> Iterator[EmbeddedRedis]:
    """An embedded server on a private copy of the release's data directory."""
    (tmp_path / "redis").mkdir()
    shutil.copytree(DATA, tmp_path / "redis" / "appendonlydir")
    server = EmbeddedRedis(tmp_path / "redis")
    server.start()
    yield server
    server.stop()


@pytest.fixture
def r(release1: EmbeddedRedis) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(release1.url)
    yield client
    client.close()


@pytest.fixture
def env(base_env: dict[str, str], release1: EmbeddedRedis) -> dict[str, str]:
    return base_env | {"SWITCHBOARD_REDIS_URL": release1.url, "SWITCHBOARD_MODEL": "offline"}


def _keys(r: redis.Redis) -> set[str]:
    return {k.decode() for k in r.scan_iter(count=1000)}


def _legacy(keys: set[str]) -> set[str]:
    return {k for k in keys if any(legacy(k) for legacy in LEGACY)}


def _waiting(r: redis.Redis) -> dict[str, list[tuple[str, str]]]:
    """Session → its waiting messages ``(id, text)`` in inbox order, read from the layout-1 keys."""
    waiting: dict[str, list[tuple[str, str]]] = {}
    for key in _keys(r):
        found = OLD.session_in(key)
        if found is None or found[1] != "inbox":
            continue
        session = found[0]
        messages_key = key.removesuffix(":inbox") + ":messages"
        ids = [i.decode() for i in r.lrange(key, 0, -1)]
        if ids:
            texts = [json.loads(raw)["text"] for raw in r.hmget(messages_key, ids) if raw is not None]
            waiting[session] = list(zip(ids, texts, strict=True))
    return waiting


def _answered(r: redis.Redis, session: str) -> list[str]:
    """The message ids the session's web chat stream holds an answer to, in stream order."""
    return [
        json.loads(fields[b"data"])["reply_to"]
        for _, fields in r.xrange(SessionKeys(session).web)
        if fields[b"type"] == b"message"
    ]


def test_web_worker_and_run_refuse_the_unmigrated_data_and_write_nothing(env: dict[str, str], r: redis.Redis) -> None:
    before = _keys(r)
    for command in ("worker", "web", "run", "discord"):
        result = sb(command, env=env)
        assert result.returncode == 1, (command, result.stdout, result.stderr)
        assert f"`switchboard {command}` refuses to start" in result.stderr
        assert "`switchboard migrate`" in result.stderr and "docs/operations/production.md" in result.stderr
        assert "Traceback" not in result.stderr
    assert _keys(r) == before and read_layout(r) is None


def test_migrate_then_a_worker_answers_every_waiting_message_once_in_order(env: dict[str, str], r: redis.Redis) -> None:
    keys = _keys(r)
    legacy = _legacy(keys)
    fenced = int(r.get(OLD.fenced_rejections) or 0)
    waiting = _waiting(r)
    assert fenced > 0 and len(waiting) >= 5 and sum(len(m) for m in waiting.values()) >= 12, "the fixture changed"
    ttls = {k: r.pttl(k) for k in legacy if OLD.session_in(k)}

    dry = sb("migrate", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert f"{len(ttls):>9,}  session keys to rename" in dry.stdout and "nothing changed" in dry.stdout
    assert _keys(r) == keys and read_layout(r) is None

    done = sb("migrate", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"{len(ttls):>9,}  session keys renamed" in done.stdout
    assert f"{fenced:>9,}  fenced writes folded" in done.stdout
    assert read_layout(r) == "2"
    after = _keys(r)
    assert _legacy(after) == set(), "a key of the layout-1 shape is left"
    for key, ttl in ttls.items():
        session, name = OLD.session_in(key) or ("", "")
        if name in CLEARED:
            continue
        new = SessionKeys(session).key(name)
        assert new in after, f"{key} did not become {new}"
        assert (ttl < 0) == (r.pttl(new) < 0) and r.pttl(new) <= ttl, f"{new} lost its TTL"
    assert int(r.hget(ShardKeys(0).stats, FENCED_FIELD) or 0) == fenced
    untouched = {k for k in keys if k not in legacy}
    assert untouched <= after, "a key that is not a layout-1 session key was moved"

    again = sb("migrate", env=env)
    assert again.returncode == 0 and "already in key layout 2: nothing to migrate" in again.stdout
    assert _keys(r) == after

    _drain_with_a_worker(env, r, waiting)


def _drain_with_a_worker(env: dict[str, str], r: redis.Redis, waiting: dict[str, list[tuple[str, str]]]) -> None:
    log = Path(env["SWITCHBOARD_DATA_DIR"]).parent / "worker.log"
    with log.open("wb") as out:
        worker = subprocess.Popen([sys.executable, "-m", "switchboard", "worker"], env=env, stdout=out, stderr=out)
    try:
        deadline = time.monotonic() + 90
        while any(len(_answered(r, s)) < len(m) for s, m in waiting.items()):
            assert worker.poll() is None, log.read_text()[-2000:]
            assert time.monotonic() < deadline, {s: (len(_answered(r, s)), len(m)) for s, m in waiting.items()}
            time.sleep(0.1)
        time.sleep(1)  # a duplicate would show up within a second or two of the last answer
    finally:
        worker.send_signal(signal.SIGTERM)
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
    for session, messages in waiting.items():
        assert _answered(r, session) == [message_id for message_id, _ in messages], session
        assert r.llen(SessionKeys(session).inbox) == 0


def test_a_migration_stopped_half_way_refuses_starts_then_resumes_to_the_same_end(
    env: dict[str, str], r: redis.Redis
) -> None:
    legacy = _legacy(_keys(r))
    r.set(LAYOUT, MIGRATING)  # what `switchboard migrate` writes first; then it "crashed" after a few renames
    partial: collections.Counter[str] = collections.Counter()
    rename_session_keys(r, partial, limit=10)
    assert partial["session keys renamed"] == 10 and len(_legacy(_keys(r))) == len(legacy) - 10

    refused = sb("worker", env=env)
    assert refused.returncode == 1 and "did not finish" in refused.stderr and "`switchboard migrate`" in refused.stderr

    resumed = sb("migrate", env=env)
    assert resumed.returncode == 0, resumed.stderr
    sessions = len([k for k in legacy if OLD.session_in(k)])
    assert "resumed" in resumed.stdout and f"{sessions - 10:>9,}  session keys renamed" in resumed.stdout
    assert read_layout(r) == "2" and _legacy(_keys(r)) == set()


def test_migrate_refuses_while_a_worker_is_alive_unless_forced(env: dict[str, str], r: redis.Redis) -> None:
    keys = GlobalKeys()
    r.zadd(keys.workers, {"w1": int(time.time() * 1000)})
    r.set(keys.worker_alive("w1"), "1", px=60_000)
    refused = sb("migrate", env=env)
    assert refused.returncode == 1 and "stop every worker" in refused.stderr and "w1" in refused.stderr
    assert read_layout(r) is None and _legacy(_keys(r))
    forced = sb("migrate", "--force", env=env)
    assert forced.returncode == 0, forced.stderr
    assert read_layout(r) == "2" and _legacy(_keys(r)) == set()


def test_migrate_without_a_url_migrates_the_embedded_server_of_the_data_directory(
    base_env: dict[str, str], tmp_path: Path
) -> None:
    data = tmp_path / "rundata"
    (data / "redis").mkdir(parents=True)
    shutil.copytree(DATA, data / "redis" / "appendonlydir")
    env = {k: v for k, v in base_env.items() if k != "SWITCHBOARD_REDIS_URL"} | {"SWITCHBOARD_DATA_DIR": str(data)}
    done = sb("migrate", env=env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "session keys renamed" in done.stdout
    with EmbeddedRedis(data / "redis") as server:  # stopped by migrate: this start finds the data as it left it
        client = redis.Redis.from_url(server.url)
        assert read_layout(client) == "2" and _legacy(_keys(client)) == set()
        client.close()


def test_a_migrate_process_killed_mid_way_is_resumed_to_the_same_end(env: dict[str, str], r: redis.Redis) -> None:
    """SIGKILL while the renames run (100,000 more layout-1 keys make it last seconds), then run it again."""
    with r.pipeline(transaction=False) as pipe:
        for n in range(10_000):
            for name in (
                "attempts",
                "messages",
                "events",
                "history",
                "meta",
                "epoch",
                "slots",
                "outbox",
                "drain",
                "web",
            ):
                pipe.set(f"sb:{{bulk/assistant/telegram/main/{n}}}:{name}", "x", ex=86_400)
        pipe.execute()
    legacy = _legacy(_keys(r))
    migrating = subprocess.Popen(
        [sys.executable, "-m", "switchboard", "migrate"], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.monotonic() + 30
    while read_layout(r) != MIGRATING:
        assert migrating.poll() is None and time.monotonic() < deadline, "migrate ended or never started"
        time.sleep(0.01)
    time.sleep(0.3)
    migrating.kill()
    migrating.communicate()
    left = _legacy(_keys(r))
    assert read_layout(r) == MIGRATING and 0 < len(left) < len(legacy), "the kill did not land mid-way"

    refused = sb("web", env=env)
    assert refused.returncode == 1 and "did not finish" in refused.stderr

    resumed = sb("migrate", env=env)
    assert resumed.returncode == 0, resumed.stderr
    renamed = len([k for k in left if OLD.session_in(k)])
    assert f"{renamed:>9,}  session keys renamed" in resumed.stdout
    after = _keys(r)
    assert read_layout(r) == "2" and _legacy(after) == set()
    for key in legacy:
        if (found := OLD.session_in(key)) and found[1] not in CLEARED:
            assert SessionKeys(found[0]).key(found[1]) in after, key
    assert int(r.hget(ShardKeys(0).stats, FENCED_FIELD) or 0) > 0
