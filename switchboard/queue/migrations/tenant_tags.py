"""Migration step: the tenant-scoped families under their tenant's hash tag (layout 1 → 2, issue #26).

Renamed (``RENAME`` keeps each key's TTL; on the one node a migration runs on it works across slots):

- access: ``sb:access:<tenant>:{paired,requests,code:<digest>,pending:<principal>,notice:<who>}`` →
  ``sb:{access:<tenant>}:…``, so live pairing codes, pending marks and refusal notices survive;
- outbound webhooks: ``sb:webhooks:<tenant>:{cursors,deliveries,due,sent,dead}`` → ``sb:{webhooks:<tenant>}:…``;
- the console's per-(address, name) sign-in throttle: ``sb:console:failures:pair:<hash>`` and
  ``sb:console:wait:<hash>`` → ``sb:{console:<hash>}:{failures,wait}`` (short-lived, but renaming is as cheap as
  dropping and keeps a guessing address's growing wait).

Dropped: the webhook delivery lock ``sb:webhooks:<tenant>:lock`` (the process holding it is stopped; its TTL is
seconds) and the web chat stream tickets ``sb:webticket:<hash>`` (a 30 s TTL; a ticket of the old shape names no shard,
so it could not be redeemed: the page asks for a new one). Unchanged names, nothing to do: the per-sender and
per-address meters, the open-stream sets, MCP clients.

Idempotent and resumable: each key moves with one atomic ``RENAME`` (or ``DEL``) and the scans match only old names,
so a rerun after a crash moves what is left and never moves a key twice. A tenant is read as what lies between
``sb:access:`` (or ``sb:webhooks:``) and the family's fixed part: a tenant containing ``:pending:`` or ``:notice:``
would be misread, none does.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterator

import redis

from switchboard.queue.keys import GlobalKeys, Layout1Keys, literal

__all__ = ["legacy", "step"]

_G = GlobalKeys()
_OLD = Layout1Keys()
_ACCESS = _OLD.access
_WEBHOOKS = _OLD.webhooks
_WEBHOOK_FAMILIES: dict[str, Callable[[str], str]] = {
    "cursors": _G.webhook_cursors,
    "deliveries": _G.webhook_deliveries,
    "due": _G.webhook_due,
    "sent": _G.webhook_sent,
    "dead": _G.webhook_dead,
}
_PAIR_FAILURES = _OLD.console_pair_failures
_PAIR_WAIT = _OLD.console_wait
_TICKETS = _OLD.web_tickets


def _scan(r: redis.Redis, head: str) -> Iterator[str]:
    for key in r.scan_iter(match=literal(head) + "*", count=1000):
        yield key.decode() if isinstance(key, bytes) else str(key)


def _move(r: redis.Redis, key: str, new: str) -> bool:
    """``RENAME``, or ``False`` when the key expired since the scan found it."""
    try:
        return bool(r.rename(key, new))
    except redis.ResponseError as err:
        if "no such key" in str(err).lower():
            return False
        raise


def _access_name(key: str) -> str | None:
    """The tagged name of an old access key, or ``None`` for a shape this release never wrote."""
    rest = key[len(_ACCESS) :]
    for kind in ("pending", "notice"):
        tenant, sep, who = rest.partition(f":{kind}:")
        if sep and tenant:
            return _G.access_pending(tenant, who) if kind == "pending" else _G.access_notice(tenant, who)
    tenant, _, last = rest.rpartition(":")
    if tenant and last == "paired":
        return _G.access_paired(tenant)
    if tenant and last == "requests":
        return _G.access_requests(tenant)
    tenant, sep, digest = rest.rpartition(":code:")
    return _G.access_code(tenant, digest) if sep and tenant and digest else None


_LEGACY = (
    (_ACCESS, "access keys to rename"),
    (_WEBHOOKS, "webhook keys to rename"),
    (_PAIR_FAILURES, "console throttle keys to rename"),
    (_PAIR_WAIT, "console throttle keys to rename"),
    (_TICKETS, "stream tickets to drop"),
)


def legacy(key: str) -> str | None:
    """The tally label of a layout-1 key this step renames or drops, else ``None``."""
    return next((label for head, label in _LEGACY if key.startswith(head)), None)


def step(r: redis.Redis, tally: collections.Counter[str]) -> None:
    """Rename the access, webhook and console-throttle keys under their hash tags; drop old tickets and locks."""
    for key in _scan(r, _ACCESS):
        new = _access_name(key)
        if new is None:
            tally["access keys of an unknown shape left"] += 1
            continue
        if _move(r, key, new):
            tally["access keys renamed"] += 1
    for key in _scan(r, _WEBHOOKS):
        tenant, _, family = key[len(_WEBHOOKS) :].rpartition(":")
        if not tenant:
            continue
        if family == "lock":
            tally["webhook locks dropped"] += r.delete(key)
        elif family in _WEBHOOK_FAMILIES and _move(r, key, _WEBHOOK_FAMILIES[family](tenant)):
            tally["webhook keys renamed"] += 1
    for key in _scan(r, _PAIR_FAILURES):
        if _move(r, key, _G.console_pair_failures(key[len(_PAIR_FAILURES) :])):
            tally["console throttle keys renamed"] += 1
    for key in _scan(r, _PAIR_WAIT):
        if _move(r, key, _G.console_wait(key[len(_PAIR_WAIT) :])):
            tally["console throttle keys renamed"] += 1
    for key in _scan(r, _TICKETS):
        tally["stream tickets dropped"] += r.delete(key)
