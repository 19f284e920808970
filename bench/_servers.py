"""Servers the benchmarks start as separate processes: the baselines and the fake Telegram Bot API.

``python -m bench._servers aiohttp --port P``
    the raw aiohttp hello-world: reads the body, answers 200 (the ceiling on one core).
``python -m bench._servers aiohttp-uvloop --port P``
    the same on uvloop's event loop (``switchboard web`` runs on uvloop when it is installed).
``python -m bench._servers ptb --port P --api URL``
    python-telegram-bot's own ``Application.run_webhook`` with a no-op handler, checking the secret token,
    its Bot API pointed at ``URL`` (the fake) for ``getMe`` and ``setWebhook``.
``python -m bench._servers fake-telegram --port P``
    :class:`switchboard.channels.telegram.fake.platform.FakeTelegram` on its own core, so the replies' arrival times are
    taken by a process the load generator does not slow down.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal

from aiohttp import web

from bench._harness import BOT_TOKEN, SECRET_TOKEN

TELEGRAM_PATH = "webhooks/telegram"


def serve_aiohttp(port: int, *, uvloop: bool = False) -> None:
    """A raw aiohttp handler returning 200 for any POST (the body is read, as any real handler would)."""

    async def hello(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(text="ok")

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/healthz", health)
    app.router.add_post("/{tail:.*}", hello)
    loop = None
    if uvloop:
        import uvloop as uv

        loop = uv.new_event_loop()
    web.run_app(app, host="127.0.0.1", port=port, access_log=None, print=None, loop=loop)


def serve_ptb(port: int, api: str) -> None:
    """python-telegram-bot's webhook server (tornado) with a no-op handler for every update."""
    from telegram import Update
    from telegram.ext import Application, ContextTypes, TypeHandler

    async def noop(update: Update, context: ContextTypes.DEFAULT_TYPE) -> None:
        return None

    application = Application.builder().token(BOT_TOKEN).base_url(f"{api.rstrip('/')}/bot").build()
    application.add_handler(TypeHandler(Update, noop))
    application.run_webhook(
        listen="127.0.0.1",
        port=port,
        url_path=TELEGRAM_PATH,
        secret_token=SECRET_TOKEN,
        webhook_url=f"http://127.0.0.1:{port}/{TELEGRAM_PATH}",
        bootstrap_retries=0,
    )


def serve_fake_telegram(port: int) -> None:
    """The fake Bot API until SIGTERM."""
    from switchboard.channels.telegram.fake.platform import FakeTelegram

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        fake = FakeTelegram(token=BOT_TOKEN)
        await fake.start(port=port)
        try:
            await stop.wait()
        finally:
            await fake.stop()

    asyncio.run(main())


def main() -> None:
    """Parse the command line and serve."""
    logging.basicConfig(level=logging.WARNING)
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("server", choices=["aiohttp", "aiohttp-uvloop", "ptb", "fake-telegram"])
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--api", default="", help="Bot API root for ptb (the fake's URL)")
    ns = p.parse_args()
    if ns.server in ("aiohttp", "aiohttp-uvloop"):
        serve_aiohttp(ns.port, uvloop=ns.server == "aiohttp-uvloop")
    elif ns.server == "ptb":
        serve_ptb(ns.port, ns.api)
    else:
        serve_fake_telegram(ns.port)


if __name__ == "__main__":
    main()
