"""④ The agent loop: one turn of one session, from the new message(s) to the final text.

Each step streams the model, folds its events into a decision and acts on it (an answer ends the turn; tool calls go
through the tool gateway; a program runs in CodeAct), with budgets checked before every step. Cancelling
:meth:`Runtime.run_turn` cancels the model stream and any running tool. The runtime never appends to the history
(the queue layer does, after delivery); a gated call ends the turn ``waiting_for_approval`` (``docs/ARCHITECTURE.md``
§6).
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import secrets
import time
from collections import Counter
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from switchboard.core.actions import ShowToolCall, ToolState
from switchboard.core.agent.attachments import AttachmentSupport, TurnInput, turn_input, vision_capable
from switchboard.core.agent.budget import MIN_ANSWER_TOKENS, Budget, BudgetName, PriceTable, StepTokens
from switchboard.core.agent.decider import Reply, StepRetry, decide
from switchboard.core.agent.evidence import ContextEvidence
from switchboard.core.agent.native import HostedFiles, NativeAdapter
from switchboard.core.agent.pending import PendingAction, held_reply, lost_actions, pending_actions
from switchboard.core.agent.programstep import refusal, run_program_call
from switchboard.core.agent.prompt import (
    BUDGET_WORDS,
    RUN_PROGRAM,
    Prompt,
    build_prompt,
    cache_key,
    final_request,
    prompt_version,
    request_tokens,
    run_program_spec,
)
from switchboard.core.agent.slots import SLOT_TOOLS, Slots
from switchboard.core.agent.steering import steered_first, steered_in
from switchboard.core.agent.taskclass import ModelClassifier, class_budgets, step_model
from switchboard.core.agent.toolcards import ended, outcome_card, program_output, started
from switchboard.core.agent.worklog import (
    call_facts,
    holds_untrusted,
    step_detail,
    stopped_reply,
    tool_message,
    untrusted_output,
    work_entries,
)
from switchboard.core.approvals.grants import agent_policy
from switchboard.core.approvals.records import ApprovalRequest
from switchboard.core.approvals.suspend import principal_of
from switchboard.core.approvals.turn import TurnApprovals, reply_sink
from switchboard.core.events import CompactionHeld, Event, StepRecorded, ToolCalled, TurnClassified, UsageMetered
from switchboard.core.inbound import plan_turn, settle_without_model
from switchboard.core.model import (
    ChatMessage,
    Decision,
    FinalAnswer,
    ModelRequest,
    Program,
    ToolCall,
    ToolCalls,
)
from switchboard.core.protocols import conforms
from switchboard.core.providers import ModelFactory, model_name
from switchboard.core.tools.builtin import ToolRegistry
from switchboard.core.tools.definition import Tool, ToolContext
from switchboard.core.tools.effects import EffectStore, TurnEffects
from switchboard.core.tools.gateway import (
    CallScope,
    ToolGateway,
    ToolOutcome,
    action_sha256,
    workspace_for,
)
from switchboard.core.tools.status import StatusSink
from switchboard.core.turn import ActivitySink, HistoryEntry, SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.core.workspaces.store import in_workspace, persist_quietly
from switchboard.errors import BudgetExceededError, ModelError

__all__ = ["Runtime"]

logger = logging.getLogger(__name__)

_SLOT_TOOL_NAMES = frozenset(t.name for t in SLOT_TOOLS)
_SLOT_OF_TOOL = {"update_plan": "plan", "update_context": "context", "update_state": "state"}


def _carries_outside_text(tool: Tool | None, outcome: ToolOutcome) -> bool:
    """Whether the model reads outside text in ``outcome``: a data tool's result, or its failure once it ran.

    An API's error page is the API's text as much as its answer is (a REST tool quotes it in the error).
    """
    return untrusted_output(tool) and (outcome.ok or outcome.attempts > 0)


def input_tokens(request: ModelRequest) -> int:
    """The tokens of a request's input (system, messages, tool specs), as the budget counts them."""
    return request_tokens(request.system, request.messages, request.tools)


class Runtime:
    """The shared agent runtime; the queue layer calls :meth:`run_turn` as its ``TurnRunner``."""

    def __init__(
        self,
        *,
        models: ModelFactory,
        tools: ToolRegistry,
        workspace_root: Path,
        prices: Mapping[str, Mapping[str, float]] | None = None,
        default_model: str = "offline",
        gateway: ToolGateway | None = None,
        history_limit: int = 200,
        model_attempts: int = 4,
        model_backoff_s: float = 0.5,
        repeat_limit: int = 2,
        parallel_reads: int = 4,
        attachments: AttachmentSupport | None = None,
        snapshot_key: bytes | None = None,
    ) -> None:
        """Wire the runtime.

        Args:
            models: Adapters by model spec.
            tools: Every tool agents may name.
            workspace_root: Session workspaces live under it (one directory per session).
            prices: Credits per 1,000 tokens by ``provider:model``.
            default_model: Spec used when an agent names no model.
            gateway: The tool gateway (default: one over ``tools``); its circuit breakers live for the process.
            history_limit: History entries loaded per turn (the context budget then picks the window).
            model_attempts: Tries per model step on retryable provider errors.
            model_backoff_s: Base of the exponential back-off between those tries (full jitter).
            repeat_limit: Failures of the same call (tool + normalised arguments) before it is refused.
            parallel_reads: Read-only calls of one model step run at the same time (1: one after another).
            attachments: Fetching (over the worker's channels), caps and transcription of the files users send.
            snapshot_key: Signs CodeAct programs paused for an approval (``core.suspend.snapshot_key``); every worker
                that may resume them needs the same key (default: a key of this process only).
        """
        self.models = models
        self.registry = tools
        self.workspace_root = workspace_root
        self.prices = PriceTable(prices)
        self.default_model = default_model
        self.gateway = gateway or ToolGateway(tools, workspace_root=workspace_root)
        self.history_limit = history_limit
        self.retry = StepRetry(attempts=max(1, model_attempts), backoff_s=model_backoff_s)
        self.repeat_limit = max(1, repeat_limit)
        self.parallel_reads = max(1, parallel_reads)
        self.attachments = attachments or AttachmentSupport()
        self.snapshot_key = snapshot_key or secrets.token_bytes(32)

    async def run_turn(self, request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        """Run one turn; see the module docstring.

        Raises:
            ModelError: the provider failed for good (auth, bad request, retries used up).
            ConfigError: the agent names an unknown model provider.
        """
        if request.agent.status == "draft":  # never served: no model call, the user is told why
            logger.warning(
                "agent %r is a draft (no %s) and is not served; see `switchboard check`",
                request.agent.name,
                " and no ".join(request.agent.missing()),
            )
            return TurnResult(text=request.agent.draft_notice(), steps=0)
        return await in_workspace(self.gateway.store, request.session_key, _Turn(self, request, sink, store).run)


class _Turn:
    """State of one running turn."""

    def __init__(self, runtime: Runtime, request: TurnRequest, sink: TurnSink, store: SessionStore) -> None:
        self.rt = runtime
        self.request = request
        self.agent = request.agent
        self.sink = sink
        self.store = store
        self.shows: ActivitySink | None = sink if conforms(sink, ActivitySink) else None
        """Where the user sees each tool call as it starts and ends (``None``: nowhere)."""
        self.routing = self.agent.models
        task = self.agent.task_classes.get(request.task_class)
        self.pinned = task.model if task is not None else None
        """The model size the turn's task class runs every step on (``None``: routed per step)."""
        self.spec = self.agent.model or runtime.default_model
        if self.routing is not None:
            self.spec = step_model(self.routing, after_tool_result=False, final=False, pinned=self.pinned)
        self.model = model_name(self.spec)
        hosted = HostedFiles(  # what an OpenAI-hosted shell did
            runtime.gateway, request.session_key, functools.partial(self._untrusted, "the output of the hosted shell")
        )
        searched = functools.partial(self._untrusted, "the results of the hosted web search")
        self.adapter = NativeAdapter(runtime.models.get(self.spec), self.agent, store, hosted, searched)  # native
        self.adapters = {self.spec: self.adapter}
        """One adapter per model spec the turn ran (routing switches between two)."""
        self._new_adapter = functools.partial(
            NativeAdapter, agent=self.agent, store=store, files=hosted, searched=searched
        )
        self.budget = Budget.for_turn(request, runtime.prices)
        policy = request.policy or agent_policy(self.agent)
        actor = request.actor or (principal_of(request.messages[-1]) if request.messages else "")
        self.tools: list[Tool] = [  # a tool the turn's role may never use is not offered at all
            tool
            for tool in runtime.registry.for_agent(self.agent)
            if policy.offers(tool, actor=actor, role=request.role)
        ]
        self.scope = CallScope(allowed=frozenset(t.name for t in self.tools))
        self.failures: Counter[str] = Counter()
        self.refused = 0
        self.stopped_by: BudgetName | None = None
        self.message_id = request.messages[-1].id if request.messages else None
        last_sender = principal_of(request.messages[-1]) if request.messages else ""  # the policy's actor form
        self.ctx = ToolContext(
            session_key=request.session_key,
            tenant=request.tenant,
            run_id=request.run_id,
            actor=request.actor or last_sender,
            workspace=workspace_for(runtime.workspace_root, request.session_key),
            idempotency_key="",
            store=store,
            act=getattr(sink, "act", None),
            record=sink.event,
            status=sink.status if conforms(sink, StatusSink) else None,
            permissions=request.permissions,
            effects=store if conforms(store, EffectStore) else TurnEffects(),
            policy=policy,
            skills=runtime.registry.skills(self.agent),  # resolved once: the catalogue and use_skill agree
            databases=self.agent.databases,
            agent=self.agent.name,
            role=request.role,
        )
        self.output = Reply(reply_sink(sink, store, self.ctx.policy), self.budget.max_output_chars)
        self.approvals = TurnApprovals(self)
        self.facts: dict[str, dict[str, Any]] = {}
        """Gateway facts of each call by call id, kept with its result in the history."""
        self.untrusted_reads = 0
        self.tainted_at: int | None = None
        """Turn messages from this index on were produced with untrusted content in the context."""
        self.slots = Slots()
        self.history: list[HistoryEntry] = []
        self.pending: list[PendingAction] = []
        """Open actions of the conversation (approvals waiting, writes in doubt): the model sees each word for word."""
        self.prompt: Prompt | None = None
        self.messages: list[ChatMessage] = []
        self.opening = 0
        self.shrunk = False
        self.inbound = request.messages  # what the model reads (plan_turn)
        self.input = TurnInput(text=None, attached=None, record=[])  # the user's message with the files they sent
        seen = ContextEvidence(lambda: self.inbound, lambda: self.history, lambda: self.messages[self.opening :])
        self.ctx = dataclasses.replace(self.ctx, evidence=seen)  # what a memory write may cite

    # ---------------------------------------------------------------- the loop

    async def run(self) -> TurnResult:
        by_model = self.agent.task_classifier == "model" and self.request.task_rule in {"", "default"}
        if not by_model:
            await self._classified()
        early = await self.approvals.before_model(plan := plan_turn(self.request.messages))
        await self.approvals.ack_taps()  # every press is answered before the model is asked
        if early is not None:
            return early  # an operator holds the conversation, or only decisions needing no model
        settled = await settle_without_model(plan, self.agent, self.store)
        if settled is not None:  # /reset, /start, /help, deletions: no model call
            return settled
        if by_model:  # only a turn the model will answer pays for classifying it
            await self._classify_by_model()
            await self._classified()
        self.slots = Slots.from_store(await self.store.load_slots())
        self.history = list(await self.store.load_history(self.rt.history_limit))
        self.inbound, vision, spaces = plan.messages, vision_capable(self.spec, self.agent.vision), self.rt.gateway
        self.input = await turn_input(self.inbound, self.rt.attachments, spaces.workspaces, self.ctx.workspace, vision)
        await persist_quietly(spaces.store, self.request.session_key)  # the user's files: any worker sends them
        self.pending = await self._open_actions()
        await self._open()
        self.messages += self.approvals.news  # what became of the actions it asked people about
        assert self.prompt is not None
        if self.input.attached:
            self._untrusted("a file the user sent")
        if holds_untrusted(self.messages) or self.prompt.untrusted or self.slots.tainted:
            self._untrusted("content from earlier in this conversation")  # outside text, or written after it
        loop = asyncio.get_running_loop()
        remaining = self.budget.remaining_s()
        hard = loop.time() + remaining
        soft = hard - min(10.0, max(0.05, 0.15 * remaining))
        answered = False
        timeout = asyncio.timeout_at(soft)
        try:
            async with timeout:
                answered = await self._loop()
        except TimeoutError:
            if not timeout.expired():
                raise
            self.stopped_by = "deadline"
        if not answered:
            await self._final_answer(hard)
        text = self.output.text
        if (held := await self.approvals.hold_reply(text)) is not None:
            text = held  # review mode: the reply waits for a person
        if self.output.cut and self.stopped_by is None:
            self.stopped_by = "output"  # the reply says so too (the cut notice)
        await self._event(
            UsageMetered(
                message_id=self.message_id,
                model=self.spec,
                steps=self.budget.steps,
                tool_calls=self.budget.tool_calls,
                input_tokens=self.budget.input_tokens,
                output_tokens=self.budget.output_tokens,
                credits=round(self.budget.credits, 6),
                stopped_by=self.stopped_by,
                policy_version=self.ctx.policy.version,
                task_class=self.request.task_class,
                cached_input_tokens=self.budget.cached_input_tokens,
                cache_write_tokens=self.budget.cache_write_tokens,
                agent=self.agent.name,
                prompt_version=self.prompt.version if self.prompt is not None else "",
                duration_ms=round((time.time() - self.budget.started) * 1000, 3),
            )
        )
        return TurnResult(
            text=text,
            steps=self.budget.steps,
            input_tokens=self.budget.input_tokens,
            output_tokens=self.budget.output_tokens,
            credits=round(self.budget.credits, 6),
            stopped_by=self.stopped_by,
            history=[*self.input.record, *work_entries(self.messages[self.opening :], self.facts, self.tainted_at)],
            waiting_for=self.approvals.waiting,
        )

    async def _classified(self) -> None:
        """Record the turn's class and the budgets it got (``turn_classified``), when it has one."""
        if self.request.task_class:
            await self._event(
                TurnClassified(
                    message_id=self.message_id,
                    task_class=self.request.task_class,
                    rule=self.request.task_rule,
                    max_steps=self.budget.max_steps,
                    max_tokens=self.budget.max_tokens,
                    max_credits=self.budget.max_credits,
                    deadline_s=round(self.budget.deadline - self.budget.started, 3),
                )
            )

    async def _classify_by_model(self) -> None:
        """Put a turn no rule matched in a class by asking the small model (its cost is the turn's).

        The call gets at most half the turn's remaining time, so a provider that hangs leaves the turn time to answer.
        """
        spec = self.routing.small if self.routing is not None else self.spec
        classifier = ModelClassifier(self.rt.models.get(spec), model_name(spec))
        try:
            async with asyncio.timeout(self.budget.remaining_s() / 2):
                picked = await classifier.classify(self.agent.task_classes, self.inbound)
        except (ModelError, TimeoutError) as err:  # the rules' outcome stands: the turn still runs
            reason = err if isinstance(err, ModelError) else "no answer in time"
            logger.warning("classifying the turn with %s failed (%s): it runs under the rules' class", spec, reason)
            return
        if picked is None:
            return
        task = self.agent.task_classes[picked.name]
        deadline = self.request.deadline
        if task.deadline_s is not None:
            deadline = min(deadline, self.budget.started + task.deadline_s)
        self.request = self.request.model_copy(update={**class_budgets(task, picked), "deadline": deadline})
        self.budget = Budget.for_turn(self.request, self.rt.prices, now=self.budget.started)
        self.budget.charge_model(spec, picked.input_tokens, picked.output_tokens, step=False)
        self.pinned = task.model

    def _untrusted(self, source: str) -> None:
        """Untrusted content entered the context (``source`` says how): risky writes now meet the policy gate."""
        if self.tainted_at is None:  # what the model writes from here on is marked untrusted in the history
            self.tainted_at = len(self.messages) - self.opening
        sources = self.ctx.untrusted_sources
        if source not in sources:
            sources = (*sources, source)
        self.ctx = dataclasses.replace(self.ctx, untrusted_context=True, untrusted_sources=sources)

    async def _open(self, history_cap: int | None = None) -> None:
        specs = self.rt.registry.specs(self.tools)
        if self.agent.codeact:
            specs.append(run_program_spec(self.tools, parallel=self.rt.parallel_reads > 1))
        show_slots = any(t.name in _SLOT_TOOL_NAMES for t in self.tools)
        reads_files = self.ctx.workspace is not None and any(t.name == "sql" for t in self.tools)
        build = functools.partial(
            build_prompt,
            self.agent,
            self.slots,
            self.history,
            self.inbound,
            self.tools,
            specs,
            show_slots=show_slots,
            history_cap=history_cap,
            text=self.input.text,
            attached=self.input.attached,
            skills=self.ctx.skills,
            workspace=self.ctx.workspace,  # the databases' card, when the agent has sql
            pending=self._pending_in_history(),
        )
        # off the loop only when the databases' card reads and counts a workspace file (a thread costs more)
        prompt = await asyncio.to_thread(build) if reads_files else build()
        version = prompt_version(prompt.system, prompt.tools)
        key = cache_key(self.request.tenant, self.agent.name, version) if self.agent.prompt_cache else None
        prompt = dataclasses.replace(prompt, version=version, cache_key=key)
        turn_messages = self.messages[self.opening :]
        self.prompt = prompt
        self.messages = [*prompt.messages, *turn_messages]
        self.opening = len(prompt.messages)

    async def _open_actions(self) -> list[PendingAction]:
        """The conversation's open actions: this turn's news settles what it decided, the store what it closed."""
        found = pending_actions([*self.history, *self.approvals.news])
        store = self.approvals.store
        if store is None:
            return found
        still: list[PendingAction] = []
        for action in found:
            if action.kind == "approval_waiting" and action.approval_id:
                record = await store.approval_get(action.approval_id)
                if record is not None and record.status != "pending":
                    continue  # decided, expired or superseded: no longer waiting (unknown to the store: kept)
            still.append(action)
        return still

    def _pending_in_history(self) -> list[PendingAction]:
        """The open actions the history holds (those of this turn's news follow the opening verbatim)."""
        ids = {str(c.get("id")) for e in self.history for c in e.meta.get("tool_calls") or [] if isinstance(c, dict)}
        return [action for action in self.pending if action.call_id in ids]

    async def _hold(self, lost: list[PendingAction]) -> bool:
        """Stop before the model acts on a context that lost ``lost``: a fact for the operator, a reply for the user."""
        logger.warning("turn stopped for review: %d pending action(s) would be compacted away", len(lost))
        await self._event(
            CompactionHeld(
                message_id=self.message_id,
                actions=[action.fact() for action in lost],
                max_input_tokens=self.agent.limits.max_input_tokens,
                reason="not kept word for word, review before the agent goes on: "
                + ", ".join(f"{a.tool} ({a.kind})" for a in lost),
            )
        )
        self.stopped_by = "compaction"
        await self.output.write(held_reply(lost), self.budget.steps)
        return True

    async def _loop(self) -> bool:
        """Step until an answer (``True``) or a budget (``False``, with ``stopped_by`` set)."""
        while True:
            self.messages += await steered_in(self.sink)  # the steer busy policy: what the user sent meanwhile
            reason = self.budget.exhausted()
            if reason is not None:
                self.stopped_by = reason
                return False
            self._route(final=False)
            request = self._fitted_request()
            if request is None:
                self.stopped_by = "context"
                return False
            if lost := lost_actions(self.pending, request.messages):
                return await self._hold(lost)  # never a model step over a summary of an open action
            if not self.budget.can_afford_step(self.spec, input_tokens(request), request.max_output_tokens):
                self.stopped_by = "credits"  # its worst case would pass the cap: a cap is a cap
                return False
            started = time.perf_counter()
            try:
                decision, usage = await self._step(request, self.budget.steps + 1)
            except ModelError as err:
                if err.code != "context_length" or self.shrunk:
                    raise
                logger.info("context too long for %s; compacting the history and retrying once", self.spec)
                self.shrunk = True
                assert self.prompt is not None
                await self._open(history_cap=self.prompt.history_tokens // 2)
                continue
            cost = self.budget.charge_model(self.spec, *usage)
            await self._step_event(decision, usage, cost, started)
            if isinstance(decision, FinalAnswer):
                if not self.output.text.strip():
                    await self.output.write("(no answer)", self.budget.steps)
                return True
            calls = decision.calls if isinstance(decision, ToolCalls) else [self._program_call(decision)]
            self.messages.append(ChatMessage(role="assistant", content=decision.text, tool_calls=calls))
            stop = await self._run_calls(calls)
            if self.approvals.waiting:
                return True  # waiting_for_approval: the turn ends here, its worker slot free
            if stop is not None:
                self.stopped_by = stop
                return False

    def _route(self, *, final: bool) -> None:
        """Pick the model of the next step under the agent's routing (small first, strong after a tool result)."""
        if self.routing is None:
            return
        after = bool(self.messages) and self.messages[-1].role == "tool"
        spec = step_model(self.routing, after_tool_result=after, final=final, pinned=self.pinned)
        if spec == self.spec:
            return
        self.spec, self.model = spec, model_name(spec)
        adapter = self.adapters.get(spec)
        if adapter is None:
            adapter = self.adapters[spec] = self._new_adapter(self.rt.models.get(spec))
        self.adapter = adapter

    def _fitted_request(self) -> ModelRequest | None:
        """The next request, with the oldest history dropped if it no longer fits the context budget."""
        assert self.prompt is not None
        limit = self.agent.limits.max_input_tokens
        pinned = self.prompt.pinned
        while self.adapter.tokens(self.prompt.system, self.messages, self.prompt.tools) > limit:
            if self.opening <= pinned:
                return None
            del self.messages[0]
            self.opening -= 1
            while self.opening > pinned and self.messages[0].role != "user":
                del self.messages[0]
                self.opening -= 1
        return self.prompt.request(self.model, self.messages, max_output_tokens=self.agent.limits.max_output_tokens)

    async def _step(self, request: ModelRequest, step: int) -> tuple[Decision, StepTokens]:
        return await decide(
            self.adapter, request, self.output, step, retry=self.rt.retry, remaining_s=self.budget.remaining_s
        )

    def _program_call(self, decision: Program) -> ToolCall:
        return ToolCall(id=decision.call_id, name=RUN_PROGRAM, arguments={"code": decision.code})

    # ---------------------------------------------------------------- tools

    async def _run_calls(self, calls: list[ToolCall]) -> BudgetName | None:
        """Run one step's calls: consecutive reads together (bounded), anything else alone; results in order asked.

        A write, a program, an unknown tool or a repeat of a call already in the batch is a barrier: the reads before
        it finish first. Budgets and the repeat guard are checked for a whole batch before it starts.
        """
        stop: BudgetName | None = None
        batch: list[ToolCall] = []
        for call in calls:
            if batch and not self._joins(batch, call):
                stop = await self._run_batch(batch, stop)
                batch = []
            if self.rt.parallel_reads > 1 and self._joins(batch, call):
                batch.append(call)
            else:
                stop = await self._run_one(call, stop)
        if batch:
            stop = await self._run_batch(batch, stop)
        return stop

    def _joins(self, batch: list[ToolCall], call: ToolCall) -> bool:
        """Whether ``call`` may run alongside ``batch``: a plain read, not the same action as one already in it."""
        if call.name == RUN_PROGRAM:
            return False
        tool = self.rt.registry.get(call.name, agent=self.agent.name)
        if tool is None or tool.side_effect != "read":
            return False
        fingerprint = action_sha256(call.name, call.arguments)
        return all(action_sha256(other.name, other.arguments) != fingerprint for other in batch)

    def _admit(
        self, call: ToolCall, stop: BudgetName | None, pending_calls: int = 0, pending_credits: int = 0
    ) -> tuple[str | None, BudgetName | None]:
        """The refusal the model reads instead of running ``call`` (``None``: run it), and the turn's stop after it.

        ``pending_calls``/``pending_credits``: what the calls admitted before it in the same batch will charge.
        """
        if self.approvals.waiting:
            return refusal(call.name, "not run: waiting for approval", error_class="waiting"), stop
        if stop is not None:
            return refusal(call.name, f"not run: the {BUDGET_WORDS[stop]} budget ran out"), stop
        tool = self.rt.registry.get(call.name, agent=self.agent.name)
        cost = tool.cost if tool is not None else 0
        if not self.budget.can_afford_tool(cost, pending_calls=pending_calls, pending_credits=pending_credits):
            stop = "tool_calls" if self.budget.tool_calls_left - pending_calls <= 0 else "credits"
            return refusal(call.name, f"not run: the {BUDGET_WORDS[stop]} budget ran out"), stop
        fingerprint = action_sha256(call.name, call.arguments)
        if self.failures[fingerprint] >= self.rt.repeat_limit:
            self.refused += 1
            message = (
                f"this exact call failed {self.failures[fingerprint]} times and was not run again: "
                "change the arguments, try another way, or answer with what you have"
            )
            self.budget.charge_tool(0)
            if self.refused >= self.rt.repeat_limit:
                stop = "repeat_guard"
            return refusal(call.name, message, error_class="repeated"), stop
        return None, stop

    async def _run_one(self, call: ToolCall, stop: BudgetName | None) -> BudgetName | None:
        refused, stop = self._admit(call, stop)
        if refused is not None:
            self._tool_message(call, refused)
            return stop
        fingerprint = action_sha256(call.name, call.arguments)
        reads = self.untrusted_reads
        card = started(call, self.message_id)
        await self._show(card)
        try:
            if call.name == RUN_PROGRAM and self.agent.codeact:
                waiting = len(self.approvals.waiting)
                content, ok = await self._program(call)
                paused = len(self.approvals.waiting) > waiting
                state: ToolState = "waiting_approval" if paused else "ok" if ok else "failed"
                card = ended(card, state, program_output(content))
            else:
                outcome = await self.call_tool(call.name, call.arguments, call.id)
                content, ok = outcome.for_model(codeact=self.agent.codeact), outcome.ok
                tool = self.rt.registry.get(call.name, agent=self.agent.name)
                card = outcome_card(card, outcome, writes=tool is not None and tool.side_effect == "write")
                if outcome.approval is not None:  # nothing ran: a person decides
                    content, ok = await self.approvals.suspend(call.id, outcome.approval, None), True
        except BudgetExceededError as err:
            stop = err.budget if err.budget in BUDGET_WORDS else "tool_calls"  # type: ignore[assignment]
            content, ok = refusal(call.name, str(err)), False
            card = ended(card, "refused", str(err))
        await self._show(card)
        if not ok:
            self.failures[fingerprint] += 1
        self.messages.append(tool_message(call, content, untrusted=self.untrusted_reads > reads))
        return stop

    async def _run_batch(self, batch: list[ToolCall], stop: BudgetName | None) -> BudgetName | None:
        """Run a batch of reads at most ``parallel_reads`` at a time; append their results in the order asked."""
        if len(batch) == 1:
            return await self._run_one(batch[0], stop)
        refusals: dict[str, str] = {}
        admitted: list[ToolCall] = []
        reserved = 0
        for call in batch:  # in order, before anything runs: the same calls are admitted on every run
            refused, stop = self._admit(call, stop, len(admitted), reserved)
            if refused is not None:
                refusals[call.id] = refused
                continue
            admitted.append(call)
            tool = self.rt.registry.get(call.name, agent=self.agent.name)
            reserved += tool.cost if tool is not None else 0
        bound = asyncio.Semaphore(self.rt.parallel_reads)

        async def read(call: ToolCall) -> ToolOutcome:
            async with bound:
                card = started(call, self.message_id)
                await self._show(card)
                outcome = await self.call_tool(call.name, call.arguments, call.id)
                await self._show(outcome_card(card, outcome, writes=False))
                return outcome

        async with asyncio.TaskGroup() as group:
            running = {call.id: group.create_task(read(call)) for call in admitted}
        for call in batch:
            if call.id in refusals:
                self._tool_message(call, refusals[call.id])
                continue
            outcome = running[call.id].result()
            content, ok = outcome.for_model(codeact=self.agent.codeact), outcome.ok
            if outcome.approval is not None and self.approvals.waiting:  # one question per turn, as when sequential
                self._tool_message(call, refusal(call.name, "not run: waiting for approval", error_class="waiting"))
                continue
            if outcome.approval is not None:  # this read did not run: a person decides (its siblings did run)
                content, ok = await self.approvals.suspend(call.id, outcome.approval, None), True
            if not ok:
                self.failures[action_sha256(call.name, call.arguments)] += 1
            tool = self.rt.registry.get(call.name, agent=self.agent.name)
            self.messages.append(tool_message(call, content, untrusted=_carries_outside_text(tool, outcome)))
        return stop

    async def _show(self, card: ShowToolCall) -> None:
        if self.shows is not None:
            await self.shows.activity(card)

    def _tool_message(self, call: ToolCall, content: str) -> None:
        self.messages.append(ChatMessage(role="tool", content=content, tool_call_id=call.id, name=call.name))

    async def call_tool(
        self, name: str, args: dict[str, Any], call_id: str | None, *, approved: ApprovalRequest | None = None
    ) -> ToolOutcome:
        """One call through the gateway (``approved``: as a person approved it), metered, recorded, slots current."""
        tool = self.rt.registry.get(name, agent=self.agent.name)
        outcome = await self.rt.gateway.call(name, args, self.ctx, scope=self.scope, approved=approved)
        self.budget.charge_tool(tool.cost if tool is not None and outcome.attempts > 0 else 0)
        if _carries_outside_text(tool, outcome):
            self.untrusted_reads += 1
            self._untrusted(f"the output of {name}")
        if call_id is not None:
            self.facts[call_id] = call_facts(tool, outcome)
        if outcome.ok and name in _SLOT_OF_TOOL and isinstance(outcome.value, dict):
            value = outcome.value.get("value")
            self.slots = self.slots.with_value(_SLOT_OF_TOOL[name], value, untrusted=self.ctx.untrusted_context)
        await self._event(
            ToolCalled(
                message_id=self.message_id,
                tool=name,
                ok=outcome.ok,
                duration_ms=round(outcome.duration_ms, 3),
                call_id=call_id,
                side_effect=tool.side_effect if tool is not None else "read",
                error_class=outcome.error_class,
                idempotency_key=outcome.idempotency_key,
                action_sha256=outcome.action_sha256,
                variable=outcome.variable,
                file=outcome.file,
                policy=outcome.policy,
                attempts=outcome.attempts,
            )
        )
        return outcome

    async def _program(self, call: ToolCall) -> tuple[str, bool]:
        """Run a CodeAct program; its tool calls go through the gateway like any other (a gated one pauses it)."""
        step = await run_program_call(
            call,
            budget=self.budget,
            tools=self.tools,
            tool_of=self.rt.registry.get,
            scope=self.scope,
            slots=self.slots.as_inputs(),
            inline_bytes=self.rt.gateway.inline_bytes,
            call_tool=self.call_tool,
            event=self._event,
            message_id=self.message_id,
            parallel_reads=self.rt.parallel_reads,
        )
        return await self.approvals.program_step(call.id, step)

    # ---------------------------------------------------------------- the end

    async def _step_event(
        self, decision: Decision, usage: StepTokens, cost: float, started: float, final: str | None = None
    ) -> None:
        trace_id = self.request.trace_id if self.budget.steps == 1 else None
        detail = step_detail(self.spec, decision, usage, cost, time.perf_counter() - started, final, trace_id)
        await self._event(
            StepRecorded(message_id=self.message_id, step=self.budget.steps, decision=decision.kind, detail=detail)
        )

    # ---------------------------------------------------------------- the last step
    # When the budget ran out: one call without tools, so the user always gets an answer. When even that cannot
    # run (no credits left for a short answer, the deadline passed, the provider failed), the answer is a fixed text
    # saying which budget ran out, what was done and what was not.

    async def _final_answer(self, hard: float) -> None:
        """One last call without tools, so the user always gets an answer; a fixed text if even that fails."""
        assert self.prompt is not None
        reason = self.stopped_by or "steps"
        self._route(final=True)
        request = final_request(
            self.prompt,
            self.model,
            *steered_first(self.messages, self.opening),
            reason=reason,
            summary=self.budget.summary(),
            max_output_tokens=self.agent.limits.max_output_tokens,
            budget_tokens=self.agent.limits.max_input_tokens,
        )
        step = self.budget.steps + 1
        affordable = self.budget.affordable_output_tokens(self.spec, input_tokens(request), request.max_output_tokens)
        if affordable < MIN_ANSWER_TOKENS:  # not even a short answer fits the credits left: the fixed reply
            logger.info("no credits left for the final answer of a turn; sending a fixed reply")
            if not self.output.text.strip():
                await self.output.write(self._fallback(reason), step)
            return
        request = request.model_copy(update={"max_output_tokens": affordable})
        started = time.perf_counter()
        timeout = asyncio.timeout_at(hard)
        try:
            async with timeout:
                decision, usage = await self._step(request, step)
        except TimeoutError:
            if not timeout.expired():
                raise
            logger.info("the final answer of a turn ran past the deadline; sending a fixed reply")
        except ModelError as err:
            logger.warning("the final answer of a turn failed (%s); sending a fixed reply", err.code or "error")
        else:
            cost = self.budget.charge_model(self.spec, *usage)
            await self._step_event(decision, usage, cost, started, final=reason)
        if not self.output.text.strip():
            await self.output.write(self._fallback(reason), step)

    def _fallback(self, reason: str) -> str:
        return stopped_reply(BUDGET_WORDS.get(reason, reason), self.messages[self.opening :], self.budget.tool_calls)

    async def _event(self, event: Event) -> None:
        await self.sink.event(event)
