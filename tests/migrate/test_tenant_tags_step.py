"""The tenant-tags migration step on a real server: old names written directly, the step run twice (issue #26)."""

from __future__ import annotations

import collections

import redis

from switchboard.queue.keys import GlobalKeys
from switchboard.queue.migrations import STEPS, tenant_tags

G = GlobalKeys()


def _old_layout(r: redis.Redis) -> None:
    """What the current release writes for two tenants (one with ``:`` in a principal), with TTLs where it sets them."""
    for tenant in ("acme", "globex"):
        r.hset(f"sb:access:{tenant}:paired", "telegram:42", '{"role": "user"}')
        r.zadd(f"sb:access:{tenant}:requests", {"telegram:43": 1e12})
        r.set(f"sb:access:{tenant}:code:c0de", '{"principal": "telegram:43"}', ex=600)
        r.set(f"sb:access:{tenant}:pending:telegram:43", "c0de", ex=600)
        r.set(f"sb:access:{tenant}:notice:group:telegram:-100", "1", ex=60)
        r.hset(f"sb:webhooks:{tenant}:cursors", mapping={"~since": "1-0", f"{tenant}/a/web/a/c": "2-0"})
        r.hset(f"sb:webhooks:{tenant}:deliveries", "0:evt_1", "{}")
        r.zadd(f"sb:webhooks:{tenant}:due", {"0:evt_1": 1})
        r.zadd(f"sb:webhooks:{tenant}:sent", {"0:evt_0": 1})
        r.xadd(f"sb:webhooks:{tenant}:dead", {"delivery": "0:evt_9"})
        r.set(f"sb:webhooks:{tenant}:lock", "worker-1", px=15_000)
    r.set("sb:console:failures:pair:abc123", 4, ex=900)
    r.set("sb:console:wait:abc123", 1, px=8000)
    r.set("sb:console:failures:address:198.51.100.9", 2, ex=900)  # not moved: one key, its own slot
    r.set("sb:webticket:5eed", "tokenhash", ex=30)
    r.set("sb:rate:sender:acme/telegram/bot1/42", 123, px=60_000)  # not moved
    r.set("sb:mcp:client:" + "ab" * 32, "{}")  # not moved


def test_the_step_renames_keeping_ttls_drops_the_short_lived_and_is_idempotent(sync_redis: redis.Redis) -> None:
    r = sync_redis
    _old_layout(r)
    before = {key: r.dump(key) for key in r.keys("*")}

    tally: collections.Counter[str] = collections.Counter()
    tenant_tags.step(r, tally)
    assert tally == {
        "access keys renamed": 10,
        "webhook keys renamed": 10,
        "webhook locks dropped": 2,
        "console throttle keys renamed": 2,
        "stream tickets dropped": 1,
    }
    after = {key.decode() for key in r.keys("*")}
    again: collections.Counter[str] = collections.Counter()
    tenant_tags.step(r, again)  # a rerun (as after a crash part way) moves nothing twice
    assert not again
    assert {key.decode() for key in r.keys("*")} == after

    for tenant in ("acme", "globex"):
        assert r.hget(G.access_paired(tenant), "telegram:42") == b'{"role": "user"}'
        assert r.zscore(G.access_requests(tenant), "telegram:43") == 1e12
        assert 590 < r.ttl(G.access_code(tenant, "c0de")) <= 600
        assert r.get(G.access_pending(tenant, "telegram:43")) == b"c0de"
        assert 0 < r.ttl(G.access_pending(tenant, "telegram:43")) <= 600
        assert 0 < r.ttl(G.access_notice(tenant, "group:telegram:-100")) <= 60
        assert r.hgetall(G.webhook_cursors(tenant))[b"~since"] == b"1-0"
        assert r.hget(G.webhook_deliveries(tenant), "0:evt_1") == b"{}"
        assert r.zcard(G.webhook_due(tenant)) == 1 and r.zcard(G.webhook_sent(tenant)) == 1
        assert r.xlen(G.webhook_dead(tenant)) == 1
        assert not r.exists(G.webhook_lock(tenant))
        for old in r.scan_iter(match=f"sb:access:{tenant}:*"):
            raise AssertionError(f"left behind: {old!r}")
    assert r.get(G.console_pair_failures("abc123")) == b"4" and 0 < r.ttl(G.console_pair_failures("abc123")) <= 900
    assert 0 < r.pttl(G.console_wait("abc123")) <= 8000
    assert r.get(G.console_failures("198.51.100.9")) == b"2"
    assert not r.keys("sb:webhooks:*") and not r.keys("sb:webticket:*") and not r.keys("sb:console:wait:*")
    assert r.exists("sb:rate:sender:acme/telegram/bot1/42", "sb:mcp:client:" + "ab" * 32) == 2
    # every renamed key holds what its old name held
    renamed = {G.access_paired("acme"): "sb:access:acme:paired", G.webhook_dead("globex"): "sb:webhooks:globex:dead"}
    for new, old in renamed.items():
        assert r.dump(new) == before[old.encode()]


def test_the_step_resumes_after_a_partial_run(sync_redis: redis.Redis) -> None:
    """Half the keys moved by hand (a run that stopped part way): the rerun moves the rest only."""
    r = sync_redis
    _old_layout(r)
    r.rename("sb:access:acme:paired", G.access_paired("acme"))
    r.rename("sb:webhooks:acme:due", G.webhook_due("acme"))
    tally: collections.Counter[str] = collections.Counter()
    tenant_tags.step(r, tally)
    assert tally["access keys renamed"] == 9 and tally["webhook keys renamed"] == 9
    assert r.hget(G.access_paired("acme"), "telegram:42") == b'{"role": "user"}'
    assert not r.keys("sb:access:*") and not r.keys("sb:webhooks:*")


def test_the_step_is_listed() -> None:
    assert tenant_tags.step in STEPS
