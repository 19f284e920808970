"""``switchboard schedules add|list|remove|run-now``: operators' scheduled jobs, from any terminal.

Like ``switchboard sessions``, it uses ``SWITCHBOARD_REDIS_URL``, or else the embedded server of a
``switchboard run`` serving the data directory. The jobs of the YAML ``schedules:`` block are stored by the workers
at start; these commands see and run them too.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from switchboard.cli.sessions import redis_url_for, with_redis
from switchboard.settings import Settings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from switchboard.queue.schedules import JobView

__all__ = ["add_schedule_parser", "schedules_command"]


def add_schedule_parser(command: argparse.ArgumentParser) -> None:
    """The ``schedules`` command's arguments."""
    command.add_argument("action", choices=["add", "list", "remove", "run-now"], help="what to do")
    command.add_argument("id", nargs="?", help="the job id (add, remove, run-now)")
    command.add_argument("--channel", help="add: the channel of the conversation (telegram, whatsapp, ...)")
    command.add_argument("--to", dest="conversation", help="add: the platform's conversation id (chat, number)")
    command.add_argument("--account", default="default", help="add: the channel account")
    command.add_argument("--agent", default="", help="add: the agent (default: the YAML file's default_agent)")
    command.add_argument("--tenant", help="add: the tenant (default: the YAML file's); list: only this tenant's")
    command.add_argument("--thread", help="add: the platform thread, where the platform has threads")
    when = command.add_mutually_exclusive_group()
    when.add_argument("--at", help="add: run once at this ISO 8601 time (2026-12-24T09:00, read in --timezone)")
    when.add_argument("--cron", help="add: run on this five-field cron expression ('0 9 * * mon-fri')")
    command.add_argument("--timezone", default="UTC", help="add: IANA time zone of --cron and of --at")
    what = command.add_mutually_exclusive_group()
    what.add_argument("--message", help="add: send this text as it is")
    what.add_argument("--turn", help="add: run an agent turn on this prompt")
    command.add_argument("--misfire", choices=["run_once", "skip"], default="run_once", help="add: a late occurrence")
    command.add_argument("--grace", type=int, default=300, help="add: seconds an occurrence may be late")
    command.add_argument("--template", help="add: WhatsApp template name:language, sent outside the 24-hour window")
    command.add_argument("--session", help="list: only this session's jobs")
    command.add_argument("--json", action="store_true", help="list: one JSON object per line")


def _spec_body(settings: Settings, args: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": args.id,
        "tenant": args.tenant or settings.file.tenant,
        "target": {
            "channel": args.channel,
            "conversation": args.conversation,
            "account": args.account,
            "agent": args.agent or settings.file.default_agent,
            "thread": args.thread,
        },
        "action": "turn" if args.turn else "message",
        "text": args.turn or args.message,
        "timezone": args.timezone,
        "misfire": args.misfire,
        "grace_s": args.grace,
        "created_by": "operator",
    }
    if args.at:
        body["at"] = args.at
    if args.cron:
        body["cron"] = args.cron
    if args.template:
        name, _, language = args.template.partition(":")
        body["template"] = {"name": name, "language": language}
    return body


def _when(value: float | None) -> str:
    if value is None:
        return "-"
    return dt.datetime.fromtimestamp(value, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _line(view: JobView) -> str:
    spec = view.spec
    rule = spec.cron or (spec.at.isoformat() if spec.at else "")
    last = view.last_outcome or "never ran"
    if view.last_reason:
        last += f" ({view.last_reason})"
    return (
        f"{spec.id}  {spec.action}  {rule} {spec.timezone}  next {_when(view.next_at)}  -> {view.session}\n"
        f"    fired {view.fired}, skipped {view.skipped}; last: {last}"
    )


def schedules_command(settings: Settings, args: argparse.Namespace) -> int:
    """Run one ``schedules`` action; the exit status (2: bad arguments, nothing changed)."""
    from switchboard.core.schedules import ScheduleSpec
    from switchboard.queue import schedules

    spec: ScheduleSpec | None = None
    if args.action in {"add", "remove", "run-now"} and not args.id:
        print(f"switchboard: `schedules {args.action}` needs a job ID", file=sys.stderr)
        return 2
    if args.action == "add":
        missing = [flag for flag, value in (("--channel", args.channel), ("--to", args.conversation)) if not value]
        missing += [] if (args.at or args.cron) else ["--at or --cron"]
        missing += [] if (args.message or args.turn) else ["--message or --turn"]
        if missing:
            print(f"switchboard: `schedules add` needs {', '.join(missing)}", file=sys.stderr)
            return 2
        try:
            spec = ScheduleSpec.model_validate(_spec_body(settings, args))
        except ValidationError as err:
            problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'job'}: {e['msg']}" for e in err.errors())
            print(f"switchboard: not a valid job: {problems}", file=sys.stderr)
            return 2

    async def body(redis: aioredis.Redis) -> int:
        if args.action == "add":
            assert spec is not None
            try:
                view = await schedules.create_job(redis, spec)
            except ValueError as err:
                print(f"switchboard: {err}", file=sys.stderr)
                return 2
            print(f"scheduled {view.spec.id}: next run {_when(view.next_at)}")
            return 0
        if args.action == "list":
            views = await schedules.list_jobs(redis, tenant=args.tenant, session=args.session)
            for view in views:
                print(json.dumps(view.as_dict(), default=str) if args.json else _line(view))
            if not views and not args.json:
                print("no scheduled jobs")
            return 0
        if args.action == "remove":
            if not await schedules.remove_job(redis, args.id):
                print(f"switchboard: no scheduled job {args.id!r}", file=sys.stderr)
                return 1
            print(f"removed {args.id}")
            return 0
        try:
            outcome = await schedules.run_now(redis, settings.queue, args.id)
        except KeyError:
            print(f"switchboard: no scheduled job {args.id!r}", file=sys.stderr)
            return 1
        after = await schedules.get_job(redis, args.id)
        reason = f" ({after.last_reason})" if after is not None and after.last_reason else ""
        print(f"{args.id}: {outcome}{reason}")
        return 0

    return with_redis(redis_url_for(settings), body)
