"""What ``switchboard check`` refuses, shared by ``run``, ``web`` and ``worker`` so that they refuse it too.

:func:`config_problems` lists everything that keeps the configuration from working as written (what each
channel's factory reports, such as a webhook without its secret; a draft agent, an unknown model provider, a tool
that does not exist), in words an operator can act on. :func:`unknown_variables` finds ``SWITCHBOARD_*`` variables
that name no setting — most often a single ``_`` where the nested delimiter ``__`` belongs — and suggests the
closest known name.
"""

from __future__ import annotations

import asyncio
import difflib
import typing
from collections.abc import Iterable, Mapping, Set
from urllib.parse import urlsplit

from pydantic import BaseModel

from switchboard.core.sealing import DATA_KEYS_ENV, Keyring
from switchboard.errors import ConfigError
from switchboard.settings import Settings

__all__ = [
    "ENV_PREFIX",
    "channel_problems",
    "check_command",
    "config_problems",
    "known_variables",
    "redacted_url",
    "unknown_variables",
]

ENV_PREFIX = "SWITCHBOARD_"
_NESTED = "__"


def redacted_url(url: str) -> str:
    """``url`` as it may be shown or logged: a password in it (``user:pw@`` or ``?password=``) becomes ``***``."""
    parts = urlsplit(url)
    shown = url
    if parts.password is not None:
        shown = shown.replace(parts.netloc, f"{parts.username or ''}:***@{parts.netloc.rpartition('@')[2]}", 1)
    base, mark, query = shown.partition("?")
    if not mark:
        return shown
    items = [
        f"{item.partition('=')[0]}=***" if item.lower().startswith("password=") else item for item in query.split("&")
    ]
    return f"{base}?{'&'.join(items)}"


def config_problems(settings: Settings) -> list[str]:
    """Every problem in the settings and the YAML file that ``check`` reports and start-up refuses."""
    from switchboard.cli.agents import agent_problems

    problems = channel_problems(settings)
    for agent in settings.file.agents.values():
        problems.extend(agent_problems(settings, agent))
    from switchboard.core.approvals.grants import policy_problems
    from switchboard.core.tools.builtin import default_registry

    rest = [spec.name for spec in settings.file.rest_tools]
    problems.extend(policy_problems(settings.file, [*default_registry().names(), *rest]))
    from switchboard.queue.access import access_problems

    problems.extend(access_problems(settings.file))
    try:
        Keyring.from_env()
    except ConfigError as err:
        problems.append(str(err))
    return problems


def channel_problems(settings: Settings) -> list[str]:
    """What keeps an enabled channel account from working.

    A YAML block naming no channel of the table, each channel's own checks (its factory's ``problems``), an account
    whose secrets or settings are missing or invalid, a route to an unknown agent.
    """
    from switchboard.channels import registry
    from switchboard.queue.router import resolve_route

    problems = [
        f"channels.{name}: no such channel (channels: {', '.join(registry.CHANNEL_MODULES)})"
        for name in settings.file.channels
        if registry.factory(name) is None
    ]
    for factory in registry.configured_factories(settings):
        try:
            accounts = registry.account_configs(settings, factory, settings.environ or None)
        except ConfigError as err:
            problems.append(str(err))
            continue
        for account in accounts:
            where = "" if account.account == "default" else f"channels.{factory.name}.accounts.{account.account}: "
            problems.extend(where + problem for problem in factory.problems(account.block))
            try:
                resolve_route(settings.file, factory.name, account.account)
            except ConfigError as err:
                problems.append(str(err))
    return problems


def _model_names(model: type[BaseModel], prefix: str) -> Iterable[tuple[str, bool]]:
    """``(variable, is_open)`` for every field of ``model``; ``is_open`` when any suffix is valid (a mapping)."""
    for name, field in model.model_fields.items():
        if field.validation_alias is not None or field.exclude:
            continue  # read under its own name (OPENAI_API_KEY), or not from the environment at all
        variable = f"{prefix}{name.upper()}"
        yield variable, False
        annotation = field.annotation
        if typing.get_origin(annotation) in (dict, Mapping):
            yield variable + _NESTED, True
            continue
        for arg in typing.get_args(annotation) or (annotation,):
            if isinstance(arg, type) and issubclass(arg, BaseModel):
                yield from _model_names(arg, variable + _NESTED)


def known_variables(settings: Settings | None = None) -> tuple[frozenset[str], tuple[str, ...]]:
    """Every ``SWITCHBOARD_*`` name a setting reads, and the prefixes under which any suffix is valid.

    With ``settings``, only the names of the channels :func:`~switchboard.channels.registry.configured` finds
    (cheaper: the other channels' modules stay unimported).
    """
    from switchboard.channels import registry

    exact: set[str] = {DATA_KEYS_ENV}  # read by the stores that seal, not by Settings (a secret kept out of it)
    open_prefixes: list[str] = []
    found = registry.factories() if settings is None else registry.configured_factories(settings)
    tabled = {factory.name: factory for factory in found}
    names = list(_model_names(Settings, ENV_PREFIX))
    for factory in tabled.values():  # a channel's block is what its factory reads
        names.extend(_model_names(factory.settings, f"{ENV_PREFIX}{factory.name.upper()}{_NESTED}"))
    for variable, is_open in names:
        (open_prefixes.append if is_open else exact.add)(variable)
    return frozenset(exact), tuple(open_prefixes)


def unknown_variables(environ: Mapping[str, str], settings: Settings) -> list[str]:
    """A warning for each ``SWITCHBOARD_*`` variable that no setting reads, with the likely intended name.

    Variables the YAML file names in ``secrets_from_env`` are known too. The names of channels nobody configured are
    only read when some variable is unknown to the configured ones (to suggest the intended name).
    """
    referenced = {
        env_name.upper()
        for options in settings.file.channels.values()
        for account in options.accounts.values()
        for env_name in account.secrets_from_env.values()
    }
    exact, open_prefixes = known_variables(settings)
    if all(_known(name, exact | referenced, open_prefixes) for name in environ):
        return []
    exact, open_prefixes = known_variables()
    warnings: list[str] = []
    for name in sorted(environ):
        if _known(name, exact | referenced, open_prefixes):
            continue
        upper = name.upper()
        suffixes = {known[len(ENV_PREFIX) :]: known for known in exact}
        guess = difflib.get_close_matches(upper[len(ENV_PREFIX) :], suffixes, n=1, cutoff=0.8)
        hint = f"; did you mean {suffixes[guess[0]]}?" if guess else "; it is ignored"
        warnings.append(f"{name} is not a known setting{hint}")
    return warnings


def _known(name: str, exact: Set[str], open_prefixes: tuple[str, ...]) -> bool:
    upper = name.upper()
    return not upper.startswith(ENV_PREFIX) or upper in exact or upper.startswith(open_prefixes)


def check_command(settings: Settings, environ: Mapping[str, str]) -> int:
    """``switchboard check``: print what is enabled, warnings and problems; returns 1 on any problem."""
    problems: list[str] = []
    print(f"config file: {settings.config} ({'found' if settings.config.exists() else 'not found, built-in defaults'})")
    print(f"data dir:    {settings.data_path}")
    print(f"model:       {settings.default_model}")
    embedded = None if settings.redis_url else embedded_url(settings)
    if settings.redis_url:
        problems.extend(_check_redis(settings.redis_url))
    elif embedded:
        print("redis:       embedded, served by the `switchboard run` of this data directory")
        if _check_redis(embedded):  # its AOF is on: only "unreachable" comes back, and that run owns its server
            print("             not reachable now: that run is stopping or starting")
    else:
        print("redis:       not set; `switchboard run` starts an embedded server (web/worker need a URL)")
    print("channels:")
    _print_channels(settings)
    print("agents:")
    for agent in settings.file.agents.values():
        print(f"  {agent.name:<12} {agent.status:<6} model={agent.model or settings.default_model}")
    operators = settings.file.console.operators
    print(
        f"console:     {len(operators)} operator(s) at /console"
        + (f"; proxy header {settings.console.auth_header}" if settings.console.auth_header else "")
        + ("" if settings.trusted_proxies or not settings.console.auth_header else " (ignored: no trusted proxies)")
        if operators
        else "console:     no operator; add one under console.operators (`switchboard console hash-password`)"
    )
    problems.extend(_print_memory(settings, environ))
    _print_data(settings, environ)
    egress_warnings, egress_problems = _print_sandbox(settings)
    problems.extend(config_problems(settings))
    problems.extend(egress_problems)
    warnings = [*egress_warnings, *unknown_variables(environ, settings)]
    if warnings:
        print("warnings:")
        for warning in warnings:
            print(f"  - {warning}")
    if problems:
        print("problems:")
        for problem in problems:
            print(f"  - {problem}")
        return 1
    print("ok: no problems found")
    return 0


def _print_memory(settings: Settings, environ: Mapping[str, str]) -> list[str]:
    """Print the memory store and its embeddings (never the DSN: it may hold a password); returns what is missing."""
    from switchboard.core.memory.config import build_embedder
    from switchboard.core.memory.embeddings import OpenAIEmbedder

    config = settings.file.memory
    problems: list[str] = []
    if config.store == "sqlite":
        where = f"sqlite in {settings.data_path / 'memory'}"
    elif config.store == "postgres":
        where = f"postgres at ${config.dsn_env}"
        if not environ.get(config.dsn_env, "").strip():
            problems.append(f"memory.dsn_env: {config.dsn_env} is unset or empty")
    else:
        typing.assert_never(config.store)
    try:
        embedder = build_embedder(config.embeddings, environ)
    except ConfigError as err:
        problems.append(str(err))
        embedder = None
    if embedder is None:
        embeddings = "none (words only)" if config.embeddings.provider == "none" else "misconfigured (see problems)"
    else:
        embeddings = f"{config.embeddings.provider} ({embedder.model}, {embedder.dims} dims)"
        if isinstance(embedder, OpenAIEmbedder):
            asyncio.run(embedder.aclose())
    print(f"memory:      {where}, embeddings {embeddings}")
    return problems


def _print_data(settings: Settings, environ: Mapping[str, str]) -> None:
    """Print whether sealing at rest is on, and the retention rules."""
    try:
        keyring = Keyring.from_env(environ)
    except ConfigError:  # reported with the problems (config_problems)
        print("sealing:     misconfigured (see problems)")
        return
    if keyring is None:
        print(f"sealing:     off (set {DATA_KEYS_ENV} to seal history, approvals and memory at rest)")
    else:
        listed = len(keyring.key_ids)
        print(f"sealing:     on, current key {keyring.current} ({listed} key{'s' if listed > 1 else ''} listed)")
    rules = settings.file.retention.describe()
    if not rules:
        print("retention:   no rule (every kind kept as it is)")
    else:
        print(f"retention:   {rules[0]}")
        for line in rules[1:]:
            print(f"             {line}")


def _print_sandbox(settings: Settings) -> tuple[list[str], list[str]]:
    """Print the isolation shell commands get here (what ``worker`` chooses at start-up) and their way out.

    Returns the egress warnings and problems (a sandbox that cannot reach the proxy; a socket path too long).
    """
    from switchboard.cli.sandbox import describe, shell_line, startup_choice
    from switchboard.egress.gate import egress_status

    choice = startup_choice(settings)
    print(f"shell:       {shell_line(choice, settings).removesuffix(' (see `switchboard check`)')}")
    first, *rest = describe(choice)
    print(f"sandbox:     {first}")
    for line in rest:
        print(f"             {line}")
    lines, warnings, problems = egress_status(settings, choice.sandbox)
    first, *rest = lines
    print(f"egress:      {first}")
    for line in rest:
        print(f"             {line}")
    if choice.sandbox is None or choice.sandbox.kind != "bwrap":
        from switchboard.core.tools.mcp.config import StdioServer

        why = "no sandbox" if choice.sandbox is None else f"a {choice.sandbox.label} sandbox, not bubblewrap"
        warnings += [
            f"MCP server {name} has sandbox: true but this host has {why}: its tools are refused (never run "
            "unsandboxed)"
            for name, server in settings.file.mcp_servers.items()
            if isinstance(server, StdioServer) and server.sandbox
        ]
    return warnings, problems


def _print_channels(settings: Settings) -> None:
    """One line per channel account of the table."""
    from switchboard.channels import registry

    for factory in registry.factories():
        try:
            accounts = registry.account_configs(settings, factory, settings.environ or None)
            block = registry.env_block(settings, factory)
        except ConfigError:
            print(f"  {factory.name:<10} misconfigured (see problems)")
            continue
        if factory.builtin:
            print(f"  {factory.name:<10} enabled (built in)")
            continue
        if not accounts:
            # some of its variables are set, yet it is not enabled: say what is missing
            missing = factory.problems(block) if block.model_fields_set else []
            print(f"  {factory.name:<10} disabled ({'incomplete: ' + missing[0] if missing else 'no credentials'})")
        for account in accounts:
            route = f"/webhooks/{factory.name}" + ("" if account.account == "default" else f"/{account.account}")
            served = f"at {', '.join(sorted(factory.webhook_methods))} {route}" if factory.webhook_methods else ""
            print(f"  {factory.name:<10} enabled, account {account.account} {served}".rstrip())


REDIS_URL_FILE = "redis.url"
"""Under the data directory while ``switchboard run`` serves an embedded server: that server's URL."""


def embedded_url(settings: Settings) -> str | None:
    """The URL of the embedded server a ``switchboard run`` of this data directory serves, if one runs."""
    try:
        return (settings.data_path / REDIS_URL_FILE).read_text().strip() or None
    except OSError:
        return None


def _check_redis(url: str) -> list[str]:
    import redis as sync_redis

    try:
        client = sync_redis.Redis.from_url(url, socket_timeout=2, socket_connect_timeout=2)
        try:
            client.ping()
            aof = client.config_get("appendonly").get("appendonly")
        finally:
            client.close()
    except Exception as exc:
        return [f"redis: cannot reach {redacted_url(url)}: {exc}"]
    print(f"redis:       {redacted_url(url)} reachable (appendonly={aof})")
    if aof != "yes":
        return ["redis: AOF is off; messages acknowledged could be lost on a crash (appendonly yes)"]
    return []
