"""A small Graph API client on one aiohttp pool, shared by the Meta channels, and its error classification.

There is no official Python SDK for the Graph API. The token lives only in the ``Authorization`` header, never in a
URL, a log, an event or an exception's text; errors are classified by :func:`classify`. Downloads check every hop
(:func:`media_allowed`: Meta's media domains over https, or the configured Graph origin), follow redirects by hand
and cap the size; the token goes only to the hosts that want it (:data:`TOKEN_HOSTS`).
"""

from __future__ import annotations

import json
import logging
import random
from typing import Any, Final, Literal

import aiohttp
from yarl import URL

from switchboard.channels.base import json_object
from switchboard.channels.download import Fetched, download, host_of
from switchboard.channels.meta.webhook import record_event
from switchboard.errors import DeliveryError, RateLimitedError

__all__ = [
    "AUTH_CODES",
    "MEDIA_DOMAINS",
    "THROTTLE_CODES",
    "TOKEN_HOSTS",
    "GraphApi",
    "GraphError",
    "GraphErrorKind",
    "GraphRateLimited",
    "backoff_s",
    "classify",
    "media_allowed",
    "sends_token",
    "window_closed",
]

GraphErrorKind = Literal["auth", "window", "recipient", "transient", "refused"]

THROTTLE_CODES: Final = frozenset(
    {4, 17, 32, 613, 80001, 80002, 80003, 80004, 80005, 80006, 80007, 80008, 80009, 80014, 130429, 131048, 131056}
)
AUTH_CODES: Final = frozenset({190, 102, 10, 3, 131005, *range(200, 300)})
_WINDOW: Final = frozenset({(131047, None), (10, 2018278), (10, 2534022), (100, 2018108), (551, 1545041)})
_RECIPIENT_CODES: Final = frozenset({131026, 131030, 131021, 551})
_RECIPIENT_SUBCODES: Final = frozenset({2018001, 2018109, 1545041, 2534014})
_TRANSIENT_CODES: Final = frozenset({1, 2, 131000, 131016, 133004})
_BACKOFF_S: Final = {130429: 2.0, 131056: 6.0, 131048: 60.0, 80007: 60.0}
_DEFAULT_BACKOFF_S: Final = 30.0
_POOL_SIZE: Final = 128
_TIMEOUT: Final = aiohttp.ClientTimeout(total=20, connect=5, sock_read=15)
_DOWNLOAD_TIMEOUT: Final = aiohttp.ClientTimeout(total=120, connect=5, sock_read=30)
MEDIA_DOMAINS: Final = ("fbcdn.net", "fbsbx.com", "cdninstagram.com")
"""Where Meta serves media (a host is allowed when it is one of these or a subdomain of one)."""
TOKEN_HOSTS: Final = frozenset({"lookaside.fbsbx.com"})
"""Media hosts that want the bearer token (WhatsApp's media URLs); signed CDN URLs never get it."""


def media_allowed(url: URL, graph_base_url: str) -> bool:
    """Whether a download may reach ``url``: https on Meta's media domains, or the configured Graph API's origin."""
    if url.user is not None or url.password is not None or not url.absolute:
        return False
    if url.origin() == URL(graph_base_url).origin():
        return True
    host = host_of(url)
    on_meta = any(host == domain or host.endswith("." + domain) for domain in MEDIA_DOMAINS)
    return url.scheme == "https" and on_meta and url.port == 443


def sends_token(url: URL, graph_base_url: str) -> bool:
    """Whether an authorized download hands ``url`` the bearer token: the Graph host, or a :data:`TOKEN_HOSTS` one."""
    if url.origin() == URL(graph_base_url).origin():
        return True
    return url.scheme == "https" and host_of(url) in TOKEN_HOSTS and url.port == 443


class GraphError(DeliveryError):
    """The Graph API refused a call or could not be reached.

    Args:
        message: What failed (never a token).
        channel: The channel.
        kind: How the error was classified (see the module docstring).
        code: Meta's ``error.code`` (0 when there was none).
        subcode: Meta's ``error.error_subcode``.
        http_status: The HTTP status (0 for network trouble).
    """

    def __init__(
        self,
        message: str,
        *,
        channel: str,
        kind: GraphErrorKind,
        code: int = 0,
        subcode: int | None = None,
        http_status: int = 0,
    ) -> None:
        super().__init__(message, channel=channel, retryable=kind == "transient")
        self.kind: GraphErrorKind = kind
        self.code = code
        self.subcode = subcode
        self.http_status = http_status


class GraphRateLimited(RateLimitedError):
    """The Graph API throttled the call (``code``); retry after :attr:`retry_after` seconds (jittered)."""

    def __init__(self, message: str, *, channel: str, retry_after: float, code: int) -> None:
        super().__init__(message, channel=channel, retry_after=retry_after)
        self.code = code


def backoff_s(code: int) -> float:
    """A jittered wait for a throttling code (±25 % around the code's default; Meta gives no ``Retry-After``)."""
    base = _BACKOFF_S.get(code, _DEFAULT_BACKOFF_S)
    return base * random.uniform(0.75, 1.25)


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def classify(status: int, answer: Any, *, channel: str, what: str) -> GraphError | GraphRateLimited:
    """The error an unsuccessful answer (``status``, parsed JSON or ``None``) stands for.

    Errors come as ``{"error": {"code", "error_subcode", "message", ...}}`` and are classified (:func:`classify`):

    - throttling (codes 4, 17, 32, 613, 80001–80014, 130429, 131048, 131056) → :class:`GraphRateLimited` with a
      jittered back-off (Meta sends no reliable ``Retry-After``);
    - auth (190, 102, 10 and 200–299 permissions, 131005, HTTP 401) → :class:`GraphError` ``kind="auth"``, not
      retryable, and an ``auth_failed`` alert (event + count + ERROR log);
    - messaging window closed (WhatsApp 131047; Messenger/Instagram code 10 with subcode 2018278, 2534022, or
      code 100 subcode 2018108) → ``kind="window"``, not retryable (the channel sends its template or records it);
    - invalid recipient (131026, 131030, 131021, 551, code 100 with subcode 2018001/2018109/1545041) →
      ``kind="recipient"``, not retryable (the outbox dead-letters the send);
    - 5xx, codes 1/2/131000/131016/133004 and network trouble → retryable :class:`GraphError` ``kind="transient"``;
    - anything else → ``kind="refused"``, not retryable.
    """
    error = answer.get("error") if isinstance(answer, dict) else None
    error = error if isinstance(error, dict) else {}
    code = _int(error.get("code")) or 0
    subcode = _int(error.get("error_subcode"))
    label = f"{channel} {what}: HTTP {status}, code {code}" + (f"/{subcode}" if subcode is not None else "")
    if code in THROTTLE_CODES or status == 429:
        return GraphRateLimited(f"{label}: throttled", channel=channel, retry_after=backoff_s(code), code=code)
    if (code, subcode) in _WINDOW or (code, None) in _WINDOW:
        return GraphError(
            f"{label}: outside the messaging window",
            channel=channel,
            kind="window",
            code=code,
            subcode=subcode,
            http_status=status,
        )
    if code in _RECIPIENT_CODES or (code == 100 and subcode in _RECIPIENT_SUBCODES):
        return GraphError(
            f"{label}: recipient cannot be reached",
            channel=channel,
            kind="recipient",
            code=code,
            subcode=subcode,
            http_status=status,
        )
    if code in AUTH_CODES or status == 401:
        return GraphError(
            f"{label}: access token or permission refused",
            channel=channel,
            kind="auth",
            code=code,
            subcode=subcode,
            http_status=status,
        )
    if status >= 500 or code in _TRANSIENT_CODES or (status == 200 and not error):
        return GraphError(
            f"{label}: Graph API failing",
            channel=channel,
            kind="transient",
            code=code,
            subcode=subcode,
            http_status=status,
        )
    return GraphError(
        f"{label}: refused", channel=channel, kind="refused", code=code, subcode=subcode, http_status=status
    )


class GraphApi:
    """Graph API calls for one account's token against a configurable base URL.

    Args:
        token: The access token (WhatsApp system-user token, Page or Instagram token).
        base_url: ``GRAPH_BASE_URL`` with the version (``https://graph.facebook.com/v23.0``).
        channel: The channel (for errors and events).
        account: The account name (for events).
    """

    def __init__(self, token: str, base_url: str, *, channel: str, account: str) -> None:
        self._auth = {"Authorization": f"Bearer {token}"}
        self._token = token
        self.base_url = base_url.rstrip("/")
        self.channel = channel
        self.account = account
        self._session: aiohttp.ClientSession | None = None

    def http(self) -> aiohttp.ClientSession:
        """The connection pool (created on first use)."""
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=_POOL_SIZE, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector, timeout=_TIMEOUT, raise_for_status=False)
        return self._session

    def url(self, path: str) -> str:
        """``{base}/{path}``."""
        return f"{self.base_url}/{path.lstrip('/')}"

    async def post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        """POST ``body`` as JSON to ``{base}/{path}``; returns the answer's JSON object.

        Raises:
            GraphRateLimited: throttled (retry after ``retry_after``).
            GraphError: classified (see the module docstring); ``retryable`` only for ``transient``.
        """
        data = json.dumps(body, separators=(",", ":")).encode()
        headers = {**self._auth, "Content-Type": "application/json"}
        return await self._call("POST", path, data=data, headers=headers)

    async def get(self, path: str) -> dict[str, Any]:
        """GET ``{base}/{path}``; returns the answer's JSON object (errors as :meth:`post`)."""
        return await self._call("GET", path, headers=self._auth)

    async def upload(
        self, path: str, fields: dict[str, str], name: str, data: bytes, mime: str, *, field: str = "file"
    ) -> dict[str, Any]:
        """POST a multipart form (``fields`` plus the file in ``field``) to ``{base}/{path}`` (errors as :meth:`post`).

        WhatsApp's ``/{phone_number_id}/media`` takes the file as ``file``; Messenger's Send API as ``filedata``.
        """
        form = aiohttp.FormData()
        for key, value in fields.items():
            form.add_field(key, value)
        form.add_field(field, data, filename=name, content_type=mime)
        return await self._call("POST", path, data=form, headers=self._auth)

    async def _call(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        what = f"{method} {path.split('?', 1)[0][:80]}"
        try:
            async with self.http().request(method, self.url(path), **kwargs) as resp:
                status, raw = resp.status, await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise GraphError(
                f"{self.channel} {what}: Graph API unreachable ({type(exc).__name__})",
                channel=self.channel,
                kind="transient",
            ) from None
        answer = json_object(raw)
        if 200 <= status < 300 and answer is not None and "error" not in answer:
            return answer
        error = classify(status, answer, channel=self.channel, what=what)
        if isinstance(error, GraphError) and error.kind == "auth":
            self._alert(error)
        raise error

    def _alert(self, error: GraphError) -> None:
        record_event(
            self.channel,
            self.account,
            "auth_failed",
            level=logging.ERROR,
            code=error.code,
            subcode=error.subcode if error.subcode is not None else 0,
            hint="renew the account access token or grant its permissions",
        )

    async def download(self, url: str, limit: int, *, authorized: bool) -> Fetched:
        """Download ``url`` from Meta's media hosts, refusing more than ``limit`` bytes.

        Every hop — ``url`` and each redirect, followed by hand, at most ``_download.MAX_REDIRECTS`` — must pass
        :func:`media_allowed`. With ``authorized`` (WhatsApp media), the bearer token goes to the hops
        :func:`sends_token` names, and to no other.

        Raises:
            AttachmentError: too large, gone, refused, off Meta's media hosts, too many redirects, or unreachable.
        """
        return await download(
            self.http(),
            url,
            limit,
            allowed=lambda target: media_allowed(target, self.base_url),
            headers_for=lambda target: self._auth if authorized and sends_token(target, self.base_url) else {},
            channel=self.channel,
            client_timeout=_DOWNLOAD_TIMEOUT,
            allowed_hosts="Meta's CDN",
        )

    async def aclose(self) -> None:
        """Close the pool."""
        session, self._session = self._session, None
        if session is not None and not session.closed:
            await session.close()


def window_closed(error: GraphError, *, account: str, remedy: str) -> DeliveryError:
    """Record a send refused because the messaging window is closed, and the error that dead-letters it.

    The ``window_closed`` event (WARNING) and count are recorded here; the returned non-retryable error carries a
    message saying what to configure (``remedy``), which the outbox records as the send's dead-letter reason.
    """
    record_event(
        error.channel,
        account,
        "window_closed",
        level=logging.WARNING,
        code=error.code,
        subcode=error.subcode if error.subcode is not None else 0,
    )
    return DeliveryError(
        f"{error.channel}: not sent: outside the 24-hour messaging window (code {error.code}); {remedy}",
        channel=error.channel,
        retryable=False,
    )
