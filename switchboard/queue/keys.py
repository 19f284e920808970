"""Every Redis key name Switchboard uses, built in one place with one prefix.

Keys of one session carry the hash tag of the session's logical shard (:mod:`switchboard.queue.shards`):
``sb:{<shard tag>}:<<session key>>:<name>``, so they stay in one cluster slot with the shard's own keys (its
fenced-write counter) and one Lua script may touch them all. Session keys are percent-escaped (see
:func:`switchboard.core.messages.session_key`), so they never contain ``{``, ``}``, ``<`` or ``>``; the angle
brackets end the session unambiguously (a component may hold ``:``).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from switchboard.queue.shards import SHARDS, TAGS, shard_of
from switchboard.types import SessionKey

__all__ = [
    "FENCED_FIELD",
    "PREFIX",
    "GlobalKeys",
    "Layout1Keys",
    "SessionKeys",
    "ShardKeys",
    "literal",
    "session_in",
    "tenant_of",
]

PREFIX = "sb"


def tenant_of(session: SessionKey) -> str:
    """The tenant a session key belongs to (its first component)."""
    return session.split("/", 1)[0]


_GLOB = re.compile(r"([*?\[\]\\])")


def literal(text: str) -> str:
    """``text`` as a literal inside a ``SCAN``/``ZSCAN``/``HSCAN`` ``MATCH`` pattern (its glob characters escaped)."""
    return _GLOB.sub(r"\\\1", text)


FENCED_FIELD = "fenced_rejections"
"""Field of a shard's :attr:`ShardKeys.stats` hash counting writes the fence refused (``lua/_fence.lua``)."""

_TAG_OF = {tag: shard for shard, tag in enumerate(TAGS)}


def session_in(key: str) -> str | None:
    """The session ``key`` belongs to (``sb:{<shard tag>}:<<session>>:...``), or ``None`` for a key of no session.

    The session must be in the shard its tag names, so a key of another shape never reads as a session's.
    """
    head = f"{PREFIX}:{{"
    if not key.startswith(head) or "}:<" not in key or ">:" not in key:
        return None
    tag_end = key.index("}:<")
    tag = key[len(head) : tag_end]
    session = key[tag_end + 3 : key.index(">:")]
    if "/" not in session or _TAG_OF.get(tag) != shard_of(session):
        return None
    return session


@dataclass(frozen=True, slots=True)
class ShardKeys:
    """The keys of one logical shard (all under the shard's hash tag, in the shard's slot)."""

    shard: int

    @property
    def tag(self) -> str:
        """The shard's hash tag, without braces."""
        return TAGS[self.shard]

    def _k(self, name: str) -> str:
        return f"{PREFIX}:{{{self.tag}}}:{name}"

    @property
    def stats(self) -> str:
        """HASH of the shard's counters (accepted, dead_letters, :data:`FENCED_FIELD`, segmented figures, ...).

        Counters of a session's work go to its shard's hash (inside its scripts); counters of no one session to any
        shard's. :func:`switchboard.queue.stats.read_stats` sums every shard's.
        """
        return self._k("stats:counters")

    @property
    def fenced_rejections(self) -> str:
        """The hash the fence counts refused writes in (field :data:`FENCED_FIELD`): ``KEYS[2]`` of fenced scripts.

        It is the shard's :attr:`stats` hash, so a scrape reads the refusals with the other counters.
        """
        return self.stats

    def histogram(self, name: str) -> str:
        """HASH ``le:<bound>`` → count, and ``sum``: the shard's share of a histogram (``queue_wait``, ``run``)."""
        return self._k(f"stats:hist:{name}")

    @property
    def runnable(self) -> str:
        """ZSET session → time it became runnable; removed when its inbox drains empty."""
        return self._k("runnable")

    @property
    def sessions(self) -> str:
        """ZSET session → last activity time (ms): every session of the shard ever seen (for listing)."""
        return self._k("sessions")

    @property
    def deferred(self) -> str:
        """ZSET session → unix time before which its inbox head must not run (the model provider asked to wait)."""
        return self._k("deferred")

    @property
    def dead_letters(self) -> str:
        """STREAM, capped per shard (``ledger.SHARD_DEAD_LETTER_CAP``): the shard's dead letters, for operators."""
        return self._k("deadletters")

    @property
    def approvals_due(self) -> str:
        """ZSET ``<session>|<approval id>`` → expires_at: the shard's pending approvals, for the expiry sweep."""
        return self._k("approvals:due")

    def approvals_pending(self, tenant: str) -> str:
        """ZSET ``<session>|<approval id>`` → requested_at: one tenant's pending approvals in the shard."""
        return self._k(f"approvals:pending:{tenant}")

    def effects_in_doubt(self, tenant: str) -> str:
        """HASH ``<session>|<effect key>`` → JSON (record, info, at): one tenant's effects in doubt in the shard."""
        return self._k(f"effects:doubt:{tenant}")

    def web_ticket(self, ticket_hash: str) -> str:
        """STRING token hash for a single-use web chat stream ticket (by the ticket's hash, short TTL, GETDEL).

        In the shard of the session it opens (the ticket names its shard, ``<shard>.<random>``), so issuing it and
        counting it on the session's ticket meter is one script in one slot.
        """
        return f"{PREFIX}:{{{self.tag}}}:webticket:{ticket_hash}"

    @property
    def drainq(self) -> str:
        """LIST of drain entries (``<session>|<job id>``, :func:`switchboard.queue.jobs.entry`) waiting, next first.

        The shard's drain queue: a session whose drain flag holds that job id waits here for a worker.
        """
        return f"{PREFIX}:{{{self.tag}}}:drainq"

    @property
    def wip(self) -> str:
        """ZSET drain entry → heartbeat deadline (unix s): the shard's drains a worker took and is running."""
        return f"{PREFIX}:{{{self.tag}}}:wip"

    @property
    def ready(self) -> str:
        """Sharded pub/sub channel (``SPUBLISH``): a drain entry was pushed on :attr:`drainq` (the payload)."""
        return f"{PREFIX}:{{{self.tag}}}:ready"

    @property
    def cancel(self) -> str:
        """Sharded pub/sub channel (``SPUBLISH``): a session of the shard whose running turn must stop."""
        return f"{PREFIX}:{{{self.tag}}}:cancel"

    @staticmethod
    def every() -> tuple[ShardKeys, ...]:
        """Every shard's keys, shard 0 first."""
        return _EVERY_SHARD


_EVERY_SHARD = tuple(ShardKeys(n) for n in range(SHARDS))


@dataclass(frozen=True, slots=True)
class SessionKeys:
    """The keys of one session."""

    session: SessionKey

    def _k(self, name: str) -> str:
        return f"{PREFIX}:{{{TAGS[shard_of(self.session)]}}}:<{self.session}>:{name}"

    def key(self, name: str) -> str:
        """The session's key called ``name`` (what follows the session in it; ``switchboard migrate`` renames by it)."""
        return self._k(name)

    @property
    def shard(self) -> ShardKeys:
        """The keys of the session's logical shard (same slot as the session's)."""
        return _EVERY_SHARD[shard_of(self.session)]

    @property
    def fenced_rejections(self) -> str:
        """The stats hash of the session's shard, where the fence counts refusals: ``KEYS[2]`` of fenced scripts."""
        return self.shard.fenced_rejections

    @property
    def every(self) -> str:
        """``MATCH`` pattern of every key of the session (for erasure)."""
        return literal(self._k("")) + "*"

    @property
    def inbox(self) -> str:
        """LIST of gateway message ids waiting, oldest first (the per-session FIFO)."""
        return self._k("inbox")

    @property
    def messages(self) -> str:
        """HASH message id → InboundMessage JSON, for messages not yet handled."""
        return self._k("messages")

    @property
    def attempts(self) -> str:
        """HASH message id → attempts started so far; ``<id>:error``, ``:deferrals``, ``:interrupts``, ``:took``."""
        return self._k("attempts")

    @property
    def lease(self) -> str:
        """STRING ``<epoch>:<worker>`` with a PX TTL: who may write for the session now."""
        return self._k("lease")

    @property
    def epoch(self) -> str:
        """STRING counter; every lease grant INCRs it (the fencing token)."""
        return self._k("epoch")

    @property
    def drain(self) -> str:
        """STRING ``<job id>`` while a drain job for the session is pending or running."""
        return self._k("drain")

    @property
    def events(self) -> str:
        """STREAM, capped: the session's event log."""
        return self._k("events")

    @property
    def history(self) -> str:
        """LIST of HistoryEntry JSON, capped: what the agent remembers."""
        return self._k("history")

    @property
    def slots(self) -> str:
        """HASH slot name → JSON: session state (plan, context, state)."""
        return self._k("slots")

    @property
    def outbox(self) -> str:
        """HASH idempotency key → ``claimed|sent`` JSON record of each send action."""
        return self._k("outbox")

    @property
    def tool_statuses(self) -> str:
        """HASH ``<run id>|<status name>`` → JSON ``{"message_id"}``, with a TTL: open tool status messages.

        Posted and not yet in their final state: a later attempt at the turn ends them as interrupted.
        """
        return self._k("tool_statuses")

    @property
    def dead(self) -> str:
        """LIST of dead-letter JSON records (message, attempts, reason)."""
        return self._k("dead")

    @property
    def web(self) -> str:
        """STREAM of web chat events (user, status, delta, message, reply_error): what SSE serves."""
        return self._k("web")

    @property
    def meta(self) -> str:
        """HASH: channel, created_at, last_at, counts, ``conversation`` (the last channel message's); for operators."""
        return self._k("meta")

    @property
    def cancel(self) -> str:
        """STRING JSON ``{reason, at}`` with a TTL: a stop was asked for the running turn."""
        return self._k("cancel")

    @property
    def group_context(self) -> str:
        """LIST of kept group messages (``ContextLine`` JSON), oldest first, capped, with a TTL.

        What the next answered turn reads as untrusted data, then clears (``group_replies.keep_context``).
        """
        return self._k("group_context")

    def dedup(self, key: str) -> str:
        """STRING message id (``<id>:<text hash>`` for a web chat ``client_id``), with a TTL: the key was accepted."""
        return self._k(f"dedup:{key}")

    def effect(self, key: str) -> str:
        """STRING effect record JSON (arguments hash, status, outcome), with a TTL: one write effect's idempotency."""
        return self._k(f"effect:{key}")

    @property
    def offers(self) -> str:
        """LIST of offered-choice JSON (``{"key", "options": [{"id", "label"}]}``), newest first, capped, with a TTL.

        What the session was offered lately: a click whose option id is in none of them reads as not offered.
        """
        return self._k("offers")

    def approval(self, approval_id: str) -> str:
        """HASH ``record`` (the opened ApprovalRecord JSON), ``status``, ``action``, ``expires_at``, ``decided_by``, ...

        One approval; kept while pending and for the retention window after it settles (``queue/approvals.py``).
        """
        return self._k(f"approval:{approval_id}")

    @property
    def approvals(self) -> str:
        """ZSET approval id → requested_at: the session's ``pending`` approvals (removed when decided)."""
        return self._k("approvals")

    @property
    def control(self) -> str:
        """STRING SessionControl JSON while an operator has taken the conversation over (absent otherwise)."""
        return self._k("control")

    @property
    def model(self) -> str:
        """STRING ``provider:name``: the model ``/model`` chose for this conversation (absent: the agent's own)."""
        return self._k("model")

    @property
    def rate(self) -> str:
        """STRING, PX TTL: the session's message-rate meter (GCRA arrival time, ms; see ``lua/_limits.lua``)."""
        return self._k("rate")

    @property
    def ticket_rate(self) -> str:
        """STRING, PX TTL: the session's stream-ticket meter (GCRA arrival time, ms; see ``lua/_limits.lua``)."""
        return self._k("ticketrate")

    def web_upload(self, upload_id: str) -> str:
        """HASH ``name``, ``mime_type``, ``kind``, ``size``, ``data`` (the bytes), with a TTL: a web chat upload.

        A file the user uploaded for a later message of this session (only this session's token reaches it).
        """
        return self._k(f"upload:{upload_id}")

    @property
    def upload_rate(self) -> str:
        """STRING, PX TTL: the session's web chat upload meter (GCRA arrival time, ms; see ``lua/_limits.lua``)."""
        return self._k("uploadrate")


@dataclass(frozen=True, slots=True)
class GlobalKeys:
    """Keys not tied to one session."""

    prefix: str = PREFIX

    @property
    def layout(self) -> str:
        """STRING: the key layout the data is in (``2``; ``migrating`` during ``switchboard migrate``; absent: 1).

        Web, worker and listener processes read it once at start (:mod:`switchboard.queue.migrations`).
        """
        return f"{self.prefix}:layout"

    @property
    def workers(self) -> str:
        """ZSET worker id → last heartbeat (ms); live workers have a recent score."""
        return f"{self.prefix}:workers"

    def worker_alive(self, worker: str) -> str:
        """STRING with a PX TTL (the server's clock): the worker is alive while it exists (see ``worker.py``)."""
        return f"{self.prefix}:worker:{worker}:alive"

    def access_paired(self, tenant: str) -> str:
        """HASH principal → JSON (role, when, by whom, session): one tenant's paired senders.

        A tenant's access keys share the hash tag ``{access:<tenant>}``: ``access_check.lua`` and the approval's
        ``MULTI`` touch one slot.
        """
        return f"{self.prefix}:{{access:{tenant}}}:paired"

    def access_code(self, tenant: str, digest: str) -> str:
        """STRING with a TTL: a live pairing code (by its SHA-256) → JSON (principal, session, expiry)."""
        return f"{self.prefix}:{{access:{tenant}}}:code:{digest}"

    def access_pending(self, tenant: str, principal: str) -> str:
        """STRING with a TTL: the digest of a sender's live pairing code (at most one per sender)."""
        return f"{self.prefix}:{{access:{tenant}}}:pending:{principal}"

    def access_notice(self, tenant: str, who: str) -> str:
        """STRING with a TTL: a refused sender (or group) was answered; no other answer until it expires."""
        return f"{self.prefix}:{{access:{tenant}}}:notice:{who}"

    def access_requests(self, tenant: str) -> str:
        """ZSET principal → expiry of its live pairing code: one tenant's open pairing requests, for operators."""
        return f"{self.prefix}:{{access:{tenant}}}:requests"

    @property
    def every_session(self) -> str:
        """``MATCH`` pattern of the keys of every session of every tenant (``sb:{<shard>}:<<tenant>/...>:...``).

        It also matches a few keys of no session: callers keep only keys :func:`session_in` reads as a session's.
        """
        return literal(f"{self.prefix}:{{") + "*" + literal("}:<") + "*"

    def every_shard(self, name: str) -> str:
        """``MATCH`` pattern of the per-shard key ``name`` (``effects:doubt:acme``) in every shard: ``sb:{*}:<name>``.

        For a scan that must find the shards holding it (``name`` may end in ``*``; its other glob characters must be
        escaped by the caller); a reader of every shard's copy pipelines :meth:`ShardKeys.every` instead.
        """
        return literal(f"{self.prefix}:{{") + "*" + literal("}:") + name

    def tenant_sessions(self, tenant: str) -> str:
        """``MATCH`` pattern of the keys of every session of ``tenant`` (``sb:{<shard>}:<<tenant>/...>:...``).

        It also matches a few keys of no session or another tenant's: callers check :func:`session_in`.
        """
        return literal(f"{self.prefix}:{{") + "*" + literal(f"}}:<{tenant}/") + "*"

    def tenant_families(self, tenant: str) -> tuple[str, ...]:
        """``MATCH`` patterns of the tenant's own keys that belong to no one session (for erasing a tenant)."""
        return tuple(
            literal(head) + "*"
            for head in (
                f"{self.prefix}:{{budget:{tenant}}}:",
                f"{self.prefix}:{{people:{tenant}}}:",
                f"{self.prefix}:{{review:{tenant}}}:",
                f"{self.prefix}:{{access:{tenant}}}:",
                f"{self.prefix}:{{webhooks:{tenant}}}:",
                f"{self.prefix}:memory:{tenant}:",
                self.sender_rate(f"{tenant}/"),
                self.handoff(f"{tenant}/"),
                self.web_streams_by_session(f"{tenant}/"),
            )
        )

    def user_budgets(self, tenant: str, subject: str) -> str:
        """``MATCH`` pattern of one user's (a principal's or a person's) budget counters, every period."""
        return f"{literal(f'{self.prefix}:{{budget:{tenant}}}:user:')}*:{literal(subject)}:*"

    def sender_rates(self, tenant: str, channel: str, sender: str) -> str:
        """``MATCH`` pattern of one sender's message-rate meters, on every account of ``channel``."""
        return f"{literal(self.sender_rate(f'{tenant}/{channel}/'))}*{literal(f'/{sender}')}"

    @property
    def erasures(self) -> str:
        """STREAM (capped) of erasure facts: who erased which scope, the subject's SHA-256 and counts, never content."""
        return f"{self.prefix}:audit:erasures"

    @property
    def memory_audit(self) -> str:
        """STREAM (capped) of operators' memory changes: who changed which fact or connection; never a fact's text."""
        return f"{self.prefix}:audit:memory"

    def project_connections(self, tenant: str) -> str:
        """SET of JSON ``[agent, project]``: the tenant's agent–project connections made in the console or the CLI."""
        return f"{self.prefix}:memory:{tenant}:connections"

    @property
    def schedules_due(self) -> str:
        """ZSET job id → next occurrence (ms): every job that will run again (all share the tag ``{schedules}``)."""
        return f"{self.prefix}:{{schedules}}:due"

    @property
    def schedules_inflight(self) -> str:
        """ZSET ``<job id>|<due ms>`` → deadline (ms): occurrences claimed and not yet delivered."""
        return f"{self.prefix}:{{schedules}}:inflight"

    def schedule(self, job_id: str) -> str:
        """HASH of one scheduled job: ``spec`` (JSON), ``session``, ``tenant``, ``next_at``, ``last_*``, counters."""
        return f"{self.prefix}:{{schedules}}:job:{job_id}"

    def schedules_of_session(self, session: str) -> str:
        """SET of the job ids whose occurrences go into ``session``."""
        return f"{self.prefix}:{{schedules}}:session:{session}"

    def schedules_of_tenant(self, tenant: str) -> str:
        """SET of one tenant's job ids."""
        return f"{self.prefix}:{{schedules}}:tenant:{tenant}"

    def handoff(self, conversation: str) -> str:
        """STRING JSON ``{agent, from, reason, at}`` with a TTL: the agent a conversation was handed to.

        ``conversation`` is ``tenant/-/channel/account/conversation[/thread]`` (a session key without its agent).
        """
        return f"{self.prefix}:handoff:{conversation}"

    @property
    def retention_lock(self) -> str:
        """STRING worker id with a PX TTL of one retention interval: the worker that ran (or runs) this sweep."""
        return f"{self.prefix}:retention:lock"

    @property
    def reaper_lock(self) -> str:
        """STRING worker id with a PX TTL: the worker sweeping for stranded sessions now."""
        return f"{self.prefix}:reaper:lock"

    def unleased_since(self, job_id: str) -> str:
        """STRING, TTL: when the reaper first saw this running drain's session without a lease."""
        return f"{self.prefix}:reaper:unleased:{job_id}"

    def listener_lease(self, channel: str, account: str) -> str:
        """STRING ``<epoch>:<holder>`` with a PX TTL: the one process running this account's listener.

        A listener is Telegram long polling, a gateway or a Socket Mode connection. Shares the hash tag
        ``{listener:<channel>/<account>}`` with its epoch counter.
        """
        return f"{self.prefix}:{{listener:{channel}/{account}}}:lease"

    def listener_epoch(self, channel: str, account: str) -> str:
        """STRING counter; every grant of the account's listener lease INCRs it (the fencing token)."""
        return f"{self.prefix}:{{listener:{channel}/{account}}}:epoch"

    def web_token(self, token_hash: str) -> str:
        """STRING session key for a web chat bearer token (stored by hash, never in clear)."""
        return f"{self.prefix}:webtoken:{token_hash}"

    def sender_rate(self, sender: str) -> str:
        """STRING, PX TTL: one sender's message-rate meter (``sender`` is ``<tenant>/<channel>/<account>/<id>``)."""
        return f"{self.prefix}:rate:sender:{sender}"

    def address_rate(self, address: str) -> str:
        """STRING, PX TTL: one client address's session-creation meter (IPv6 counted per /64)."""
        return f"{self.prefix}:rate:address:{address}"

    def send_rate(self, channel: str, account: str) -> str:
        """STRING, PX TTL: one bot account's send bucket (GCRA arrival time, ms), shared by every worker.

        The keys of one account share the hash tag ``{rate:<channel>/<account>}``, so one script takes the account's
        and a chat's tokens together.
        """
        return f"{self.prefix}:{{rate:{channel}/{account}}}:send"

    def chat_send_rate(self, channel: str, account: str, chat: str) -> str:
        """STRING, PX TTL: one chat's send bucket (GCRA arrival time, ms; held for a platform's ``retry_after``)."""
        return f"{self.prefix}:{{rate:{channel}/{account}}}:send:{chat}"

    def chat_edit_rate(self, channel: str, account: str, chat: str) -> str:
        """STRING, PX TTL: one chat's streaming edit budget (GCRA arrival time, ms), shared by every worker."""
        return f"{self.prefix}:{{rate:{channel}/{account}}}:edit:{chat}"

    @property
    def every_web_ticket(self) -> str:
        """``MATCH`` pattern of every shard's web chat stream tickets (:meth:`ShardKeys.web_ticket`)."""
        return literal(f"{self.prefix}:{{") + "*" + literal("}:webticket:") + "*"

    def web_streams_by_session(self, session: str) -> str:
        """ZSET open stream id → expiry (server ms): the session's open web chat streams, across processes."""
        return f"{self.prefix}:webstreams:session:{session}"

    def web_streams_by_address(self, address: str) -> str:
        """ZSET open stream id → expiry (server ms): one client address's open web chat streams."""
        return f"{self.prefix}:webstreams:address:{address}"

    def webhook_cursors(self, tenant: str) -> str:
        """HASH session → last event-log entry id read for the tenant's webhooks; ``~since``: where others start.

        A tenant's webhook keys share the hash tag ``{webhooks:<tenant>}``, so each ``MULTI`` over them is one slot.
        """
        return f"{self.prefix}:{{webhooks:{tenant}}}:cursors"

    def webhook_deliveries(self, tenant: str) -> str:
        """HASH delivery id (``<endpoint>:<event id>``) → JSON ``{endpoint, body, attempts, last_error}``: waiting."""
        return f"{self.prefix}:{{webhooks:{tenant}}}:deliveries"

    def webhook_due(self, tenant: str) -> str:
        """ZSET delivery id → unix time its next attempt is due."""
        return f"{self.prefix}:{{webhooks:{tenant}}}:due"

    def webhook_sent(self, tenant: str) -> str:
        """ZSET delivery id → unix time delivered (a week kept): the same event is never queued twice per URL."""
        return f"{self.prefix}:{{webhooks:{tenant}}}:sent"

    def webhook_dead(self, tenant: str) -> str:
        """STREAM, capped: deliveries that ran out of attempts or were refused, for operators."""
        return f"{self.prefix}:{{webhooks:{tenant}}}:dead"

    def webhook_lock(self, tenant: str) -> str:
        """STRING worker id, PX TTL: the process delivering the tenant's webhooks now."""
        return f"{self.prefix}:{{webhooks:{tenant}}}:lock"

    def console_login(self, token_hash: str) -> str:
        """STRING JSON ``{"operator", "csrf", "via"}``, EX TTL: one console sign-in, by its cookie's hash."""
        return f"{self.prefix}:console:login:{token_hash}"

    def console_failures(self, address: str) -> str:
        """STRING counter, EX TTL: failed console sign-ins from one client address (IPv6 per /64)."""
        return f"{self.prefix}:console:failures:address:{address}"

    def console_pair_failures(self, pair: str) -> str:
        """STRING counter, EX TTL: failed console sign-ins of one (address, operator name) pair, by its hash.

        Shares the hash tag ``{console:<pair>}`` with :meth:`console_wait`: one script reads and sets both.
        """
        return f"{self.prefix}:{{console:{pair}}}:failures"

    def console_wait(self, pair: str) -> str:
        """STRING, PX TTL: while it lives, one (address, operator name) pair's sign-in tries are refused."""
        return f"{self.prefix}:{{console:{pair}}}:wait"

    def budget(self, tenant: str, scope: str, name: str, stamp: str) -> str:
        """HASH ``spent``, the rule (``budget``, ``scope``, ``subject``, ``period``), ``alert:<fraction>`` marks.

        One budget counter for one period, EXPIREAT the period's end plus a day; a tenant's budget keys share the
        hash tag ``{budget:<tenant>}``.
        """
        return f"{self.prefix}:{{budget:{tenant}}}:{scope}:{name}:{stamp}"

    def budget_counters(self, tenant: str) -> str:
        """ZSET counter key → its expiry (Unix s): a tenant's live budget counters, for the console."""
        return f"{self.prefix}:{{budget:{tenant}}}:counters"

    def budget_alerts(self, tenant: str) -> str:
        """STREAM (capped) of a tenant's budget alerts: what the console and operators read."""
        return f"{self.prefix}:{{budget:{tenant}}}:alerts"

    def people(self, tenant: str) -> str:
        """HASH principal (``telegram:42``) → person id: a tenant's linked identities."""
        return f"{self.prefix}:{{people:{tenant}}}:principals"

    def people_log(self, tenant: str) -> str:
        """STREAM (capped) of a tenant's ``person_linked`` / ``person_unlinked`` facts."""
        return f"{self.prefix}:{{people:{tenant}}}:log"

    def link_code(self, tenant: str, code_hash: str) -> str:
        """STRING JSON ``{"principal", "person"}``, EX TTL: one pending ``/link`` code, by its hash."""
        return f"{self.prefix}:{{people:{tenant}}}:code:{code_hash}"

    def link_wrong(self, tenant: str) -> str:
        """STRING counter, EX one hour: wrong ``/link`` codes sent by all the accounts of a tenant together."""
        return f"{self.prefix}:{{people:{tenant}}}:wrong"

    def link_tries(self, tenant: str, principal: str) -> str:
        """STRING counter, EX one hour: ``/link`` codes asked for and wrong codes tried by one principal."""
        return f"{self.prefix}:{{people:{tenant}}}:tries:{principal}"

    def mcp_client(self, token_hash: str) -> str:
        """STRING JSON ``{"name", "tenant", "sha256", "created_at"}``: an MCP client of ``mcp serve``, by token hash."""
        return f"{self.prefix}:mcp:client:{token_hash}"

    def mcp_clients(self, tenant: str) -> str:
        """HASH client name → its token's SHA-256: one tenant's MCP clients, for listing and removal."""
        return f"{self.prefix}:mcp:{tenant}:clients"

    def review_runs(self, tenant: str) -> str:
        """LIST of JSON samples, newest first, capped: a tenant's finished runs sampled for review (no words)."""
        return f"{self.prefix}:{{review:{tenant}}}:runs"

    def review_verdicts(self, tenant: str) -> str:
        """HASH ``<session>|<run id>`` → JSON verdict (pass/fail, note, reviewer, when) of a tenant's sampled runs."""
        return f"{self.prefix}:{{review:{tenant}}}:verdicts"

    def agent_drafts(self, tenant: str) -> str:
        """HASH agent name → JSON draft (the proposed agent, who proposed it, when): never served until accepted."""
        return f"{self.prefix}:drafts:{tenant}:agents"


_COMPONENT = r"[A-Za-z0-9_.:@+=%-]+"  # one percent-escaped session-key component (core.messages.session_key)
_LAYOUT1_SESSION = re.compile(rf"{PREFIX}:\{{((?:{_COMPONENT}/){{4,5}}{_COMPONENT})\}}:(.+)", re.DOTALL)


@dataclass(frozen=True, slots=True)
class Layout1Keys:
    """Key names of layout 1 (the release before the sharded layout), read only by ``switchboard migrate``.

    A session's keys were ``sb:{<session>}:<name>``: the session key itself as the hash tag; the indexes written per
    message (runnable, sessions, stats, dead letters, approvals, effects in doubt) were one key for the deployment.
    """

    prefix: str = PREFIX

    @property
    def every_session(self) -> str:
        """``MATCH`` pattern of every layout-1 session key (and a few others: check :meth:`session_in`)."""
        return literal(f"{self.prefix}:{{") + "*/*" + literal("}:") + "*"

    @staticmethod
    def session_in(key: str) -> tuple[SessionKey, str] | None:
        """``(session, name)`` of a layout-1 session key, or ``None`` for any other key.

        Exactly the shape the release's ``session_key`` builds: five or six ``/``-separated percent-escaped
        components in the hash tag. ``sb:{listener:<channel>/<account>}:…``, ``sb:{rate:…}``, ``sb:{budget:…}``
        and today's ``sb:{<shard tag>}:<<session>>:…`` do not match.
        """
        found = _LAYOUT1_SESSION.fullmatch(key)
        return (SessionKey(found.group(1)), found.group(2)) if found else None

    @property
    def runnable(self) -> str:
        """ZSET session → time runnable (now :attr:`ShardKeys.runnable`)."""
        return f"{self.prefix}:runnable"

    @property
    def sessions(self) -> str:
        """ZSET session → last activity (now :attr:`ShardKeys.sessions`)."""
        return f"{self.prefix}:sessions"

    @property
    def deferred(self) -> str:
        """ZSET session → deferred until (now :attr:`ShardKeys.deferred`)."""
        return f"{self.prefix}:deferred"

    @property
    def dead_letters(self) -> str:
        """STREAM of every dead letter (now :attr:`ShardKeys.dead_letters`)."""
        return f"{self.prefix}:deadletters"

    @property
    def stats(self) -> str:
        """HASH of counters (now :attr:`ShardKeys.stats`)."""
        return f"{self.prefix}:stats:counters"

    @property
    def fenced_rejections(self) -> str:
        """STRING counter of fenced writes (now the field :data:`FENCED_FIELD` of :attr:`ShardKeys.stats`)."""
        return f"{self.prefix}:stats:fenced"

    def histogram(self, name: str) -> str:
        """HASH of one latency histogram (now :meth:`ShardKeys.histogram`)."""
        return f"{self.prefix}:stats:hist:{name}"

    @property
    def approvals_due(self) -> str:
        """ZSET ``<session>|<approval id>`` → expires_at (now :attr:`ShardKeys.approvals_due`)."""
        return f"{self.prefix}:approvals:due"

    def approvals_pending(self, tenant: str) -> str:
        """ZSET of one tenant's pending approvals (now :meth:`ShardKeys.approvals_pending`)."""
        return f"{self.prefix}:approvals:pending:{tenant}"

    def effects_in_doubt(self, tenant: str) -> str:
        """HASH of one tenant's effects in doubt (now :meth:`ShardKeys.effects_in_doubt`)."""
        return f"{self.prefix}:effects:doubt:{tenant}"

    def family(self, head: str) -> str:
        """``MATCH`` pattern of the keys named ``<prefix>:<head><anything>`` (``stats:hist:``)."""
        return literal(f"{self.prefix}:{head}") + "*"

    @property
    def access(self) -> str:
        """``sb:access:<tenant>:{paired,requests,code:<digest>,pending:<principal>,notice:<who>}``."""
        return f"{self.prefix}:access:"

    @property
    def webhooks(self) -> str:
        """``sb:webhooks:<tenant>:{cursors,deliveries,due,sent,dead,lock}``."""
        return f"{self.prefix}:webhooks:"

    @property
    def console_pair_failures(self) -> str:
        """``sb:console:failures:pair:<pair hash>``."""
        return f"{self.prefix}:console:failures:pair:"

    @property
    def console_wait(self) -> str:
        """``sb:console:wait:<pair hash>``."""
        return f"{self.prefix}:console:wait:"

    @property
    def web_tickets(self) -> str:
        """``sb:webticket:<ticket hash>``."""
        return f"{self.prefix}:webticket:"

    @staticmethod
    def rq(prefix: str) -> str:
        """``MATCH`` pattern of every key rq kept for layout 1's drain jobs under ``prefix`` (``RQ_KEY_PREFIX``).

        Its queue, intermediate list, registries, job hashes and queue set.
        """
        return literal(f"{prefix}:") + "*"
