"""``switchboard`` command line: wires settings, Redis, the web tier and workers together.

Logging is configured here and nowhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import secrets
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any

from switchboard.errors import ConfigError, SwitchboardError
from switchboard.settings import Settings, load_settings

if TYPE_CHECKING:
    from switchboard.queue.sessions import SessionSummary

__all__ = ["main"]

logger = logging.getLogger("switchboard")

SIMULATE_FILE = "simulate.json"
DEMO_OFFLINE_DELAY_MS = 500
"""``switchboard run`` paces the offline model over this long unless SWITCHBOARD_OFFLINE__DELAY_MS is set."""


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    for noisy in ("aiohttp.access", "httpx", "telegram", "rq.worker", "rq.queue"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


def _require_redis(settings: Settings, command: str) -> str:
    if not settings.redis_url:
        raise ConfigError(
            f"`switchboard {command}` needs SWITCHBOARD_REDIS_URL (e.g. redis://localhost:6379/0); "
            "only `switchboard run` starts an embedded server",
            field="redis_url",
        )
    return settings.redis_url


def _stop_event() -> asyncio.Event:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


# ---------------------------------------------------------------- processes


def _serve_forever(main: Coroutine[Any, Any, None], *, use_uvloop: bool) -> None:
    """Run a long-lived process's event loop: uvloop when installed (less CPU per request), else asyncio's own.

    ``SWITCHBOARD_UVLOOP=0`` keeps asyncio's loop (to compare, or to rule uvloop out when debugging).
    """
    uvloop: Any = None
    if use_uvloop:
        try:
            import uvloop
        except ImportError:
            uvloop = None
    if uvloop is None:
        asyncio.run(main)
        return
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        runner.run(main)


async def _serve_web(settings: Settings, stop: asyncio.Event, *, ready: Callable[[str], None] | None = None) -> None:
    from aiohttp import web

    from switchboard.app import create_app

    runner = web.AppRunner(create_app(settings), access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    await site.start()
    # Everything loaded so far lives as long as the process: keep it out of the collector's full passes.
    gc.freeze()
    port = runner.addresses[0][1] if runner.addresses else settings.port
    url = f"http://{settings.host}:{port}/"
    if ready:
        ready(url)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


async def _serve_worker(settings: Settings, stop: asyncio.Event) -> None:
    from switchboard.worker import run_worker

    await run_worker(settings, stop)


async def _web_main(settings: Settings) -> None:
    stop = _stop_event()
    await _serve_web(settings, stop, ready=lambda url: print(f"Switchboard web tier listening on {url}", flush=True))


async def _worker_main(settings: Settings) -> None:
    stop = _stop_event()
    await _serve_worker(settings, stop)


async def _run_main(settings: Settings, started: float, *, embedded: bool) -> None:
    stop = _stop_event()
    fake = None
    if not settings.telegram.enabled:
        fake = await _simulated_telegram(settings)
    web_ready = asyncio.Event()
    url_box: list[str] = []

    def ready(url: str) -> None:
        url_box.append(url)
        web_ready.set()

    tasks = [
        asyncio.create_task(_serve_web(settings, stop, ready=ready), name="web"),
        asyncio.create_task(_serve_worker(settings, stop), name="worker"),
    ]
    waiter = asyncio.create_task(web_ready.wait())
    done, _ = await asyncio.wait([waiter, *tasks], return_when=asyncio.FIRST_COMPLETED)
    if waiter not in done:
        waiter.cancel()
        stop.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        for task in tasks:
            if task.done() and task.exception():
                raise task.exception()  # type: ignore[misc]
        return
    url = url_box[0]
    redis_line = f"embedded, data in {settings.data_path}" if embedded else str(settings.redis_url)
    if fake is not None:
        _write_simulate_file(settings, url)
    print(
        f"\n  Switchboard is ready in {time.monotonic() - started:.1f} s\n"
        f"  Web chat:  {url}\n"
        f"  Model:     {settings.default_model}\n"
        f"  Redis:     {redis_line}\n"
        + (
            '  Telegram:  simulated (try: switchboard simulate telegram "hello")\n'
            if fake
            else "  Telegram:  POST /webhooks/telegram\n"
        )
        + "  Press Ctrl-C to stop.\n",
        flush=True,
    )
    try:
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result
    finally:
        if fake is not None:
            await fake.stop()


async def _simulated_telegram(settings: Settings) -> Any:
    """Under ``run`` with no Telegram token: a built-in fake Bot API, so ``simulate telegram`` works offline."""
    from pydantic import SecretStr

    from switchboard.fakes.telegram import FakeTelegram

    token = f"100000:{secrets.token_urlsafe(24)}"
    fake = FakeTelegram(token=token)
    base_url = await fake.start()
    settings.telegram = settings.telegram.model_copy(
        update={
            "bot_token": SecretStr(token),
            "secret_token": SecretStr(secrets.token_urlsafe(24)),
            "api_base_url": base_url,
            "bot_username": settings.telegram.bot_username or "switchboard_demo_bot",
        }
    )
    return fake


def _write_simulate_file(settings: Settings, gateway_url: str) -> None:
    assert settings.telegram.secret_token is not None
    path = settings.data_path / SIMULATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "gateway_url": gateway_url,
        "telegram": {
            "fake_url": settings.telegram.api_base_url,
            "secret_token": settings.telegram.secret_token.get_secret_value(),
        },
    }
    path.write_text(json.dumps(payload))
    path.chmod(0o600)


def cmd_run(settings: Settings) -> int:
    """All-in-one: embedded server (unless a URL is set), web tier, one worker, simulated Telegram."""
    from switchboard.queue.embedded import EmbeddedRedis

    started = time.monotonic()
    if "delay_ms" not in settings.offline.model_fields_set:
        # On a laptop demo the offline model paces its answer, so the reply visibly streams in.
        settings.offline = settings.offline.model_copy(update={"delay_ms": DEMO_OFFLINE_DELAY_MS})
    embedded = None
    if not settings.redis_url:
        embedded = EmbeddedRedis(settings.data_path / "redis")
        settings.redis_url = embedded.start()
    try:
        _serve_forever(_run_main(settings, started, embedded=embedded is not None), use_uvloop=settings.uvloop)
    finally:
        if embedded is not None:
            embedded.stop()
        (settings.data_path / SIMULATE_FILE).unlink(missing_ok=True)
    print("Switchboard stopped.", flush=True)
    return 0


# ---------------------------------------------------------------- check


def cmd_check(settings: Settings) -> int:
    """Print what is enabled and what is misconfigured; exit 1 on any problem."""
    problems: list[str] = []
    print(f"config file: {settings.config} ({'found' if settings.config.exists() else 'not found, built-in defaults'})")
    print(f"data dir:    {settings.data_path}")
    print(f"model:       {settings.default_model}")
    if settings.redis_url:
        import redis as sync_redis

        try:
            client = sync_redis.Redis.from_url(settings.redis_url, socket_timeout=2, socket_connect_timeout=2)
            client.ping()
            aof = client.config_get("appendonly").get("appendonly")
            print(f"redis:       {settings.redis_url} reachable (appendonly={aof})")
            if aof != "yes":
                problems.append("redis: AOF is off; messages acknowledged could be lost on a crash (appendonly yes)")
            client.close()
        except Exception as exc:
            problems.append(f"redis: cannot reach {settings.redis_url}: {exc}")
    else:
        print("redis:       not set; `switchboard run` starts an embedded server (web/worker need a URL)")
    print("channels:")
    print("  web        enabled (built in)")
    for name in ("telegram", "slack", "discord", "teams", "whatsapp", "instagram", "messenger"):
        block = settings.channel(name)
        if not block.enabled:
            print(f"  {name:<10} disabled (no credentials)")
            continue
        if name == "telegram" and settings.telegram.secret_token is None:
            problems.append(
                "telegram: SWITCHBOARD_TELEGRAM__SECRET_TOKEN is not set; every webhook would be refused "
                "(choose 1-256 chars of A-Z a-z 0-9 _ - and pass it to setWebhook as secret_token)"
            )
        if name != "telegram":
            print(f"  {name:<10} credentials present, but this version has no {name} adapter yet")
            continue
        print(f"  {name:<10} enabled at POST /webhooks/{name}")
    print("agents:")
    from switchboard.agents import agent_problems

    for agent in settings.file.agents.values():
        print(f"  {agent.name:<12} {agent.status:<6} model={agent.model or settings.default_model}")
        problems.extend(agent_problems(settings, agent))
    if problems:
        print("problems:")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    print("ok: no problems found")
    return 0


# ---------------------------------------------------------------- simulate, sessions, agents


def cmd_simulate(settings: Settings, channel: str, text: str, timeout: float) -> int:
    """Send a correctly signed platform request to the running gateway and print the captured reply."""
    from switchboard.simulate import simulate

    return asyncio.run(simulate(settings, channel, text, wait_s=timeout))


def cmd_sessions(settings: Settings, action: str, key: str | None, limit: int) -> int:
    """``sessions list`` / ``sessions show KEY`` / ``sessions stop KEY``."""
    from switchboard.queue.cancellation import request_stop
    from switchboard.queue.connection import async_client
    from switchboard.queue.sessions import list_sessions, timeline
    from switchboard.types import SessionKey

    url = _require_redis(settings, "sessions")

    async def go() -> int:
        redis = async_client(url)
        try:
            if action == "list":
                rows = await list_sessions(redis, limit=limit)
                if not rows:
                    print("no sessions yet")
                for row in rows:
                    print(_format_row(row))
                return 0
            assert key is not None
            if action == "stop":
                heard = await request_stop(redis, SessionKey(key), reason="stopped by an operator")
                print(f"stop sent to {heard} worker(s); the running turn of {key} (if any) stops now")
                return 0 if heard else 1
            events = await timeline(redis, SessionKey(key), count=limit)
            if not events:
                print(f"no events for session {key!r} (see `switchboard sessions list`)")
                return 1
            for event in events:
                print(_format_event(event))
            return 0
        finally:
            await redis.aclose()

    return asyncio.run(go())


def _format_row(row: SessionSummary) -> str:
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(row.last_activity)) if row.last_activity else "-"
    return (
        f"{row.key}  {when}  channel={row.channel}  status={row.status}  waiting={row.inbox_depth}  "
        f"received={row.received}  dead_letters={row.dead_letters}"
    )


def _format_event(event: dict[str, Any]) -> str:
    at = event.get("at")
    when = time.strftime("%H:%M:%S", time.localtime(float(at))) + f".{int(float(at) * 1000) % 1000:03d}" if at else "-"
    kind = event.get("kind", "?")
    rest = {k: v for k, v in event.items() if k not in {"at", "kind", "id", "ts"}}
    return f"{when}  {kind:<18} " + " ".join(f"{k}={v}" for k, v in rest.items())


def cmd_agents(settings: Settings, action: str, name: str | None) -> int:
    """``agents list|show NAME|validate``."""
    from switchboard.agents import agents_command

    return agents_command(settings, action, name)


# ---------------------------------------------------------------- entry


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchboard", description="Switchboard: connect AI agents to the chat apps people already use."
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("run", help="all-in-one: embedded Redis, web tier, one worker (Ctrl-C stops everything)")
    sub.add_parser("web", help="the web tier: webhooks, web chat, /healthz, /metrics (needs SWITCHBOARD_REDIS_URL)")
    sub.add_parser("worker", help="a worker: agent runs and deliveries (needs SWITCHBOARD_REDIS_URL)")
    sub.add_parser("check", help="validate configuration and credentials, ping Redis, print what is enabled")
    sim = sub.add_parser("simulate", help="send a signed platform request to a running gateway, print the reply")
    sim.add_argument("channel", choices=["telegram", "web"])
    sim.add_argument("text")
    sim.add_argument("--timeout", type=float, default=30.0)
    sessions = sub.add_parser("sessions", help="list sessions, show one session's timeline, or stop its running turn")
    sessions.add_argument("action", choices=["list", "show", "stop"])
    sessions.add_argument("key", nargs="?")
    sessions.add_argument("--limit", type=int, default=50)
    agents = sub.add_parser("agents", help="list agents, show one, or validate them all")
    agents.add_argument("action", choices=["list", "show", "validate"])
    agents.add_argument("name", nargs="?")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``switchboard`` console script."""
    args = _parser().parse_args(argv)
    try:
        settings = load_settings()
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2
    _configure_logging(settings.log_level)
    try:
        if args.command == "run":
            return cmd_run(settings)
        if args.command == "web":
            _require_redis(settings, "web")
            _serve_forever(_web_main(settings), use_uvloop=settings.uvloop)
            return 0
        if args.command == "worker":
            _require_redis(settings, "worker")
            _serve_forever(_worker_main(settings), use_uvloop=settings.uvloop)
            return 0
        if args.command == "check":
            return cmd_check(settings)
        if args.command == "simulate":
            return cmd_simulate(settings, args.channel, args.text, args.timeout)
        if args.command == "sessions":
            if args.action == "show" and not args.key:
                print(
                    "switchboard: `sessions show` needs a session KEY (see `switchboard sessions list`)",
                    file=sys.stderr,
                )
                return 2
            return cmd_sessions(settings, args.action, args.key, args.limit)
        if args.command == "agents":
            return cmd_agents(settings, args.action, args.name)
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2
    except SwitchboardError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 2


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
