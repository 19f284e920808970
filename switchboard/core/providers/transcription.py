"""Voice notes to text through OpenAI's audio API (``POST /v1/audio/transcriptions``) with the official SDK.

One async client for the life of the process (its connection pool is reused), pointed at ``OPENAI_BASE_URL``
like the chat adapter, so an OpenAI-compatible server with a transcription route (or the test suite's fake)
serves it too. Failures become :class:`~switchboard.errors.AttachmentError` with a short reason the model can
pass on; the upstream text is never quoted for authentication failures (it can echo part of the key).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from switchboard.errors import AttachmentError

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["MAX_AUDIO_BYTES", "OpenAITranscriber"]

logger = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"
MAX_AUDIO_BYTES = 25 * 2**20
"""OpenAI's upload limit for one transcription."""
_NO_KEY = "unused"


class OpenAITranscriber:
    """A :class:`~switchboard.core.agent.attachments.Transcriber` over OpenAI's audio transcription API."""

    def __init__(self, *, model: str, api_key: str | None, base_url: str | None, timeout_s: float = 60.0) -> None:
        """Create the client.

        Args:
            model: ``gpt-4o-mini-transcribe``, ``whisper-1``, ... (``SWITCHBOARD_TRANSCRIPTION__MODEL``).
            api_key: ``OPENAI_API_KEY``.
            base_url: ``OPENAI_BASE_URL``; unset means OpenAI itself.
            timeout_s: Per-request timeout.
        """
        # the SDK takes most of a second to import: only a process with transcription configured pays for it
        import httpx2
        import openai

        self.model = model
        self._sdk = openai
        self._transport_error = httpx2.TransportError
        self._client: AsyncOpenAI = openai.AsyncOpenAI(
            api_key=api_key or _NO_KEY, base_url=base_url or OPENAI_BASE_URL, timeout=timeout_s, max_retries=1
        )

    async def transcribe(self, name: str, data: bytes, mime_type: str | None) -> str:
        """The text spoken in ``data``.

        Raises:
            AttachmentError: too large for the API, or the provider failed or refused (the reason, shortly).
        """
        if len(data) > MAX_AUDIO_BYTES:
            raise AttachmentError("too large to transcribe (limit 25 MiB)", channel="transcription", too_large=True)
        upload = (name or "voice.ogg", data, mime_type or "application/octet-stream")
        sdk = self._sdk
        try:
            result = await self._client.audio.transcriptions.create(model=self.model, file=upload)
        except (sdk.AuthenticationError, sdk.PermissionDeniedError):
            logger.warning("transcription refused: check OPENAI_API_KEY")
            raise AttachmentError("the transcription provider refused the key", channel="transcription") from None
        except sdk.APIStatusError as exc:
            logger.warning("transcription failed with HTTP %d", exc.status_code)
            raise AttachmentError(
                f"the transcription provider answered HTTP {exc.status_code}", channel="transcription"
            ) from None
        except (sdk.APIConnectionError, self._transport_error):
            logger.warning("transcription provider unreachable")
            raise AttachmentError("the transcription provider could not be reached", channel="transcription") from None
        return result.text

    async def aclose(self) -> None:
        """Release the HTTP connection pool."""
        await self._client.close()
