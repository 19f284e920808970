"""The session worker: one process, one persistent event loop, many sessions' drains at once.

It consumes the drain queues of the shards rendezvous hashing gives it among the live workers
(:mod:`switchboard.queue.shardwork`), woken by its shards' ready channels, and runs up to ``concurrency`` drains as
asyncio tasks, keeping its connection pools for life. Across shards it serves one entry per shard with work in turn;
within a shard, in queue order; yielding drains go to the back. A safety pass every heartbeat finds what a lost
wake-up left. Its heartbeat comes from a thread of its own, so only a dead or frozen process stops it, and the
sessions of workers that stopped beating are taken over at once; the lease stays the fence. On stop, running turns
finish and hand their sessions over.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
import secrets
import socket
import threading
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from switchboard import tracing
from switchboard.core.agent.config import Agent
from switchboard.core.messages import InboundMessage
from switchboard.core.schedules import ScheduleSpec
from switchboard.core.turn import SessionStore, TurnRequest, TurnResult, TurnSink
from switchboard.core.workspaces.store import WorkspaceStore
from switchboard.errors import ConfigError
from switchboard.outbound.deliver import Deliverer
from switchboard.queue import scripts
from switchboard.queue.cancellation import stop_requested_since
from switchboard.queue.connection import as_redis, async_client, sync_client
from switchboard.queue.jobs import WIP_TTL_S, DrainJobs, StartedJob
from switchboard.queue.keys import GlobalKeys, ShardKeys
from switchboard.queue.reaper import Reaper, worker_ttl_s
from switchboard.queue.retention import RetentionPlan, sweep_if_due
from switchboard.queue.schedules import Scheduler, sync_config_jobs
from switchboard.queue.sealed import data_keyring
from switchboard.queue.shards import shard_of
from switchboard.queue.shardwork import ShardListener, ShardRota, owned_shards
from switchboard.settings import QueueSettings, Settings
from switchboard.worker.drain import Drainer, TurnRunner
from switchboard.worker.drainturn import DrainOutcome
from switchboard.worker.sampling import Sampler
from switchboard.worker.voice import VoiceReplies

__all__ = ["ALIVE_BEATS", "DrainerFactory", "SessionWorker", "run_worker", "traced_runner"]

logger = logging.getLogger(__name__)

DrainerFactory = Callable[[aioredis.Redis, str], Drainer]
"""Builds the worker's drainer from its Redis client and worker id."""

IDLE_WAIT_S = 1.0
"""How long an idle worker waits for a wake-up before it looks again (also how quickly it notices a stop)."""
ALIVE_BEATS = 3
"""A worker silent for this many heartbeats is dead (its liveness key expires) and its sessions are taken over."""
_QUEUE_NAME = re.compile(r"^[A-Za-z0-9_.:-]+$")
_GLOBAL = GlobalKeys()


def _new_worker_id() -> str:
    return f"{socket.gethostname()[:32]}-{secrets.token_hex(4)}"


class _Liveness:
    """The worker's liveness key, written every beat from a daemon thread with its own synchronous client."""

    def __init__(self, redis_url: str, worker_id: str, beat_s: float) -> None:
        self.key = _GLOBAL.worker_alive(worker_id)
        self.beat_s = beat_s
        self.ttl_ms = max(1, int(ALIVE_BEATS * beat_s * 1000))
        self.healthy_since: float | None = None
        """``time.monotonic()`` since when every beat succeeded (``None`` after a failed one)."""
        self._client = sync_client(redis_url)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"liveness-{worker_id}", daemon=True)

    def beat(self) -> None:
        """Write the key once (blocking: call it from a thread)."""
        self._client.set(self.key, int(time.time() * 1000), px=self.ttl_ms)

    def start(self) -> None:
        """Start beating (after a first :meth:`beat` succeeded)."""
        self.healthy_since = time.monotonic()
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(self.beat_s):
            try:
                self.beat()
            except Exception as err:  # the thread must outlive any failure: the next beat retries
                self.healthy_since = None
                logger.warning("worker liveness beat failed: %s", err)
                continue
            if self.healthy_since is None:
                self.healthy_since = time.monotonic()

    async def stop(self) -> None:
        """Stop beating and delete the key (a clean stop is not a death: nothing to take over)."""
        self._stop.set()
        if self._thread.is_alive():
            await asyncio.to_thread(self._thread.join, 5.0)
        with contextlib.suppress(RedisError, OSError):
            await asyncio.to_thread(self._client.delete, self.key)
        self._client.close()


class SessionWorker:
    """Runs drain jobs from one RQ queue, many at once."""

    def __init__(
        self,
        redis_url: str,
        settings: QueueSettings,
        *,
        drainer: Drainer | None = None,
        drainer_factory: DrainerFactory | None = None,
        worker_id: str | None = None,
        heartbeat_s: float | None = None,
        shutdown_grace_s: float | None = None,
        schedules: Sequence[ScheduleSpec] = (),
        default_agent: str = "",
        retention: RetentionPlan | None = None,
    ) -> None:
        if (drainer is None) == (drainer_factory is None):
            raise ValueError("give exactly one of drainer or drainer_factory")
        self.redis_url = redis_url
        self.settings = settings
        self.worker_id = worker_id or (drainer.worker_id if drainer else _new_worker_id())
        # never slower than the lease renewals: a very short lease (tests) shortens the heartbeat with it
        default_beat_s = min(settings.worker_heartbeat_ms, settings.lease_ms / 3) / 1000
        self.heartbeat_s = heartbeat_s if heartbeat_s is not None else default_beat_s
        self.shutdown_grace_s = shutdown_grace_s if shutdown_grace_s is not None else settings.lease_ms / 1000
        self.jobs = DrainJobs()
        self._drainer = drainer
        self._factory = drainer_factory
        self._running: dict[str, StartedJob] = {}
        """The drains running now, by entry."""
        self.owned: frozenset[int] = frozenset()
        """The shards this worker consumes (rendezvous hashing over the live workers, renewed every heartbeat)."""
        self._rota = ShardRota()
        self._listener: ShardListener | None = None
        self._safety_due = 0.0
        """``time.monotonic()`` of the next safety pass (0: at once)."""
        self._safety_from = 0
        self._tasks: set[asyncio.Task[None]] = set()
        self._liveness: _Liveness | None = None
        self._schedules = list(schedules)
        self._retention = retention
        """The YAML file's jobs, stored at start (:func:`~switchboard.queue.schedules.sync_config_jobs`)."""
        self._default_agent = default_agent

    # -- configuration --------------------------------------------------------------------------------------

    def check_config(self) -> None:
        """Start-up self-check: refuse a setup that would break the queue's guarantees.

        Raises:
            ConfigError: naming the field: not exactly one queue name, or a heartbeat not shorter than the lease.
        """
        name = self.settings.name
        if not _QUEUE_NAME.match(name):
            raise ConfigError(
                f"SWITCHBOARD_QUEUE__NAME={name!r}: a worker listens on exactly one queue; "
                "use one name of letters, digits and _ . : -",
                field="queue.name",
            )
        if self.heartbeat_s <= 0 or self.heartbeat_s * 1000 >= self.settings.lease_ms:
            raise ConfigError(
                f"worker heartbeat every {self.heartbeat_s:g} s (SWITCHBOARD_QUEUE__WORKER_HEARTBEAT_MS) is not "
                f"shorter than the lease (SWITCHBOARD_QUEUE__LEASE_MS={self.settings.lease_ms})",
                field="queue.lease_ms",
            )
        if self.settings.reaper_interval_s * 1000 > 10 * self.settings.lease_ms:
            raise ConfigError(
                f"SWITCHBOARD_QUEUE__REAPER_INTERVAL_S={self.settings.reaper_interval_s:g} is far longer than the "
                "lease: stranded sessions would wait minutes; keep it at most 10x lease_ms",
                field="queue.reaper_interval_s",
            )
        if self._drainer is not None and self._drainer.settings.name != name:
            raise ConfigError("the drainer and the worker disagree on the queue name", field="queue.name")

    async def _check_server(self, redis: aioredis.Redis) -> None:
        info = await redis.info("server")
        raw = str(info.get("valkey_version") or info.get("redis_version") or "0")
        parts = [int(p) for p in re.findall(r"\d+", raw)[:2]] + [0, 0]
        if "valkey_version" not in info and (parts[0], parts[1]) < (7, 0):
            raise ConfigError(
                f"Redis {raw} is too old: the worker needs sharded pub/sub and LMPOP (Redis >= 7.0)", field="redis_url"
            )

    # -- running ---------------------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        """Work until ``stop`` is set, then shut down cleanly (see the module docstring)."""
        self.check_config()
        # no max_connections: redis-py's asyncio pool raises (rather than waits) when it runs out;
        # the concurrency cap bounds the connections in use anyway
        client = async_client(self.redis_url)
        redis = as_redis(client)
        drainer = self._drainer or self._factory(redis, self.worker_id)  # type: ignore[misc]
        drainer.waiting_elsewhere = lambda session: self._rota.others_than(shard_of(session))
        listener = self._listener = ShardListener(
            redis,
            on_ready=self._woken,
            on_stop=drainer.cancel,
            reason_of=lambda session: stop_requested_since(redis, session, 0.0),
        )
        reaper = Reaper(redis, self.settings, worker_id=self.worker_id)
        liveness = self._liveness = _Liveness(self.redis_url, self.worker_id, self.heartbeat_s)
        background: list[asyncio.Task[None]] = []
        try:
            await self._check_server(redis)
            await scripts.load_all(redis)
            await asyncio.to_thread(liveness.beat)
            liveness.start()
            await self._beat(redis)
            if self._schedules or self._default_agent:
                await sync_config_jobs(redis, self._schedules, self._default_agent)
            background = [
                asyncio.create_task(Scheduler(redis, self.settings).run(stop)),
                asyncio.create_task(self._heartbeat_loop(redis, stop)),
                asyncio.create_task(self._takeover_loop(reaper, stop)),
                asyncio.create_task(self._reaper_loop(reaper, stop)),
                asyncio.create_task(listener.run(stop)),
            ]
            if self._retention is not None and self._retention.config.active:  # no rule: no loop, no command
                background.append(asyncio.create_task(self._retention_loop(redis, self._retention, stop)))
            with contextlib.suppress(
                TimeoutError
            ):  # a wake-up sent before the subscription is found by the safety pass
                await asyncio.wait_for(listener.ready.wait(), timeout=5.0)
            logger.info("worker %s listening on %d shards", self.worker_id, len(self.owned))
            await self._dequeue_loop(redis, drainer, stop)
            await self._shutdown(drainer)
        finally:
            for task in background:
                task.cancel()
            for task in background:
                with contextlib.suppress(asyncio.CancelledError, RedisError):
                    await task
            await liveness.stop()
            with contextlib.suppress(RedisError, OSError):
                await redis.zrem(_GLOBAL.workers, self.worker_id)
            await redis.aclose()
            logger.info("worker %s stopped", self.worker_id)

    async def _dequeue_loop(self, redis: aioredis.Redis, drainer: Drainer, stop: asyncio.Event) -> None:
        slots = asyncio.Semaphore(self.settings.concurrency)
        drainer.slots_full = slots.locked
        stopped = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                if slots.locked():
                    acquire = asyncio.ensure_future(slots.acquire())
                    await asyncio.wait({acquire, stopped}, return_when=asyncio.FIRST_COMPLETED)
                    if not acquire.done():
                        acquire.cancel()
                        break
                else:
                    await slots.acquire()
                if stop.is_set():
                    slots.release()
                    break
                try:
                    job = await self._next_job(redis, stopped)
                except (RedisError, OSError) as err:
                    slots.release()
                    logger.warning("dequeue failed: %s; retrying", err)
                    await asyncio.sleep(0.5)
                    continue
                if job is None:
                    slots.release()
                    continue
                self._running[job.entry] = job
                task = asyncio.create_task(self._run_job(redis, drainer, job, slots))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        finally:
            stopped.cancel()

    def _woken(self, shard: int) -> None:
        """A wake-up on ``shard``'s ready channel: its turn comes in the rota (if the shard is still this worker's)."""
        if shard in self.owned:
            self._rota.add(shard)

    async def _next_job(self, redis: aioredis.Redis, stopped: asyncio.Future[Any]) -> StartedJob | None:
        """The next drain to run, or ``None`` after an idle wait (for a wake-up, the safety pass, or the stop).

        The safety pass's find when one is due, else the next entry of the shard whose turn it is.
        """
        if time.monotonic() >= self._safety_due:
            job = await self._safety_pass(redis)
            if job is not None:
                return job
        shard = self._rota.next()
        if shard is None:
            woken = asyncio.ensure_future(self._rota.woken.wait())
            timeout = min(IDLE_WAIT_S, max(0.0, self._safety_due - time.monotonic()))
            await asyncio.wait({woken, stopped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            woken.cancel()
            return None
        if shard not in self.owned:
            return None
        job, left = await self.jobs.take(redis, shard)
        if left:
            self._rota.add(shard)  # its next entry waits for the other shards' turns
        return job

    async def _safety_pass(self, redis: aioredis.Redis) -> StartedJob | None:
        """Pub/sub is at most once: pop an entry from any owned shard not in the rota, if one has any.

        One ``LMPOP`` over their queues, from a rotating start. A find means a wake-up was lost (or is on its way):
        the shard joins the rota and the next pass comes at once, until a pass finds nothing; then one a heartbeat
        later.

        The popped entry is registered right after (not in the same step as :meth:`DrainJobs.take`): a crash in
        between leaves its session to the reaper, which finds the flag's entry in no list.
        """
        self._safety_due = time.monotonic() + self.heartbeat_s
        unknown = sorted(self.owned.difference(self._rota.waiting()))
        if not unknown:
            return None
        start = self._safety_from % len(unknown)
        order = unknown[start:] + unknown[:start]
        every = ShardKeys.every()
        if isinstance(redis, aioredis.RedisCluster):
            return await self._safety_pass_cluster(redis, order)
        found = await redis.lmpop(len(order), *(every[n].drainq for n in order), direction="LEFT")
        if not found:
            return None
        key, entries = found
        name = key.decode() if isinstance(key, bytes) else str(key)
        shard = next(n for n in order if every[n].drainq == name)
        self._safety_from = unknown.index(shard) + 1
        self._safety_due = 0.0
        self._rota.add(shard)
        return await self.jobs.register(redis, entries[0])

    async def _safety_pass_cluster(self, redis: aioredis.RedisCluster, order: list[int]) -> StartedJob | None:
        """The safety pass on a Redis Cluster, where one ``LMPOP`` cannot name queues in several slots.

        One ``LLEN`` per shard in one pipeline (redis-py splits it per node: a round trip per primary): the shards
        with entries join the rota and are taken from as usual. Nothing is popped here, so nothing needs registering.
        """
        every = ShardKeys.every()
        async with redis.pipeline(transaction=False) as pipe:
            for n in order:
                pipe.llen(every[n].drainq)
            lengths = await pipe.execute()
        waiting = [n for n, length in zip(order, lengths, strict=True) if length]
        for shard in waiting:
            self._rota.add(shard)
        if waiting:
            self._safety_from = order.index(waiting[-1]) + 1
            self._safety_due = 0.0
        return None

    async def _run_job(
        self, redis: aioredis.Redis, drainer: Drainer, job: StartedJob, slots: asyncio.Semaphore
    ) -> None:
        try:
            try:
                outcome = await drainer.drain_session(job.session, job)
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await asyncio.shield(self._abandoned(redis, job))
                raise
            except Exception:
                logger.exception("drain of %s crashed", job.session)
                await self.jobs.expire(redis, job)  # the reaper's next sweep repairs the session
                return
            if outcome is DrainOutcome.HANDED_OVER:
                await self.jobs.enqueue(redis, job.session, expected=job.job_id, front=True, stale=job.entry)
            if outcome not in (DrainOutcome.RELEASED, DrainOutcome.YIELDED):  # those closed the entry in their step
                await self.jobs.finish(redis, job)
        except (RedisError, OSError) as err:
            logger.warning("drain %s: Redis failed (%s); the reaper will repair the session", job.entry, err)
        finally:
            self._running.pop(job.entry, None)
            slots.release()

    async def _abandoned(self, redis: aioredis.Redis, job: StartedJob) -> None:
        await self.jobs.enqueue(redis, job.session, expected=job.job_id, front=True, stale=job.entry)
        await self.jobs.finish(redis, job)

    async def _shutdown(self, drainer: Drainer) -> None:
        drainer.stopping.set()
        if self._tasks:
            _done, pending = await asyncio.wait(set(self._tasks), timeout=self.shutdown_grace_s)
            for task in pending:
                task.cancel()
            if pending:
                logger.warning("cancelled %d drains still running at shutdown", len(pending))
                await asyncio.wait(pending)

    async def _beat(self, redis: aioredis.Redis) -> None:
        """Register this worker, read the live ones and take the shards they leave it; renew the running drains."""
        now_ms = int(time.time() * 1000)
        async with redis.pipeline(transaction=False) as pipe:
            pipe.zadd(_GLOBAL.workers, {self.worker_id: now_ms})
            pipe.zremrangebyscore(_GLOBAL.workers, "-inf", now_ms - 24 * 3600 * 1000)
            pipe.zrangebyscore(_GLOBAL.workers, now_ms - worker_ttl_s(self.settings) * 1000, "+inf")
            *_, live = await pipe.execute()
        self._assign([w.decode() if isinstance(w, bytes) else str(w) for w in live])
        await self.jobs.heartbeat(redis, list(self._running.values()), ttl_s=WIP_TTL_S)

    def _assign(self, live: list[str]) -> None:
        owned = owned_shards(self.worker_id, live)
        if owned != self.owned:
            if self.owned:
                logger.info("worker %s now consumes %d shards (%d live workers)", self.worker_id, len(owned), len(live))
            self.owned = owned
            self._safety_due = 0.0  # the new shards' entries were announced to their previous consumer
        if self._listener is not None:
            self._listener.watch(owned, owned | {job.shard for job in self._running.values()})

    async def _heartbeat_loop(self, redis: aioredis.Redis, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await asyncio.sleep(self.heartbeat_s)
            try:
                await self._beat(redis)
            except (RedisError, OSError) as err:
                logger.warning("worker heartbeat failed: %s", err)
            except Exception:
                logger.exception("worker heartbeat crashed; retrying")

    async def _takeover_loop(self, reaper: Reaper, stop: asyncio.Event) -> None:
        """Twice a beat, take over the sessions of dead workers (a crash costs the liveness TTL and half a beat).

        Only once this worker's own beats have succeeded for a whole liveness TTL: after a Redis outage every
        worker gets the chance to beat again before any judges another dead.
        """
        while not stop.is_set():
            await asyncio.sleep(self.heartbeat_s / 2)
            since = self._liveness.healthy_since if self._liveness is not None else None
            if since is None or time.monotonic() - since < ALIVE_BEATS * self.heartbeat_s:
                continue
            try:
                await reaper.take_over_dead_workers()
            except (RedisError, OSError) as err:
                logger.warning("takeover check failed: %s", err)
            except Exception:
                logger.exception("takeover check crashed; retrying")

    async def _retention_loop(self, redis: aioredis.Redis, plan: RetentionPlan, stop: asyncio.Event) -> None:
        """Every ``retention.every``, the retention sweep, run by one worker of all (see ``retention.md``)."""
        while not stop.is_set():
            try:
                await sweep_if_due(redis, plan, self.worker_id)
            except (RedisError, OSError) as err:
                logger.warning("retention sweep failed: %s", err)
            except Exception:
                logger.exception("retention sweep crashed; retrying next interval")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=plan.config.every)

    async def _reaper_loop(self, reaper: Reaper, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                await reaper.sweep()
            except (RedisError, OSError) as err:
                logger.warning("reaper sweep failed: %s", err)
            except Exception:
                logger.exception("reaper sweep crashed; retrying next interval")
            await asyncio.sleep(self.settings.reaper_interval_s)


def traced_runner(runner: TurnRunner) -> TurnRunner:
    """``runner`` in the request's trace: ``queue.wait`` and ``run`` spans, and the real trace id on the request.

    The trace is the first message's (:func:`switchboard.tracing.trace_id_of` of its gateway id), so the worker's
    spans join the web tier's ``webhook`` span without any context passed through Redis. ``TurnRequest.trace_id``
    becomes that trace id in hex (:func:`switchboard.tracing.trace_hex`, what the ``step`` facts carry), whether or
    not spans are exported. Each message of the turn gets a ``queue.wait`` span in its own trace, from its acceptance
    to the start of this run (a retried turn's second run records another); a message folded into a turn begun by an
    earlier one links to the run's trace. The drain's final reply is sent after the runner returns: its ``send`` span
    finds the trace from the run id (:class:`~switchboard.outbound.outbox.Outbox`).
    """

    async def run(request: TurnRequest, sink: TurnSink, store: SessionStore) -> TurnResult:
        key = request.messages[0].id if request.messages else request.run_id
        request = request.model_copy(update={"trace_id": tracing.trace_hex(key)})
        if not tracing.recording():
            return await runner(request, sink, store)
        started = time.time_ns()
        for message in request.messages:
            tracing.span_at(
                "queue.wait",
                start_ns=min(int(message.received_at * 1e9), started),
                end_ns=started,
                trace_key=message.id,
                links=[tracing.link_to(key)] if message.id != key else (),
                switchboard__message_id=message.id,
                switchboard__channel=message.conversation.channel,
            )
        with (
            tracing.conversation(request.session_key) as conversation,
            tracing.span(
                "run",
                trace_key=key,
                switchboard__run_id=request.run_id,
                switchboard__channel=request.messages[0].conversation.channel if request.messages else None,
                switchboard__tenant=request.tenant,
                switchboard__messages=len(request.messages),
                gen_ai__agent__name=request.agent.name,
                gen_ai__conversation__id=conversation,
                switchboard__task_class=request.task_class or None,
            ) as opened,
        ):
            result = await runner(request, sink, store)
            opened.set_attribute("switchboard.steps", result.steps)
            opened.set_attribute("gen_ai.usage.input_tokens", result.input_tokens)
            opened.set_attribute("gen_ai.usage.output_tokens", result.output_tokens)
            if result.stopped_by is not None:
                opened.set_attribute("switchboard.stopped_by", result.stopped_by)
            return result

    return run


async def run_worker(
    settings: Settings,
    runner: TurnRunner,
    deliverer: Deliverer,
    agent_for: Callable[[InboundMessage], Agent] | None,
    stop: asyncio.Event,
    *,
    worker_id: str | None = None,
    workspace_store: WorkspaceStore | None = None,
    retention: RetentionPlan | None = None,
) -> None:
    """Run one session worker until ``stop`` is set (what ``switchboard worker`` and ``run`` call).

    ``agent_for`` defaults to the YAML file's agent named by the conversation (or the default agent);
    ``workspace_store`` is where the files channels send are read from (default: the local workspace directory);
    ``retention``: the retention sweep this worker takes its turn at (``None``: no rule, no loop).

    Raises:
        ConfigError: no ``SWITCHBOARD_REDIS_URL``, or the self-check failed.
    """
    if not settings.redis_url:
        raise ConfigError(
            "the worker needs SWITCHBOARD_REDIS_URL (only `switchboard run` embeds a server)", field="redis_url"
        )
    data_keyring()  # a malformed SWITCHBOARD_DATA_KEYS stops the start with what to fix, not the first turn
    pick = agent_for or (lambda message: settings.file.agent(message.conversation.agent))
    identity = worker_id or _new_worker_id()
    voice = VoiceReplies.build(settings)

    def factory(redis: aioredis.Redis, wid: str) -> Drainer:
        return Drainer(
            redis,
            settings.queue,
            runner=traced_runner(runner),
            deliverer=deliverer,
            agent_for=pick,
            worker_id=wid,
            workspace_root=settings.workspace_path,
            workspace_store=workspace_store,
            config=settings.file,
            voice=voice,
            sampler=Sampler.build(redis, settings.evals),
        )

    worker = SessionWorker(
        settings.redis_url,
        settings.queue,
        drainer_factory=factory,
        worker_id=identity,
        schedules=settings.file.schedules,
        default_agent=settings.file.default_agent,
        retention=retention,
    )
    try:
        if not settings.file.api.webhooks:  # nothing to deliver: no loop, no Redis command
            await worker.run(stop)
            return
        await _with_webhooks(settings, settings.redis_url, identity, worker.run(stop), stop)
    finally:
        if voice is not None:
            await voice.aclose()


async def _with_webhooks(
    settings: Settings, redis_url: str, identity: str, work: Coroutine[Any, Any, None], stop: asyncio.Event
) -> None:
    """Run ``work`` beside the outbound webhooks' delivery loop (``api.webhooks``), stopping both together."""
    from switchboard.outbound.webhooks import WebhookDispatcher

    redis = as_redis(async_client(redis_url))
    try:
        dispatcher = WebhookDispatcher(
            redis, settings.file.api.webhooks, settings.webhooks, settings.environ, owner=identity
        )
    except BaseException:
        work.close()
        await redis.aclose()
        raise
    hooks = asyncio.create_task(dispatcher.run(stop), name="webhooks")
    try:
        await work
    finally:
        hooks.cancel()
        await asyncio.gather(hooks, return_exceptions=True)
        await redis.aclose()
