"""``switchboard`` command line: wires settings, Redis, the web tier and workers together.

Logging is configured here and nowhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import errno
import gc
import json
import logging
import os
import secrets
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Mapping, Sequence
from typing import Any

from switchboard.errors import ConfigError, QueueUnavailableError, SwitchboardError
from switchboard.sessions import REDIS_URL_FILE
from switchboard.settings import Settings, load_settings

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
    from switchboard.server import GuardedAppRunner

    # header/body timeouts and a connection cap (SWITCHBOARD_HTTP__*)
    runner = GuardedAppRunner(create_app(settings), settings.http, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as err:
        await runner.cleanup()  # closes what the app opened at start-up (no "Unclosed client session")
        if err.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {settings.port} on {settings.host} is already in use: set SWITCHBOARD_PORT to a free port "
                "(or stop the other process)",
                field="port",
            ) from None
        raise ConfigError(f"cannot listen on {settings.host}:{settings.port}: {err.strerror or err}") from None
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
    from redis.exceptions import ConnectionError as RedisConnectionError

    from switchboard.checks import redacted_url
    from switchboard.worker import run_worker

    try:
        await run_worker(settings, stop)
    except (RedisConnectionError, OSError) as err:  # e.g. started before its Redis: one line, not a traceback
        url = redacted_url(settings.redis_url or "")
        raise QueueUnavailableError(
            f"cannot reach Redis at {url}: {err}; start it (or fix SWITCHBOARD_REDIS_URL) and try again"
        ) from None


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
    try:
        await _run_all(settings, started, stop, simulated=fake is not None, embedded=embedded)
    finally:
        if fake is not None:
            await fake.stop()


async def _run_all(settings: Settings, started: float, stop: asyncio.Event, *, simulated: bool, embedded: bool) -> None:
    from switchboard.checks import redacted_url

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
        results = await asyncio.gather(*tasks, return_exceptions=True)
        for result in results:
            if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
                raise result
        return
    url = url_box[0]
    redis_line = f"embedded, data in {settings.data_path}" if embedded else redacted_url(str(settings.redis_url))
    if simulated:
        _write_simulate_file(settings, url)
    print(
        f"\n  Switchboard is ready in {time.monotonic() - started:.1f} s\n"
        f"  Web chat:  {url}\n"
        f"  Model:     {settings.default_model}\n"
        f"  Redis:     {redis_line}\n"
        + (
            '  Telegram:  simulated (try: switchboard simulate telegram "hello")\n'
            if simulated
            else "  Telegram:  POST /webhooks/telegram\n"
        )
        + "  Press Ctrl-C to stop.\n",
        flush=True,
    )
    await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    stop.set()  # one of them failed (or both ended): never keep a web tier up without its worker
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result


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
    url_file = settings.data_path / REDIS_URL_FILE
    if not settings.redis_url:
        embedded = EmbeddedRedis(settings.data_path / "redis")
        settings.redis_url = embedded.start()
        # `switchboard sessions …` in another terminal finds the embedded server here (no URL to copy).
        url_file.write_text(settings.redis_url + "\n")
        url_file.chmod(0o600)
    try:
        _serve_forever(_run_main(settings, started, embedded=embedded is not None), use_uvloop=settings.uvloop)
    finally:
        if embedded is not None:
            url_file.unlink(missing_ok=True)
            embedded.stop()
        (settings.data_path / SIMULATE_FILE).unlink(missing_ok=True)
    print("Switchboard stopped.", flush=True)
    return 0


# ---------------------------------------------------------------- check


def cmd_check(settings: Settings, environ: Mapping[str, str]) -> int:
    """Print what is enabled and what is misconfigured; exit 1 on any problem."""
    from switchboard.checks import check_command

    return check_command(settings, environ)


def _refuse_bad_config(settings: Settings, command: str) -> None:
    """Refuse to start on anything ``check`` reports as a problem (Redis is checked by connecting)."""
    from switchboard.checks import config_problems

    problems = config_problems(settings)
    if problems:
        listed = "\n".join(f"  - {problem}" for problem in problems)
        raise ConfigError(
            f"`switchboard {command}` refuses to start; fix these first (see `switchboard check`):\n{listed}"
        )


def _warn_unknown_variables(settings: Settings, environ: Mapping[str, str]) -> None:
    from switchboard.checks import unknown_variables

    for warning in unknown_variables(environ, settings):
        logger.warning("%s", warning)


# ---------------------------------------------------------------- simulate, sessions, agents


def cmd_simulate(settings: Settings, channel: str, text: str, timeout: float) -> int:
    """Send a correctly signed platform request to the running gateway and print the captured reply."""
    from switchboard.simulate import simulate

    return asyncio.run(simulate(settings, channel, text, wait_s=timeout))


def cmd_sessions(settings: Settings, action: str, key: str | None, limit: int) -> int:
    """``sessions list`` / ``sessions show KEY`` / ``sessions stop KEY``."""
    from switchboard.sessions import sessions_command

    return sessions_command(settings, action, key, limit)


def cmd_agents(settings: Settings, action: str, name: str | None) -> int:
    """``agents list|show NAME|validate``."""
    from switchboard.agents import agents_command

    return agents_command(settings, action, name)


# ---------------------------------------------------------------- entry


_ENV_HELP = (
    "Configuration comes from SWITCHBOARD_* environment variables (nested with __, e.g. "
    "SWITCHBOARD_TELEGRAM__BOT_TOKEN) and the YAML file named by SWITCHBOARD_CONFIG; see the README."
)


def _command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser], name: str, summary: str, description: str
) -> argparse.ArgumentParser:
    command = sub.add_parser(
        name, help=summary, description=f"{description}\n\n{_ENV_HELP}", formatter_class=_Formatter
    )
    command.set_defaults(command_parser=command)
    return command


class _Formatter(argparse.HelpFormatter):
    """Wraps each paragraph of a description on its own, and shows an option's default when it has one."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        return "\n\n".join(super(_Formatter, self)._fill_text(part, width, indent) for part in text.split("\n\n"))

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if action.default not in (None, argparse.SUPPRESS) and action.option_strings and "%(default)" not in text:
            text += " (default: %(default)s)"
        return text


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="switchboard",
        description="Switchboard: connect AI agents to the chat apps people already use.\n\n" + _ENV_HELP,
        formatter_class=_Formatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="what to do (COMMAND --help)")
    _command(
        sub,
        "run",
        "all-in-one: embedded Redis, web tier, one worker (Ctrl-C stops everything)",
        "Start everything on this machine: an embedded Redis-compatible server (unless SWITCHBOARD_REDIS_URL is "
        "set), the web tier on SWITCHBOARD_HOST:SWITCHBOARD_PORT, one worker, and a simulated Telegram when no "
        "bot token is set. Refuses to start on any problem `switchboard check` reports.",
    )
    _command(
        sub,
        "web",
        "the web tier: webhooks, web chat, /healthz, /metrics (needs SWITCHBOARD_REDIS_URL)",
        "Serve webhooks, the web chat and its API, /healthz and /metrics on SWITCHBOARD_HOST:SWITCHBOARD_PORT. "
        "Needs SWITCHBOARD_REDIS_URL; run as many as you like behind a load balancer.",
    )
    _command(
        sub,
        "worker",
        "a worker: agent runs and deliveries (needs SWITCHBOARD_REDIS_URL)",
        "Run agent turns and deliver their replies, many sessions at once. Needs SWITCHBOARD_REDIS_URL; run as "
        "many as you like, on any machine that reaches that Redis.",
    )
    _command(
        sub,
        "check",
        "validate configuration and credentials, ping Redis, print what is enabled",
        "Print the configuration in effect (config file, data directory, model, Redis, channels, agents), warn "
        "about SWITCHBOARD_* variables that no setting reads, and list every problem. Exit status 1 when there "
        "is a problem; `run`, `web` and `worker` refuse to start on the same problems.",
    )
    sim = _command(
        sub,
        "simulate",
        "send a signed platform request to a running gateway, print the reply",
        "Send TEXT as a user of CHANNEL to the gateway started by `switchboard run` in this directory (found "
        "through SWITCHBOARD_DATA_DIR) and print the reply. Telegram needs `run` without a bot token, so that "
        "its built-in fake Bot API captures the reply.",
    )
    sim.add_argument("channel", choices=["telegram", "web"], help="the channel to speak as a user of")
    sim.add_argument("text", help="the message text to send")
    sim.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the reply")
    sessions = _command(
        sub,
        "sessions",
        "list sessions, show one session's timeline, or stop its running turn",
        "list: the most recently active sessions. show KEY: one session's event timeline. stop KEY: stop the "
        "turn running for a session. Uses SWITCHBOARD_REDIS_URL, or else the embedded server of a "
        "`switchboard run` serving SWITCHBOARD_DATA_DIR.",
    )
    sessions.add_argument("action", choices=["list", "show", "stop"], help="what to do")
    sessions.add_argument("key", nargs="?", help="session key (show, stop), as `sessions list` prints it")
    sessions.add_argument("--limit", type=int, default=50, help="most sessions (list) or events (show) to print")
    agents = _command(
        sub,
        "agents",
        "list agents, show one, or validate them all",
        "list: every agent with its status and model. show NAME: one agent's profile, model, limits and tools. "
        "validate: every agent's problems (exit status 1 when there is one). Reads the YAML file only.",
    )
    agents.add_argument("action", choices=["list", "show", "validate"], help="what to do")
    agents.add_argument("name", nargs="?", help="agent name (show)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``switchboard`` console script."""
    args = _parser().parse_args(argv)
    if args.command == "sessions" and args.action in {"show", "stop"} and not args.key:
        args.command_parser.error(f"`sessions {args.action}` needs a session KEY (see `switchboard sessions list`)")
    if args.command == "agents" and args.action == "show" and not args.name:
        args.command_parser.error("`agents show` needs an agent NAME (see `switchboard agents list`)")
    try:
        settings = load_settings()
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2
    _configure_logging(settings.log_level)
    try:
        if args.command in {"run", "web", "worker"}:
            _refuse_bad_config(settings, args.command)
            _warn_unknown_variables(settings, os.environ)
            # conversation text lives in the data dir (AOF, workspaces, result files): this user only
            os.umask(0o077)
            if args.command != "web":
                from switchboard.queue.embedded import make_private_dir

                make_private_dir(settings.data_path)
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
            return cmd_check(settings, os.environ)
        if args.command == "simulate":
            return cmd_simulate(settings, args.channel, args.text, args.timeout)
        if args.command == "sessions":
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
