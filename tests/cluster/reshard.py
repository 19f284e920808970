"""Moving hash slots (and so Switchboard's logical shards) from one primary to another on a live cluster.

The standard protocol, as ``valkey-cli --cluster reshard`` runs it, per slot:

1. ``CLUSTER SETSLOT <slot> IMPORTING <source id>`` on the target (first, so the target accepts the ``ASK``
   redirections the source starts sending at step 2);
2. ``CLUSTER SETSLOT <slot> MIGRATING <target id>`` on the source: from now on the source answers a command for a key
   it no longer has with ``-ASK`` (the client sends ``ASKING`` and the command to the target), and a multi-key command
   or script of which it has some keys but not all with ``-TRYAGAIN``;
3. ``CLUSTER GETKEYSINSLOT`` / ``MIGRATE host port "" 0 timeout KEYS k1 k2 …`` in batches until the slot is empty on
   the source (each ``MIGRATE`` is atomic: its keys leave the source together);
4. ``CLUSTER SETSLOT <slot> NODE <target id>`` on the target, then the source, then every other primary (the target
   bumps its config epoch, the gossip spreads the new owner, the others learn it at once).

Steps 1, 2 and 4 are sent for a chunk of slots in one pipeline per node, but each ``SETSLOT … NODE`` still
rewrites the node's config file. Shard ``n`` of :mod:`switchboard.queue.shards` is in slot ``16 * n``;
:func:`shard_slots` gives each shard's slot, or with ``ranges`` its 16 slots ``16n … 16n+15`` (the contiguous range an
operator moves, which takes whatever other hash tags fall in it along). Used by the slot-migration
tests and the cluster benchmark (issue #26); never by the application.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import redis

from switchboard.queue.shards import SLOTS_PER_SHARD

__all__ = [
    "Move", "Node", "close_slots", "migrate", "move_shards", "move_slots", "open_slots", "owner_of", "primaries",
    "shard_slots",
]  # fmt: skip

CHUNK = 256
"""Slots whose ``SETSLOT`` commands go in one pipeline per node."""
BATCH = 100
"""Keys per ``MIGRATE``."""
MIGRATE_TIMEOUT_MS = 10_000


@dataclass(frozen=True, slots=True)
class Node:
    """A primary as ``CLUSTER NODES`` describes it."""

    id: str
    host: str
    port: int
    slots: frozenset[int]

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def client(self) -> redis.Redis:
        return redis.Redis(host=self.host, port=self.port, socket_timeout=MIGRATE_TIMEOUT_MS / 1000 + 5)


@dataclass(slots=True)
class Move:
    """What :func:`move_slots` did."""

    slots: int = 0
    keys: int = 0
    migrates: int = 0
    """``MIGRATE`` commands sent."""
    seconds: float = 0.0


def primaries(seed: tuple[str, int]) -> list[Node]:
    """Every primary of the cluster ``seed`` belongs to, with the slots it owns (as ``seed`` sees them)."""
    with redis.Redis(host=seed[0], port=seed[1], socket_timeout=5) as c:
        text = c.execute_command("CLUSTER", "NODES")
    text = text.decode() if isinstance(text, bytes) else str(text)
    nodes: list[Node] = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 8 or "master" not in fields[2].split(",") or "fail" in fields[2]:
            continue
        host, _, port = fields[1].split("@", 1)[0].rpartition(":")
        owned: set[int] = set()
        for entry in fields[8:]:
            if entry.startswith("["):  # [slot->-id] migrating / [slot-<-id] importing: not ownership
                continue
            first, _, last = entry.partition("-")
            owned.update(range(int(first), int(last or first) + 1))
        nodes.append(Node(fields[0], host or "127.0.0.1", int(port), frozenset(owned)))
    return nodes


def owner_of(seed: tuple[str, int], slot: int) -> Node:
    """The primary that owns ``slot`` (as ``seed`` sees it)."""
    return next(n for n in primaries(seed) if slot in n.slots)


def shard_slots(shards: Iterable[int], *, ranges: bool = False) -> list[int]:
    """The slot of each logical shard in ``shards`` (``16n``, where all its keys are), or with ``ranges`` the 16 slots
    ``16n … 16n+15`` (the contiguous range an operator moves, taking whatever other hash tags fall in it too)."""
    width = SLOTS_PER_SHARD if ranges else 1
    return [slot for n in shards for slot in range(SLOTS_PER_SHARD * n, SLOTS_PER_SHARD * n + width)]


def move_shards(seed: tuple[str, int], shards: Iterable[int], target: str, *, ranges: bool = False, **kw: int) -> Move:
    """Move the logical shards ``shards`` to the primary at ``target`` (``host:port``): their slots, or with
    ``ranges`` their whole slot ranges (16 times the ``SETSLOT`` commands: each ``SETSLOT … NODE`` rewrites and
    fsyncs the node's ``nodes.conf``; 5,456 slots took 61 s under load on the 2-core test machine, 341 take seconds)."""
    return move_slots(seed, shard_slots(shards, ranges=ranges), target, **kw)


def move_slots(
    seed: tuple[str, int], slots: Iterable[int], target: str, *, batch: int = BATCH, chunk: int = CHUNK
) -> Move:
    """Move ``slots`` to the primary at ``target`` (``host:port``), live; slots it already owns are skipped."""
    started = time.monotonic()
    nodes = primaries(seed)
    destination = next((n for n in nodes if n.address == target), None)
    if destination is None:
        raise ValueError(f"{target} is not a primary of the cluster: {[n.address for n in nodes]}")
    move = Move()
    for source in nodes:
        if source is destination:
            continue
        mine = sorted(set(slots) & source.slots)
        for i in range(0, len(mine), chunk):
            part = mine[i : i + chunk]
            _move_chunk(source, destination, [n for n in nodes if n not in (source, destination)], part, batch, move)
            move.slots += len(part)
    move.seconds = time.monotonic() - started
    return move


def _move_chunk(source: Node, target: Node, others: Sequence[Node], slots: list[int], batch: int, move: Move) -> None:
    open_slots(source, target, slots)
    with source.client() as src:
        for slot in slots:
            while keys := src.execute_command("CLUSTER", "GETKEYSINSLOT", slot, batch):
                migrate(source, target, keys)
                move.keys += len(keys)
                move.migrates += 1
    close_slots(source, target, others, slots)


def open_slots(source: Node, target: Node, slots: list[int]) -> None:
    """Steps 1 and 2: the target imports ``slots`` from the source, the source migrates them to the target."""
    with source.client() as src, target.client() as dst:
        _setslots(dst, slots, "IMPORTING", source.id)
        _setslots(src, slots, "MIGRATING", target.id)


def migrate(source: Node, target: Node, keys: Sequence[bytes | str]) -> None:
    """Step 3 for ``keys`` (of open slots): one atomic ``MIGRATE``."""
    with source.client() as src:
        src.execute_command("MIGRATE", target.host, target.port, "", 0, MIGRATE_TIMEOUT_MS, "KEYS", *keys)


def close_slots(source: Node, target: Node, others: Sequence[Node], slots: list[int]) -> None:
    """Step 4: ``slots`` are the target's, told to the target, the source, then every other primary."""
    for node in (target, source, *others):
        with node.client() as c:
            _setslots(c, slots, "NODE", target.id)


def _setslots(client: redis.Redis, slots: list[int], state: str, node_id: str) -> None:
    pipe = client.pipeline(transaction=False)
    for slot in slots:
        pipe.execute_command("CLUSTER", "SETSLOT", slot, state, node_id)  # type: ignore[no-untyped-call]
    pipe.execute()
