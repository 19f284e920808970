"""``switchboard`` command line: wires settings, Redis, the web tier and workers together.

Logging is configured here and nowhere else.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from switchboard import __version__
from switchboard.channels.registry import CHANNEL_MODULES
from switchboard.cli.memory import add_memory_parser, memory_command
from switchboard.cli.processes import (
    require_layout,
    require_redis,
    run_all_in_one,
    serve_forever,
    web_main,
    worker_main,
)
from switchboard.cli.schedules import add_schedule_parser
from switchboard.errors import ConfigError, SwitchboardError
from switchboard.settings import Settings, load_settings
from switchboard.types import SESSION_STATES

__all__ = ["main"]

logger = logging.getLogger("switchboard")


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format="%(asctime)s %(levelname)-7s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    noisy_loggers = ("aiohttp.access", "httpx", "telegram", "slack_sdk", "discord", "rq.worker", "rq.queue")
    for noisy in (*noisy_loggers, "mcp.server.streamable_http", "mcp.server.streamable_http_manager"):
        logging.getLogger(noisy).setLevel(logging.WARNING)


# ---------------------------------------------------------------- check


def cmd_check(settings: Settings, environ: Mapping[str, str]) -> int:
    """Print what is enabled and what is misconfigured; exit 1 on any problem."""
    from switchboard.cli.checks import check_command

    return check_command(settings, environ)


def _refuse_bad_config(settings: Settings, command: str) -> None:
    """Refuse to start on anything ``check`` reports as a problem (Redis is checked by connecting)."""
    from switchboard.cli.checks import config_problems

    problems = config_problems(settings)
    if problems:
        listed = "\n".join(f"  - {problem}" for problem in problems)
        raise ConfigError(
            f"`switchboard {command}` refuses to start; fix these first (see `switchboard check`):\n{listed}"
        )


def _warn_unknown_variables(settings: Settings, environ: Mapping[str, str]) -> None:
    from switchboard.cli.checks import unknown_variables

    for warning in unknown_variables(environ, settings):
        logger.warning("%s", warning)


# ---------------------------------------------------------------- simulate, sessions, agents


def cmd_simulate(
    settings: Settings, channel: str, text: str, timeout: float, group: str | None = None, mention: bool = False
) -> int:
    """Send a correctly signed platform request to the running gateway and print the captured reply."""
    from switchboard.cli.simulate import simulate

    return asyncio.run(simulate(settings, channel, text, wait_s=timeout, group=group, mention=mention))


def cmd_sessions(settings: Settings, args: argparse.Namespace) -> int:
    """``sessions list`` / ``sessions show KEY`` / ``sessions stop KEY``."""
    from switchboard.cli.sessions import SessionsQuery, sessions_command

    query = SessionsQuery(
        limit=args.limit,
        channel=args.channel,
        agent=args.agent,
        tenant=args.tenant,
        state=args.state,
        events=args.events,
    )
    return sessions_command(settings, args.action, args.key, query)


def cmd_people(settings: Settings, args: argparse.Namespace) -> int:
    """``people list|link|unlink`` and ``budgets``."""
    from switchboard.cli.people import budgets_command, people_command

    if args.command == "budgets":
        return budgets_command(settings, args.tenant)
    return people_command(settings, args.action, args.principals, args.person, args.tenant)


def cmd_agents(settings: Settings, action: str, name: str | None) -> int:
    """``agents list|show NAME|validate``."""
    from switchboard.cli.agents import agents_command

    return agents_command(settings, action, name)


def cmd_skills(settings: Settings, action: str, target: str | None, template: str | None) -> int:
    """``skills add DIR|ZIP|--template NAME`` / ``list`` / ``show NAME[@VERSION]`` / ``remove NAME[@VERSION]``."""
    from switchboard.cli.skills import skills_command

    return skills_command(settings, action, target, template)


def cmd_telegram(settings: Settings, action: str, url: str | None, account: str) -> int:
    """``telegram set-webhook URL`` / ``delete-webhook`` / ``webhook-info`` / ``set-commands``."""
    from switchboard.cli.telegram import telegram_command

    return telegram_command(settings, action, url, account)


def cmd_console(action: str) -> int:
    """``console hash-password``: print the Argon2 hash of a password read from the terminal or stdin."""
    from switchboard.web.console.hashcli import hash_password_command

    return hash_password_command()


def cmd_api_tokens(name: str, tenant: str, scopes: str) -> int:
    """``api-tokens create``: print a new integration API token once, and the YAML entry holding its hash."""
    from switchboard.web.api.tokens import create_token_command

    return create_token_command(name, tenant, [s.strip() for s in scopes.split(",") if s.strip()])


def cmd_webhooks(settings: Settings, tenant: str, limit: int) -> int:
    """``webhooks dead-letters``: the tenant's outbound webhook deliveries that were given up on, newest first."""
    from switchboard.outbound.webhooks import dead_letters
    from switchboard.queue.connection import as_sync_redis, sync_client

    if not settings.redis_url:
        raise ConfigError("needs SWITCHBOARD_REDIS_URL", field="redis_url")
    client = as_sync_redis(sync_client(settings.redis_url))
    try:
        rows = dead_letters(client, tenant, limit)
    finally:
        client.close()
    for row in rows:
        where = f"{row['url']}  attempts={row['attempts']}"
        print(f"{row['at']}  {row['type']:<20} {row['event_id']}  {where}  {row['reason']}")
    if not rows:
        print(f"no dead-lettered webhook deliveries for tenant {tenant!r}")
    return 0


def cmd_discord(settings: Settings, action: str) -> int:
    """``discord`` (hold the gateway connections only) / ``discord register-commands``."""
    from switchboard.cli.discord import discord_command

    return discord_command(settings, action)


def cmd_access(settings: Settings, args: argparse.Namespace) -> int:
    """``access approve CODE`` / ``list`` / ``revoke PRINCIPAL``: pairing, the operators' side."""
    from switchboard.cli.access import access_command

    return access_command(
        settings, args.action, args.target, tenant=args.tenant, role=args.role, operator=args.operator
    )


def cmd_control(settings: Settings, args: argparse.Namespace) -> int:
    """``approvals``, ``reconcile``, ``dead-letters``, ``takeover``, ``say``, ``handback`` (over ``control.py``)."""
    from switchboard.cli.control import control_command

    action = getattr(args, "action", "-")
    targets = [t for t in (getattr(args, name, None) for name in ("session", "target", "key", "outcome", "text")) if t]
    return control_command(
        settings, args.command, action, targets, operator=args.operator, show_all=getattr(args, "all", False)
    )


_CONTROL_NEEDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("approvals", "approve"): ("target",),
    ("approvals", "deny"): ("target",),
    ("reconcile", "resolve"): ("session", "key", "outcome"),
    ("dead-letters", "requeue"): ("session", "target"),
}


# ---------------------------------------------------------------- entry


_ENV_HELP = (
    "Configuration comes from SWITCHBOARD_* environment variables (nested with __, e.g. "
    "SWITCHBOARD_TELEGRAM__BOT_TOKEN) and the YAML file named by SWITCHBOARD_CONFIG; see docs/configuration.md."
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
    parser.add_argument("--version", action="version", version=f"switchboard {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND", help="what to do (COMMAND --help)")
    _command(
        sub,
        "run",
        "all-in-one: embedded Redis, web tier, one worker (Ctrl-C stops everything)",
        "Start everything on this machine: an embedded Redis-compatible server (unless SWITCHBOARD_REDIS_URL is "
        "set), the web tier on SWITCHBOARD_HOST:SWITCHBOARD_PORT, one worker, and a simulated platform (a "
        "built-in fake API) for each channel without credentials. Refuses to start on any problem `switchboard "
        "check` reports.",
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
        "through SWITCHBOARD_DATA_DIR) and print the reply. A platform channel needs `run` without its "
        "credentials, so that its built-in fake API captures the reply.",
    )
    sim.add_argument("channel", choices=list(CHANNEL_MODULES), help="the channel to speak as a user of")
    sim.add_argument("text", help="the message text to send")
    sim.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the reply")
    sim.add_argument("--group", help="post in this group (Telegram: a chat id such as -1001234567890) as a member")
    sim.add_argument("--mention", action="store_true", help="with --group: mention the bot in the message")
    evals = _command(
        sub,
        "eval",
        "run evaluation scenarios (YAML) through the agent runtime, print a table, write JSON results",
        "run PATH...: run every scenario of the files (and directories) named through the agent runtime, on "
        "temporary workspaces, and check each scenario's invariants on the trajectory (docs/evals.md). Exit "
        "status 1 when a check (or a rubric) fails; with --baseline, 1 only when a strict invariant that passed in the "
        "baseline fails now (even when the mean score improved). Models and prices come from the config file, as for "
        "the worker; --variant runs every scenario per variant of the agent and prints them side by side. "
        "record SESSION: write the session kept in Redis as a replay scenario (its messages, the model's decisions, "
        "the tools' results, invariants pinning what happened) to -o FILE, or print it.",
    )
    evals.add_argument("action", choices=["run", "record"], help="what to do")
    evals.add_argument(
        "paths", type=Path, nargs="+", metavar="PATH", help="scenario files or directories (record: one SESSION key)"
    )
    evals.add_argument("--json", type=Path, dest="json_out", metavar="OUT", help="write the results (JSON) here")
    evals.add_argument("--baseline", type=Path, metavar="RESULTS", help="a results file to compare with")
    evals.add_argument("--concurrency", type=int, default=4, help="scenarios run at the same time")
    evals.add_argument("-o", "--out", type=Path, metavar="FILE", help="record: write the scenario here")
    evals.add_argument("--run", dest="run_id", metavar="RUN", help="record: the turns up to this run only")
    evals.add_argument("--operator", help="record: as this console operator, within their tenants")
    evals.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="NAME=OVERRIDES.yaml",
        help="run every scenario with these overrides of the agent (repeatable; printed side by side)",
    )
    evals.add_argument(
        "--repeat", type=int, default=1, metavar="N", help="run each scenario N times (measures over all runs)"
    )
    evals.add_argument(
        "--skip-rubrics",
        action="store_true",
        help="score the exact checks only, without calling grader models (rubrics are recorded as skipped)",
    )
    evals.add_argument(
        "--small-threshold",
        type=float,
        default=0.9,
        metavar="RATE",
        help="share of correct results a routing variant's small model must reach to be enough",
    )
    sessions = _command(
        sub,
        "sessions",
        "list sessions, show one session's conversation, or stop its running turn",
        "list: the most recently active sessions and their state (the console's words). show KEY: one session's "
        "transcript (what the user and the agent said, tool calls, approvals, operators), or with --events its "
        "raw event log. stop KEY: stop the turn running for a session. Uses SWITCHBOARD_REDIS_URL, or else the "
        "embedded server of a `switchboard run` serving SWITCHBOARD_DATA_DIR.",
    )
    sessions.add_argument("action", choices=["list", "show", "stop"], help="what to do")
    sessions.add_argument("key", nargs="?", help="session key (show, stop), as `sessions list` prints it")
    sessions.add_argument("--limit", type=int, default=50, help="most sessions (list) or lines (show) to print")
    sessions.add_argument("--channel", help="list: only this channel's sessions")
    sessions.add_argument("--agent", help="list: only this agent's sessions")
    sessions.add_argument("--tenant", help="list: only this tenant's sessions")
    sessions.add_argument("--state", choices=list(SESSION_STATES), help="list: only sessions in this state")
    sessions.add_argument("--events", action="store_true", help="show: the raw event log instead of the transcript")
    people = _command(
        sub,
        "people",
        "link one person's accounts across channels (budgets and permissions follow the person)",
        "list: each person and their principals. link P1 P2 --as PERSON: link principals (<channel>:<sender id>) "
        "to one person. unlink P: take a principal out of its person. Never guessed: only what you link.",
    )
    people.add_argument("action", choices=["list", "link", "unlink"], help="what to do")
    people.add_argument("principals", nargs="*", help="principals, e.g. telegram:42 slack:U123")
    people.add_argument("--as", dest="person", help="the person id (link)")
    people.add_argument("--tenant", help="tenant (default: the YAML file's tenant)")
    erase = _command(
        sub,
        "erase",
        "remove a person's, a session's or a whole tenant's data from every store",
        "--tenant T alone: everything of the tenant. --user U (a principal such as telegram:42, or a linked person "
        "id): the sessions only they wrote to, their links, access and budgets. --session S: one session. Prints "
        "counts per store, never content, and records one audit fact. --dry-run: count, change nothing.",
    )
    erase.add_argument("--tenant", required=True, help="the tenant")
    scope = erase.add_mutually_exclusive_group()
    scope.add_argument("--user", help="a principal (<channel>:<sender id>) or a linked person id")
    scope.add_argument("--session", help="a session key, as `sessions list` prints it")
    erase.add_argument("--dry-run", action="store_true", help="count what would be removed; change nothing")
    erase.add_argument("--by", help="who runs it, for the audit fact (default: cli:<login name>)")
    retention = _command(
        sub,
        "retention",
        "apply the retention rules now (retention: in the YAML file)",
        "run: remove what is older than its tenant's rule, per kind (history, events, workspaces, memory, knowledge, "
        "approvals, dead_letters), and print counts per tenant and kind. --dry-run: count, change nothing.",
    )
    retention.add_argument("action", choices=["run"], help="what to do")
    retention.add_argument("--dry-run", action="store_true", help="count what would be removed; change nothing")
    migrate = _command(
        sub,
        "migrate",
        "move the data of the release before to the sharded key layout (once, on a stopped deployment)",
        "Rename every session key to its shard's hash tag and fold the global counters into per-shard ones, then "
        "stamp the data with layout 2 (sb:layout). Stop every web and worker process first and back up Redis; a "
        "migration that stops half-way resumes when run again. Without SWITCHBOARD_REDIS_URL it starts the "
        "embedded server of `switchboard run`'s data directory (SWITCHBOARD_DATA_DIR) for the migration. See "
        "docs/operations/production.md.",
    )
    migrate.add_argument("--dry-run", action="store_true", help="count the keys it would move; change nothing")
    migrate.add_argument("--force", action="store_true", help="run even though some worker's liveness key is set")
    keys = _command(
        sub,
        "keys",
        "data keys for encryption at rest (SWITCHBOARD_DATA_KEYS)",
        "new [--id ID]: print a fresh key entry (put it first in SWITCHBOARD_DATA_KEYS to make it current). rotate: "
        "re-seal what is stored under older keys with the current one, then the old keys can be dropped. "
        "--dry-run: count, change nothing.",
    )
    keys.add_argument("action", choices=["new", "rotate"], help="what to do")
    keys.add_argument("--id", dest="key_id", help="new: the key's id (default: k<YYYYMMDD>)")
    keys.add_argument("--dry-run", action="store_true", help="rotate: count what would be re-sealed; change nothing")
    knowledge = _command(
        sub,
        "knowledge",
        "index agents' knowledge sources, or list what is indexed",
        "index: read each agent's knowledge sources (files next to the YAML file, URLs through egress), re-index the "
        "ones whose content changed, drop the ones no longer listed; prints each source's state (exit 1 when one "
        "failed). list: each indexed source with its id, size, summary and keywords.",
    )
    knowledge.add_argument("action", choices=["index", "list"], help="what to do")
    knowledge.add_argument("--agent", help="only this agent (default: every agent with knowledge)")
    memory = _command(
        sub,
        "memory",
        "list projects and facts, show a fact's history, correct or delete a fact, connect agents to projects",
        "projects: each project with its agents and fact count. facts: a tenant's facts (--project P). show ID: a "
        "fact with its source and change history. correct ID --text T --reason R, forget ID --reason R: recorded "
        "with who (--by) and why. connect|disconnect AGENT PROJECT: beside the YAML file's agents.<name>.projects. "
        "audit: operators' changes. See docs/memory.md.",
    )
    add_memory_parser(memory)
    budgets = _command(
        sub,
        "budgets",
        "spend of each period budget (tenant, agent, user) and the alerts reported",
        "Each live budget counter: scope, subject, period, spent/budget, thresholds already reported.",
    )
    budgets.add_argument("--tenant", help="tenant (default: the YAML file's tenant)")
    schedules = _command(
        sub,
        "schedules",
        "add, list, remove or run now a scheduled job (a message or an agent turn at a time or on cron)",
        "add ID: a job that sends --message TEXT or runs --turn PROMPT in one conversation (--channel, --to), once "
        "--at a time or on --cron, in --timezone. list: every job with its next run and what became of its last. "
        "remove ID. run-now ID: one extra occurrence now. See docs/schedules.md. Uses SWITCHBOARD_REDIS_URL, or "
        "else the embedded server of a `switchboard run` serving SWITCHBOARD_DATA_DIR.",
    )
    add_schedule_parser(schedules)
    agents = _command(
        sub,
        "agents",
        "list agents, show one, or validate them all",
        "list: every agent with its status and model. show NAME: one agent's profile, model, limits and tools. "
        "validate: every agent's problems (exit status 1 when there is one). Reads the YAML file only. drafts: the "
        "agents MCP clients proposed (never served); accept NAME writes one to agents.d/<tenant>/NAME.yaml beside "
        "the YAML file (served from each process's next start); reject NAME drops it.",
    )
    agents.add_argument("action", choices=["list", "show", "validate", "drafts", "accept", "reject"], help="what to do")
    agents.add_argument("name", nargs="?", help="agent name (show, accept, reject)")
    agents.add_argument("--tenant", default="default", help="drafts, accept, reject: whose draft agents")
    skills = _command(
        sub,
        "skills",
        "add, list, show or remove skill packages (folders with a SKILL.md)",
        "add DIR|ZIP: validate a skill (the agentskills.io SKILL.md format) and install it as a versioned package "
        "under SWITCHBOARD_DATA_DIR/skills; add --template NAME: install a shipped template. list: installed, "
        "built-in and template skills. show NAME[@VERSION]: one package's version, hash and files. remove "
        "NAME[@VERSION]: uninstall one version, or every version. Agents name skills in their YAML `skills:` list.",
    )
    mcp = _command(
        sub,
        "mcp",
        "MCP servers' tools (tools, accept); Switchboard as an MCP server (serve, clients)",
        "tools SERVER: connect to a server of the YAML's mcp_servers and list the tools it announces, each with "
        "the hash of its description and schema and whether it is new, accepted or changed since accepted. "
        "accept SERVER [TOOL]: pin the server's identity and its tools (or one tool); a tool whose description or "
        "schema changes after that is disabled until accepted again. serve --client NAME: be an MCP server over "
        "stdio for one client (its token in SWITCHBOARD_MCP_SERVE__TOKEN): a tool ask_<agent> per ready agent of "
        "its tenant, and propose_agent. clients add NAME | list | remove NAME: the clients of serve and of the web "
        "tier's /mcp (add prints the token once). See docs/mcp.md.",
    )
    mcp.add_argument("action", choices=["tools", "accept", "serve", "clients"], help="what to do")
    mcp.add_argument(
        "server", nargs="?", help="tools, accept: the server's name in mcp_servers; clients: add|list|remove"
    )
    mcp.add_argument("tool", nargs="?", help="accept: only this tool (default: every one); clients: the client's NAME")
    mcp.add_argument("--client", help="serve: the client's name (as `mcp clients add` made it)")
    mcp.add_argument("--token", help="serve: the client's token (default: SWITCHBOARD_MCP_SERVE__TOKEN)")
    mcp.add_argument("--tenant", default="default", help="clients: the tenant whose clients")
    skills.add_argument("action", choices=["add", "list", "show", "remove"], help="what to do")
    skills.add_argument("target", nargs="?", help="a folder or .zip (add); NAME or NAME@VERSION (show, remove)")
    skills.add_argument("--template", help="install the shipped template NAME (add)")
    connectors = _command(
        sub,
        "connectors",
        "list the connector packs, or show one and what an agent gets from it",
        "list: every shipped pack, its reads and writes, and the agents that switch it on. show PACK [--agent NAME]: "
        "the pack's settings (as configured under connectors.PACK), its operations with their side effect, risk, "
        "timeout and whether writes wait for approval, and the hosts it calls; with --agent, the tools, egress hosts "
        "and policy rules that agent gets. Reads the YAML file only (docs/connectors.md).",
    )
    connectors.add_argument("action", choices=["list", "show"], help="what to do")
    connectors.add_argument("pack", nargs="?", help="the pack (show)")
    connectors.add_argument("--agent", help="show: what this agent gets from the pack")
    tools = _command(
        sub,
        "tools",
        "draft REST tool declarations from an OpenAPI 3 document, or check a YAML file's declarations",
        "import openapi FILE --agent NAME --only ID,...: draft one REST tool declaration per chosen operationId of "
        "the OpenAPI 3 document FILE (YAML or JSON), for agent NAME, and print them (or write them to --out) as "
        "YAML to review and put under agents.NAME.rest_tools. Nothing is loaded or changed until you do "
        "(docs/rest-tools.md). check FILE: validate FILE as the YAML file (its REST tool declarations, with the "
        "hosts each agent may not reach) before saving it over the running one, which workers reload at their next "
        "turn.",
    )
    tools.add_argument("action", choices=["import", "check"], help="what to do")
    tools.add_argument("format", help="import: the document's format (openapi); check: the YAML file")
    tools.add_argument("file", type=Path, nargs="?", help="import: the OpenAPI 3 document (YAML or JSON)")
    tools.add_argument("--agent", help="import: the agent the tools are drafted for")
    tools.add_argument("--only", help="import: comma-separated operationIds to draft")
    tools.add_argument("--server", help="the API's base URL, when the document's servers entry is not absolute")
    tools.add_argument("--out", type=Path, help="write the drafts to this new file instead of printing them")
    discord = _command(
        sub,
        "discord",
        "hold Discord's gateway connection (needs SWITCHBOARD_REDIS_URL), or register its slash commands",
        "Without an action: hold each Discord bot's gateway connection (ordinary messages) and queue what arrives, "
        "like the web tier's listener but in a process of its own; exactly one process holds each bot's "
        "connection, so it is safe beside `web` or twice. register-commands: register /ask, /reset and /stop "
        "with Discord for every configured bot.",
    )
    discord.add_argument(
        "action", nargs="?", default="listen", choices=["listen", "register-commands"], help="what to do"
    )
    console = _command(
        sub,
        "console",
        "the operator console: make an operator's password hash",
        "hash-password: read a password (from the terminal without echo, or one line of standard input; never an "
        "argument) and print its Argon2 hash for console.operators[].password_hash in the YAML file.",
    )
    console.add_argument("action", choices=["hash-password"], help="what to do")
    api_tokens = _command(
        sub,
        "api-tokens",
        "the integration API: make a token",
        "create: print a new random token (shown only this once) and the api.tokens entry holding its SHA-256 for "
        "the YAML file; the gateway never stores the token itself.",
    )
    api_tokens.add_argument("action", choices=["create"], help="what to do")
    hooks = _command(
        sub,
        "webhooks",
        "outbound webhooks: list deliveries given up on",
        "dead-letters: the tenant's webhook deliveries that ran out of attempts or were refused (an address not "
        "allowed, a 4xx answer), newest first, with the event id, URL and reason.",
    )
    hooks.add_argument("action", choices=["dead-letters"], help="what to do")
    hooks.add_argument("--tenant", default="default", help="whose deliveries")
    hooks.add_argument("--limit", type=int, default=50, help="at most this many")
    api_tokens.add_argument("--name", required=True, help="who uses it (signed as api:NAME)")
    api_tokens.add_argument("--tenant", default="default", help="the tenant it reaches")
    api_tokens.add_argument(
        "--scopes",
        required=True,
        help="comma-separated: messages:send, turns:start, conversations:read, conversations:history",
    )
    telegram = _command(
        sub,
        "telegram",
        "register the webhook with Telegram (with the secret token), remove it, or show it",
        "set-webhook URL: tell Telegram to post updates to URL (the gateway's public https:// address, e.g. "
        "https://bot.example.com/webhooks/telegram) with SWITCHBOARD_TELEGRAM__SECRET_TOKEN, which the gateway "
        "checks on every request. delete-webhook: stop Telegram posting (for long polling, "
        "SWITCHBOARD_TELEGRAM__TRANSPORT=polling). webhook-info: where Telegram posts now, and its last error.",
    )
    telegram.add_argument(
        "action", choices=["set-webhook", "delete-webhook", "webhook-info", "set-commands"], help="what to do"
    )
    telegram.add_argument("url", nargs="?", help="the webhook URL (set-webhook)")
    telegram.add_argument("--account", default="default", help="the Telegram account (a YAML account name)")
    _control_parsers(sub)
    return parser


def _control_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    where = (
        "Uses SWITCHBOARD_REDIS_URL, or else the embedded server of a `switchboard run` serving SWITCHBOARD_DATA_DIR. "
        "What you do is signed as console:<--operator> (default: your login name) and reaches the session in order "
        "with its conversation; the console does the same through the same service."
    )
    approvals = _command(
        sub,
        "approvals",
        "list pending approvals, or approve / deny one",
        f"list: every pending approval (id, session, tool, who asked, expiry, reason). approve ID / deny ID: decide "
        f"it (it counts where the policy lets operators decide). {where}",
    )
    approvals.add_argument("action", choices=["list", "approve", "deny"], help="what to do")
    approvals.add_argument("target", nargs="?", metavar="ID", help="the approval id (approve, deny)")
    reconcile = _command(
        sub,
        "reconcile",
        "list effects in doubt (started, outcome unknown), or say what became of one",
        "list: write effects whose worker was lost mid-call; they are never performed again automatically. resolve "
        f"SESSION KEY done|failed: record whether it happened (a re-run of its turn then gets that outcome). {where}",
    )
    reconcile.add_argument("action", choices=["list", "resolve"], help="what to do")
    reconcile.add_argument("session", nargs="?", help="session key (resolve)")
    reconcile.add_argument("key", nargs="?", help="the effect's idempotency key (resolve)")
    reconcile.add_argument("outcome", nargs="?", choices=["done", "failed"], help="what happened (resolve)")
    reconcile.add_argument("--all", action="store_true", help="also list resolved effects (list)")
    dead = _command(
        sub,
        "dead-letters",
        "list dead-lettered messages, or requeue one",
        f"list: the most recent dead letters (id, session, attempts, reason). requeue SESSION ID: ingest its messages "
        f"into their session again (once; a second requeue is a duplicate). {where}",
    )
    dead.add_argument("action", choices=["list", "requeue"], help="what to do")
    dead.add_argument("session", nargs="?", help="session key (requeue)")
    dead.add_argument("target", nargs="?", metavar="ID", help="the dead letter id, as `list` prints it (requeue)")
    takeover = _command(
        sub,
        "takeover",
        "take a conversation over from its agent",
        f"The agent pauses; the user's messages are recorded, not answered; `say` reaches the user. {where}",
    )
    takeover.add_argument("session", help="session key, as `switchboard sessions list` prints it")
    say = _command(sub, "say", "send a message to the user of a conversation as an operator", where)
    say.add_argument("session", help="session key")
    say.add_argument("text", help="what to send")
    handback = _command(
        sub,
        "handback",
        "hand a conversation back to its agent",
        f"The agent resumes with the operator's messages in its history. {where}",
    )
    handback.add_argument("session", help="session key")
    access = _command(
        sub,
        "access",
        "approve a sender's pairing code, list paired senders and open requests, or revoke one",
        "approve CODE: pair the sender who was given CODE (their next message is answered). list: paired senders "
        "and senders holding a live code, per tenant. revoke PRINCIPAL (telegram:42): unpair; a web process that "
        f"found them paired believes it for up to access.pairing.recheck_s more. {where}",
    )
    access.add_argument("action", choices=["approve", "list", "revoke"], help="what to do")
    access.add_argument("target", nargs="?", help="the code (approve) or the principal (revoke)")
    access.add_argument("--tenant", help="only this tenant (default: every tenant the YAML file names)")
    access.add_argument(
        "--role",
        choices=["admin", "user", "guest"],
        help="the paired sender's role (approve; default: access.pairing.role, itself user by default)",
    )
    for command in (approvals, reconcile, dead, takeover, say, handback, access):
        command.add_argument("--operator", help="your operator name (signed as console:NAME; default: login name)")


def _check_mcp_args(args: argparse.Namespace) -> None:
    if args.action in {"tools", "accept"} and not args.server:
        args.command_parser.error(f"`mcp {args.action}` needs a SERVER (a name in mcp_servers)")
    if args.action == "serve" and not args.client:
        args.command_parser.error("`mcp serve` needs --client NAME (see `switchboard mcp clients list`)")
    if args.action == "clients" and args.server not in {"add", "list", "remove"}:
        args.command_parser.error("`mcp clients` needs add NAME, list or remove NAME")


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``switchboard`` console script."""
    parser = _parser()
    if not (sys.argv[1:] if argv is None else argv):  # bare `switchboard`: what it can do, not an error
        parser.print_help()
        return 0
    args = parser.parse_args(argv)
    if args.command == "sessions" and args.action in {"show", "stop"} and not args.key:
        args.command_parser.error(f"`sessions {args.action}` needs a session KEY (see `switchboard sessions list`)")
    if args.command == "telegram" and args.action == "set-webhook" and not args.url:
        args.command_parser.error("`telegram set-webhook` needs the URL Telegram should post to")
    if args.command == "agents" and args.action in {"accept", "reject"} and not args.name:
        args.command_parser.error(f"`agents {args.action}` needs the draft's NAME (see `switchboard agents drafts`)")
    if args.command == "agents" and args.action == "show" and not args.name:
        args.command_parser.error("`agents show` needs an agent NAME (see `switchboard agents list`)")
    if args.command == "mcp":
        _check_mcp_args(args)
    if args.command == "console":  # needs no settings: works before the YAML file is valid
        return cmd_console(args.action)
    if args.command == "keys" and args.action == "new":  # needs no settings either
        from switchboard.cli.retention import keys_new_command

        return keys_new_command(args.key_id)
    if args.command == "api-tokens":  # needs no settings either
        return cmd_api_tokens(args.name, args.tenant, args.scopes)
    for name in _CONTROL_NEEDS.get((args.command, getattr(args, "action", "")), ()):
        if not getattr(args, name, None):
            args.command_parser.error(f"`{args.command} {args.action}` needs {name.replace('target', 'an ID')}")
    try:
        settings = load_settings()
        from switchboard.channels.registry import check_env_blocks

        check_env_blocks(settings)  # each channel's SWITCHBOARD_<NAME>__* block, as strictly as the rest
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
            return run_all_in_one(settings)
        if args.command == "web":
            require_layout(require_redis(settings, "web"), "web")
            serve_forever(web_main(settings), use_uvloop=settings.uvloop)
            return 0
        if args.command == "worker":
            require_layout(require_redis(settings, "worker"), "worker")
            serve_forever(worker_main(settings), use_uvloop=settings.uvloop)
            return 0
        if args.command == "check":
            return cmd_check(settings, os.environ)
        if args.command == "simulate":
            return cmd_simulate(settings, args.channel, args.text, args.timeout, args.group, args.mention)
        if args.command == "eval" and args.action == "record":
            from switchboard.cli.evals import record_command

            if len(args.paths) != 1:
                print("switchboard: eval record takes one SESSION key", file=sys.stderr)
                return 2
            return record_command(
                settings, args.paths[0].as_posix(), out=args.out, run_id=args.run_id, operator=args.operator
            )
        if args.command == "eval":
            from switchboard.cli.evals import eval_command, eval_setup, parse_variant

            return eval_command(
                args.paths,
                json_out=args.json_out,
                baseline=args.baseline,
                concurrency=args.concurrency,
                agents=settings.file.agents,
                setup=eval_setup(settings, rubrics=not args.skip_rubrics),
                variants=[parse_variant(v) for v in args.variant],
                small_threshold=args.small_threshold,
                repeat=args.repeat,
            )
        if args.command == "sessions":
            return cmd_sessions(settings, args)
        if args.command in {"people", "budgets"}:
            return cmd_people(settings, args)
        if args.command == "erase":
            from switchboard.cli.erase import erase_command

            return erase_command(
                settings, args.tenant, user=args.user, session=args.session, dry_run=args.dry_run, by=args.by
            )
        if args.command == "retention":
            from switchboard.cli.retention import retention_run_command

            return retention_run_command(settings, dry_run=args.dry_run)
        if args.command == "migrate":
            from switchboard.cli.migrate import migrate_command

            return migrate_command(settings, dry_run=args.dry_run, force=args.force)
        if args.command == "keys":
            from switchboard.cli.retention import keys_rotate_command

            return keys_rotate_command(settings, dry_run=args.dry_run)
        if args.command == "knowledge":
            from switchboard.cli.knowledge import knowledge_command
            from switchboard.cli.sessions import redis_url_for, with_redis
            from switchboard.cli.worker import provider_config
            from switchboard.control.memory import memory_store

            return knowledge_command(
                settings,
                args.action,
                args.agent,
                provider_config(settings),
                memory_store(settings),
                lambda body: with_redis(redis_url_for(settings), body),
            )
        if args.command == "memory":
            return memory_command(settings, args)
        if args.command == "schedules":
            from switchboard.cli.schedules import schedules_command

            return schedules_command(settings, args)
        if args.command == "agents" and args.action in {"drafts", "accept", "reject"}:
            from switchboard.cli.drafts import drafts_command

            return drafts_command(settings, args.action, args.name, args.tenant)
        if args.command == "agents":
            return cmd_agents(settings, args.action, args.name)
        if args.command == "skills":
            return cmd_skills(settings, args.action, args.target, args.template)
        if args.command == "tools":
            from switchboard.cli.tools import check_declarations, import_openapi

            if args.action == "check":
                return check_declarations(settings, Path(args.format))
            if args.format != "openapi" or args.file is None or not args.agent or not args.only:
                raise ConfigError("usage: switchboard tools import openapi FILE --agent NAME --only ID,...")
            return import_openapi(settings, args.file, args.agent, args.only, server=args.server, out=args.out)
        if args.command == "connectors":
            from switchboard.cli.connectors import connectors_command

            return connectors_command(settings, args.action, args.pack, args.agent)
        if args.command == "mcp":
            from switchboard.cli.mcp import mcp_command

            if args.action == "serve":
                from switchboard.cli.mcp import serve_command

                return serve_command(settings, args.client, args.token)
            if args.action == "clients":
                from switchboard.cli.mcp import clients_command

                return clients_command(settings, args.server, args.tool, args.tenant)
            return mcp_command(settings, args.action, args.server, args.tool)
        if args.command == "webhooks":
            return cmd_webhooks(settings, args.tenant, args.limit)
        if args.command == "telegram":
            return cmd_telegram(settings, args.action, args.url, args.account)
        if args.command in {"approvals", "reconcile", "dead-letters", "takeover", "say", "handback"}:
            return cmd_control(settings, args)
        if args.command == "access":
            return cmd_access(settings, args)
        if args.command == "discord":
            if args.action == "listen":
                _refuse_bad_config(settings, "discord")
            return cmd_discord(settings, args.action)
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
