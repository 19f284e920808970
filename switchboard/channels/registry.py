"""The table of channel factories: which channels exist, how each is configured, built, checked and simulated.

Every channel module exports ``FACTORY = ChannelFactory(...)``; :data:`CHANNEL_MODULES` names the module of each
channel (one line per channel, imported lazily). Everything else finds channels here: the settings (the env block
``SWITCHBOARD_<CHANNEL>__*`` is account ``default``; further accounts come from the YAML file's
``channels.<name>.accounts.<account>`` with ``secrets_from_env`` and ``options``), ``switchboard check``
(:attr:`ChannelFactory.problems`), ``switchboard simulate`` and the built-in fakes of ``switchboard run``
(:attr:`ChannelFactory.fake`, a module exporting ``SIMULATION``), the webhook route and the conventions test.
How to add a channel: docs/ARCHITECTURE.md §12.
"""

from __future__ import annotations

import importlib
import logging
import math
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, runtime_checkable

from pydantic import ValidationError

from switchboard.channels.base import Capabilities, Channel, FileData, Rate, Receipt, SendContext
from switchboard.core.actions import Action
from switchboard.core.groups import GroupRule, resolve_group_rule
from switchboard.core.messages import ConversationRef
from switchboard.core.protocols import conforms
from switchboard.errors import ConfigError, DeliveryError
from switchboard.settings import FileConfig, Settings
from switchboard.settings.channels import ChannelAccount, ChannelOptions, ChannelSettings
from switchboard.types import BusyPolicy, SessionKey

if TYPE_CHECKING:
    import aiohttp

__all__ = [
    "BUILTIN_CHANNELS",
    "CHANNEL_MODULES",
    "ENV_NESTED",
    "ENV_PREFIX",
    "NO_ADAPTER",
    "AccountConfig",
    "BuildContext",
    "ChannelFactory",
    "ChannelSet",
    "FakePlatform",
    "PerConversation",
    "Publish",
    "ReadUpload",
    "Route",
    "SampleRequest",
    "Simulation",
    "account_configs",
    "account_group_rule",
    "build_channels",
    "busy_policy",
    "check_env_blocks",
    "configured",
    "configured_factories",
    "env_block",
    "factories",
    "factory",
    "group_rule",
    "resolve_route",
    "send_rates",
    "simulation",
]

logger = logging.getLogger(__name__)

S = TypeVar("S", bound=ChannelSettings)

Publish = Callable[[SessionKey, str, dict[str, Any]], Awaitable[str]]
"""Append one event (session, type, data) to a web chat session's web stream; returns the entry id."""

ReadUpload = Callable[[SessionKey, str, int], Awaitable[FileData]]
"""Read a web chat upload back (session, upload id, at most that many bytes); raises ``AttachmentError``."""

ENV_PREFIX = "SWITCHBOARD_"
ENV_NESTED = "__"
"""A channel's env block is ``SWITCHBOARD_<NAME>__<FIELD>``."""

CHANNEL_MODULES: dict[str, str] = {
    "web": "switchboard.channels.web.factory",
    "telegram": "switchboard.channels.telegram.factory",
    "slack": "switchboard.channels.slack.factory",
    "discord": "switchboard.channels.discord.factory",
    "teams": "switchboard.channels.teams.factory",
    "whatsapp": "switchboard.channels.meta.whatsapp.factory",
    "messenger": "switchboard.channels.meta.messenger.factory",
    "instagram": "switchboard.channels.meta.instagram.factory",
}
"""Channel name → the module exporting its ``FACTORY`` (the one line a new channel adds)."""


@dataclass(frozen=True, slots=True)
class Route:
    """Where a channel account's messages go."""

    agent: str
    tenant: str
    busy_policy: BusyPolicy


def busy_policy(config: FileConfig, channel: str, account: str, agent: str) -> BusyPolicy:
    """The busy policy of a channel account's messages to ``agent``.

    The account's, else the channel's, else the agent's (``sequential`` when none sets one).
    """
    options = config.channels.get(channel)
    extra = options.accounts.get(account) if options else None
    profile = config.agents.get(agent)
    return (
        (extra.busy_policy if extra else None)
        or (options.busy_policy if options else None)
        or (profile.busy_policy if profile else None)
        or "sequential"
    )


def resolve_route(config: FileConfig, channel: str, account: str) -> Route:
    """Where a channel account's messages go.

    Agent and tenant come from the account's options, else the channel's, else the file's defaults.

    Raises:
        ConfigError: the agent is not defined.
    """
    options = config.channels.get(channel)
    extra = options.accounts.get(account) if options else None
    agent = (extra.agent if extra else None) or (options.agent if options else None) or config.default_agent
    tenant = (extra.tenant if extra else None) or (options.tenant if options else None) or config.tenant
    if agent not in config.agents:
        where = f"channels.{channel}" + (f".accounts.{account}" if extra else "")
        known = ", ".join(sorted(config.agents)) or "none"
        raise ConfigError(f"{where}: unknown agent {agent!r} (defined: {known})", field=f"{where}.agent")
    return Route(agent, tenant, busy_policy(config, channel, account, agent))


@dataclass(frozen=True, slots=True)
class BuildContext:
    """What an adapter gets besides its settings block, resolved for one account."""

    account: str = "default"
    agent: str = ""
    """The agent the account's messages go to (:func:`resolve_route`; empty: the ingest router fills it in)."""
    tenant: str = "default"
    """The account's tenant, set with :attr:`agent`: drafts built routed spare the ingest router a copy of each."""
    require_mention: bool = True
    """Group and channel messages reach the agent only when they mention the bot (direct messages always do)."""
    groups: GroupRule | None = None
    """The account's group behaviour (``group_replies``); ``None``: from :attr:`require_mention` alone."""
    publish: Publish | None = None
    """The web chat's stream publisher (``None`` in a process that only ingests); other channels ignore it."""
    read_upload: ReadUpload | None = None
    """Reads the web chat's uploads back for a worker (``None``: the web chat's files cannot be fetched here)."""
    accounts: Mapping[str, ChannelSettings] = field(default_factory=dict)
    """Every enabled account of the same channel by name, this one included: an adapter whose one webhook URL
    serves many accounts (Meta: one app, many numbers or pages) names the account a payload's id belongs to."""


@dataclass(frozen=True, slots=True)
class SampleRequest:
    """A correctly signed webhook request a user of the platform would cause, for ``switchboard simulate``."""

    body: bytes
    headers: Mapping[str, str]
    conversation: str
    """The conversation the request posts to (a fresh one each time); :attr:`Simulation.replies` reads it back."""


class FakePlatform:
    """What :attr:`Simulation.start` returns: a running fake platform API to stop at the end."""

    async def stop(self) -> None:  # pragma: no cover - the protocol's shape
        """Stop serving."""
        raise NotImplementedError


@dataclass(frozen=True)
class Simulation(Generic[S]):
    """How ``switchboard run`` fakes a channel that has no credentials, and how ``simulate`` speaks to it.

    The channel's fake module exports one as ``SIMULATION``.
    """

    start: Callable[[S], Awaitable[tuple[S, FakePlatform]]]
    """Start the fake platform API; returns the settings block (made-up credentials) pointing at it."""
    details: Callable[[S], dict[str, str]]
    """What ``simulate`` needs later (fake URL, webhook secret), saved in the data directory's ``simulate.json``
    (mode 0600) by ``run``."""
    request: Callable[[Mapping[str, str], str], SampleRequest]
    """``(details, text)`` → a signed request posting ``text`` from a new conversation."""
    replies: Callable[[aiohttp.ClientSession, Mapping[str, str], str], Awaitable[list[str]]]
    """``(http, details, conversation)`` → the texts the fake has received for that conversation so far."""
    group_request: Callable[[Mapping[str, str], str, str, bool], SampleRequest] | None = None
    """``(details, text, group id, mention)`` → a signed request posting ``text`` in that group, mentioning the bot or
    not (``simulate --group``; ``None``: the channel's fake cannot simulate groups)."""


def _no_problems(block: Any) -> list[str]:
    return []


@dataclass(frozen=True)
class ChannelFactory(Generic[S]):
    """One channel: its settings, how to build an account's adapter, what ``check`` says, and its fake."""

    name: str
    """The channel name (``ChannelName``), as in ``/webhooks/{name}`` and ``SWITCHBOARD_<NAME>__*``."""
    settings: type[S]
    """The settings block; the env block ``SWITCHBOARD_<NAME>__*`` and every YAML account validate into it. A
    channel is enabled when ``block.enabled`` (its credentials are present)."""
    build: Callable[[S, BuildContext], Channel]
    """Build one account's adapter."""
    problems: Callable[[S], list[str]] = _no_problems
    """What keeps an enabled account from working and how to fix it (``switchboard check``; start-up refuses)."""
    fake: str | None = None
    """Module of the built-in fake platform, exporting ``SIMULATION`` (``None``: the web chat, built in)."""
    webhook_methods: frozenset[str] = frozenset({"POST"})
    """HTTP methods ``/webhooks/{name}`` passes to the adapter (others are 405; add ``GET`` for Meta's handshake;
    empty: the channel has no webhook route)."""
    builtin: bool = False
    """Always on, whatever the settings say (the web chat)."""


def factory(name: str) -> ChannelFactory[Any] | None:
    """The factory of channel ``name``, or ``None`` when there is no such channel (or its module is missing)."""
    path = CHANNEL_MODULES.get(name)
    if path is None:
        return None
    try:
        module = importlib.import_module(path)
    except ModuleNotFoundError as err:
        if err.name != path:
            raise
        return None
    found = getattr(module, "FACTORY", None)  # the module's one public contract: checked here, once
    if not isinstance(found, ChannelFactory) or found.name != name:
        raise ConfigError(f"{path} must export FACTORY = ChannelFactory(name={name!r}, ...)", field=name)
    if found.builtin != (name in BUILTIN_CHANNELS):
        raise ConfigError(f"{path}: a built-in channel must be listed in BUILTIN_CHANNELS (and only one)", field=name)
    return found


def factories() -> Iterator[ChannelFactory[Any]]:
    """Every channel whose module is present, in table order."""
    for name in CHANNEL_MODULES:
        found = factory(name)
        if found is not None:
            yield found


BUILTIN_CHANNELS: frozenset[str] = frozenset({"web"})
"""Channels that are always on (their factory says ``builtin``; checked when the module loads)."""


def configured(settings: Settings, name: str) -> bool:
    """Whether channel ``name`` is built in or given any configuration.

    That is: named in the YAML file's ``channels``, an enabled block in the settings, or some
    ``SWITCHBOARD_<NAME>__*`` variable. Any other channel has no account, so processes need not import its module
    (a worker starts faster).
    """
    if name in BUILTIN_CHANNELS or name in settings.file.channels:
        return True
    block = settings.channel_block(name)
    if block is not None and block.enabled:
        return True
    prefix = f"{ENV_PREFIX}{name.upper()}{ENV_NESTED}"
    return any(key.upper().startswith(prefix) for key in settings.environ)


def configured_factories(settings: Settings) -> Iterator[ChannelFactory[Any]]:
    """The factories of the channels :func:`configured` finds, in table order (only their modules are imported)."""
    for name in CHANNEL_MODULES:
        if configured(settings, name):
            found = factory(name)
            if found is not None:
                yield found


def simulation(found: ChannelFactory[Any]) -> Simulation[Any] | None:
    """The channel's ``SIMULATION`` (from its fake module), or ``None`` when it has no fake."""
    if found.fake is None:
        return None
    sim = importlib.import_module(found.fake).SIMULATION
    if not isinstance(sim, Simulation):
        raise ConfigError(f"{found.fake}.SIMULATION must be a Simulation", field=found.name)
    return sim


def _invalid(err: ValidationError, where: str) -> ConfigError:
    lines = [f"invalid settings for {where}:"]
    lines += [f"  {'.'.join(str(p) for p in item['loc'])}: {item['msg']}" for item in err.errors()]
    return ConfigError("\n".join(lines), field=where)


def env_block(settings: Settings, found: ChannelFactory[S]) -> S:
    """The channel's env-configured block (account ``default``).

    Read from the ``SWITCHBOARD_<NAME>__<FIELD>`` variables of the environment :func:`load_settings` read (names
    are case-insensitive, as for every other setting), unless ``switchboard run`` replaced the block
    (:meth:`Settings.set_channel_block`).

    Raises:
        ConfigError: a variable of the block is invalid or names no field of it; the message names the variable.
    """
    block = settings.channel_block(found.name)
    if isinstance(block, found.settings):
        return block
    prefix = f"{ENV_PREFIX}{found.name.upper()}{ENV_NESTED}"
    values = {k[len(prefix) :].lower(): v for k, v in settings.environ.items() if k.upper().startswith(prefix)}
    try:
        return found.settings.model_validate(values)
    except ValidationError as err:
        lines = ["invalid configuration in the environment:"]
        lines += [f"  {prefix}{'__'.join(str(p) for p in item['loc']).upper()}: {item['msg']}" for item in err.errors()]
        raise ConfigError("\n".join(lines), field=f"{prefix}*") from None


def check_env_blocks(settings: Settings) -> None:
    """Validate the env block of every channel given a ``SWITCHBOARD_<NAME>__*`` variable, as start-up does.

    Raises:
        ConfigError: naming every invalid variable of every such channel.
    """
    problems: list[str] = []
    blocks = {f"SWITCHBOARD_{name.upper()}" for name in CHANNEL_MODULES}
    for variable in settings.environ:  # a whole block in one variable is no way to set a channel: say so
        if variable.upper() in blocks:
            problems.append(f"  {variable}: set the channel's settings one by one, as {variable.upper()}__<FIELD>")
    for found in configured_factories(settings):
        try:
            env_block(settings, found)
        except ConfigError as err:
            problems += str(err).splitlines()[1:]
    if problems:
        raise ConfigError("\n".join(["invalid configuration in the environment:", *problems]))


@dataclass(frozen=True, slots=True)
class AccountConfig:
    """One configured account of a channel: its settings block and its YAML options."""

    channel: str
    account: str
    block: ChannelSettings
    channel_options: ChannelOptions | None = None
    """``channels.<channel>`` in the YAML file."""
    account_options: ChannelAccount | None = None
    """``channels.<channel>.accounts.<account>`` (``None`` for the env-configured ``default``)."""
    require_mention: bool = field(init=False)
    groups: GroupRule = field(init=False)
    """The account's group behaviour: ``group_replies`` (account over channel), ``require_mention`` its fallback."""

    def __post_init__(self) -> None:
        rule = group_rule(self.channel_options, self.account_options)
        object.__setattr__(self, "groups", rule)
        object.__setattr__(self, "require_mention", rule.answer == "mention")


def group_rule(channel: ChannelOptions | None, account: ChannelAccount | None) -> GroupRule:
    """An account's group behaviour from its YAML options (:func:`switchboard.core.groups.resolve_group_rule`)."""
    require_mention = next((s.require_mention for s in (account, channel) if s and s.require_mention is not None), None)
    return resolve_group_rule(
        channel.group_replies if channel else None,
        account.group_replies if account else None,
        require_mention=require_mention,
    )


def account_group_rule(config: FileConfig, channel: str, account: str) -> GroupRule:
    """The group behaviour of ``channel``'s ``account`` as configured in ``config``."""
    options = config.channels.get(channel)
    return group_rule(options, options.accounts.get(account) if options else None)


def account_configs(
    settings: Settings, found: ChannelFactory[Any], environ: Mapping[str, str] | None = None
) -> list[AccountConfig]:
    """Every enabled account of a channel: ``default`` from the env block, then the YAML file's accounts.

    Raises:
        ConfigError: a ``secrets_from_env`` variable is unset, or an account's settings are invalid.
    """
    env = os.environ if environ is None else environ
    options = settings.file.channels.get(found.name)
    found_accounts: list[AccountConfig] = []
    block = env_block(settings, found)
    if found.builtin or block.enabled:
        found_accounts.append(AccountConfig(found.name, "default", block, options))
    for name, account in (options.accounts if options else {}).items():
        where = f"channels.{found.name}.accounts.{name}"
        values: dict[str, Any] = dict(account.options)
        for setting, env_name in account.secrets_from_env.items():
            value = env.get(env_name)
            if value is None:
                raise ConfigError(
                    f"{where}: environment variable {env_name} (for {setting}) is not set",
                    field=f"{where}.secrets_from_env.{setting}",
                )
            values[setting] = value
        try:
            extra = found.settings.model_validate(values)
        except ValidationError as err:
            raise _invalid(err, where) from None
        found_accounts.append(AccountConfig(found.name, name, extra, options, account))
    return found_accounts


def build_channels(
    settings: Settings, *, publish: Publish | None, read_upload: ReadUpload | None = None
) -> dict[tuple[str, str], Channel]:
    """Adapters for every enabled channel account, keyed by ``(channel, account)``.

    The web chat is always on; a platform channel is on when its credentials are present.

    Raises:
        ConfigError: an account's settings are invalid, or it routes to an agent that is not defined (the same as
            ``switchboard check`` reports).
    """
    found: dict[tuple[str, str], Channel] = {}
    for channel in configured_factories(settings):
        configs = account_configs(settings, channel, settings.environ or None)
        siblings = {config.account: config.block for config in configs}
        for config in configs:
            route = resolve_route(settings.file, channel.name, config.account)
            context = BuildContext(
                account=config.account,
                agent=route.agent,
                tenant=route.tenant,
                require_mention=config.require_mention,
                groups=config.groups,
                publish=publish,
                read_upload=read_upload,
                accounts=siblings,
            )
            found[(channel.name, config.account)] = channel.build(config.block, context)
    return found


def _rate(configured: float | None, platform: Rate) -> Rate:
    if configured is None:
        return platform
    if configured == 0:
        return Rate(0.0, 0)  # no limit (see ratelimits.bucket_args)
    return Rate(configured, max(platform.burst, math.ceil(configured)))


def send_rates(settings: Settings) -> dict[tuple[str, str], tuple[float | None, float | None]]:
    """The YAML's ``send_rate`` and ``chat_send_rate`` per ``(channel, account)``; an account's win."""
    rates: dict[tuple[str, str], tuple[float | None, float | None]] = {}
    for name, options in settings.file.channels.items():
        rates[(name, "default")] = (options.send_rate, options.chat_send_rate)
        for account, extra in options.accounts.items():
            send = extra.send_rate if extra.send_rate is not None else options.send_rate
            chat = extra.chat_send_rate if extra.chat_send_rate is not None else options.chat_send_rate
            rates[(name, account)] = (send, chat)
    return rates


NO_ADAPTER = Capabilities(max_text=4096)
"""What a conversation without an adapter in this process can show: nothing streams, nothing is typed."""


@runtime_checkable
class PerConversation(Protocol):
    """An adapter whose capabilities differ by conversation."""

    def capabilities_for(self, conversation: ConversationRef) -> Capabilities:
        """What ``conversation`` can show."""


class ChannelSet:
    """Routes send actions to the adapter of the conversation's channel account (the queue's Deliverer)."""

    def __init__(
        self,
        channels: Mapping[tuple[str, str], Channel],
        rates: Mapping[tuple[str, str], tuple[float | None, float | None]] | None = None,
    ) -> None:
        """Route to ``channels``; ``rates`` (:func:`send_rates`) replaces platforms' send rates where configured."""
        self.channels = dict(channels)
        self._rates = {key: value for key, value in (rates or {}).items() if value != (None, None)}

    def adapter(self, conversation: ConversationRef) -> Channel:
        """The adapter of the conversation's channel account.

        Raises:
            DeliveryError: the account is not enabled in this process (not retryable).
        """
        adapter = self.channels.get((conversation.channel, conversation.account))
        if adapter is None:
            raise DeliveryError(
                f"channel account {conversation.channel}/{conversation.account} is not enabled in this process",
                channel=conversation.channel,
                retryable=False,
            )
        return adapter

    def capabilities(self, conversation: ConversationRef) -> Capabilities:
        """What the conversation's channel can show (the queue plans streaming, typing and rates with it).

        An adapter whose capabilities differ by conversation says so with ``capabilities_for`` (Telegram: drafts
        in private chats, edits in groups); a conversation without an adapter here shows plain text only.
        """
        key = (conversation.channel, conversation.account)
        adapter = self.channels.get(key)
        if adapter is None:
            return NO_ADAPTER
        caps = adapter.capabilities_for(conversation) if conforms(adapter, PerConversation) else adapter.capabilities
        configured = self._rates.get(key)
        if configured is None:
            return caps
        send, chat = configured
        return replace(caps, bot_rate=_rate(send, caps.bot_rate), chat_rate=_rate(chat, caps.chat_rate))

    def streams(self, conversation: ConversationRef) -> bool:
        """Whether the conversation's channel shows ``StreamDelta``s on its own transport (the web chat)."""
        adapter = self.channels.get((conversation.channel, conversation.account))
        return adapter is not None and adapter.capabilities.streaming == "transport"

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:
        """Carry out one send action on the conversation's channel."""
        return await self.adapter(conversation).perform(action, conversation, send)

    async def start(self) -> None:
        """Let every adapter look itself up on its platform (a platform being down must not stop the gateway)."""
        for adapter in self.channels.values():
            try:
                await adapter.start()
            except Exception as exc:
                logger.warning("%s/%s: start-up lookup failed: %s", adapter.name, adapter.account, type(exc).__name__)

    async def aclose(self) -> None:
        """Close every adapter's connection pool."""
        for adapter in self.channels.values():
            await adapter.aclose()
