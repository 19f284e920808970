"""The files users send, for the agent runtime: fetched through the channel adapters, voice notes transcribed.

The runtime (core) never imports channels: it asks an :class:`~switchboard.core.agent.attachments.AttachmentSource`,
and the worker hands it :class:`ChannelAttachments` over its own adapters. Transcription is on when
``SWITCHBOARD_TRANSCRIPTION__MODEL`` names a model, or by default when ``OPENAI_API_KEY`` is set
(:data:`DEFAULT_TRANSCRIPTION_MODEL`); ``off`` turns it off.
"""

from __future__ import annotations

import asyncio
import logging

from switchboard.channels.registry import ChannelSet
from switchboard.core.agent.attachments import AttachmentLimits, AttachmentSupport, FetchedFile
from switchboard.core.messages import Attachment, ConversationRef
from switchboard.core.providers.transcription import OpenAITranscriber
from switchboard.errors import AttachmentError, DeliveryError
from switchboard.settings import Settings

__all__ = ["DEFAULT_TRANSCRIPTION_MODEL", "ChannelAttachments", "attachment_support", "transcription_model"]

logger = logging.getLogger(__name__)

DEFAULT_TRANSCRIPTION_MODEL = "gpt-4o-mini-transcribe"


class ChannelAttachments:
    """Fetches an attachment through the adapter of its conversation's channel account."""

    def __init__(self, channels: ChannelSet) -> None:
        self.channels = channels

    async def fetch(self, attachment: Attachment, conversation: ConversationRef, limit: int) -> FetchedFile:
        """Download ``attachment`` (at most ``limit`` bytes).

        Raises:
            AttachmentError: the adapter refused, or failed in any other way (never anything else but
                ``CancelledError``: one unreadable file must not fail the turn).
        """
        try:
            adapter = self.channels.adapter(conversation)
        except DeliveryError:
            raise AttachmentError("its channel is not enabled in this worker", channel=conversation.channel) from None
        try:
            return await adapter.fetch(attachment, conversation, limit)
        except (AttachmentError, asyncio.CancelledError):
            raise
        except Exception as exc:
            logger.warning("%s: fetching an attachment failed: %s", conversation.channel, type(exc).__name__)
            raise AttachmentError("the platform could not be reached", channel=conversation.channel) from None


def transcription_model(settings: Settings) -> str | None:
    """The transcription model to use, or ``None`` when voice notes are not transcribed."""
    model = (settings.transcription.model or "").strip()
    if model.lower() == "off":
        return None
    if model:
        return model
    return DEFAULT_TRANSCRIPTION_MODEL if settings.openai_api_key is not None else None


def attachment_support(settings: Settings, channels: ChannelSet | None) -> AttachmentSupport:
    """Fetching over ``channels``, the configured caps, and the transcriber when transcription is on."""
    model = transcription_model(settings)
    transcriber = None
    if model is not None:
        key = settings.openai_api_key.get_secret_value() if settings.openai_api_key else None
        transcriber = OpenAITranscriber(model=model, api_key=key, base_url=settings.openai_base_url)
    limits = AttachmentLimits(max_bytes=settings.attachments.max_bytes, max_count=settings.attachments.max_count)
    source = ChannelAttachments(channels) if channels is not None else None
    return AttachmentSupport(source=source, limits=limits, transcriber=transcriber)
