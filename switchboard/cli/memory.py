"""``switchboard memory``: the console's memory view from a shell, through the same control service.

Operators list projects and facts, show a fact's history, correct and delete facts, and connect agents to projects.
"""

from __future__ import annotations

import argparse
import dataclasses
import getpass
import json
import sys
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from switchboard.errors import ConfigError
from switchboard.settings import Settings

if TYPE_CHECKING:
    import redis.asyncio as aioredis

    from switchboard.control import OperatorScope
    from switchboard.control.memory import ChangeView, FactView, MemoryControl

__all__ = ["MEMORY_ACTIONS", "add_memory_parser", "memory_command"]

MEMORY_ACTIONS = ("projects", "facts", "show", "correct", "forget", "connect", "disconnect", "audit")
_NAMES_NEEDED = {"show": 1, "correct": 1, "forget": 1, "connect": 2, "disconnect": 2}
_SNIPPET = 100


def add_memory_parser(command: argparse.ArgumentParser) -> None:
    """The ``memory`` command's arguments."""
    command.add_argument("action", choices=MEMORY_ACTIONS, help="what to do")
    command.add_argument("names", nargs="*", help="show/correct/forget: a fact ID; connect/disconnect: AGENT PROJECT")
    command.add_argument("--tenant", help="the tenant (default: the YAML file's)")
    command.add_argument("--project", help="facts: only this project's")
    command.add_argument("--text", help="correct: the corrected fact")
    command.add_argument("--reason", help="correct, forget: why (kept with the change)")
    command.add_argument("--confidence", type=float, help="correct: a new confidence, 0 to 1 (default: kept)")
    command.add_argument("--by", help="who runs it, recorded with the change (default: cli:<login name>)")
    command.add_argument("--json", action="store_true", help="projects, facts, show, audit: JSON")


def _date(at: float | None) -> str:
    return "-" if at is None else datetime.fromtimestamp(at, UTC).strftime("%Y-%m-%d %H:%M")


def _fact_line(fact: FactView) -> str:
    text = fact.text if len(fact.text) <= _SNIPPET else fact.text[: _SNIPPET - 1] + "…"
    source = f"{fact.source['kind']}:{fact.source['ref'] or '-'}"
    return f"{fact.id}  {fact.project}  {fact.confidence:.2f}  {_date(fact.created_at)}  {source}  {text}"


def _change_line(change: ChangeView) -> str:
    by = change.actor + (f" (agent {change.agent}, run {change.run_id})" if change.agent else "")
    return f"  {_date(change.at)}  {change.op}  by {by}" + (f": {change.reason}" if change.reason else "")


def _dumps(value: Any) -> str:
    plain = dataclasses.asdict(value) if dataclasses.is_dataclass(value) and not isinstance(value, type) else value
    return json.dumps(plain, ensure_ascii=False)


def memory_command(settings: Settings, args: argparse.Namespace) -> int:
    """Run one ``memory`` action; returns the exit code (2: bad input, nothing changed; 1: not found)."""
    from switchboard.cli.sessions import redis_url_for, with_redis
    from switchboard.control import InvalidRequestError, NotFoundError, OperatorScope
    from switchboard.control.memory import MemoryControl, close_store, memory_store
    from switchboard.core.memory.config import build_embedder
    from switchboard.core.memory.embeddings import OpenAIEmbedder

    needed = _NAMES_NEEDED.get(args.action, 0)
    if len(args.names) != needed:
        what = {0: "no argument", 1: "a fact ID", 2: "AGENT PROJECT"}[needed]
        print(f"switchboard: `memory {args.action}` takes {what}", file=sys.stderr)
        return 2
    try:
        url = redis_url_for(settings)
    except ConfigError as err:
        print(f"switchboard: {err}", file=sys.stderr)
        return 2
    tenant = args.tenant or settings.file.tenant
    scope = OperatorScope.everything(args.by or f"cli:{getpass.getuser()}")
    store = memory_store(settings)
    embedder = build_embedder(settings.file.memory.embeddings)

    async def go(redis: aioredis.Redis) -> int:
        control = MemoryControl(settings, store, redis, embedder)
        try:
            for line in await _run(control, scope, tenant, args):
                print(line)
        except InvalidRequestError as err:
            print(f"switchboard: {err}; nothing changed", file=sys.stderr)
            return 2
        except NotFoundError as err:
            print(f"switchboard: {err}", file=sys.stderr)
            return 1
        finally:
            if isinstance(embedder, OpenAIEmbedder):
                await embedder.aclose()
            await close_store(store)
        return 0

    return with_redis(url, go)


async def _run(control: MemoryControl, scope: OperatorScope, tenant: str, args: argparse.Namespace) -> list[str]:
    from switchboard.control import InvalidRequestError

    action, names = args.action, args.names
    if action == "projects":
        projects = await control.projects(scope, args.tenant)
        if args.json:
            return [_dumps(p) for p in projects]
        return [
            f"{p.name}  tenant {p.tenant}  {p.facts} fact(s)  agents: {', '.join(p.agents + p.connected) or '-'}"
            + (f"  (connected here: {', '.join(p.connected)})" if p.connected else "")
            for p in projects
        ] or ["no projects (define them under projects: in the YAML file)"]
    if action == "facts":
        facts = await control.facts(scope, tenant, args.project)
        if args.json:
            return [_dumps(f) for f in facts]
        return [_fact_line(f) for f in facts] or [f"no facts in tenant {tenant}"]
    if action == "show":
        detail = await control.show(scope, tenant, names[0])
        if args.json:
            return [_dumps(detail)]
        fact = detail.fact
        return [
            _fact_line(fact),
            f"  text: {fact.text}",
            f"  source: {fact.source['kind']} {fact.source['ref']} quote {fact.source['quote']!r}",
            f"  run {fact.run_id}, corrected {_date(fact.updated_at)}, expires {_date(fact.expires_at)}",
            f"  links: {', '.join(fact.links) or '-'}",
            "history:",
            *[_change_line(c) for c in detail.changes],
        ]
    if action == "correct":
        if args.text is None:
            raise InvalidRequestError("give the corrected fact with --text")
        detail = await control.correct(scope, tenant, names[0], args.text, args.reason, args.confidence)
        return [f"corrected {detail.fact.id} (by {scope.operator})"]
    if action == "forget":
        change = await control.forget(scope, tenant, names[0], args.reason)
        return [f"forgot {names[0]} (by {change.actor})"]
    if action == "connect":
        view = await control.connect(scope, names[0], names[1])
        return [f"connected {names[0]} to {view.name} (tenant {view.tenant})"]
    if action == "disconnect":
        view = await control.disconnect(scope, names[0], names[1])
        return [f"disconnected {names[0]} from {view.name} (tenant {view.tenant})"]
    if action == "audit":
        entries = await control.audit(scope, tenant)
        if args.json:
            return [_dumps(e) for e in entries]
        return [
            f"{_date(e.at)}  {e.op}  {e.fact_id or e.agent}  project {e.project}  by {e.actor}" for e in entries
        ] or [f"no operator changes to memory in tenant {tenant}"]
    raise InvalidRequestError(f"unknown action {action!r}")
