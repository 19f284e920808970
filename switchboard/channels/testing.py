"""The conformance kit every channel adapter passes, and :class:`MockChannel`, an in-memory channel for tests.

The kit drives one channel of the registry through its own fake (the ``SIMULATION`` its factory names), as the
gateway would: a correctly signed request verifies and a tampered one is refused with a 4xx; every sample payload
parses or is refused with a 4xx (never another exception, which the webhook route could only turn into a guess); the
answer the platform gets back is never a 5xx; Markdown reaches the fake as the channel's dialect within its limits;
a long reply is split into parts within the platform's limit, losing nothing; and every kind of
:data:`~switchboard.core.actions.Action` is performed against the fake, succeeding where the channel's capabilities
promise it and otherwise failing only with a ``DeliveryError``.

Third-party channels use it from their tests::

    async with channel_harness(registry.factory("mine")) as harness:
        await run_conformance(harness, Path("tests/payloads/mine"))

Only tests import this module (the package never does); it needs no test framework.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import hmac
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, assert_never, get_args

import aiohttp
from pydantic import SecretStr

from switchboard.channels.base import (
    Capabilities,
    Channel,
    FileData,
    HttpAnswer,
    Inbound,
    Listener,
    RawRequest,
    Receipt,
    SendContext,
)
from switchboard.channels.parts import SentParts
from switchboard.channels.registry import (
    BuildContext,
    ChannelFactory,
    FakePlatform,
    SampleRequest,
    Simulation,
    simulation,
)
from switchboard.channels.render.plain import render_parts
from switchboard.channels.render.split import measure
from switchboard.core.actions import (
    AckChoice,
    Action,
    Choice,
    EditText,
    OfferChoice,
    SendError,
    SendFile,
    SendText,
    SendTyping,
    SendVoice,
    SetStatus,
    SettleChoices,
    ShowToolCall,
    StreamDelta,
    StreamText,
)
from switchboard.core.messages import Attachment, ConversationRef, InboundMessage, Sender
from switchboard.core.providers.oggopus import silent_opus
from switchboard.errors import AttachmentError, DeliveryError, MalformedBodyError, RequestError, SignatureError
from switchboard.settings.channels import ChannelSettings
from switchboard.types import SessionKey

__all__ = [
    "FACTORY",
    "SIMULATION",
    "ChannelHarness",
    "ConformanceError",
    "KitSend",
    "MockChannel",
    "MockSettings",
    "channel_harness",
    "check_actions",
    "check_answer",
    "check_parse",
    "check_render",
    "check_split",
    "check_verify",
    "run_conformance",
    "sample_actions",
]

KIT_FILE: Final = "kit/report.txt"
"""The workspace file the kit's ``SendFile`` sends (served by :class:`KitSend`)."""


class ConformanceError(AssertionError):
    """A channel broke the adapter contract (docs/ARCHITECTURE.md §4); the message says where."""


def _fail(channel: str, check: str, detail: str) -> ConformanceError:
    return ConformanceError(f"{channel}: {check}: {detail}")


@dataclass
class KitSend:
    """A send context as the outbox gives one (:class:`~switchboard.channels.base.SendContext`), kept in memory."""

    idempotency_key: str = "kit-send"
    recorded: list[str] = field(default_factory=list)
    """Platform ids :meth:`part_sent` recorded, in order."""
    files: dict[str, FileData] = field(
        default_factory=lambda: {KIT_FILE: FileData("report.txt", b"conformance\n", "text/plain")}
    )
    paced: int = 0

    @property
    def sent(self) -> tuple[str, ...]:
        """Nothing was sent before this attempt."""
        return ()

    async def part_sent(self, platform_id: str) -> None:
        """Record one part."""
        self.recorded.append(platform_id)

    async def pace(self) -> None:
        """Count the send tokens taken (never waits)."""
        self.paced += 1

    async def read_file(self, path: str) -> FileData:
        """A file of :attr:`files`.

        Raises:
            DeliveryError: no such file (``retryable=False``).
        """
        try:
            return self.files[path]
        except KeyError:
            raise DeliveryError(f"no such file {path!r}", channel="", retryable=False) from None


@dataclass
class ChannelHarness:
    """One account of a channel, built by its factory against its running fake."""

    factory: ChannelFactory[Any]
    adapter: Channel
    conversation: ConversationRef
    """A conversation the fake knows (from its signed sample request), where the kit's actions go."""
    sample: Callable[[str], SampleRequest] | None
    """A fresh signed request posting a text (``None``: the channel has no webhook, as the web chat)."""
    replies: Callable[[], Awaitable[list[str]]]
    """The texts the fake received for :attr:`conversation` so far."""

    @property
    def name(self) -> str:
        """The channel's name."""
        return self.factory.name


def _raw(name: str, body: bytes, headers: dict[str, str] | None = None, method: str = "POST") -> RawRequest:
    return RawRequest(method=method, path=f"/webhooks/{name}", headers=headers or {}, query={}, body=body)


@contextlib.asynccontextmanager
async def channel_harness(found: ChannelFactory[Any] | None) -> AsyncIterator[ChannelHarness]:
    """Start the channel's fake, build its ``default`` account against it, and stop both at the end.

    A channel without a fake (the built-in web chat) is built with an in-memory stream publisher instead.
    """
    if found is None:
        raise ConformanceError("no such channel in the registry")
    sim: Simulation[Any] | None = simulation(found)
    published: list[tuple[SessionKey, str, dict[str, Any]]] = []

    async def publish(session: SessionKey, kind: str, data: dict[str, Any]) -> str:
        published.append((session, kind, data))
        return str(len(published))

    fake: FakePlatform | None = None
    block: ChannelSettings = found.settings()
    details: dict[str, str] = {}
    if sim is not None:
        block, fake = await sim.start(block)
        details = sim.details(block)
    context = BuildContext(
        account="default", agent="assistant", tenant="default", publish=publish, accounts={"default": block}
    )
    adapter = found.build(block, context)
    http = aiohttp.ClientSession()
    try:
        await adapter.start()
        if sim is not None:
            sim_ = sim
            first = sim_.request(details, "hello from the conformance kit")
            raw = _raw(found.name, first.body, dict(first.headers))
            await adapter.verify(raw)
            inbound = await adapter.receive(raw)
            if not inbound.messages:
                raise _fail(found.name, "sample", "the fake's signed sample request gave no message")
            conversation = inbound.messages[0].conversation
            platform_conversation = first.conversation

            async def replies() -> list[str]:
                return await sim_.replies(http, details, platform_conversation)

            def sample(text: str) -> SampleRequest:
                return sim_.request(details, text)

            yield ChannelHarness(found, adapter, conversation, sample, replies)
        else:
            conversation = ConversationRef(channel=found.name, agent="assistant", conversation="kit-session")

            async def published_texts() -> list[str]:
                texts = (" ".join(v for v in data.values() if isinstance(v, str)) for _, _, data in published)
                return [text for text in texts if text]

            yield ChannelHarness(found, adapter, conversation, None, published_texts)
    finally:
        await http.close()
        await adapter.aclose()
        if fake is not None:
            await fake.stop()


def _mutated(body: bytes) -> bytes:
    if not body:
        return b"x"
    middle = len(body) // 2
    return body[:middle] + bytes([body[middle] ^ 0x01]) + body[middle + 1 :]


async def _refused(adapter: Channel, raw: RawRequest) -> RequestError | None:
    """The 4xx error verifying (then reading) ``raw`` ends in, ``None`` if it was accepted."""
    try:
        await adapter.verify(raw)
        await adapter.receive(raw)
    except RequestError as err:
        return err
    return None


async def check_verify(harness: ChannelHarness) -> None:
    """A signed request verifies; a forged one is refused with a 4xx, never another exception.

    Forgeries: no headers at all; each header removed, and each changed in its last character (at least one of
    them must be refused as a bad signature); the body changed by one bit, which must be refused too unless the
    platform authenticates with a constant secret rather than a per-request signature (Telegram's secret token:
    two fresh requests carry the same headers).

    Raises:
        ConformanceError: a forged request was accepted, or refused with anything but a ``RequestError``.
    """
    if harness.sample is None:
        return
    name, adapter = harness.name, harness.adapter
    good, other = harness.sample("verify me"), harness.sample("verify me too")
    await adapter.verify(_raw(name, good.body, dict(good.headers)))
    signs_each_request = dict(good.headers) != dict(other.headers)
    refused_header = False
    forgeries = {
        "no headers": _raw(name, good.body, {}),
        "a body changed by one bit": _raw(name, _mutated(good.body), dict(good.headers)),
    }
    for header in good.headers:
        fewer = {k: v for k, v in good.headers.items() if k != header}
        forged = {k: (v[:-1] + ("0" if v[-1:] != "0" else "1")) if k == header else v for k, v in good.headers.items()}
        forgeries[f"no {header}"] = _raw(name, good.body, fewer)
        forgeries[f"{header} changed in its last character"] = _raw(name, good.body, forged)
    for what, raw in forgeries.items():
        try:
            err = await _refused(adapter, raw)
        except Exception as exc:
            raise _fail(name, "verify", f"{what}: raised {type(exc).__name__}, not a RequestError") from exc
        if err is None:
            if what == "no headers" or (what.startswith("a body") and signs_each_request):
                raise _fail(name, "verify", f"{what}: accepted")
            continue
        if not 400 <= err.status < 500:
            raise _fail(name, "verify", f"{what}: refused with {err.status}")
        refused_header |= isinstance(err, SignatureError) and what not in {"no headers", "a body changed by one bit"}
    if not refused_header:
        raise _fail(name, "verify", "no header's removal or change is refused as a bad signature")


async def check_parse(harness: ChannelHarness, payloads: Path) -> None:
    """Every sample payload in ``payloads`` parses, or is refused with a 4xx; nothing else is ever raised.

    Raises:
        ConformanceError: a payload raised anything but a ``RequestError``, or a message is not of this channel.
    """
    name = harness.name
    files = sorted(p for p in payloads.iterdir() if p.is_file())  # noqa: ASYNC240 - a test's few small files
    if not files:
        raise _fail(name, "parse", f"no sample payloads in {payloads}")
    for path in files:
        raw = _raw(name, path.read_bytes(), {"Content-Type": "application/json"})
        try:
            inbound = await harness.adapter.receive(raw)
        except RequestError as err:
            if not 400 <= err.status < 500:
                raise _fail(name, "parse", f"{path.name}: refused with {err.status}") from None
            continue
        except Exception as exc:
            raise _fail(name, "parse", f"{path.name}: raised {type(exc).__name__}, not a RequestError") from exc
        _check_inbound(name, f"parse {path.name}", inbound)


def _check_inbound(name: str, where: str, inbound: Inbound) -> None:
    if not isinstance(inbound, Inbound):
        raise _fail(name, where, f"returned {type(inbound).__name__}, not an Inbound")
    if not isinstance(inbound.answer, HttpAnswer) or inbound.answer.status >= 500:
        raise _fail(name, where, f"answers the platform {inbound.answer!r}")
    for message in inbound.messages:  # its account may be another's (one URL, many accounts): the router's to sort
        if message.conversation.channel != name:
            raise _fail(name, where, f"a message of channel {message.conversation.channel!r}")


async def check_answer(harness: ChannelHarness) -> None:
    """The signed sample gets a 2xx answer; a bare handshake (``GET``, where the channel takes one) gets a 4xx.

    Raises:
        ConformanceError: the answer is not a 2xx, or an unauthenticated handshake was answered.
    """
    if harness.sample is None:
        return
    name, adapter = harness.name, harness.adapter
    good = harness.sample("answer me")
    raw = _raw(name, good.body, dict(good.headers))
    await adapter.verify(raw)
    inbound = await adapter.receive(raw)
    _check_inbound(name, "answer", inbound)
    if not 200 <= inbound.answer.status < 300:
        raise _fail(name, "answer", f"the signed sample is answered {inbound.answer.status}")
    if "GET" in harness.factory.webhook_methods:
        try:
            err = await _refused(adapter, _raw(name, b"", {}, method="GET"))
        except Exception as exc:
            raise _fail(name, "answer", f"a bare GET raised {type(exc).__name__}") from exc
        if err is None:
            raise _fail(name, "answer", "a GET handshake without the verify token was answered")


_MARKDOWN: Final = "# Title\n\n**bold** and _slanted_ and `code`, a [link](https://example.com/kit)\n\n- one\n- two\n"


def _limit(caps: Capabilities, parts: list[str]) -> list[str]:
    return [part for part in parts if measure(part, caps.text_unit) > caps.max_text]


async def check_render(harness: ChannelHarness) -> None:
    """Markdown reaches the platform with its words intact, in parts within the platform's limit.

    Raises:
        ConformanceError: the send failed, words were lost, or a part is over the limit.
    """
    name, caps = harness.name, harness.adapter.capabilities
    before = len(await harness.replies())
    await harness.adapter.perform(SendText(text=_MARKDOWN), harness.conversation, KitSend())
    got = (await harness.replies())[before:]
    text = " ".join(got)
    if not got or any(word not in text for word in ("Title", "bold", "slanted", "code", "link", "one", "two")):
        raise _fail(name, "render", f"the fake received {got!r}")
    if over := _limit(caps, got):
        raise _fail(name, "render", f"parts over {caps.max_text} {caps.text_unit}: {over!r}")


async def check_split(harness: ChannelHarness) -> None:
    """A reply longer than the platform's limit is sent as several parts, each within it, losing no word.

    A channel that shows replies on the gateway's own transport (``streaming="transport"``, the web chat) has no
    platform limit to split at: its reply must arrive whole.

    Raises:
        ConformanceError: one part only, a part over the limit, or words lost or reordered.
    """
    name, caps = harness.name, harness.adapter.capabilities
    words = [f"w{n}" for n in range(caps.max_text * 5 // 8)]  # about 2.5 times the limit in ASCII
    send = KitSend()
    before = len(await harness.replies())
    receipt = await harness.adapter.perform(SendText(text=" ".join(words)), harness.conversation, send)
    got = (await harness.replies())[before:]
    if caps.streaming == "transport":
        if " ".join(got).split() != words:
            raise _fail(name, "split", "the reply did not arrive whole on the transport")
        return
    if receipt.parts < 2 or len(got) < 2:
        raise _fail(name, "split", f"{len(' '.join(words))} characters went as {receipt.parts} part(s)")
    if over := _limit(caps, got):
        raise _fail(name, "split", f"{len(over)} part(s) over {caps.max_text} {caps.text_unit}")
    if " ".join(got).split() != words:
        raise _fail(name, "split", "the parts do not add up to the reply")
    if len(send.recorded) != receipt.parts:
        raise _fail(name, "split", f"{receipt.parts} parts sent, {len(send.recorded)} recorded with part_sent")


def sample_actions(posted: str = "1") -> list[Action]:
    """One action of every kind of the ``Action`` union (``posted``: the platform id of a message to edit).

    Raises:
        ConformanceError: the union has a kind the kit has no sample of (a new kind: add it here).
    """
    samples: list[Action] = [
        SendText(text="kit: a plain reply"),
        StreamDelta(text="kit: a streamed piece"),
        SendTyping(),
        SetStatus(status="running"),
        SendError(code="kit", message="kit: something failed"),
        SendFile(path=KIT_FILE, caption="kit: a file", mime_type="text/plain"),
        SendVoice(audio=base64.b64encode(silent_opus(1.0)).decode("ascii"), duration_s=1.0, text="kit: spoken"),
        OfferChoice(
            question="kit: proceed?", options=[Choice(id="kit:yes", label="Yes"), Choice(id="kit:no", label="No")]
        ),
        EditText(message_id=posted, text="kit: an edited reply"),
        StreamText(text="kit: a streamed reply", final=True),
        AckChoice(ack_ref="kit-ack", text="kit: noted"),
        ShowToolCall(call_id="kit-call", tool="shell", title="shell: ls", state="ok", started_at=0.0),
        SettleChoices(ids=("kit:yes", "kit:no"), chosen="kit:yes", label="Yes", by="you"),
    ]
    missing = set(get_args(get_args(Action)[0])) - {type(action) for action in samples}
    if missing:
        raise ConformanceError(f"the kit has no sample of {sorted(kind.__name__ for kind in missing)}: add one")
    return samples


def _promised(action: Action, caps: Capabilities) -> bool:
    """Whether the channel's capabilities promise ``action`` succeeds (else a ``DeliveryError`` is allowed)."""
    match action:
        case SendText() | SendError() | OfferChoice():
            return True
        case SendFile():
            return caps.files
        case SendVoice():
            return caps.voice
        case SendTyping():
            return caps.typing
        case EditText():
            return caps.edits
        case StreamDelta():
            return caps.streaming == "transport"
        case StreamText():
            return caps.streaming == "native"
        case ShowToolCall() | SettleChoices():
            return caps.tool_activity
        case SetStatus() | AckChoice():
            return False  # best effort: a made-up click reference may be refused by the platform
        case _:
            assert_never(action)


async def check_actions(harness: ChannelHarness) -> None:
    """Every kind of action is performed against the fake: it succeeds where promised, else fails cleanly.

    Raises:
        ConformanceError: a promised action failed, or any action raised anything but a ``DeliveryError``.
    """
    name, adapter, caps = harness.name, harness.adapter, harness.adapter.capabilities
    first = await adapter.perform(SendText(text="kit: to be edited"), harness.conversation, KitSend())
    posted = first.platform_ids[0] if first.platform_ids else "1"
    kinds = set()
    for action in sample_actions(posted):
        kinds.add(type(action))
        try:
            receipt = await adapter.perform(action, harness.conversation, KitSend())
        except DeliveryError as err:
            if _promised(action, caps):
                raise _fail(name, f"perform {action.kind}", f"promised by its capabilities, yet {err}") from err
            continue
        except Exception as exc:
            raise _fail(name, f"perform {action.kind}", f"raised {type(exc).__name__}: {exc}") from exc
        if not isinstance(receipt, Receipt):
            raise _fail(name, f"perform {action.kind}", f"returned {type(receipt).__name__}, not a Receipt")
    if kinds != set(get_args(get_args(Action)[0])):
        raise _fail(name, "perform", "not every kind of action was tried")
    texts = " ".join(await harness.replies())
    if "kit: a plain reply" not in texts or "kit: something failed" not in texts or "proceed?" not in texts:
        raise _fail(name, "perform", f"the fake did not receive the texts sent: {texts[:300]!r}")


async def run_conformance(harness: ChannelHarness, payloads: Path) -> None:
    """Every check of the kit, in order.

    Raises:
        ConformanceError: the first check the channel fails.
    """
    await check_verify(harness)
    await check_parse(harness, payloads)
    await check_answer(harness)
    await check_render(harness)
    await check_split(harness)
    await check_actions(harness)


# ---- MockChannel: an in-memory channel that passes the kit, for tests of what sits around channels


class MockSettings(ChannelSettings):
    """``SWITCHBOARD_<NAME>__SECRET`` signs requests (``X-Mock-Signature: hex(HMAC-SHA256(secret, body))``)."""

    secret: SecretStr | None = None
    max_text: int = 500

    @property
    def enabled(self) -> bool:  # noqa: D102
        return self.secret is not None


_SENT: dict[str, list[str]] = {}
"""What every :class:`MockChannel` of this process was asked to send, by conversation (its "platform")."""


class MockChannel:
    """A text-only channel whose platform is this process's memory: requests ``{"id", "chat", "text"}``."""

    def __init__(self, settings: MockSettings, context: BuildContext, name: str = "mock") -> None:
        """An account of the mock channel ``name``."""
        self.settings = settings
        self._secret = (settings.secret or SecretStr("")).get_secret_value().encode()
        self._caps = Capabilities(max_text=settings.max_text)
        self._account = context.account
        self._name = name
        self.performed: list[tuple[Action, ConversationRef]] = []

    @property
    def name(self) -> str:  # noqa: D102
        return self._name

    @property
    def account(self) -> str:  # noqa: D102
        return self._account

    @property
    def capabilities(self) -> Capabilities:  # noqa: D102
        return self._caps

    async def verify(self, request: RawRequest) -> None:  # noqa: D102
        expected = hmac.new(self._secret, request.body, hashlib.sha256).hexdigest().encode()
        if not self._secret or not hmac.compare_digest(expected, request.headers.get("X-Mock-Signature", "").encode()):
            raise SignatureError("bad mock signature", channel=self._name)

    async def receive(self, request: RawRequest) -> Inbound:  # noqa: D102
        try:
            raw = json.loads(request.body)
            text, chat, message_id = raw["text"], raw["chat"], raw["id"]
            if not all(isinstance(v, str) and v for v in (text, chat, message_id)):
                raise TypeError("id, chat and text are non-empty strings")
        except (ValueError, KeyError, TypeError) as err:
            raise MalformedBodyError(f"not a {self._name} payload", channel=self._name) from err
        conversation = ConversationRef(channel=self._name, account=request.account, conversation=chat)
        message = InboundMessage(dedup_key=message_id, conversation=conversation, sender=Sender(id=chat), text=text)
        return Inbound(messages=(message,))

    async def perform(self, action: Action, conversation: ConversationRef, send: SendContext) -> Receipt:  # noqa: D102
        self.performed.append((action, conversation))
        match action:
            case SendText(text=text) | StreamText(text=text) | SendError(message=text):
                return await self._send(text, conversation, send)
            case OfferChoice():
                numbered = [action.question, *(f"{n}. {o.label}" for n, o in enumerate(action.options, 1))]
                return await self._send("\n".join(numbered), conversation, send)
            case SendFile() | EditText():
                raise DeliveryError(f"{self._name} has no {action.kind}s", channel=self._name, retryable=False)
            case (
                StreamDelta()
                | SendTyping()
                | SetStatus()
                | AckChoice()
                | ShowToolCall()
                | SettleChoices()
                | SendVoice()
            ):
                return Receipt(parts=0)
            case _:
                assert_never(action)

    async def _send(self, markdown: str, conversation: ConversationRef, send: SendContext) -> Receipt:
        sent = _SENT.setdefault(conversation.conversation, [])

        async def post(index: int, part: str) -> str:
            await send.pace()
            sent.append(part)
            return f"{conversation.conversation}:{len(sent)}"

        parts = SentParts(send)
        await parts.send(render_parts(markdown, self._caps.max_text, self._caps.text_unit), post)
        return parts.receipt()

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FileData:  # noqa: D102
        raise AttachmentError(f"{self._name} sends no files", channel=self._name)

    def listener(self) -> Listener | None:  # noqa: D102
        return None

    async def start(self) -> None:  # noqa: D102
        return None

    async def aclose(self) -> None:  # noqa: D102
        return None


class _MockPlatform(FakePlatform):
    async def stop(self) -> None:
        return None


async def _mock_start(block: MockSettings) -> tuple[MockSettings, FakePlatform]:
    return block.model_copy(update={"secret": SecretStr("mock-secret")}), _MockPlatform()


def _mock_request(details: Any, text: str) -> SampleRequest:
    chat = f"mock-{len(_SENT)}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    _SENT.setdefault(chat, [])
    body = json.dumps({"id": chat, "chat": chat, "text": text}).encode()
    signature = hmac.new(details["secret"].encode(), body, hashlib.sha256).hexdigest()
    return SampleRequest(body=body, headers={"X-Mock-Signature": signature}, conversation=chat)


async def _mock_replies(http: Any, details: Any, conversation: str) -> list[str]:
    return list(_SENT.get(conversation, []))


SIMULATION: Simulation[MockSettings] = Simulation(
    start=_mock_start,
    details=lambda block: {"secret": (block.secret or SecretStr("")).get_secret_value()},
    request=_mock_request,
    replies=_mock_replies,
)
"""The mock channel's "platform": this process's memory."""

FACTORY: ChannelFactory[MockSettings] = ChannelFactory(
    name="mock",
    settings=MockSettings,
    build=lambda block, context: MockChannel(block, context),
    fake="switchboard.channels.testing",
)
"""Register it with ``CHANNEL_MODULES["mock"] = "switchboard.channels.testing"``."""
