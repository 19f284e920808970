"""A third of the shards moved between primaries under a direct load: nothing acknowledged is lost, writes go on.

Writers (redis-py's asyncio ``RedisCluster``, the app's client) put keys on every one of the 1,024 shards, plain
``SET`` and a multi-key Lua script on one shard's tag (a set and a list, as the queue's scripts touch a session's and
its shard's keys together); readers read back what was acknowledged, all while :func:`tests.cluster.reshard.move_shards`
moves shards ``0 … 340`` to another primary. redis-py follows ``MOVED`` and ``ASK`` by itself and retries ``TRYAGAIN``
(a multi-key command on a slot whose keys are half moved) up to its request TTL (16 tries, the last 8 after 50 ms);
what still reaches the application is counted and retried by the writer, as the app's callers would (the web tier
answers 503 and the platform posts again; a worker's drain fails and is retried).
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator
from functools import partial
from pathlib import Path

import pytest
import redis.asyncio as aioredis
from redis.crc import key_slot
from redis.exceptions import ClusterError, TryAgainError
from redis.exceptions import ConnectionError as RedisConnectionError

from switchboard.queue.shards import SHARDS, SLOTS_PER_SHARD, TAGS
from tests.cluster.reshard import close_slots, migrate, move_shards, open_slots, owner_of, primaries, shard_slots
from tests.cluster.servers import LocalCluster

pytestmark = [pytest.mark.cluster, pytest.mark.timeout(90)]

MOVED = range(0, SHARDS // 3)
"""Shards ``0 … 340``: slots ``0, 16, … 5440``, all on the first primary of a fresh cluster."""
BATCH = 8
"""Keys per ``MIGRATE``: a shard's ~20 keys leave in several, so its multi-key script meets the half-moved slot."""
WRITERS = 6
READERS = 2

RECORD = """
if redis.call('SADD', KEYS[1], ARGV[1]) == 1 then redis.call('RPUSH', KEYS[2], ARGV[1]) end
return redis.call('SCARD', KEYS[1])
"""
"""Idempotent: a retried call adds nothing twice (the set and the list stay the same length)."""


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A cluster of its own: the test changes which primary owns which slots."""
    with LocalCluster(tmp_path_factory.mktemp("reshard")) as c:
        yield c


def _plain(writer: int, i: int) -> str:
    return f"sb:{{{TAGS[(writer * 7919 + i) % SHARDS]}}}:w{writer}:{i}"


def _redirections(seed: tuple[str, int]) -> Counter[str]:
    """``MOVED``, ``ASK``, ``TRYAGAIN``… answers the primaries gave so far (``INFO errorstats``), and by command."""
    out: Counter[str] = Counter()
    for node in primaries(seed):
        with node.client() as c:
            for name, stat in c.info("errorstats").items():
                out[name.removeprefix("errorstat_")] += int(stat["count"])
            for name, stat in c.info("commandstats").items():  # which commands the errors answered
                if int(stat.get("failed_calls", 0)) or int(stat.get("rejected_calls", 0)):
                    out[f"{name.removeprefix('cmdstat_')} failed"] += int(stat.get("failed_calls", 0))
                    out[f"{name.removeprefix('cmdstat_')} rejected"] += int(stat.get("rejected_calls", 0))
    return out


def _tagged(shard: int) -> tuple[str, str]:
    return f"sb:{{{TAGS[shard]}}}:recorded", f"sb:{{{TAGS[shard]}}}:log"


class Load:
    """Acknowledged writes and what the application saw go wrong."""

    def __init__(self) -> None:
        self.acked: dict[str, str] = {}
        self.recorded: dict[int, set[str]] = {}
        self.errors: Counter[str] = Counter()
        self.during: int = 0
        self.moving = False
        self.stop = False
        self.bad_reads: list[tuple[str, object]] = []


async def _writer(rc: aioredis.RedisCluster, writer: int, load: Load) -> None:
    record = rc.register_script(RECORD)
    i = 0
    while not load.stop:
        key, value = _plain(writer, i), f"v{writer}-{i}"
        shard = (writer * 31 + i) % SHARDS
        member = f"{writer}:{i}"
        await _until_acked("SET", partial(rc.set, key, value), load)
        await _until_acked("EVALSHA", partial(record, keys=list(_tagged(shard)), args=[member]), load)
        load.acked[key] = value
        load.recorded.setdefault(shard, set()).add(member)
        load.during += load.moving
        i += 1
        await asyncio.sleep(0)


async def _until_acked(name: str, call: Callable[[], Awaitable[object]], load: Load) -> None:
    """As the app's callers do: an error is answered non-2xx and the message posted again."""
    while True:
        try:
            await call()
            return
        except (TryAgainError, ClusterError, RedisConnectionError) as err:
            load.errors[f"{name}: {type(err).__name__}: {str(err)[:40]}"] += 1
            await asyncio.sleep(0.05)


async def _reader(rc: aioredis.RedisCluster, load: Load, rng: random.Random) -> None:
    while not load.stop:
        if load.acked:
            key = rng.choice(list(load.acked))
            try:
                got = await rc.get(key)
            except (TryAgainError, ClusterError, RedisConnectionError) as err:
                load.errors[f"GET: {type(err).__name__}"] += 1
            else:
                if got != load.acked[key].encode():
                    load.bad_reads.append((key, got))
        await asyncio.sleep(0.001)


async def test_a_third_of_the_shards_move_under_load_and_every_acknowledged_write_stays(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    seed = cluster.startup_nodes[0]
    source = owner_of(seed, 0)
    target = next(n for n in primaries(seed) if n.id != source.id and SLOTS_PER_SHARD * MOVED[-1] not in n.slots)
    assert all(SLOTS_PER_SHARD * s in source.slots for s in MOVED), "a fresh cluster's first primary owns 0-5460"
    rcs = [aioredis.RedisCluster.from_url(cluster.url) for _ in range(WRITERS + READERS)]
    load = Load()
    rng = random.Random(26)
    try:
        tasks = [asyncio.create_task(_writer(rcs[w], w, load)) for w in range(WRITERS)]
        tasks += [asyncio.create_task(_reader(rcs[WRITERS + r], load, rng)) for r in range(READERS)]
        await asyncio.sleep(2.0)  # every shard has keys before the move
        before = len(load.acked)
        load.moving = True
        answered = _redirections(seed)
        move = await asyncio.to_thread(move_shards, seed, MOVED, target.address, batch=BATCH)
        load.moving = False
        await asyncio.sleep(1.0)  # and writes after it
        load.stop = True
        await asyncio.gather(*tasks)
        answered = _redirections(seed) - answered
        print(
            f"\n[reshard] {move.slots} slots, {move.keys} keys in {move.migrates} MIGRATEs, {move.seconds:.2f}s; "
            f"{before} writes before, {load.during} during, {len(load.acked)} in all; "
            f"answered {dict(answered)}; errors reaching the app (then retried): {dict(load.errors) or 'none'}"
        )

        # the new owner, as every primary sees it
        moved_slots = set(shard_slots(MOVED))
        for seen_by in primaries(seed):
            view = {n.id: n.slots for n in primaries((seen_by.host, seen_by.port))}
            assert moved_slots <= view[target.id] and not moved_slots & view[source.id], seen_by.address
        # a moved shard's keys all on the target, none left on the source
        with source.client() as src, target.client() as dst:
            for shard in MOVED:
                slot = SLOTS_PER_SHARD * shard
                assert src.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0, shard
                assert dst.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) > 0, shard
        assert load.during > 0, "no write was acknowledged while the slots moved"
        assert answered["ASK"] > 0, "no command met a slot half moved: the test proved nothing"
        assert not load.bad_reads, load.bad_reads[:10]

        # every acknowledged write is there, and every recorded member once, in both keys of its shard
        rc = rcs[0]
        keys = list(load.acked)
        values = await rc.mget_nonatomic(keys)
        missing = [k for k, v in zip(keys, values, strict=True) if v != load.acked[k].encode()]
        assert not missing, f"{len(missing)} acknowledged writes lost, e.g. {missing[:5]}"
        assert {key_slot(k.encode()) // SLOTS_PER_SHARD for k in keys} >= set(MOVED)
        pipe = rc.pipeline(transaction=False)
        for shard in sorted(load.recorded):
            recorded, log = _tagged(shard)
            pipe.smembers(recorded)
            pipe.lrange(log, 0, -1)
        replies = await pipe.execute()
        for n, shard in enumerate(sorted(load.recorded)):
            members, logged = replies[2 * n], replies[2 * n + 1]
            wanted = {m.encode() for m in load.recorded[shard]}
            assert members == wanted, shard
            assert sorted(logged) == sorted(wanted), f"shard {shard}: the script's two keys disagree"
    finally:
        for rc in rcs:
            await rc.aclose()


async def test_a_script_on_a_half_moved_slot_is_refused_tryagain_until_the_slot_has_moved(
    cluster: LocalCluster,
) -> None:
    """What redis-py does not hide: a multi-key script whose keys are split between the source and the target.

    Only while a slot's keys are half moved (several ``MIGRATE`` for one slot, or a key created on the target through
    ``ASK`` beside older ones still on the source). redis-py retries ``TRYAGAIN`` 16 times (the last 8 after 50 ms,
    ~0.4 s), then raises; once the slot has moved the same call succeeds. So an application must treat the error
    like a lost connection: answer the platform non-2xx (it posts again) or fail the step to be retried.
    """
    seed = cluster.startup_nodes[0]
    shard = 700
    recorded, log = (f"sb:{{{TAGS[shard]}}}:half:{name}" for name in ("recorded", "log"))
    rc = aioredis.RedisCluster.from_url(cluster.url)
    try:
        record = rc.register_script(RECORD)
        assert await record(keys=[recorded, log], args=["a"]) == 1
        source = owner_of(seed, SLOTS_PER_SHARD * shard)
        target = next(n for n in primaries(seed) if n.id != source.id)
        others = [n for n in primaries(seed) if n.id not in (source.id, target.id)]
        slot = [SLOTS_PER_SHARD * shard]
        open_slots(source, target, slot)
        migrate(source, target, [recorded])  # the set moved, the list not yet
        started = asyncio.get_running_loop().time()
        with pytest.raises((TryAgainError, ClusterError)):
            await record(keys=[recorded, log], args=["b"])
        gave_up_after = asyncio.get_running_loop().time() - started
        assert await rc.get(f"sb:{{{TAGS[shard]}}}:absent") is None  # a one-key command is redirected (ASK)
        with source.client() as src:  # the rest of the slot (the other test's keys of this shard) too
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot[0], 100):
                migrate(source, target, keys)
        close_slots(source, target, others, slot)
        assert await record(keys=[recorded, log], args=["b"]) == 2
        assert await rc.lrange(log, 0, -1) == [b"a", b"b"]
        print(f"\n[reshard] a script on a half-moved slot: redis-py gave up after {gave_up_after:.2f}s")
        assert gave_up_after < 5
    finally:
        await rc.aclose()
