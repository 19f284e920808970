"""Metrics split by agent, agent version, tool and tenant, kept in Redis so any web process exports them.

A turn's figures are tallied as its events pass through the drain (:class:`TurnTally`) and written with the facts the
drain already writes when the turn ends (the reply's outbox claim, or the ``facts`` script): increments of fields of
the stats hash of the session's shard (:attr:`ShardKeys.stats`, summed over the shards when read), no round trip of
their own. What is tallied:

- per agent, version and tenant: the turn's duration (a histogram: turns completed, p50/p95), its credits (cost per
  task) and the budget that stopped it early (``deadline`` is a timeout);
- per agent, tool and tenant: each call's outcome (``ok``, ``approval``: held for a person, ``validation``,
  ``timeout``, ``refused`` by the policy, ``error``) and its retries;
- per agent and tenant: approvals asked (of a tool call, or of a held reply), and runs that failed or were cancelled
  (:func:`run_field`, written by the ``fail`` and ``complete`` scripts);
- per agent and tenant: reviewers' first verdicts on sampled runs, ``pass`` or ``fail`` (:func:`review_field`,
  written with the verdict): completion as people judge it.

Label values come only from configuration and code, never from a request or a model: a tenant, agent or tool that
the configuration does not name (a tool name a model made up, a tenant no binding declares) is counted as
:data:`OTHER`, and so is every name past each label's cap (:data:`LABEL_CAPS`, in sorted order). The agent version is
the digest of the agent's prompt and tool catalog (``UsageMetered.prompt_version``): the export keeps the
:data:`VERSIONS_SHOWN` most used of each agent and folds the rest into :data:`OTHER`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, Literal

from switchboard.core.agent.prompt import RUN_PROGRAM
from switchboard.core.agent.slots import SLOT_TOOLS
from switchboard.core.events import ApprovalRequested, Event, ToolCalled, UsageMetered
from switchboard.core.knowledge.config import KNOWLEDGE_TOOLS
from switchboard.core.memory.tools import MEMORY_TOOLS
from switchboard.core.tables.config import table_cost
from switchboard.core.tools.builtin.skills import USE_SKILL
from switchboard.queue.connection import AsyncClient
from switchboard.queue.fanout import each_shard, sum_counts
from switchboard.settings import FileConfig

__all__ = [
    "FIELD_PREFIX",
    "LABEL_CAPS",
    "OTHER",
    "TOOL_OUTCOMES",
    "TURN_SECONDS_BUCKETS",
    "VERSIONS_SHOWN",
    "SegmentLabels",
    "Segments",
    "TurnTally",
    "parse_segments",
    "quantile",
    "read_segments",
    "review_field",
    "run_field",
]

OTHER: Final = "other"
"""The label value of everything the configuration does not name, or past a label's cap."""
LABEL_CAPS: Final = {"tenant": 50, "agent": 50, "tool": 100}
"""Most distinct values of each label; the rest are counted as :data:`OTHER`."""
VERSIONS_SHOWN: Final = 5
"""Versions of one agent exported with their own label (the most used); older ones are summed as :data:`OTHER`."""
TURN_SECONDS_BUCKETS: Final = (0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
"""Upper bounds (seconds) of the per-agent turn-duration histogram; ``+Inf`` is implied."""
FIELD_PREFIX: Final = "seg:"
"""Stats-hash fields of this module start with it, followed by the JSON list ``[metric, *labels]``."""
TOOL_OUTCOMES: Final = ("ok", "approval", "validation", "timeout", "refused", "error")
"""The ``outcome`` label of a tool call."""

Metric = Literal["turn", "turn_sum", "credits", "stop", "tool", "retries", "approvals", "run", "review"]
_BUILTIN_TOOLS: Final = frozenset(
    {RUN_PROGRAM, USE_SKILL, *MEMORY_TOOLS, *KNOWLEDGE_TOOLS, *(tool.name for tool in SLOT_TOOLS)}
)


def _capped(names: Iterable[str], cap: int) -> frozenset[str]:
    return frozenset(sorted(set(names))[:cap])


@dataclass(frozen=True)
class SegmentLabels:
    """The label values a deployment may export: names from its configuration and code, each label capped."""

    tenants: frozenset[str] = frozenset()
    agents: frozenset[str] = frozenset()
    tools: frozenset[str] = frozenset()

    @classmethod
    def of(cls, config: FileConfig | None) -> SegmentLabels:
        """The names ``config`` declares: its tenants, its agents and every tool they may be offered.

        Tenants: the default, the ``tenants`` blocks, the channels' and accounts' routes and the projects'.
        """
        if config is None:
            return cls(tenants=frozenset({"default"}), tools=_BUILTIN_TOOLS)
        tenants = {config.tenant, *config.tenants, *(p.tenant for p in config.projects.values())}
        for options in config.channels.values():  # where a channel or an account routes its messages
            tenants.update(t for t in (options.tenant, *(a.tenant for a in options.accounts.values())) if t)
        tools = set(_BUILTIN_TOOLS) | {spec.name for spec in config.rest_tools}
        for agent in config.agents.values():
            tools.update(agent.tools)
            tools.update(spec.name for spec in agent.rest_tools)
            tools.update(table_cost(agent.tables).parts)
            for entry in agent.mcp:
                tools.update(f"{entry.server}__{tool}" for tool in entry.tools or ())
        return cls(
            tenants=_capped(tenants, LABEL_CAPS["tenant"]),
            agents=_capped(config.agents, LABEL_CAPS["agent"]),
            tools=_capped(tools, LABEL_CAPS["tool"]),
        )

    def tenant(self, name: str) -> str:
        """``name`` as a ``tenant`` label value."""
        return name if name in self.tenants else OTHER

    def agent(self, name: str) -> str:
        """``name`` as an ``agent`` label value."""
        return name if name in self.agents else OTHER

    def tool(self, name: str) -> str:
        """``name`` as a ``tool`` label value."""
        return name if name in self.tools else OTHER


def _outcome(event: ToolCalled) -> str:
    """A tool call's ``outcome`` label (one of :data:`TOOL_OUTCOMES`)."""
    if event.ok:
        return "ok"
    if (event.policy or "").startswith("refuse:"):
        return "refused"
    error = event.error_class or ""
    if error in ("needs_approval", "waiting"):
        return "approval"
    if error == "validation":
        return "validation"
    if "timeout" in error:
        return "timeout"
    return "error"


def _field(metric: Metric, *labels: str) -> str:
    return FIELD_PREFIX + json.dumps([metric, *labels], separators=(",", ":"))


def run_field(labels: SegmentLabels, agent: str, tenant: str, outcome: Literal["failed", "cancelled"]) -> str:
    """The stats-hash field counting runs of ``agent`` in ``tenant`` that ended with ``outcome``."""
    return _field("run", labels.agent(agent), labels.tenant(tenant), outcome)


def review_field(labels: SegmentLabels, agent: str, tenant: str, verdict: Literal["pass", "fail"]) -> str:
    """The stats-hash field counting sampled runs of ``agent`` in ``tenant`` a reviewer first judged ``verdict``."""
    return _field("review", labels.agent(agent), labels.tenant(tenant), verdict)


def _bucket(seconds: float) -> str:
    for bound in TURN_SECONDS_BUCKETS:
        if seconds <= bound:
            return f"{bound:g}"
    return "+Inf"


@dataclass
class TurnTally:
    """What one turn did, tallied from its events as the drain sees them; written with its closing facts."""

    tenant: str
    agent: str = ""
    version: str = ""
    metered: bool = False
    seconds: float = 0.0
    credits: float = 0.0
    stopped_by: str | None = None
    tools: Counter[tuple[str, str]] = field(default_factory=Counter)
    retries: Counter[str] = field(default_factory=Counter)
    approvals: Counter[str] = field(default_factory=Counter)

    def see(self, event: Event) -> None:
        """Count ``event`` if it is one of the facts tallied (any other is ignored)."""
        if isinstance(event, ToolCalled):
            self.tools[(event.tool, _outcome(event))] += 1
            if event.attempts > 1:
                self.retries[event.tool] += event.attempts - 1
        elif isinstance(event, ApprovalRequested):
            self.approvals[event.approval_kind] += 1
        elif isinstance(event, UsageMetered) and event.agent:  # a voice reply's metering names no agent
            self.metered = True
            self.agent, self.version = event.agent, event.prompt_version
            self.seconds += event.duration_ms / 1000.0
            self.credits += event.credits
            self.stopped_by = event.stopped_by or self.stopped_by

    def increments(self, labels: SegmentLabels) -> list[tuple[str, str, bool]]:
        """The stats-hash fields to add to: ``(field, amount, is_float)``; cleared after (a turn counts once).

        Nothing unless the turn was metered (it ran its model): the plain path pays two increments (the duration's
        bucket and sum), a priced turn one more, a stopped turn one more; tools and approvals only when used.
        """
        if not self.metered:
            return []
        tenant, agent, version = labels.tenant(self.tenant), labels.agent(self.agent), self.version
        out: list[tuple[str, str, bool]] = [
            (_field("turn", agent, version, tenant, _bucket(self.seconds)), "1", False),
            (_field("turn_sum", agent, version, tenant), f"{self.seconds:.6f}", True),
        ]
        if self.credits:
            out.append((_field("credits", agent, version, tenant), repr(self.credits), True))
        if self.stopped_by:
            out.append((_field("stop", agent, version, tenant, self.stopped_by), "1", False))
        for (tool, outcome), count in sorted(self.tools.items()):
            out.append((_field("tool", agent, labels.tool(tool), tenant, outcome), str(count), False))
        for tool, count in sorted(self.retries.items()):
            out.append((_field("retries", agent, labels.tool(tool), tenant), str(count), False))
        for kind, count in sorted(self.approvals.items()):
            out.append((_field("approvals", agent, tenant, kind), str(count), False))
        self.metered, self.seconds, self.credits, self.stopped_by = False, 0.0, 0.0, None
        self.tools, self.retries, self.approvals = Counter(), Counter(), Counter()
        return out


@dataclass(frozen=True)
class Segments:
    """The segmented figures of the whole deployment, labels ready for export (versions capped)."""

    turns: dict[tuple[str, str, str], tuple[tuple[tuple[float, int], ...], float]] = field(default_factory=dict)
    """By ``(agent, version, tenant)``: cumulative bucket counts (last bound ``inf``) and the sum of seconds."""
    credits: dict[tuple[str, str, str], float] = field(default_factory=dict)
    stops: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    """By ``(agent, version, tenant, reason)``."""
    tools: dict[tuple[str, str, str, str], int] = field(default_factory=dict)
    """By ``(agent, tool, tenant, outcome)``."""
    retries: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """By ``(agent, tool, tenant)``."""
    approvals: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """By ``(agent, tenant, kind)``."""
    runs: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """Attempts that failed and runs cancelled, by ``(agent, tenant, outcome)``."""
    reviews: dict[tuple[str, str, str], int] = field(default_factory=dict)
    """Sampled runs by their first verdict, by ``(agent, tenant, verdict)``."""


def _number(raw: bytes | str) -> float:
    try:
        return float(raw)
    except ValueError:
        return 0.0


def parse_segments(raw: Mapping[bytes, bytes] | Mapping[str, str]) -> Segments:
    """The figures in a stats hash as read (fields of other modules are skipped)."""
    fields: list[tuple[list[str], float]] = []
    for key, amount in raw.items():
        name = key.decode() if isinstance(key, bytes) else key
        if not name.startswith(FIELD_PREFIX):
            continue
        try:
            parts = json.loads(name[len(FIELD_PREFIX) :])
        except ValueError:
            continue
        if isinstance(parts, list) and parts and all(isinstance(p, str) for p in parts):
            fields.append((parts, _number(amount)))
    used: Counter[tuple[str, str]] = Counter()
    for parts, value in fields:
        if parts[0] == "turn" and len(parts) == 5:
            used[(parts[1], parts[2])] += int(value)
    shown = _shown_versions(used)

    def version(agent: str, name: str) -> str:
        return name if (agent, name) in shown else OTHER

    buckets: dict[tuple[str, str, str], Counter[str]] = {}
    sums: dict[tuple[str, str, str], float] = {}
    credits: dict[tuple[str, str, str], float] = {}
    stops: Counter[tuple[str, str, str, str]] = Counter()
    tools: Counter[tuple[str, str, str, str]] = Counter()
    retries: Counter[tuple[str, str, str]] = Counter()
    approvals: Counter[tuple[str, str, str]] = Counter()
    runs: Counter[tuple[str, str, str]] = Counter()
    reviews: Counter[tuple[str, str, str]] = Counter()
    for parts, value in fields:
        match parts:
            case ["turn", agent, ver, tenant, bound]:
                buckets.setdefault((agent, version(agent, ver), tenant), Counter())[bound] += int(value)
            case ["turn_sum", agent, ver, tenant]:
                seg = (agent, version(agent, ver), tenant)
                sums[seg] = sums.get(seg, 0.0) + value
            case ["credits", agent, ver, tenant]:
                seg = (agent, version(agent, ver), tenant)
                credits[seg] = credits.get(seg, 0.0) + value
            case ["stop", agent, ver, tenant, reason]:
                stops[(agent, version(agent, ver), tenant, reason)] += int(value)
            case ["tool", agent, tool, tenant, outcome]:
                tools[(agent, tool, tenant, outcome)] += int(value)
            case ["retries", agent, tool, tenant]:
                retries[(agent, tool, tenant)] += int(value)
            case ["approvals", agent, tenant, kind]:
                approvals[(agent, tenant, kind)] += int(value)
            case ["run", agent, tenant, outcome]:
                runs[(agent, tenant, outcome)] += int(value)
            case ["review", agent, tenant, verdict]:
                reviews[(agent, tenant, verdict)] += int(value)
            case _:
                continue
    turns = {key: (_cumulative(counts), sums.get(key, 0.0)) for key, counts in buckets.items()}
    return Segments(
        turns=turns,
        credits=credits,
        stops=dict(stops),
        tools=dict(tools),
        retries=dict(retries),
        approvals=dict(approvals),
        runs=dict(runs),
        reviews=dict(reviews),
    )


def _shown_versions(used: Mapping[tuple[str, str], int]) -> set[tuple[str, str]]:
    """Each agent's :data:`VERSIONS_SHOWN` most used versions."""
    by_agent: dict[str, list[tuple[int, str]]] = {}
    for (agent, version), count in used.items():
        by_agent.setdefault(agent, []).append((count, version))
    shown: set[tuple[str, str]] = set()
    for agent, versions in by_agent.items():
        for _, version in sorted(versions, key=lambda item: (-item[0], item[1]))[:VERSIONS_SHOWN]:
            shown.add((agent, version))
    return shown


def _cumulative(counts: Mapping[str, int]) -> tuple[tuple[float, int], ...]:
    running = 0
    out: list[tuple[float, int]] = []
    for bound in (*TURN_SECONDS_BUCKETS, float("inf")):
        running += counts.get(f"{bound:g}" if bound != float("inf") else "+Inf", 0)
        out.append((bound, running))
    return tuple(out)


def quantile(buckets: Sequence[tuple[float, int]], q: float) -> float | None:
    """The ``q`` quantile of a cumulative histogram, interpolated in its bucket as Prometheus does (``None``: empty).

    An answer in the ``+Inf`` bucket is the highest finite bound.
    """
    total = buckets[-1][1] if buckets else 0
    if total == 0:
        return None
    rank = q * total
    lower_bound, lower_count = 0.0, 0
    for bound, count in buckets:
        if count >= rank:
            if bound == float("inf"):
                return lower_bound
            if count == lower_count:
                return bound
            return lower_bound + (bound - lower_bound) * (rank - lower_count) / (count - lower_count)
        lower_bound, lower_count = bound, count
    return lower_bound


async def read_segments(redis: AsyncClient) -> Segments:
    """The segmented figures: every shard's stats hash (its fields bounded by the label caps), summed."""
    return parse_segments(sum_counts(await each_shard(redis, lambda pipe, shard: pipe.hgetall(shard.stats))))
