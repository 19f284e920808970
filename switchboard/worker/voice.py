"""Voice replies: a turn's text reply also spoken, and sent as a voice note after it where the channel has one.

Built only when some agent's ``voice.mode`` is not ``off`` (:meth:`VoiceReplies.build`): without it a turn costs
nothing more, not a Redis command. When a turn's reply is delivered, :meth:`VoiceReplies.wanted` decides from the
agent's mode, what the user sent (a voice note) and the conversation's own choice (``/voice on|off``, kept in the
session's state hash, read with the turn's first step), and only for a channel whose capabilities declare ``voice``.
The speech request (:class:`~switchboard.core.providers.speech.OpenAISpeech`) has its own timeout; a failure leaves
the reply as the text already sent, with a log line and a ``voice_replied`` fact. ``docs/voice.md`` has the rest.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping, Sequence

from switchboard.channels.base import Capabilities
from switchboard.channels.render.plain import markdown_to_plain
from switchboard.core.actions import SendVoice
from switchboard.core.agent.budget import PriceTable
from switchboard.core.agent.config import AgentVoice
from switchboard.core.events import Event, UsageMetered, VoiceReplied
from switchboard.core.messages import CommandIssued, InboundMessage, Posted
from switchboard.core.providers.oggopus import opus_duration
from switchboard.core.providers.speech import OpenAISpeech
from switchboard.errors import SpeechError
from switchboard.settings import Settings

__all__ = [
    "VOICE_COMMAND",
    "VOICE_SLOT",
    "VoiceReplies",
    "command_argument",
    "outcome",
    "slots_toggle",
    "spoke",
    "toggle_of",
    "toggle_text",
]

logger = logging.getLogger(__name__)

VOICE_COMMAND = "voice"
VOICE_SLOT = "voice"
"""The session-state field holding the conversation's ``/voice`` choice (``"on"`` / ``"off"``; never shown to the
model, which reads only its own slots; ``/reset`` clears it with them)."""


def spoke(messages: Sequence[InboundMessage]) -> bool:
    """Whether the user spoke in this turn: a message of it carries a voice note."""
    for message in messages:
        event = message.event
        if isinstance(event, Posted | CommandIssued) and any(a.kind == "voice" for a in event.attachments):
            return True
    return False


def toggle_of(raw: bytes | str | None) -> bool | None:
    """The conversation's ``/voice`` choice as stored (``None``: it never chose, or the value is unreadable)."""
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return None
    return {"on": True, "off": False}.get(value) if isinstance(value, str) else None


def toggle_text(mode: str, argument: str, *, voice_notes: bool = True) -> tuple[str, str | None]:
    """What ``/voice <argument>`` answers, and the value to store (``None``: store nothing).

    ``voice_notes``: whether the conversation's channel shows voice notes (else nothing is stored: there is nothing to
    turn on).
    """
    if mode == "off":
        return "Voice replies are not available for this agent.", None
    if not voice_notes:
        return "Voice replies are not available here: this chat shows no voice notes.", None
    choice = argument.strip().lower()
    if choice == "on":
        return "Voice replies on: I will also send my answers as voice notes.", "on"
    if choice == "off":
        return "Voice replies off: I will answer in text only.", "off"
    return "Send /voice on to get my answers as voice notes too, or /voice off for text only.", None


class VoiceReplies:
    """Decides, speaks and meters voice replies for one worker (one speech client per model and voice)."""

    def __init__(
        self,
        *,
        api_key: str | None,
        base_url: str | None,
        prices: PriceTable | None = None,
    ) -> None:
        self._api_key = api_key
        self._base_url = base_url
        self.prices = prices or PriceTable()
        self._speakers: dict[tuple[str, str, float], OpenAISpeech] = {}

    @classmethod
    def build(cls, settings: Settings) -> VoiceReplies | None:
        """Voice replies for the worker, or ``None`` when no agent has them on (nothing is asked then)."""
        if all(agent.voice.mode == "off" for agent in settings.file.agents.values()):
            return None
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
        if key is None:
            logger.warning("voice replies are configured but OPENAI_API_KEY is not set: the speech requests will fail")
        return cls(api_key=key, base_url=settings.openai_base_url, prices=PriceTable(settings.file.prices))

    def wanted(
        self, voice: AgentVoice, messages: Sequence[InboundMessage], caps: Capabilities, toggle: bool | None
    ) -> bool:
        """Whether this turn's reply is also spoken: the agent's mode, the conversation's choice, the channel."""
        if voice.mode == "off" or not caps.voice or toggle is False:
            return False
        if toggle is True or voice.mode == "always":
            return True
        return voice.mode == "when_spoken_to" and spoke(messages)

    def _speaker(self, voice: AgentVoice) -> OpenAISpeech:
        key = (voice.model, voice.voice, voice.timeout_s)
        speaker = self._speakers.get(key)
        if speaker is None:
            speaker = OpenAISpeech(
                model=voice.model,
                voice=voice.voice,
                api_key=self._api_key,
                base_url=self._base_url,
                timeout_s=voice.timeout_s,
            )
            self._speakers[key] = speaker
        return speaker

    async def speak(
        self, voice: AgentVoice, markdown: str, reply_to: str | None
    ) -> tuple[SendVoice | None, list[Event]]:
        """The reply spoken as a :class:`SendVoice` (``None`` when it stays text only) and the facts to record.

        Spoken: the facts are its ``usage_metered`` (the caller records the send's outcome with :func:`outcome`).
        A reply over ``voice.max_chars`` is not spoken at all (nothing is sent to the provider); a failed request is
        logged (never with the text or the key); either is a ``voice_replied`` fact.
        """
        text = markdown_to_plain(markdown).strip()
        spec = f"openai:{voice.model}"
        if len(text) > voice.max_chars:
            logger.info("reply of %d characters not spoken (voice.max_chars %d)", len(text), voice.max_chars)
            return None, [VoiceReplied(message_id=reply_to, outcome="too_long", model=spec, chars=len(text))]
        if not text:
            return None, []
        try:
            if self._api_key is None and self._base_url is None:
                raise SpeechError("no speech provider: set OPENAI_API_KEY (or OPENAI_BASE_URL)")
            audio = await self._speaker(voice).speak(text)
            seconds = opus_duration(audio)
        except SpeechError as err:
            logger.warning("voice reply not made, the reply stays text only: %s", err)
            failed = VoiceReplied(message_id=reply_to, outcome="failed", model=spec, chars=len(text), reason=str(err))
            return None, [failed]
        credits = self.prices.speech_credits(spec, len(text))
        metered = UsageMetered(
            message_id=reply_to,
            model=spec,
            steps=0,
            tool_calls=0,
            input_tokens=0,
            output_tokens=0,
            credits=credits,
            characters=len(text),
        )
        action = SendVoice(
            audio=base64.b64encode(audio).decode("ascii"),
            duration_s=round(seconds, 3),
            text=text,
            reply_to=reply_to,
        )
        return action, [metered]

    async def aclose(self) -> None:
        """Release the speech clients' connection pools."""
        for speaker in self._speakers.values():
            await speaker.aclose()
        self._speakers.clear()


def outcome(voice: AgentVoice, action: SendVoice, error: str | None) -> VoiceReplied:
    """The fact of a spoken reply's send: ``sent``, or ``undelivered`` with the channel's reason."""
    return VoiceReplied(
        message_id=action.reply_to,
        outcome="sent" if error is None else "undelivered",
        model=f"openai:{voice.model}",
        chars=len(action.text),
        seconds=action.duration_s,
        reason=(error or "")[:200],
    )


def command_argument(messages: Sequence[InboundMessage]) -> str:
    """The argument of the turn's last command message (``on`` of ``/voice on``)."""
    for message in reversed(messages):
        if isinstance(message.event, CommandIssued):
            return message.text
    return ""


def slots_toggle(slots: Mapping[str, bytes] | None) -> bool | None:
    """The ``/voice`` choice among the session-state fields ``begin`` read (``None`` if it did not read them)."""
    return toggle_of(slots.get(VOICE_SLOT)) if slots else None
