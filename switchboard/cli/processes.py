"""The long-running process roles: the web tier, a worker, and ``switchboard run`` (everything in one process).

Started by :mod:`switchboard.cli.main`, which reads the settings and configures logging.
"""

from __future__ import annotations

import asyncio
import errno
import gc
import json
import shutil
import signal
import socket
import sys
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from switchboard import tracing
from switchboard.channels.registry import FakePlatform
from switchboard.cli.sessions import REDIS_URL_FILE
from switchboard.cli.simulate import SIMULATE_FILE
from switchboard.errors import ConfigError, QueueUnavailableError
from switchboard.settings import Settings

__all__ = [
    "DEMO_OFFLINE_DELAY_MS",
    "SIMULATE_FILE",
    "require_layout",
    "require_redis",
    "run_all_in_one",
    "serve_forever",
    "serve_web",
    "serve_worker",
    "simulated_channels",
    "stop_event",
    "web_main",
    "worker_main",
]

DEMO_OFFLINE_DELAY_MS = 500
"""``switchboard run`` paces the offline model over this long unless SWITCHBOARD_OFFLINE__DELAY_MS is set."""


def require_redis(settings: Settings, command: str) -> str:
    """The Redis URL a role without an embedded server needs.

    Raises:
        ConfigError: ``SWITCHBOARD_REDIS_URL`` is not set.
    """
    if not settings.redis_url:
        raise ConfigError(
            f"`switchboard {command}` needs SWITCHBOARD_REDIS_URL (e.g. redis://localhost:6379/0); "
            "only `switchboard run` starts an embedded server",
            field="redis_url",
        )
    return settings.redis_url


def require_layout(url: str, role: str) -> None:
    """Refuse to start on data in a key layout this release does not read; stamp an empty database (at start, once).

    Raises:
        LayoutError: the data is of the release before (run ``switchboard migrate``), half-migrated, or newer.
        QueueUnavailableError: Redis cannot be reached.
    """
    from redis.exceptions import ConnectionError as RedisConnectionError

    from switchboard.cli.checks import redacted_url
    from switchboard.queue.connection import sync_client
    from switchboard.queue.migrations import check_layout

    client = sync_client(url)
    try:
        check_layout(client, role)
    except (RedisConnectionError, OSError) as err:
        raise QueueUnavailableError(
            f"cannot reach Redis at {redacted_url(url)}: {err}; start it (or fix SWITCHBOARD_REDIS_URL) and try again"
        ) from None
    finally:
        client.close()


def stop_event() -> asyncio.Event:
    """An event set by SIGINT or SIGTERM."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    return stop


# ---------------------------------------------------------------- processes


def serve_forever(main: Coroutine[Any, Any, None], *, use_uvloop: bool) -> None:
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


def _port_in_use(settings: Settings) -> ConfigError:
    return ConfigError(
        f"port {settings.port} on {settings.host} is already in use: set SWITCHBOARD_PORT to a free port "
        "(or stop the other process)",
        field="port",
    )


def _refuse_a_busy_port(settings: Settings) -> None:
    """Raise at once when another process listens on the port; other bind errors are left to the real start."""
    if not settings.port:
        return
    try:
        probe = socket.create_server((settings.host, settings.port))
    except OSError as err:
        if err.errno == errno.EADDRINUSE:
            raise _port_in_use(settings) from None
        return
    probe.close()


async def serve_web(settings: Settings, stop: asyncio.Event, *, ready: Callable[[str], None] | None = None) -> None:
    """Serve the web tier until ``stop`` is set; ``ready`` gets its URL once it listens.

    Raises:
        ConfigError: the port is in use or cannot be bound.
    """
    from aiohttp import web

    from switchboard.web.app import create_app
    from switchboard.web.server import GuardedAppRunner

    _refuse_a_busy_port(settings)  # before the app starts anything (connections, listeners) it would stop again
    # header/body timeouts and a connection cap (SWITCHBOARD_HTTP__*)
    runner = GuardedAppRunner(create_app(settings), settings.http, access_log=None, shutdown_timeout=2.0)
    await runner.setup()
    site = web.TCPSite(runner, settings.host, settings.port)
    try:
        await site.start()
    except OSError as err:
        await runner.cleanup()  # closes what the app opened at start-up (no "Unclosed client session")
        if err.errno == errno.EADDRINUSE:
            raise _port_in_use(settings) from None
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


async def serve_worker(settings: Settings, stop: asyncio.Event) -> None:
    """Run one worker until ``stop`` is set.

    Raises:
        QueueUnavailableError: Redis cannot be reached.
    """
    from redis.exceptions import ConnectionError as RedisConnectionError

    from switchboard.cli.checks import redacted_url
    from switchboard.cli.worker import run_worker

    # What start-up loaded lives as long as the process: keep it out of the collector's full passes. A turn allocates
    # thousands of short-lived objects; a young generation of 10,000 (CPython's default is 700) collects them in far
    # fewer passes (docs/performance.md).
    gc.freeze()
    gc.set_threshold(10_000, 10, 10)
    try:
        await run_worker(settings, stop)
    except (RedisConnectionError, OSError) as err:  # e.g. started before its Redis: one line, not a traceback
        url = redacted_url(settings.redis_url or "")
        raise QueueUnavailableError(
            f"cannot reach Redis at {url}: {err}; start it (or fix SWITCHBOARD_REDIS_URL) and try again"
        ) from None


async def web_main(settings: Settings) -> None:
    """``switchboard web``."""
    stop = stop_event()
    traces = tracing.configure("switchboard-web")  # before the app is built: it times webhooks only when recording
    try:
        await serve_web(settings, stop, ready=lambda url: print(f"Switchboard web tier listening on {url}", flush=True))
    finally:
        traces.shutdown()  # exports the spans still batched


async def worker_main(settings: Settings) -> None:
    """``switchboard worker``."""
    stop = stop_event()
    traces = tracing.configure("switchboard-worker")
    try:
        await serve_worker(settings, stop)
    finally:
        traces.shutdown()


async def _run_main(settings: Settings, started: float, *, embedded: bool) -> None:
    stop = stop_event()
    traces = tracing.configure("switchboard")  # web tier and worker in one process: one service
    fakes = await simulated_channels(settings)
    try:
        await _run_all(settings, started, stop, simulated=sorted(fakes), embedded=embedded)
    finally:
        for fake in fakes.values():
            await fake.stop()
        traces.shutdown()


async def _run_all(
    settings: Settings, started: float, stop: asyncio.Event, *, simulated: list[str], embedded: bool
) -> None:
    from switchboard.cli.checks import redacted_url
    from switchboard.cli.sandbox import shell_line, startup_choice

    web_ready = asyncio.Event()
    url_box: list[str] = []

    def ready(url: str) -> None:
        url_box.append(url)
        web_ready.set()

    tasks = [
        asyncio.create_task(serve_web(settings, stop, ready=ready), name="web"),
        asyncio.create_task(serve_worker(settings, stop), name="worker"),
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
    _write_simulate_file(settings, url, simulated)
    print(
        f"\n  Switchboard is ready in {time.monotonic() - started:.1f} s\n"
        f"  Web chat:  {url}\n"
        f"  Model:     {settings.default_model}\n"
        f"  Redis:     {redis_line}\n"
        f"  Shell:     {shell_line(startup_choice(settings), settings)}\n"
        + "".join(_channel_lines(settings, simulated))
        + "  Press Ctrl-C to stop.\n",
        flush=True,
    )
    await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    stop.set()  # one of them failed (or both ended): never keep a web tier up without its worker
    results = await asyncio.gather(*tasks, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException) and not isinstance(result, asyncio.CancelledError):
            raise result


async def simulated_channels(settings: Settings) -> dict[str, FakePlatform]:
    """Under ``run``: a built-in fake platform API for each channel without credentials, so ``simulate`` works."""
    from switchboard.channels import registry

    fakes: dict[str, FakePlatform] = {}
    try:
        for factory in registry.factories():
            sim = registry.simulation(factory)
            if sim is None or registry.env_block(settings, factory).enabled:
                continue
            block, fakes[factory.name] = await sim.start(registry.env_block(settings, factory))
            settings.set_channel_block(factory.name, block)
    except BaseException:
        for fake in fakes.values():
            await fake.stop()
        raise
    return fakes


def invocation(argv0: str | None = None, cwd: Path | None = None) -> str:
    """How to run this ``switchboard`` again from a new shell in this directory.

    ``switchboard`` when that name on ``PATH`` is this very script; else its path (``.venv/bin/switchboard`` after
    ``make run``, whose virtual environment a new shell has not activated); ``python -m switchboard`` as it was
    started otherwise.
    """
    script = Path(argv0 if argv0 is not None else sys.argv[0])
    if script.name != "switchboard":  # python -m switchboard
        return f"{sys.executable} -m switchboard"
    found = shutil.which("switchboard")
    if found is not None and Path(found).resolve() == script.resolve():
        return "switchboard"
    here = (cwd or Path.cwd()).resolve()
    full = script.resolve() if script.is_absolute() else (here / script)
    try:
        return str(full.relative_to(here))
    except ValueError:
        return str(full)


def _channel_lines(settings: Settings, simulated: list[str]) -> list[str]:
    from switchboard.channels import registry

    command = invocation()
    lines: list[str] = []
    for factory in registry.factories():
        if factory.builtin:
            continue
        label = f"{factory.name.capitalize()}:"
        if factory.name in simulated:
            lines.append(f'  {label:<10} simulated (try: {command} simulate {factory.name} "hello")\n')
        elif registry.env_block(settings, factory).enabled:
            lines.append(f"  {label:<10} enabled (`{command} check` shows how it receives)\n")
    return lines


def _write_simulate_file(settings: Settings, gateway_url: str, simulated: list[str]) -> None:
    from switchboard.channels import registry

    payload: dict[str, Any] = {"gateway_url": gateway_url}
    for name in simulated:
        factory = registry.factory(name)
        sim = registry.simulation(factory) if factory is not None else None
        if factory is not None and sim is not None:
            payload[name] = sim.details(registry.env_block(settings, factory))
    path = settings.data_path / SIMULATE_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.touch(mode=0o600)
    path.chmod(0o600)  # made-up secrets only, but secrets all the same
    path.write_text(json.dumps(payload))


def run_all_in_one(settings: Settings) -> int:
    """All-in-one: embedded server (unless a URL is set), web tier, one worker, simulated platforms."""
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
        require_layout(settings.redis_url, "run")
        serve_forever(_run_main(settings, started, embedded=embedded is not None), use_uvloop=settings.uvloop)
    finally:
        if embedded is not None:
            url_file.unlink(missing_ok=True)
            embedded.stop()
        (settings.data_path / SIMULATE_FILE).unlink(missing_ok=True)
    print("Switchboard stopped.", flush=True)
    return 0
