"""③ → ④ → ⑤ Drain one session: take its lease, run its inbox head by head, send through the outbox, release.

Each step that touches the session is one fenced Lua script (``begin``, ``complete``, ``lease_yield``), so a crash
anywhere leaves nothing half-done and a drain whose lease passed to another epoch stops at once, without releasing.
Failures are retried in the same drain up to ``max_attempts``, then dead-lettered; the loop is described step by step
in ``docs/ARCHITECTURE.md`` §5.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import assert_never

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from switchboard.channels.base import Receipt, SendContext
from switchboard.core.actions import (
    AckChoice,
    Action,
    SendText,
    SendTyping,
    SetStatus,
    SettleChoices,
    ShowToolCall,
    StreamText,
)
from switchboard.core.agent.config import Agent
from switchboard.core.events import Event, StepRecorded, UsageMetered
from switchboard.core.groups import CONTEXT_META
from switchboard.core.messages import ConversationRef, InboundMessage
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.core.workspaces.store import WorkspaceStore
from switchboard.errors import DeliveryError, FencedWriteError, RunCancelledError
from switchboard.outbound.deliver import ClassifiedDeliverer, Deliverer
from switchboard.outbound.outbox import Ephemeral, Outbox, idempotency_key
from switchboard.outbound.ratelimits import SendBuckets
from switchboard.outbound.sending import REPLY, Undelivered
from switchboard.outbound.streaming import ReplyStream
from switchboard.outbound.toolstatus import StatusBoard, resume, settle
from switchboard.queue.cancellation import is_stop
from switchboard.queue.eventlog import EventLog
from switchboard.queue.groups import take as take_context
from switchboard.queue.handoffs import Handoffs, TurnHandoff
from switchboard.queue.jobs import DrainJobs, StartedJob
from switchboard.queue.keys import SessionKeys
from switchboard.queue.lease import CURRENT_LEASE, Lease, LeaseToken
from switchboard.queue.ledger import Attempt, AttemptStore, Ledger, Start, Taken, encode_facts
from switchboard.queue.offers import check_choices, record_offer
from switchboard.queue.segments import SegmentLabels, TurnTally
from switchboard.settings import FileConfig, QueueSettings
from switchboard.types import SessionKey
from switchboard.worker.authority import turn_request
from switchboard.worker.budgets import USAGE_COMMAND, Ticket, TurnGate, command_of, usage_without_budgets
from switchboard.worker.busy import answered_part
from switchboard.worker.commands import CommandDesk, model_override
from switchboard.worker.drainturn import DrainOutcome, DrainTurn
from switchboard.worker.endings import TurnEndings, end_interrupted
from switchboard.worker.sampling import Sampler
from switchboard.worker.voice import (
    VOICE_COMMAND,
    VOICE_SLOT,
    VoiceReplies,
    command_argument,
    outcome,
    slots_toggle,
    toggle_of,
    toggle_text,
)

__all__ = ["Drainer", "TurnRunner"]

logger = logging.getLogger(__name__)

TurnRunner = Callable[[TurnRequest, TurnSink, SessionStore], Awaitable[TurnResult]]
"""Plays one turn (the agent runtime, or a test's simple function)."""

TYPING_DELAY_S = 0.75
"""A run still going this long after it started shows a typing indicator (most replies are ready sooner)."""
RUNNER_GRACE_S = 30.0
"""How long past its deadline a turn may run before the drain counts it as failed."""


class _Sink:
    """The turn's view of its drain: deltas to streaming channels, tool status messages, facts to the fenced event log.

    The answering ``step`` event and the closing ``usage_metered`` are held back to ride on the drain's next
    fenced step (the reply's outbox claim); any other write for the turn writes them first, so order holds.
    """

    status: StatusBoard | None = None
    """The turn's tool status messages (``None`` without a conversation to show them in)."""

    def __init__(self, drainer: Drainer, turn: DrainTurn, events: EventLog) -> None:
        self._drainer = drainer
        self._turn = turn
        self._events = events
        self.held: list[Event] = []
        self.charge: Callable[[UsageMetered], Awaitable[list[Event]]] | None = None
        """Charges the turn's metered credits to its period budgets (set when budgets apply to the turn)."""
        self.tally = TurnTally(tenant="")
        """The turn's segmented metrics (:mod:`switchboard.queue.segments`), written with its closing facts."""
        stream = turn.stream
        self.status: StatusBoard | None = None
        # A channel that shows tool calls as live cards (the web chat) has its progress indicator there: no notices.
        if stream is not None and not stream.caps.tool_activity:
            self.status = StatusBoard.beside(stream, drainer._perform_for(turn))

    def take(self) -> list[Event]:
        """The held events, to write with the drain's next step (the caller writes them)."""
        held, self.held = self.held, []
        return held

    def facts(self) -> str:
        """The held events and the turn's segmented metrics, encoded to ride on the reply's claim."""
        return encode_facts(self.take(), self.tally.increments(self._drainer.labels))

    async def flush(self) -> None:
        """Write the held events now (one fenced step), with the turn's segmented metrics once it was metered."""
        if self.held:
            await self._turn.ledger.facts(self.take(), self.tally.increments(self._drainer.labels))

    async def delta(self, text: str) -> None:
        turn = self._turn
        if turn.lost.is_set():
            raise _lost(turn.lease)
        if turn.stream is not None:
            turn.deltas += 1
            await turn.stream.delta(text)

    async def steered(self) -> list[InboundMessage]:
        """Under ``steer``, the messages accepted for the session since the turn last asked (read from Redis)."""
        if self._turn.lost.is_set():
            raise _lost(self._turn.lease)
        return await self._turn.busy.take_steered(self._turn.ledger)

    async def activity(self, action: ShowToolCall | SettleChoices) -> None:
        """A tool call's card or a decided offer: best effort like a status, only where the channel shows them.

        A channel whose capabilities do not declare ``tool_activity`` is sent nothing (no Redis command either).
        Pieces of the reply written before a call go out first, so the call's card and what it sends follow them.
        """
        turn = self._turn
        if turn.lost.is_set():
            raise _lost(turn.lease)
        stream = turn.stream
        if stream is None or not stream.caps.tool_activity:
            return
        await stream.flush()
        logical = f"tool:{action.call_id}:{action.state}" if isinstance(action, ShowToolCall) else "settled"
        await self._drainer._notify(turn, action.model_copy(update={"reply_to": turn.reply_to}), logical)

    async def act(self, action: Action) -> None:
        """A channel action a tool asked for (send a file, offer a choice): through the outbox, once.

        A tap's acknowledgement is sent at once instead, best effort and unpaced: the platform refuses a second
        one (a re-run's) and forgets the tap soon, so it is not worth a durable send.
        """
        turn = self._turn
        if turn.lost.is_set():
            raise _lost(turn.lease)
        if isinstance(action, AckChoice):
            await self._drainer._notify(turn, action, f"ack:{action.ack_ref}")
            return
        if turn.conversation is None or turn.outbox is None:
            return
        turn.acts += 1
        await self.flush()
        if turn.stream is not None:
            await turn.stream.flush()  # the reply's pieces written before the call go out before what it sends
        if action.reply_to is None:  # it belongs to this turn's reply (the web chat shows it in its place there)
            action = action.model_copy(update={"reply_to": turn.reply_to})
        await turn.outbox.send(action, turn.conversation, run_id=turn.run_id, logical=f"act:{turn.acts}")
        await record_offer(self._drainer.redis, turn.lease, action, idempotency_key(turn.run_id, f"act:{turn.acts}"))

    async def event(self, event: Event) -> None:
        if self._turn.lost.is_set():
            raise _lost(self._turn.lease)
        self.tally.see(event)
        if isinstance(event, UsageMetered) or (isinstance(event, StepRecorded) and event.decision == "answer"):
            self.held.append(event)  # the turn is about to end: written with the reply's claim
            if isinstance(event, UsageMetered) and self.charge is not None:
                self.held.extend(await self.charge(event))  # the alerts it crossed ride along
            return
        await self.flush()
        await self._events.append(event)


STOPPED_TEXT = "Stopped."
NOTHING_RUNNING_TEXT = "Nothing was running, so there was nothing to stop."


def _swallow(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        logger.debug("typing refresh failed: %s", type(task.exception()).__name__)


def _lost(lease: LeaseToken) -> FencedWriteError:
    return FencedWriteError("the session lease was lost", session_key=lease.session, epoch=lease.epoch)


class Drainer(TurnEndings):
    """Drains sessions for one worker: one lease, one turn at a time per session, many sessions at once."""

    def __init__(
        self,
        redis: aioredis.Redis,
        settings: QueueSettings,
        *,
        runner: TurnRunner,
        deliverer: Deliverer,
        agent_for: Callable[[InboundMessage], Agent],
        worker_id: str,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        workspace_root: Path | None = None,
        workspace_store: WorkspaceStore | None = None,
        config: FileConfig | None = None,
        voice: VoiceReplies | None = None,
        sampler: Sampler | None = None,
    ) -> None:
        self.redis = redis
        self.sampler = sampler
        """Production sampling for review (``None`` when no rate is set: a finished run then does nothing more)."""
        self.config = config
        """The YAML file: each turn's principal gets its permissions and policy from it (``queue/authority.py``)."""
        self.voice = voice
        """Voice replies (``None`` when no agent has them: a turn then asks nothing more)."""
        self.workspace_root = workspace_root
        """Where session workspaces live: channels read the files they send from there."""
        self.workspace_store = workspace_store
        """Where workspaces are kept, when not only under ``workspace_root`` (files sent are read from it)."""
        self.buckets = SendBuckets(redis, sleep=sleep)
        """The outbound rate limits, shared by every worker (:mod:`switchboard.outbound.ratelimits`)."""
        self.settings = settings
        self.runner = runner
        self.deliverer = ClassifiedDeliverer(deliverer)
        """Every send goes through it: a channel's send fails only with ``DeliveryError`` (handled by each caller)."""
        self.agent_for = agent_for
        self.worker_id = worker_id
        self.lease = Lease(redis, worker_id=worker_id, lease_ms=settings.lease_ms)
        self.stopping = asyncio.Event()
        """Set by the worker on shutdown: drains hand their session over after the current turn."""
        self._sleep = sleep
        self._active: dict[SessionKey, DrainTurn] = {}
        self.jobs = DrainJobs()
        self.slots_full: Callable[[], bool] = lambda: False
        """Set by the worker: whether it has no free slot (only then can yielding one help a waiting session)."""
        self.waiting_elsewhere: Callable[[SessionKey], bool] = lambda session: False
        """Set by the worker: whether drains of its shards other than the session's wait (a yield then helps them
        even when the session's own shard queue is empty)."""
        self.gate = TurnGate.build(redis, config)
        """Budgets and linked identities (``None`` when neither is configured: a turn then asks Redis nothing more)."""
        self.handoffs = Handoffs.build(redis, config, history_maxlen=settings.history_maxlen)
        """Conversations handed between agents (``None`` when no agent may hand over)."""
        self.desk = CommandDesk(redis, config, self.handoffs)
        """Answers ``/status``, ``/model``, ``/whoami``, ``/help`` and refuses commands a role may not use."""
        self.labels = SegmentLabels.of(config)
        """The label values the segmented metrics may use (names from the configuration and code, capped)."""

    def cancel(self, session: SessionKey, reason: str) -> bool:
        """Stop the turn running for ``session`` in this worker, if any (the model request and tools with it)."""
        turn = self._active.get(session)
        if turn is None or turn.outbox is None:
            return False
        if turn.busy.interrupt(reason) is False:
            return False  # an interrupt this turn does not take (it holds that message, or was restarted enough)
        turn.stop_reason = reason
        turn.stop.set()
        return True

    async def drain(self, session: SessionKey) -> None:
        """Drain ``session`` until its inbox is empty (or another worker holds or takes it)."""
        await self.drain_session(session)

    async def drain_session(self, session: SessionKey, job: StartedJob | None = None) -> DrainOutcome:
        """Like :meth:`drain`, telling the caller how the drain ended.

        With ``job``, a drain that ends ``RELEASED`` has closed that drain job too (in its releasing step).
        """
        if self.stopping.is_set():
            return DrainOutcome.HANDED_OVER
        taken = await Ledger.take(
            self.redis,
            session,
            self.settings,
            worker_id=self.worker_id,
            job=job,
            jobs=self.jobs,
            read_history=self.settings.history_maxlen,
        )
        match taken:
            case Start.BUSY:
                return DrainOutcome.BUSY
            case Start.EMPTY:
                return DrainOutcome.RELEASED
            case Taken():
                pass
            case _:
                assert_never(taken)
        lease = taken.ledger.lease
        turn = DrainTurn(lease, asyncio.Event(), taken.ledger)
        keeper = asyncio.create_task(self.lease.keep_alive(lease, turn.lost))
        context = CURRENT_LEASE.set(lease)
        self._active[session] = turn
        fair_turns, fair_slice_s = self.settings.fair_turns, self.settings.fair_slice_s
        turns, held_since = 0, time.monotonic()

        def share_used(count: int) -> bool:  # fairness: this many turns (or this long) is the session's share
            return bool(fair_turns and count >= fair_turns) or bool(
                fair_slice_s and time.monotonic() - held_since >= fair_slice_s
            )

        attempt: Attempt | None = taken.attempt
        begun: Attempt | None = None  # begun for the next turn, not handed to it yet (returned if the drain stops)
        try:
            while attempt is not None:
                begun = None
                stopped_at = turn.stopped_at
                # a turn that ends the session's share gives the slot up in its own completion
                turn.yield_after = share_used(turns + 1) and self.slots_full()
                turn.yield_elsewhere = turn.yield_after and self.waiting_elsewhere(session)
                if await self._handle(turn, attempt) is DrainOutcome.DEFERRED:
                    return DrainOutcome.DEFERRED
                if turn.ledger.released:  # the turn's completion left the inbox empty and ended the drain
                    return DrainOutcome.RELEASED
                if turn.ledger.yielded:  # ... or gave the slot up to the sessions waiting
                    return DrainOutcome.YIELDED
                # a turn stopped on request is answered by the /stop behind it, in this drain (it knows what ran)
                turns = 0 if turn.stopped_at != stopped_at else turns + 1
                attempt = begun = turn.ledger.next_attempt  # begun by the completion
                turn.ledger.next_attempt = None
                if turn.lost.is_set():
                    raise _lost(lease)
                if self.stopping.is_set():
                    await self.lease.abandon(lease, return_attempt_of=begun.ids[0] if begun else None)
                    return DrainOutcome.HANDED_OVER
                if attempt is None:
                    if (
                        turns
                        and share_used(turns)
                        and self.slots_full()
                        and await self.jobs.yield_slot(
                            self.redis, lease, job, elsewhere=self.waiting_elsewhere(session)
                        )
                    ):
                        return DrainOutcome.YIELDED
                    attempt = await turn.ledger.begin(read_history=self.settings.history_maxlen)
            return DrainOutcome.RELEASED  # the inbox was empty: released in the same step
        except FencedWriteError:
            logger.warning("drain of %s stopped: epoch %d lost the lease", session, lease.epoch)
            return DrainOutcome.FENCED
        except asyncio.CancelledError:
            # between turns (a turn in flight already gave the lease up and returned its attempt)
            with contextlib.suppress(Exception):
                await asyncio.shield(self.lease.abandon(lease, return_attempt_of=begun.ids[0] if begun else None))
            raise
        finally:
            self._active.pop(session, None)
            keeper.cancel()
            CURRENT_LEASE.reset(context)

    # -- steps ---------------------------------------------------------------------------------------------

    async def _handle(self, turn: DrainTurn, attempt: Attempt) -> DrainOutcome | None:
        lease = turn.lease
        turn.busy.start(attempt)
        turn.stop.clear()  # from here on a stop or an interrupt is this turn's
        pairs = zip(attempt.ids, attempt.bodies, strict=True)
        read = [(i, InboundMessage.model_validate_json(body)) for i, body in pairs if body]
        messages = [message for _, message in read]
        if any(CONTEXT_META in message.meta for message in messages):  # a group that keeps unanswered messages
            messages = await take_context(self.redis, lease, read)
        messages = await check_choices(self.redis, lease.session, messages)  # clicks read as offered or not
        turn.run_id = f"run-{attempt.ids[0]}"
        outbox = Outbox(
            self.redis,
            lease,
            self._perform_for(turn),
            sleep=self._sleep,
            events_maxlen=self.settings.events_maxlen,
            max_wait_s=self.settings.max_defer_s,
            buckets=self.buckets,
            capabilities=self.deliverer.capabilities,
            workspace_root=self.workspace_root,
            workspace_store=self.workspace_store,
            ack_replicas=self.settings.ack_replicas,
            ack_timeout_ms=self.settings.ack_timeout_ms,
        )
        turn.outbox = outbox
        turn.stream = None
        if not messages:
            reason = "message record missing"
            await self._dead_letter(turn, attempt, messages, outbox, reason, attempt.attempt - 1, "internal")
            return None
        turn.conversation = messages[-1].conversation
        turn.reply_to = messages[-1].id
        turn.stream = ReplyStream(
            self.deliverer.capabilities(turn.conversation),
            turn.conversation,
            outbox=outbox,
            perform=self._perform_for(turn),
            notify=lambda action, logical: self._notify(turn, action, logical),
            buckets=self.buckets,
            run_id=turn.run_id,
            reply_to=turn.reply_to,
            start_after_s=self.settings.stream_after_s,
            delta_every_s=self.settings.delta_every_s,
        )
        if attempt.dead:
            reason = attempt.last_error or "the worker running it was lost"
            await self._dead_letter(turn, attempt, messages, outbox, reason, attempt.attempt - 1, "internal")
            return None
        if attempt.last_error and await self._still_deferred(turn, attempt):
            return DrainOutcome.DEFERRED
        if attempt.attempt > 1:  # an earlier attempt may have produced the reply: then only its send is left
            pending = await outbox.pending(turn.run_id, REPLY)
            await resume(turn.stream, self._perform_for(turn))  # its preview is edited, its status messages ended
            if pending is not None and isinstance(pending.action, SendText | StreamText):
                attempt, messages = answered_part(attempt, messages, pending.action.reply_to)
                await self._resume(turn, attempt, messages, outbox, pending)
                return None
        started = time.time()
        try:
            result, sent = await self._play(turn, attempt, messages, outbox)
        except FencedWriteError:
            raise
        except RunCancelledError as stopped:
            if turn.busy.interrupted:  # a newer message: nothing acked, the next turn restarts with it
                await end_interrupted(turn, attempt, outbox, stopped.reason)
                return None
            await self._stopped(turn, attempt, messages, outbox, started, stopped.reason)
            return None
        except (asyncio.CancelledError, RedisConnectionError, RedisTimeoutError) as err:
            if not isinstance(err, asyncio.CancelledError) and attempt.attempt < self.settings.max_attempts:
                return await self._failed(turn, attempt, messages, outbox, err)  # retried here, as any failure
            # unfinished by no fault of the message (a shutdown; the queue's own store gone at its last attempt, which
            # the reaper repairs): the attempt is handed back, unless a reply was claimed (the next resumes that send)
            returned = None if idempotency_key(turn.run_id, REPLY) in outbox.used else attempt.ids[0]
            with contextlib.suppress(Exception):
                await asyncio.shield(self.lease.abandon(lease, return_attempt_of=returned))
            raise
        except Exception as err:
            return await self._failed(turn, attempt, messages, outbox, err)
        finally:
            for pending_task in turn.typing:
                pending_task.cancel()
            turn.typing.clear()
        attempt, messages = turn.busy.answered(attempt, messages)  # steered messages are acked with the turn
        await self._finish(
            turn, attempt, messages, outbox, text=result.text, sent=sent, started=started, work=result.history
        )
        if self.sampler is not None and result.steps:  # a model run (a command answered here asks no model)
            await self.sampler.finished(
                lease.session, turn.run_id, steps=result.steps, work=result.history, answered=bool(result.text.strip())
            )
        return None

    async def _play(
        self, turn: DrainTurn, attempt: Attempt, messages: Sequence[InboundMessage], outbox: Outbox
    ) -> tuple[TurnResult, Receipt | Undelivered | None]:
        if turn.stream is not None and turn.stream.caps.statuses:
            await self._notify(turn, SetStatus(status="running", reply_to=turn.reply_to), "status:running")
        self._schedule_typing(turn)
        agent = self.agent_for(messages[0])
        if agent.models_allowed:  # the model /model chose for this conversation
            agent = await model_override(self.redis, turn.lease.session, agent)
        conversation = messages[-1].conversation
        request = turn_request(self.config, turn.lease.session, agent, messages, turn.run_id)
        events = EventLog(self.redis, turn.lease, maxlen=self.settings.events_maxlen)
        store = AttemptStore(self.redis, turn.lease, self.settings, attempt)
        if self.handoffs is not None:
            store.handoff = TurnHandoff(self.handoffs, conversation, messages)
        sink = _Sink(self, turn, events)
        sink.tally.tenant = request.tenant
        notice = False
        if all(is_stop(m) for m in messages):
            # a /stop that reached its turn: say whether it stopped something, without asking the model, once (a
            # stopped reply that streamed into a message says it there already)
            stopped = turn.stopped_at is not None and turn.stopped_at >= messages[0].received_at
            said = stopped and turn.stop_shown
            result = TurnResult(text="" if said else STOPPED_TEXT if stopped else NOTHING_RUNNING_TEXT, steps=0)
            notice = True
        elif command_of(messages) == VOICE_COMMAND:  # the agent's voice replies, per conversation
            voice_notes = turn.stream is not None and turn.stream.caps.voice
            text, value = toggle_text(agent.voice.mode, command_argument(messages), voice_notes=voice_notes)
            if value is not None:
                await store.save_slot(VOICE_SLOT, value)
            result, notice = TurnResult(text=text, steps=0), True
        elif (command := await self.desk.answer(request, messages, conversation)) is not None:
            sink.held.extend(command.events)  # written with the reply's claim
            result = command.result
        else:
            ticket = await self.gate.before(request, messages) if self.gate is not None else None
            result = await self._answer(turn, ticket, request, messages, sink, store, agent.limits.deadline_s)
        sent: Receipt | Undelivered | None = None
        if result.text.strip():
            stream = turn.stream
            reply: SendText | StreamText
            if notice or stream is None:
                reply = SendText(text=result.text, reply_to=turn.reply_to, notice=notice)
            else:
                reply = stream.reply(result.text)
            facts = sink.facts() if sink.held else ""
            sent = await self._deliver(turn, outbox, reply, conversation, facts=facts)
            if isinstance(sent, Receipt) and not notice and self.voice is not None and agent.voice.mode != "off":
                await self._speak(turn, attempt, agent, messages, sink, result.text)
        else:
            await sink.flush()
        return result, sent

    async def _speak(
        self,
        turn: DrainTurn,
        attempt: Attempt,
        agent: Agent,
        messages: Sequence[InboundMessage],
        sink: _Sink,
        text: str,
    ) -> None:
        """Send the delivered reply spoken too, when the turn wants it (:mod:`switchboard.worker.voice`).

        Best effort after the text: a failed speech request or a refused send leaves the reply as the text already
        sent (a log line and a fact). Through the outbox under its own logical name, so a re-run sends it once.
        """
        voice, conversation, outbox = self.voice, turn.conversation, turn.outbox
        if voice is None or conversation is None or outbox is None or turn.stream is None:
            return
        caps = turn.stream.caps
        if not caps.voice:
            return
        if attempt.slots is not None:
            toggle = slots_toggle(attempt.slots)
        else:
            toggle = toggle_of(await self.redis.hget(SessionKeys(turn.lease.session).slots, VOICE_SLOT))
        if not voice.wanted(agent.voice, messages, caps, toggle):
            return
        action, facts = await voice.speak(agent.voice, text, turn.reply_to)
        if sink.charge is not None:
            for fact in list(facts):
                if isinstance(fact, UsageMetered):
                    facts.extend(await sink.charge(fact))
        if action is not None:
            try:
                await outbox.send(action, conversation, run_id=turn.run_id, logical="voice")
                facts.append(outcome(agent.voice, action, None))
            except DeliveryError as err:
                logger.warning("%s refused the voice reply; the reply stays text only: %s", conversation.channel, err)
                facts.append(outcome(agent.voice, action, str(err)))
        if facts:
            await turn.ledger.facts(facts)

    async def _answer(
        self,
        turn: DrainTurn,
        ticket: Ticket | None,
        request: TurnRequest,
        messages: Sequence[InboundMessage],
        sink: _Sink,
        store: AttemptStore,
        deadline_s: float,
    ) -> TurnResult:
        """The turn's result: answered by the gate (budget used up, ``/usage``, ``/link``), or played."""
        if ticket is None and command_of(messages) == USAGE_COMMAND:
            return usage_without_budgets()
        if ticket is not None:
            sink.held.extend(ticket.events)  # written with the reply's claim
            if ticket.answer is not None:
                return ticket.answer  # the model is not asked
            request = ticket.request
            if ticket.counters and self.gate is not None:
                gate, charged = self.gate, ticket

                async def charge(metered: UsageMetered) -> list[Event]:
                    return await gate.charge(charged, metered)

                sink.charge = charge
        try:
            result = await self._run(turn, request, sink, store, deadline_s)
            if ticket is not None and ticket.cap is not None and result.stopped_by == "credits" and not result.steps:
                # the credits left in a period budget could not pay for one step: the budget's message, not the
                # runtime's note about a turn's own cap
                result = result.model_copy(update={"text": ticket.exhausted})
            return result
        except (FencedWriteError, asyncio.CancelledError):
            raise
        except BaseException:
            with contextlib.suppress(Exception):
                await sink.flush()  # what the turn did before it failed or was stopped is still a fact
            raise

    async def _run(
        self, turn: DrainTurn, request: TurnRequest, sink: _Sink, store: AttemptStore, deadline_s: float
    ) -> TurnResult:
        """Play the turn; stop it as soon as the lease is lost, or when it overruns its deadline."""
        task = asyncio.ensure_future(self.runner(request, sink, store))
        lost = asyncio.ensure_future(turn.lost.wait())
        stop = asyncio.ensure_future(turn.stop.wait())
        try:
            done, _ = await asyncio.wait(
                {task, lost, stop}, timeout=deadline_s + RUNNER_GRACE_S, return_when="FIRST_COMPLETED"
            )
        except BaseException:
            task.cancel()
            raise
        finally:
            lost.cancel()
            stop.cancel()
        if task not in done:
            task.cancel()  # reaches the model's HTTP request and any tool call in flight
        await settle(sink.status, after=task)  # the turn's status messages take their final state before it goes on
        if task in done:
            return task.result()
        if turn.lost.is_set():
            raise _lost(turn.lease)
        if turn.stop.is_set():
            raise RunCancelledError(turn.stop_reason or "stopped on request")
        raise TimeoutError(f"the turn overran its {deadline_s:g} s deadline")

    def _schedule_typing(self, turn: DrainTurn) -> None:
        """Show typing (where the channel has it) once the run lasts :data:`TYPING_DELAY_S`, then keep it shown."""
        caps = turn.stream.caps if turn.stream is not None else None
        if caps is None or not caps.typing:
            return
        every = max(caps.typing_refresh_s, 0.5)
        loop = asyncio.get_running_loop()

        def refresh() -> None:
            task = loop.create_task(self._notify(turn, SendTyping(reply_to=turn.reply_to), "typing"))
            task.add_done_callback(_swallow)
            turn.typing.append(task)
            turn.typing.append(loop.call_later(every, refresh))

        turn.typing.append(loop.call_later(TYPING_DELAY_S, refresh))

    def _perform_for(self, turn: DrainTurn) -> Callable[[Action, ConversationRef, SendContext], Awaitable[Receipt]]:
        async def perform(action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
            if turn.lost.is_set():
                raise _lost(turn.lease)
            if turn.stream is not None and turn.stream.takes(send.idempotency_key):
                return await turn.stream.perform_reply(action, conversation, send)  # edits the streamed preview
            return await self.deliverer.perform(action, conversation, send)

        return perform

    async def _notify(self, turn: DrainTurn, action: Action, logical: str) -> None:
        """An ephemeral action (status, typing, delta): best effort, but never after the lease is lost."""
        if turn.lost.is_set():
            raise _lost(turn.lease)
        if turn.conversation is None:
            return
        try:
            await self.deliverer.perform(action, turn.conversation, Ephemeral(idempotency_key(turn.run_id, logical)))
        except DeliveryError as err:
            logger.info("%s for %s not delivered: %s", action.kind, turn.lease.session, type(err).__name__)
