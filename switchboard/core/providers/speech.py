"""Text to speech through OpenAI's audio API (``POST /v1/audio/speech``) with the official SDK, as OGG/Opus.

Opus in an OGG container is what Telegram (``sendVoice``) and WhatsApp take as a voice note, so no transcoding is
needed. The client points at ``OPENAI_BASE_URL`` like the chat adapter and the transcriber (the test suite's fake
serves the route). Failures become :class:`~switchboard.errors.SpeechError` with a short reason; the upstream text
is never quoted (an authentication error can echo part of the key).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from switchboard.core.providers.oggopus import opus_duration
from switchboard.errors import SpeechError

if TYPE_CHECKING:
    from openai import AsyncOpenAI

__all__ = ["MAX_SPEECH_BYTES", "MAX_SPEECH_CHARS", "OpenAISpeech"]

logger = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"
MAX_SPEECH_CHARS = 4096
"""OpenAI's limit on the text of one speech request."""
MAX_SPEECH_BYTES = 4 * 2**20
"""The most audio one reply may be (a few minutes of speech at OpenAI's Opus bitrate); more is refused."""
_NO_KEY = "unused"


async def _read_capped(chunks: AsyncIterator[bytes]) -> bytes:
    """The body read as it arrives, refused as soon as it passes :data:`MAX_SPEECH_BYTES` (never buffered whole)."""
    parts: list[bytes] = []
    size = 0
    async for chunk in chunks:
        size += len(chunk)
        if size > MAX_SPEECH_BYTES:
            raise SpeechError(f"the speech provider answered more than {MAX_SPEECH_BYTES} bytes (the limit)")
        parts.append(chunk)
    return b"".join(parts)


class OpenAISpeech:
    """Speaks text with one OpenAI speech model and voice."""

    def __init__(
        self, *, model: str, voice: str, api_key: str | None, base_url: str | None, timeout_s: float = 30.0
    ) -> None:
        """Create the client.

        Args:
            model: ``gpt-4o-mini-tts``, ``tts-1``, ... (the agent's ``voice.model``).
            voice: ``alloy``, ``coral``, ... (the agent's ``voice.voice``).
            api_key: ``OPENAI_API_KEY``.
            base_url: ``OPENAI_BASE_URL``; unset means OpenAI itself.
            timeout_s: The whole request's timeout (the reply's text went out already; the voice note waits at most
                this long).
        """
        # the SDK takes most of a second to import: only a worker with a voice-enabled agent pays for it
        import httpx2
        import openai

        self.model = model
        self.voice = voice
        self.timeout_s = timeout_s
        self._sdk = openai
        self._transport_error = httpx2.TransportError
        self._client: AsyncOpenAI = openai.AsyncOpenAI(
            api_key=api_key or _NO_KEY, base_url=base_url or OPENAI_BASE_URL, timeout=timeout_s, max_retries=0
        )

    async def speak(self, text: str) -> bytes:
        """``text`` spoken, as OGG/Opus bytes (checked to be that).

        Raises:
            SpeechError: the provider refused, failed, could not be reached or timed out, or answered no OGG/Opus.
        """
        sdk = self._sdk
        try:
            async with asyncio.timeout(self.timeout_s):  # the SDK's timeout is per read: this bounds the whole request
                async with self._client.audio.speech.with_streaming_response.create(
                    model=self.model, voice=self.voice, input=text[:MAX_SPEECH_CHARS], response_format="opus"
                ) as response:
                    data = await _read_capped(response.iter_bytes())
        except TimeoutError:
            raise SpeechError("the speech provider did not answer in time") from None
        except (sdk.AuthenticationError, sdk.PermissionDeniedError):
            raise SpeechError("the speech provider refused the key: check OPENAI_API_KEY") from None
        except sdk.APIStatusError as exc:
            raise SpeechError(f"the speech provider answered HTTP {exc.status_code}") from None
        except sdk.APITimeoutError:
            raise SpeechError("the speech provider did not answer in time") from None
        except (sdk.APIConnectionError, self._transport_error):
            raise SpeechError("the speech provider could not be reached") from None
        opus_duration(data)  # refuses anything that is not OGG/Opus
        return data

    async def aclose(self) -> None:
        """Release the HTTP connection pool."""
        await self._client.close()
