"""The tool gateway: every tool call, from a model step or a CodeAct program, passes through here.

One call is resolved, validated, authorised outside the model, decided by the policy, stamped with its idempotency
key and claimed, run under its timeout and circuit breaker with safe retries, and its output tiered (inline, data
card, workspace file); ``docs/ARCHITECTURE.md`` §6 describes each step. Error messages never carry a host path.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import time
from collections import Counter
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError

from switchboard.core.approvals.policy import PolicyDecision, granted
from switchboard.core.approvals.records import ApprovalRequest
from switchboard.core.tools.breakers import CircuitBreaker
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.calls import (
    Tier,
    ToolOutcome,
    action_sha256,
    canonical_json,
    classify_error,
    describe_invalid,
    doubt_info,
    failure_message,
    idempotency_key,
    retry_safe,
)
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.effects import (
    Refused,
    claim_effect,
    doubt_effect,
    logical_action,
    running,
    settle_effect,
)
from switchboard.core.tools.results import data_card, save_result, scrub_paths
from switchboard.core.tools.threads import ThreadShare, default_share, run_blocking
from switchboard.core.workspaces.disk import Workspaces, workspace_for
from switchboard.core.workspaces.store import LocalWorkspaces, WorkspaceStore
from switchboard.errors import ToolError
from switchboard.tracing import span

__all__ = [
    "CallScope",
    "CircuitBreaker",
    "ToolGateway",
    "ToolOutcome",
    "action_sha256",
    "canonical_json",
    "classify_error",
    "data_card",
    "idempotency_key",
    "workspace_for",
]

logger = logging.getLogger(__name__)

_UNHEALTHY = frozenset({"rate_limit", "transient", "ambiguous_timeout"})
"""Failures that say something about the connector's health (and so count towards its breaker)."""
_MAX_RESULT_DEPTH = 100
"""Deepest nesting of a result passed on: the outcome and its effect record are serialised a few levels deeper, and
pydantic refuses to serialise a value nested much deeper (a hostile API's ``[[[[…]]]]`` would crash the call)."""


def _nesting(value: Any, limit: int) -> bool:
    """Whether ``value`` nests lists and objects more than ``limit`` levels deep (iterative: no recursion limit)."""
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list | tuple):
            if depth >= limit:
                return True
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return False


@dataclass
class CallScope:
    """Per-turn bookkeeping shared by every call of one turn."""

    allowed: frozenset[str] | None = None
    """Names the agent may call (``None``: any registered tool)."""
    ordinals: Counter[str] = field(default_factory=Counter)
    """Calls that succeeded so far, by action (:func:`action_sha256` of the tool and its normalised arguments).

    The next identical call is occurrence ``ordinals[action] + 1`` of that action and gets that occurrence's
    idempotency key. Failed or refused calls do not count: a retry of one keeps its key (a released claim is taken
    again, an unknown outcome stays refused). Counted in the order the calls are made, so a re-attempt of the run
    that makes the same calls maps each one to its earlier key.
    """
    variables: dict[str, Any] = field(default_factory=dict)
    """Large results by variable name; passed to the next CodeAct program."""

    def bind(self, value: Any) -> str:
        """Bind a value to the next free ``result_N`` name."""
        name = f"result_{len(self.variables) + 1}"
        self.variables[name] = value
        return name


class ToolGateway:
    """Validates, authorises, runs, retries and tiers tool calls; one per process (breakers live here)."""

    def __init__(
        self,
        registry: ToolRegistry,
        *,
        workspace_root: Path,
        max_attempts: int = 3,
        backoff_base_s: float = 0.2,
        backoff_cap_s: float = 5.0,
        max_retry_wait_s: float = 10.0,
        breaker_threshold: int = 5,
        breaker_cooldown_s: float = 30.0,
        inline_bytes: int = 2048,
        file_bytes: int = 64 * 1024,
        clock: Callable[[], float] = time.monotonic,
        workspaces: Workspaces | None = None,
        threads: ThreadShare | None = None,
        store: WorkspaceStore | None = None,
    ) -> None:
        self.registry = registry
        self.workspace_root = workspace_root
        self.workspaces = workspaces or Workspaces(workspace_root)
        """Every session workspace and its quotas; tools and result files write through it."""
        self.store = store or LocalWorkspaces(workspace_root, self.workspaces)
        """Where workspaces are kept between turns; what a write tool changed is persisted right after it."""
        self.threads = threads or default_share()
        """The tool threads, shared fairly between sessions."""
        self.max_attempts = max(1, max_attempts)
        self.backoff_base_s = backoff_base_s
        self.backoff_cap_s = backoff_cap_s
        self.max_retry_wait_s = max_retry_wait_s
        self.inline_bytes = inline_bytes
        self.file_bytes = file_bytes
        self._breaker_threshold = breaker_threshold
        self._breaker_cooldown_s = breaker_cooldown_s
        self._clock = clock
        self._breakers: dict[str, CircuitBreaker] = {}

    def breaker(self, connector: str) -> CircuitBreaker:
        """The circuit breaker of one connector (created closed on first use)."""
        found = self._breakers.get(connector)
        if found is None:
            found = self._breakers[connector] = CircuitBreaker(
                self._breaker_threshold, self._breaker_cooldown_s, self._clock
            )
        return found

    def backoff_s(self, attempt: int, retry_after: float | None = None) -> float:
        """Full-jitter exponential back-off before retry ``attempt`` (1-based), at least ``retry_after``."""
        jitter = random.uniform(0.0, min(self.backoff_cap_s, self.backoff_base_s * 2 ** (attempt - 1)))
        return max(jitter, retry_after or 0.0)

    async def call(
        self,
        name: str,
        args: dict[str, Any],
        ctx: ToolContext,
        *,
        scope: CallScope | None = None,
        allowed: Collection[str] | None = None,
        approved: ApprovalRequest | None = None,
    ) -> ToolOutcome:
        """Run one call through every gate; failures come back as an outcome, never as an exception.

        Args:
            name: the tool.
            args: its arguments as the model (or a program) gave them.
            ctx: the call's context (``ctx.policy`` decides it).
            scope: the turn's bookkeeping (occurrences, variables, allowed names).
            allowed: narrows the names that may be called (default: ``scope.allowed``).
            approved: the :class:`ApprovalRequest` a person approved: the call must hash to its
                ``action_sha256`` (else ``approval_mismatch``), runs under its ``idempotency_key`` and skips the
                policy's *approve*; a missing permission or a *refuse* still refuses it.

        ``asyncio.CancelledError`` is not caught: cancelling the turn cancels the running tool.
        """
        with span("tool.call", tool__name=name, tool__approved=approved is not None) as opened:
            outcome = await self._call(name, args, ctx, scope if scope is not None else CallScope(), allowed, approved)
            opened.set_attribute("tool.ok", outcome.ok)
            if outcome.error_class:
                opened.set_attribute("tool.error_class", outcome.error_class)
            if outcome.policy:
                opened.set_attribute("policy.decision", outcome.policy)
            return outcome

    async def _call(
        self,
        name: str,
        args: dict[str, Any],
        ctx: ToolContext,
        scope: CallScope,
        allowed: Collection[str] | None,
        approved: ApprovalRequest | None,
    ) -> ToolOutcome:
        permitted = allowed if allowed is not None else scope.allowed
        started = time.perf_counter()
        tool = self.registry.get(name, agent=ctx.agent)  # its risk may follow the agent's own configuration
        if tool is None or (permitted is not None and name not in permitted):
            names = sorted(permitted) if permitted is not None else self.registry.names()
            return self._failed(name, started, "validation", f"unknown tool {name!r}; available: {', '.join(names)}")
        if "_raw" in args and len(args) == 1:
            raw = str(args["_raw"])[:200]
            return self._failed(name, started, "validation", f"arguments of {name} are not a JSON object: {raw!r}")
        try:
            validated = tool.input.model_validate(args)
        except ValidationError as err:
            return self._failed(name, started, "validation", describe_invalid(name, err))
        if tool.permission is not None and not granted(tool.permission, ctx.permissions):
            return self._failed(
                name, started, "auth", f"not permitted: {name} needs the {tool.permission!r} permission"
            )

        normalised = validated.model_dump(mode="json", by_alias=True)  # named as the model (and a rule) names them
        try:
            fingerprint = action_sha256(name, normalised)
        except ValueError:  # an int of thousands of digits (from a program) has no canonical JSON
            return self._failed(name, started, "validation", f"arguments of {name} hold a number too large to record")
        if approved is not None:
            if approved.tool != name or approved.action_sha256 != fingerprint:
                return self._failed(
                    name,
                    started,
                    "approval_mismatch",
                    f"not performed: this {name} call is not the action that was approved (its arguments changed); "
                    "ask again for approval of the new action",
                    fingerprint=fingerprint,
                )
            key = approved.idempotency_key
        else:
            occurrence = scope.ordinals[fingerprint] + 1
            key = idempotency_key(ctx.run_id, name, logical_action(tool, normalised), occurrence)
        decision = self._decide(tool, normalised, ctx)
        if decision.decision == "refuse":
            message = f"not performed: refused by policy ({decision.reason}); do not repeat this call"
            return self._failed(
                name, started, "refused_by_policy", message, key=key, fingerprint=fingerprint, policy=decision.label
            )
        if decision.decision == "approve" and approved is None:
            request = ApprovalRequest(
                tool=name,
                arguments=normalised,
                action_sha256=fingerprint,
                idempotency_key=key,
                resources=tool.affected(validated),
                reason=decision.reason,
                rule=decision.rule,
                policy_version=decision.version,
                risk=tool.risk,
                reversible=tool.reversible,
            )
            message = f"not performed yet: {name} needs a person's approval ({decision.reason})"
            failed = self._failed(
                name, started, "needs_approval", message, key=key, fingerprint=fingerprint, policy=decision.label
            )
            return failed.model_copy(update={"approval": request})
        with running(key):  # a sibling call racing this one waits for its outcome (effects.claim_effect)
            outcome = await self._effect(tool, validated, ctx, scope, started, key, fingerprint)
        outcome = outcome.model_copy(update={"policy": decision.label})
        if outcome.ok:  # this occurrence happened (or was recorded): an identical call after it is the next one
            scope.ordinals[fingerprint] += 1
        return outcome

    @staticmethod
    def _decide(tool: Tool, normalised: dict[str, Any], ctx: ToolContext) -> PolicyDecision:
        """Ask the turn's policy about one call (span ``policy.check``: names and classes, never argument values)."""
        policy = ctx.policy
        with span("policy.check", tool__name=tool.name, policy__version=policy.version) as opened:
            decision = policy.decide(
                tool,
                normalised,
                actor=ctx.actor,
                untrusted=ctx.untrusted_context,
                untrusted_sources=ctx.untrusted_sources,
                role=ctx.role,
            )
            opened.set_attribute("policy.decision", decision.label.partition(":")[0])
            opened.set_attribute("policy.rule", decision.rule)
            return decision

    async def _effect(
        self,
        tool: Tool,
        validated: BaseModel,
        ctx: ToolContext,
        scope: CallScope,
        started: float,
        key: str,
        fingerprint: str,
    ) -> ToolOutcome:
        """Claim, run (retrying what the tool allows) and settle one validated call under its key."""
        name = tool.name
        claimed = await claim_effect(ctx.effects, tool, key, fingerprint, run_id=ctx.run_id)
        if isinstance(claimed, Refused):
            if claimed.error_class == "ambiguous":  # started before, no result: reconciliation, never re-run
                await doubt_effect(
                    ctx.effects, tool, key, fingerprint, doubt_info(ctx, "found_started"), claimed.record
                )
            return self._failed(name, started, claimed.error_class, claimed.message, key=key, fingerprint=fingerprint)
        if claimed is not None:  # done before under this key: the recorded outcome, not a second effect
            elapsed = (time.perf_counter() - started) * 1000
            return ToolOutcome.model_validate({**claimed, "attempts": 0, "variable": None, "duration_ms": elapsed})
        call_ctx = dataclasses.replace(ctx, idempotency_key=key, workspaces=self.workspaces, threads=self.threads)
        breaker = self.breaker(tool.breaker_key)

        attempt = 0
        while True:
            attempt += 1
            if not breaker.allow():
                await settle_effect(ctx.effects, tool, key, fingerprint, None)
                return self._failed(
                    name,
                    started,
                    "circuit_open",
                    f"{tool.breaker_key} is failing and paused for up to {breaker.cooldown_s:g}s; "
                    "do not retry now, continue without it",
                    attempts=attempt - 1,
                    key=key,
                    fingerprint=fingerprint,
                )
            try:
                async with asyncio.timeout(tool.timeout_s):
                    value = await tool.fn(validated, call_ctx)
            except Exception as exc:
                error_class, retry_after = classify_error(exc, tool)
                message = scrub_paths(failure_message(name, exc, tool), call_ctx.workspace, self.workspace_root)
            else:
                breaker.record_success()
                if _nesting(value, _MAX_RESULT_DEPTH):  # it ran: only its result cannot be passed on
                    value = {"omitted": f"the result nests more than {_MAX_RESULT_DEPTH} levels deep"}
                outcome = await self._succeeded(tool, value, call_ctx, scope, started, attempt, key, fingerprint)
                if (tool.side_effect == "write" or outcome.file) and (refused := await self._persist(ctx)):
                    await settle_effect(ctx.effects, tool, key, fingerprint, None)  # nothing of it was kept
                    return self._failed(
                        name, started, "permanent", refused, attempts=attempt, key=key, fingerprint=fingerprint
                    )
                await settle_effect(ctx.effects, tool, key, fingerprint, outcome.model_dump(mode="json"))
                return outcome

            if error_class in _UNHEALTHY:
                breaker.record_failure()
            else:
                breaker.record_success()
            wait = self.backoff_s(attempt, retry_after)
            if not retry_safe(tool, error_class) or attempt >= self.max_attempts or wait > self.max_retry_wait_s:
                logger.debug("tool %s failed (%s) after %d attempt(s)", name, error_class, attempt)
                if error_class != "ambiguous_timeout":  # it may have happened: keep the claim, never repeat it
                    await settle_effect(ctx.effects, tool, key, fingerprint, None)
                else:
                    await doubt_effect(ctx.effects, tool, key, fingerprint, doubt_info(ctx, error_class))
                return self._failed(
                    name, started, error_class, message, attempts=attempt, key=key, fingerprint=fingerprint
                )
            await asyncio.sleep(wait)

    async def _persist(self, ctx: ToolContext) -> str | None:
        """Persist the workspace after a call that may have written; why the store refused it, if it did.

        A store that cannot be reached is retried at the end of the turn (the file stays in the working copy).
        """
        try:
            await self.store.persist(ctx.session_key)
        except ToolError as err:
            return scrub_paths(str(err), ctx.workspace, self.workspace_root)
        except OSError as err:
            logger.warning("workspace of a session not persisted after a tool call: %s", err)
        return None

    async def _succeeded(
        self,
        tool: Tool,
        value: Any,
        ctx: ToolContext,
        scope: CallScope,
        started: float,
        attempts: int,
        key: str,
        fingerprint: str,
    ) -> ToolOutcome:
        encoded = canonical_json(value)
        size = len(encoded.encode())
        tier: Tier = "inline"
        variable: str | None = None
        path: str | None = None
        shown = value
        if size > max(self.inline_bytes, tool.max_inline_bytes or 0):
            tier = "card"
            variable = scope.bind(value)
            shown = data_card(value, size_bytes=size)
            if size > self.file_bytes:
                path = f"results/{tool.name}-{key[:12]}.json"
                try:
                    await run_blocking(ctx, save_result, self.workspaces, ctx.workspace, path, encoded)
                except ToolError as err:  # over a quota: the card and the variable still stand
                    shown = {**shown, "not_saved": scrub_paths(str(err), ctx.workspace, self.workspace_root)}
                    path = None
                else:
                    tier = "file"
        return ToolOutcome(
            tool=tool.name,
            ok=True,
            value=shown,
            variable=variable,
            file=path,
            tier=tier,
            duration_ms=(time.perf_counter() - started) * 1000,
            attempts=attempts,
            idempotency_key=key,
            action_sha256=fingerprint,
        )

    @staticmethod
    def _failed(
        name: str,
        started: float,
        error_class: str,
        message: str,
        *,
        attempts: int = 0,
        key: str | None = None,
        fingerprint: str | None = None,
        policy: str | None = None,
    ) -> ToolOutcome:
        return ToolOutcome(
            tool=name,
            ok=False,
            error=message,
            error_class=error_class,
            duration_ms=(time.perf_counter() - started) * 1000,
            attempts=attempts,
            idempotency_key=key,
            action_sha256=fingerprint,
            policy=policy,
        )
