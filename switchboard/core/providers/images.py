"""Image generation through OpenAI's Images API (``POST /v1/images/generations``) with the official SDK.

The picture comes back base64-encoded in the answer (``b64_json``), so nothing is fetched from a second URL. The
client points at ``OPENAI_BASE_URL`` like the chat adapter (the test suite's fake serves the route). Failures become
:class:`~switchboard.errors.ToolError` with a short reason; the upstream text is never quoted (an authentication
error can echo part of the key).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal, Protocol, cast

from switchboard.errors import ToolError

if TYPE_CHECKING:
    from openai import AsyncOpenAI, Omit

__all__ = ["MAX_IMAGE_BYTES", "GeneratedImage", "ImageProvider", "OpenAIImages", "image_type"]

logger = logging.getLogger(__name__)

OPENAI_BASE_URL = "https://api.openai.com/v1"
MAX_IMAGE_BYTES = 20 * 2**20
"""The largest picture kept (a 1536x1024 PNG is a few MiB); more is refused."""
_NO_KEY = "unused"


@dataclass(frozen=True, slots=True)
class GeneratedImage:
    """A picture an image provider drew."""

    data: bytes
    mime_type: str
    """``image/png``, ``image/jpeg`` or ``image/webp`` (read from the bytes, not from what the provider said)."""
    revised_prompt: str | None = None
    """The prompt the provider actually drew from, when it rewrote the one it was given."""


class ImageProvider(Protocol):
    """Draws a picture from a prompt."""

    async def generate(
        self, prompt: str, *, model: str, size: str, quality: str, timeout_s: float, format: str, compression: int
    ) -> GeneratedImage:
        """One picture for ``prompt`` (``format``: ``jpeg``, ``png`` or ``webp``, where the model can choose).

        Raises:
            ToolError: refused, failed, unreachable, timed out, or not a picture.
        """
        ...

    async def aclose(self) -> None:
        """Release the HTTP connection pool."""
        ...


def image_type(data: bytes) -> str | None:
    """The picture's type from its first bytes (``None``: not a PNG, JPEG or WebP)."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    return None


class OpenAIImages:
    """OpenAI's Images API (``gpt-image-1``, ``dall-e-3`` ...)."""

    def __init__(self, *, api_key: str | None, base_url: str | None) -> None:
        """Create the client (``OPENAI_API_KEY``, ``OPENAI_BASE_URL``; unset means OpenAI itself)."""
        import httpx2  # the SDK is imported only by a worker whose agents draw
        import openai

        self._sdk = openai
        self._transport_error = httpx2.TransportError
        self._client: AsyncOpenAI = openai.AsyncOpenAI(
            api_key=api_key or _NO_KEY, base_url=base_url or OPENAI_BASE_URL, max_retries=0
        )

    async def generate(
        self, prompt: str, *, model: str, size: str, quality: str, timeout_s: float, format: str, compression: int
    ) -> GeneratedImage:
        """One picture for ``prompt``, asked for as ``b64_json``.

        Raises:
            ToolError: refused (``auth``, ``validation``), rate limited, failed, unreachable, timed out, or not a
                picture.
        """
        sdk = self._sdk
        # the DALL·E models answer a URL unless told; the GPT image models always answer base64 and refuse the field
        dall_e = model.startswith("dall-e")
        response_format: Literal["b64_json"] | Omit = "b64_json" if dall_e else sdk.omit
        lossy = format in ("jpeg", "webp") and not dall_e
        try:
            async with asyncio.timeout(timeout_s):
                answer = await self._client.images.generate(
                    model=model,
                    prompt=prompt,
                    n=1,
                    size=size,
                    quality=cast(Any, quality),
                    response_format=response_format,
                    output_format=sdk.omit if dall_e else cast(Any, format),
                    output_compression=compression if lossy else sdk.omit,
                    timeout=timeout_s,
                )
        except TimeoutError:
            raise ToolError("the image provider did not answer in time", error_class="transient") from None
        except (sdk.AuthenticationError, sdk.PermissionDeniedError):
            raise ToolError("the image provider refused the key: check OPENAI_API_KEY", error_class="auth") from None
        except sdk.RateLimitError:
            raise ToolError("the image provider is rate limiting", error_class="rate_limit") from None
        except sdk.BadRequestError:
            raise ToolError(
                "the image provider refused the request (the prompt, or the model's options)", error_class="validation"
            ) from None
        except sdk.APIStatusError as exc:
            raise ToolError(f"the image provider answered HTTP {exc.status_code}", error_class="transient") from None
        except sdk.APITimeoutError:
            raise ToolError("the image provider did not answer in time", error_class="transient") from None
        except (sdk.APIConnectionError, self._transport_error):
            raise ToolError("the image provider could not be reached", error_class="transient") from None
        first = answer.data[0] if answer.data else None
        encoded = first.b64_json if first is not None else None
        if not encoded:
            raise ToolError("the image provider answered no picture")
        if len(encoded) > MAX_IMAGE_BYTES * 4 // 3 + 4:
            raise ToolError(f"the image provider answered more than {MAX_IMAGE_BYTES} bytes (the limit)")
        try:
            data = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):
            raise ToolError("the image provider answered a picture that is not base64") from None
        mime_type = image_type(data)
        if mime_type is None:
            raise ToolError("the image provider answered something that is not a PNG, JPEG or WebP picture")
        return GeneratedImage(data=data, mime_type=mime_type, revised_prompt=first.revised_prompt if first else None)

    async def aclose(self) -> None:
        """Release the HTTP connection pool."""
        await self._client.close()
