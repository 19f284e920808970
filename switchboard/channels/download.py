"""Downloads of URLs that come from payloads: every hop checked against a policy, redirects followed by hand.

A channel whose files arrive as URLs in a webhook payload must not fetch whatever URL a payload names (an internal
host, the cloud metadata endpoint) and hand the bytes to the agent. :func:`download` takes the channel's policy —
``allowed(url)`` for each hop, ``headers_for(url)`` for the credentials a hop may receive — and fetches ``url`` with
aiohttp's own redirect handling off: each ``Location`` is resolved against the hop that sent it and checked again,
at most :data:`MAX_REDIRECTS` times; the body is refused once its declared or streamed size passes the limit.

Used by Teams (:meth:`~switchboard.channels.teams.adapter.TeamsChannel.fetch`) and the Meta channels
(:meth:`~switchboard.channels.meta.graph.GraphApi.download`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Final

import aiohttp
from yarl import URL

from switchboard.errors import AttachmentError

__all__ = ["MAX_REDIRECTS", "Fetched", "download", "host_of", "on_domains"]

MAX_REDIRECTS: Final = 3
_REDIRECT_STATUSES: Final = frozenset({301, 302, 303, 307, 308})
_CHUNK: Final = 65536


@dataclass(frozen=True, slots=True)
class Fetched:
    """What :func:`download` fetched."""

    data: bytes
    content_type: str | None
    """The answer's ``Content-Type`` (``None`` when it sent none)."""
    url: URL
    """Where it was served from, after any redirects (a file name may come from its path)."""


def host_of(url: URL) -> str:
    """The URL's host, lower-case, without a trailing dot (``""`` when it has none)."""
    return (url.raw_host or "").lower().rstrip(".")


def on_domains(url: URL, domains: tuple[str, ...]) -> bool:
    """Whether ``url`` is ``https`` on port 443 without userinfo, on one of ``domains`` or a subdomain of one."""
    if url.user is not None or url.password is not None or not url.absolute:
        return False
    host = host_of(url)
    return url.scheme == "https" and url.port == 443 and any(host == d or host.endswith("." + d) for d in domains)


async def download(
    session: aiohttp.ClientSession,
    url: str,
    limit: int,
    *,
    allowed: Callable[[URL], bool],
    headers_for: Callable[[URL], Mapping[str, str]],
    channel: str,
    client_timeout: aiohttp.ClientTimeout,
    allowed_hosts: str = "an allowed host",
) -> Fetched:
    """GET ``url``, checking it and every redirect with ``allowed``, refusing more than ``limit`` bytes.

    ``allowed_hosts`` names, in the refusal, the hosts ``allowed`` accepts.

    Raises:
        AttachmentError: a hop the policy refuses ("not fetched"), more than :data:`MAX_REDIRECTS` redirects, an
            answer other than 200, too large (``too_large``), or the host unreachable.
    """
    try:
        target = URL(url)
        for _ in range(MAX_REDIRECTS + 1):
            if not target.absolute or not allowed(target):
                raise AttachmentError(
                    f"{channel}: the file URL is not on {allowed_hosts}; not fetched", channel=channel
                )
            async with session.get(
                target, headers=dict(headers_for(target)), allow_redirects=False, timeout=client_timeout
            ) as resp:
                if resp.status in _REDIRECT_STATUSES:
                    location = resp.headers.get("Location", "")
                    if not location:
                        raise AttachmentError(f"{channel}: a file redirect without a Location", channel=channel)
                    target = target.join(URL(location))
                    continue
                if resp.status != 200:
                    raise AttachmentError(f"{channel}: the file download answered HTTP {resp.status}", channel=channel)
                data = await _read_capped(resp, limit, channel)
                content_type = resp.content_type if resp.headers.get("Content-Type") else None
                return Fetched(data, content_type, target)
    except ValueError:
        raise AttachmentError(f"{channel}: a file URL that is not a URL; not fetched", channel=channel) from None
    except (TimeoutError, aiohttp.ClientError, OSError) as exc:
        raise AttachmentError(f"{channel}: the file download failed ({type(exc).__name__})", channel=channel) from None
    raise AttachmentError(f"{channel}: more than {MAX_REDIRECTS} file redirects; not fetched", channel=channel)


async def _read_capped(resp: aiohttp.ClientResponse, limit: int, channel: str) -> bytes:
    """The body, refused (``too_large``) once the declared or the streamed size passes ``limit``."""
    if resp.content_length is not None and resp.content_length > limit:
        raise AttachmentError(f"{channel}: the file is over the {limit}-byte limit", channel=channel, too_large=True)
    data = bytearray()
    async for chunk in resp.content.iter_chunked(_CHUNK):
        data += chunk
        if len(data) > limit:
            raise AttachmentError(
                f"{channel}: the file is over the {limit}-byte limit", channel=channel, too_large=True
            )
    return bytes(data)
