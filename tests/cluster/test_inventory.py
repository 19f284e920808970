"""Which Lua scripts touch one hash slot, and which cross slots today (issue #26's acceptance test).

Each script's keys are built with the real key builders for a real session, in the order its call site passes them
(the call site is named on each row), then routed through redis-py's ``key_slot`` and run on the test cluster. A script
that touches more than one slot cannot run on Redis Cluster; those are marked ``xfail(strict=True)`` with the keys that
leave the session's slot, so the sharded key layout flips each one to a pass (and must then drop its mark).

``python -m tests.cluster.test_inventory`` prints the table (docs/pending/cluster-plan.md quotes it).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator

import pytest
import redis
from redis.cluster import key_slot

from switchboard.core.messages import session_key
from switchboard.queue import scripts
from switchboard.queue.jobs import entry
from switchboard.queue.keys import GlobalKeys, SessionKeys
from switchboard.queue.limits import _STREAM_TICKET
from switchboard.queue.streamslots import _ACQUIRE, _REFRESH
from tests.cluster.servers import LocalCluster

SESSION = session_key("acme", "assistant", "telegram", "bot1", "chat-4242")
TENANT = "acme"
G = GlobalKeys()
S = SessionKeys(SESSION)
JOB = "d0193a7c2b1f4e5d6a7b8c9d"
CHAT = "4242"
PRINCIPAL = "telegram/bot1/4242"
FENCED = [S.lease, S.fenced_rejections]
SH = S.shard
"""What every fenced script's first two keys are (``_fence.lua``)."""

INGEST_KEYS = [
    S.dedup("telegram:update:1"), S.messages, S.inbox, S.meta, S.events, S.drain, SH.runnable, SH.sessions, SH.stats,
    SH.drainq, S.rate, S.cancel,
]  # fmt: skip
BEGIN_KEYS = [
    *FENCED, S.inbox, S.messages, S.attempts, S.meta, S.events, S.drain, SH.runnable, S.history, S.slots, S.epoch,
    S.outbox, S.dead, S.web, S.control, S.approvals, SH.wip,
]  # fmt: skip
COMPLETE_KEYS = [
    *FENCED, S.inbox, S.messages, S.attempts, S.history, S.events, S.outbox, S.meta, SH.stats,
    SH.histogram("queue_wait"), SH.histogram("run"), S.drain, SH.runnable, S.slots, S.epoch, S.dead, S.web,
    SH.wip, SH.drainq, S.control, S.approvals,
]  # fmt: skip
APPROVAL_KEYS = [*FENCED, S.approval("ap1"), S.approvals, SH.approvals_due, SH.approvals_pending(TENANT)]
SCHEDULE_KEYS = [G.schedule("job1"), G.schedules_due, G.schedules_of_session(SESSION), G.schedules_of_tenant(TENANT)]
BUDGETS = [G.budget(TENANT, "tenant", TENANT, "2026-12"), G.budget(TENANT, "user", PRINCIPAL, "2026-12-07")]

CALLS: dict[str, tuple[str, list[str]]] = {
    # name: (call site, keys in the order it passes them)
    "ingest": ("queue/ingest.py _script_call (platform message)", INGEST_KEYS),
    "ingest_web": (
        "queue/ingest.py _script_call (web chat: + _web_keys)",
        [*INGEST_KEYS, S.web, S.attempts, S.history, S.slots, S.outbox, S.dead, S.epoch],
    ),
    "ingest_after": (
        "queue/ingest.py ingest_all (a platform delivery's later message: + the one before's dedup key)",
        [*INGEST_KEYS, S.dedup("telegram:update:0")],
    ),
    "session_quota": ("queue/limits.py count_session", [G.address_rate("203.0.113.7")]),
    "sender_meter": ("queue/ingest.py _take (before ingest)", [G.sender_rate(f"{TENANT}/telegram/bot1/4242")]),
    "enqueue": ("queue/jobs.py enqueue_many", [S.lease, S.drain, SH.drainq, SH.wip]),
    "take": ("queue/jobs.py take", [SH.drainq, SH.wip]),
    "lease_acquire": ("queue/lease.py acquire", [S.lease, S.epoch]),
    "lease_acquire_listener": (
        "queue/holders.py _acquire",
        [G.listener_lease("telegram", "bot1"), G.listener_epoch("telegram", "bot1")],
    ),
    "lease_renew": ("queue/lease.py renew", [S.lease]),
    "lease_abandon": ("queue/lease.py abandon", [S.lease, S.attempts]),
    "lease_yield": (
        "queue/jobs.py yield_slot",
        [*FENCED, S.inbox, S.drain, SH.drainq, SH.wip],
    ),
    "lease_takeover": ("queue/jobs.py take_over_many", [S.lease, S.drain, SH.drainq, SH.wip]),
    "fenced_xadd": ("queue/lease.py fenced_xadd", [*FENCED, S.web]),
    "begin": ("queue/ledger.py _begin", BEGIN_KEYS),
    "fail": ("queue/ledger.py fail (_run)", [*FENCED, S.attempts, S.events, SH.stats]),
    "complete": ("queue/ledger.py complete (_run)", COMPLETE_KEYS),
    "dead_letter": (
        "queue/ledger.py dead_letter (_run)",
        [*FENCED, S.inbox, S.messages, S.attempts, S.events, S.dead, SH.dead_letters, S.outbox, SH.stats, S.meta],
    ),
    "defer": ("queue/ledger.py defer (_run)", [*FENCED, S.attempts, S.events, SH.deferred, SH.stats, S.meta]),
    "steer": ("queue/ledger.py steer (_run)", [*FENCED, S.inbox, S.messages, S.attempts]),
    "interrupt": ("queue/ledger.py interrupt (_run)", [*FENCED, S.attempts, S.events, S.outbox]),
    "outbox_claim": ("outbound/outbox.py send", [*FENCED, S.outbox, SH.stats, S.events]),
    "facts": ("queue/ledger.py facts (_run)", [*FENCED, S.events, SH.stats]),
    "outbox_record": ("outbound/outbox.py _record (_fenced_keys)", [*FENCED, S.outbox]),
    "outbox_part": ("outbound/outbox.py OutboxSend._record_part (_fenced_keys)", [*FENCED, S.outbox]),
    "bucket_take": (
        "outbound/ratelimits.py try_edit (take: the first two)",
        [
            G.send_rate("telegram", "bot1"),
            G.chat_send_rate("telegram", "bot1", CHAT),
            G.chat_edit_rate("telegram", "bot1", CHAT),
        ],
    ),
    "bucket_hold": (
        "outbound/ratelimits.py hold",
        [G.chat_send_rate("telegram", "bot1", CHAT), G.chat_edit_rate("telegram", "bot1", CHAT)],
    ),
    "outbox_append": ("outbound/outbox.py append_once", [*FENCED, S.web, S.outbox, SH.stats]),
    "history_append": ("queue/store.py append_history", [*FENCED, S.history]),
    "slot_save": ("queue/store.py save_slot", [*FENCED, S.slots, S.meta]),
    "session_reset": ("queue/store.py reset_conversation", [*FENCED, S.history, S.slots, S.offers]),
    "effect_begin": ("queue/effects.py effect_begin", [*FENCED, S.effect("e1")]),
    "effect_finish": ("queue/effects.py effect_finish", [*FENCED, S.effect("e1")]),
    "offer_record": ("queue/offers.py record_offer", [*FENCED, S.offers]),
    "effect_doubt": ("queue/effects.py effect_doubt", [*FENCED, SH.effects_in_doubt(TENANT)]),
    "effect_resolve": ("control/operations.py resolve_doubt", [SH.effects_in_doubt(TENANT), S.effect("e1")]),
    "approval_open": ("queue/approvals.py approval_open (_index_keys)", APPROVAL_KEYS),
    "approval_decide": ("queue/approvals.py approval_decide (_index_keys)", APPROVAL_KEYS),
    "approval_supersede": ("queue/approvals.py approval_supersede (_index_keys)", APPROVAL_KEYS),
    "approval_settle": ("queue/approvals.py approval_settle", [*FENCED, S.approval("ap1")]),
    "control_set": ("queue/approvals.py set_control", [*FENCED, S.control]),
    "console_throttle": (
        "web/console/auth.py admit",
        [G.console_pair_failures("198.51.100.9|ops"), G.console_wait("198.51.100.9|ops")],
    ),
    "context_keep": ("queue/groups.py keep", [S.group_context, S.dedup("context:telegram:update:2"), S.events]),
    "context_take": ("queue/groups.py take", [*FENCED, S.messages]),
    "access_check": (
        "queue/access.py _pairing",
        [
            G.access_paired(TENANT),
            G.access_pending(TENANT, PRINCIPAL),
            G.access_code(TENANT, "c0de"),
            G.access_notice(TENANT, PRINCIPAL),
            G.access_requests(TENANT),
        ],
    ),
    "budget_read": ("queue/budgets.py _read", BUDGETS),
    "budget_charge": (
        "queue/budgets.py charge",
        [G.budget_counters(TENANT), G.budget_alerts(TENANT), *BUDGETS],
    ),
    "people_link": ("queue/people.py link", [G.people(TENANT), G.people_log(TENANT)]),
    "people_unlink": ("queue/people.py unlink", [G.people(TENANT), G.people_log(TENANT)]),
    "schedule_put": ("queue/schedules.py create_job (_job_keys)", SCHEDULE_KEYS),
    "schedule_remove": ("queue/schedules.py remove_job (_job_keys)", SCHEDULE_KEYS),
    "schedule_due": ("queue/schedules.py tick", [G.schedules_due, G.schedules_inflight]),
    "schedule_claim": ("queue/schedules.py _claim", [G.schedules_due, G.schedules_inflight, G.schedule("job1")]),
    "schedule_reclaim": ("queue/schedules.py _reclaim", [G.schedules_inflight]),
    "schedule_done": ("queue/schedules.py _done", [G.schedules_inflight, G.schedule("job1")]),
    "stream_ticket": ("queue/limits.py issue_stream_ticket", [S.ticket_rate, S.shard.web_ticket("5eed")]),
    "stream_slot_acquire": (
        "queue/streamslots.py acquire (one set a step: the address's, then the session's)",
        [G.web_streams_by_address("203.0.113.7")],
    ),
    "stream_slot_refresh": ("queue/streamslots.py refresh (one set a call)", [G.web_streams_by_session(SESSION)]),
}

_ROW = re.compile(r"_(web|after|listener)$")
"""Rows of a script called several ways (``ingest_web`` is ``ingest``'s web chat call)."""

CROSS_SLOT: dict[str, str] = {
    # what takes each off the session's (or its own group's) slot today
}
"""Scripts that cross slots today, and why (each an ``xfail(strict=True)`` below)."""


def _script(name: str) -> scripts.Script:
    extra = {s.name: s for s in (_STREAM_TICKET, _ACQUIRE, _REFRESH)}
    by_name = {s.name: s for s in scripts.ALL} | extra
    return by_name[_ROW.sub("", name)]


def slots_of(keys: list[str]) -> dict[int, list[str]]:
    """Slot → the keys in it."""
    out: dict[int, list[str]] = {}
    for key in keys:
        out.setdefault(key_slot(key.encode()), []).append(key)
    return out


def off_slot(keys: list[str]) -> list[str]:
    """The keys outside the slot of the script's first key."""
    home = key_slot(keys[0].encode())
    return [k for k in keys if key_slot(k.encode()) != home]


def test_every_script_has_a_row() -> None:
    from importlib import resources

    files = {
        p.name.removesuffix(".lua")
        for p in resources.files("switchboard.queue").joinpath("lua").iterdir()
        if p.name.endswith(".lua") and not p.name.startswith("_")
    }
    rows = {_ROW.sub("", name) for name in CALLS}
    assert rows == files
    assert {s.name for s in scripts.ALL} <= rows


@pytest.mark.parametrize("script", sorted({_ROW.sub("", n) for n in CALLS}))
def test_rows_pass_every_key_the_script_reads(script: str) -> None:
    """A script's longest row holds at least as many keys as the highest ``KEYS[n]`` it (with its preludes) names."""
    source = _script(script).source
    highest = max((int(n) for n in re.findall(r"KEYS\[(\d+)\]", source)), default=0)
    longest = max(len(keys) for name, (_, keys) in CALLS.items() if _ROW.sub("", name) == script)
    assert longest >= highest, f"{script}: the script reads KEYS[{highest}], its longest row has {longest} keys"


def _case(name: str) -> object:
    if name in CROSS_SLOT:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=f"cross-slot: {CROSS_SLOT[name]}"))
    return name


@pytest.fixture(scope="module")
def cluster_client(redis_cluster: LocalCluster) -> Iterator[redis.RedisCluster]:
    """One cluster client for the module (the scripts below write nothing but the drain test's, which it deletes)."""
    rc = redis.RedisCluster.from_url(redis_cluster.url)
    yield rc
    rc.close()


@pytest.mark.cluster
@pytest.mark.parametrize("name", [_case(n) for n in sorted(CALLS)])
def test_script_keys_share_one_slot(name: str, cluster_client: redis.RedisCluster) -> None:
    """Every key in one slot, so the script runs on the cluster (the call goes through the cluster client)."""
    keys = CALLS[name][1]
    assert not off_slot(keys), f"{name} touches {len(slots_of(keys))} slots; off its first key's: {off_slot(keys)}"
    assert cluster_client.eval("return #KEYS", len(keys), *keys) == len(keys)


@pytest.mark.cluster
def test_a_queued_drain_wakes_its_shard_and_is_taken_in_its_slot(cluster_client: redis.RedisCluster) -> None:
    """The drain scripts run on the cluster: enqueue pushes the entry and ``SPUBLISH``es on the shard's ready channel
    from inside the script (the channel is in the shard's slot), a sharded subscriber hears it, take pops it into the
    running set."""
    queued = entry(SESSION, JOB)
    pubsub = cluster_client.pubsub()
    pubsub.ssubscribe(SH.ready)
    try:
        for _ in range(20):
            if pubsub.get_sharded_message(timeout=0.1) is not None:  # the subscription's confirmation
                break
        enqueue = _script("enqueue").source
        args = ["", JOB, queued, SH.ready, "", ""]
        assert cluster_client.eval(enqueue, 4, S.lease, S.drain, SH.drainq, SH.wip, *args) == 1
        heard = None
        for _ in range(50):
            heard = heard or pubsub.get_sharded_message(ignore_subscribe_messages=True, timeout=0.1)
        assert heard is not None and heard["data"] == queued.encode()
        taken = cluster_client.eval(_script("take").source, 2, SH.drainq, SH.wip, "9999999999")
        assert taken == [queued.encode(), 0]
        assert cluster_client.zscore(SH.wip, queued) == 9999999999
    finally:
        pubsub.close()
        cluster_client.delete(S.drain)
        cluster_client.delete(SH.drainq, SH.wip)


def test_cross_slot_reasons_name_only_rows() -> None:
    assert set(CROSS_SLOT) <= set(CALLS)


def table(describe: Callable[[str], str] = lambda name: CALLS[name][0]) -> str:
    """The inventory as a Markdown table: keys, slots, the keys off the first key's slot."""
    lines = ["| script | keys | slots | off the first key's slot | call site |", "|---|---|---|---|---|"]
    for name in sorted(CALLS):
        keys = CALLS[name][1]
        off = ", ".join(f"`{k}`" for k in dict.fromkeys(off_slot(keys))).replace("|", "\\|") or "—"
        lines.append(f"| `{name}` | {len(keys)} | {len(slots_of(keys))} | {off} | {describe(name)} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table())
