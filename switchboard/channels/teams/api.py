"""The bot's side of the Bot Connector: its own access token, and activities posted to a conversation.

The Entra client-credentials grant is one form POST made here with aiohttp: MSAL is synchronous, accepts only an
``https`` authority and looks hosts up at login.microsoftonline.com, so it could neither stay off the event loop nor
talk to the local fake. The token is cached, fetched by one caller at a time and dropped on a 401. Sends go through
the Agents SDK's ``ConnectorClient`` rooted at the verified ``serviceUrl``; a ``serviceUrl`` off the Connector's hosts
gets no call and no token. Answers map to the gateway's errors (429 → :class:`RateLimitedError`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Final

import aiohttp
from microsoft_agents.activity import Activity
from microsoft_agents.hosting.core.authorization.authentication_constants import AuthenticationConstants
from microsoft_agents.hosting.core.connector.client import ConnectorClient
from yarl import URL

from switchboard.channels.base import json_object, retry_after_s
from switchboard.channels.download import host_of
from switchboard.channels.teams.files import service_allowed
from switchboard.errors import DeliveryError, RateLimitedError

__all__ = ["BOT_SCOPE", "BotToken", "ConnectorApi"]

logger = logging.getLogger(__name__)

BOT_SCOPE: Final = f"{AuthenticationConstants.AGENTS_SDK_SCOPE}/.default"
"""The scope of the bot's token for the Connector."""
_MULTI_TENANT: Final = "botframework.com"
_EARLY_S: Final = 300.0
_POOL_SIZE: Final = 64
_TIMEOUT: Final = aiohttp.ClientTimeout(total=20, connect=5, sock_read=15)
_RETRYABLE: Final = frozenset({408, 412, 425, 500, 502, 503, 504})
_CHANNEL: Final = "teams"


class BotToken:
    """The bot's client-credentials token, cached until shortly before it expires.

    Args:
        login_base_url: The Entra login root (``https://login.microsoftonline.com``).
        tenant: The tenant id of a single-tenant bot; ``None`` for a multi-tenant one (``botframework.com``).
        app_id: The bot's app id.
        app_password: The app's client secret.
        http: Returns the connection pool to fetch with.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        login_base_url: str,
        tenant: str | None,
        app_id: str,
        app_password: str,
        http: Callable[[], aiohttp.ClientSession],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.url = f"{login_base_url.rstrip('/')}/{tenant or _MULTI_TENANT}/oauth2/v2.0/token"
        self._form = {
            "grant_type": "client_credentials",
            "client_id": app_id,
            "client_secret": app_password,
            "scope": BOT_SCOPE,
        }
        self._http = http
        self._clock = clock
        self._token: str | None = None
        self._renew_at = 0.0
        self._lock = asyncio.Lock()
        self.fetches = 0
        """Tokens fetched so far (what the cache saves)."""

    def forget(self, token: str) -> None:
        """Drop ``token`` from the cache (the Connector refused it)."""
        if self._token == token:
            self._token = None

    async def get(self) -> str:
        """The current token, fetching a new one when none is held or it expires within five minutes.

        Raises:
            DeliveryError: Entra refused the credentials (not retryable) or could not be reached (retryable).
            RateLimitedError: Entra asked to wait.
        """
        if self._token is not None and self._clock() < self._renew_at:
            return self._token
        async with self._lock:
            if self._token is not None and self._clock() < self._renew_at:
                return self._token
            token, lifetime = await self._fetch()
            self._token, self._renew_at = token, self._clock() + max(lifetime - _EARLY_S, lifetime / 2)
            self.fetches += 1
            return token

    async def _fetch(self) -> tuple[str, float]:
        try:
            async with self._http().post(self.url, data=self._form, timeout=_TIMEOUT) as resp:
                status, retry_after, raw = resp.status, resp.headers.get("Retry-After"), await resp.read()
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise DeliveryError(
                f"teams: Entra token endpoint unreachable: {type(exc).__name__}", channel=_CHANNEL
            ) from None
        if status == 429:
            raise RateLimitedError(
                "teams: Entra token endpoint rate-limited", channel=_CHANNEL, retry_after=retry_after_s(retry_after)
            )
        answer = json_object(raw)
        if answer is None:
            raise DeliveryError(
                f"teams: Entra answered HTTP {status} without JSON", channel=_CHANNEL, retryable=status >= 500
            )
        token, lifetime = answer.get("access_token"), answer.get("expires_in")
        if status == 200 and isinstance(token, str) and token:
            try:
                seconds = float(lifetime) if lifetime is not None else 3600.0
            except (TypeError, ValueError):
                seconds = 3600.0
            return token, min(max(seconds, 60.0), 86_400.0)
        error = str(answer.get("error") or f"http_{status}")[:80]
        raise DeliveryError(
            f"teams: Entra refused the bot's credentials ({error}): check SWITCHBOARD_TEAMS__APP_ID, __APP_PASSWORD "
            "and __TENANT_ID",
            channel=_CHANNEL,
            retryable=status >= 500,
        )


class ConnectorApi:
    """Activities to and updates in Bot Connector conversations, with the bot's token.

    Args:
        token: The bot's token source.
        connector_hosts: Where a conversation's ``serviceUrl`` may be (``SWITCHBOARD_TEAMS__CONNECTOR_HOSTS``).
    """

    def __init__(self, token: BotToken, connector_hosts: Collection[str]) -> None:
        self.token = token
        self.connector_hosts = connector_hosts
        self._connector: aiohttp.TCPConnector | None = None
        self._plain: aiohttp.ClientSession | None = None

    def http(self) -> aiohttp.ClientSession:
        """A session on the pool without a base URL (token and key fetches)."""
        if self._plain is None or self._plain.closed:
            self._plain = aiohttp.ClientSession(connector=self._pool(), connector_owner=False, timeout=_TIMEOUT)
        return self._plain

    def _pool(self) -> aiohttp.TCPConnector:
        if self._connector is None or self._connector.closed:
            self._connector = aiohttp.TCPConnector(limit=_POOL_SIZE, ttl_dns_cache=300)
        return self._connector

    async def send(self, service_url: str, conversation_id: str, activity: Activity) -> str:
        """``POST {service_url}/v3/conversations/{conversation_id}/activities``; returns the new activity's id.

        Raises:
            RateLimitedError: 429.
            DeliveryError: refused (``retryable`` for 412, 5xx and network trouble).
        """
        answer = await self._call(
            service_url, lambda c: c.conversations.send_to_conversation(conversation_id, activity)
        )
        return answer or ""

    async def update(self, service_url: str, conversation_id: str, activity_id: str, activity: Activity) -> None:
        """``PUT {service_url}/v3/conversations/{conversation_id}/activities/{activity_id}``.

        Raises:
            RateLimitedError: 429.
            DeliveryError: refused (``retryable`` for 412, 5xx and network trouble).
        """
        await self._call(service_url, lambda c: c.conversations.update_activity(conversation_id, activity_id, activity))

    async def _call(self, service_url: str, call: Callable[[ConnectorClient], object]) -> str | None:
        if not service_allowed(service_url, self.connector_hosts):
            raise DeliveryError(
                f"teams: the conversation's serviceUrl ({_origin(service_url)}) is not a Bot Connector host "
                "(https on a host of SWITCHBOARD_TEAMS__CONNECTOR_HOSTS); not sent",
                channel=_CHANNEL,
                retryable=False,
            )
        token = await self.token.get()
        base = service_url if service_url.endswith("/") else service_url + "/"
        session = aiohttp.ClientSession(base_url=base, connector=self._pool(), connector_owner=False, timeout=_TIMEOUT)
        try:
            client = ConnectorClient(base, token, session=session)
            answer = await call(client)  # type: ignore[misc]
        except aiohttp.ClientResponseError as exc:
            raise self._refused(exc, token) from None
        except (TimeoutError, aiohttp.ClientError, OSError) as exc:
            raise DeliveryError(f"teams: connector unreachable: {type(exc).__name__}", channel=_CHANNEL) from None
        finally:
            await session.close()
        found = getattr(answer, "id", None)
        return found if isinstance(found, str) else None

    def _refused(self, exc: aiohttp.ClientResponseError, token: str) -> DeliveryError:
        status = exc.status
        if status == 429:
            retry_after = exc.headers.get("Retry-After") if exc.headers else None
            return RateLimitedError(
                "teams: connector rate-limited", channel=_CHANNEL, retry_after=retry_after_s(retry_after)
            )
        if status == 401:
            self.token.forget(token)
            return DeliveryError("teams: connector refused the bot's token (fetching a new one)", channel=_CHANNEL)
        detail = {403: "the bot is not in the conversation", 404: "no such conversation or activity", 413: "too large"}
        why = detail.get(status, "refused")
        return DeliveryError(
            f"teams: connector answered HTTP {status}: {why}", channel=_CHANNEL, retryable=status in _RETRYABLE
        )

    async def aclose(self) -> None:
        """Close the connection pool."""
        if self._plain is not None:
            await self._plain.close()
            self._plain = None
        if self._connector is not None:
            await self._connector.close()
            self._connector = None


def _origin(service_url: str) -> str:
    """Scheme, host and port of a URL, for a message (never its userinfo or path)."""
    try:
        url = URL(service_url)
        shown = f"{url.scheme}://{host_of(url)}" if url.scheme else "no absolute URL"
        return f"{shown}:{url.explicit_port}" if url.explicit_port is not None else shown
    except (ValueError, TypeError):
        return "no URL"
