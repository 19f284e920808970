"""Who may post to the Teams webhook: the Bot Framework's JWT on every activity, checked with the published keys.

The checks are listed on :class:`TokenValidator`. The Agents SDK's ``JwtTokenValidator`` is not used: it reads keys
from fixed Microsoft URLs, leaves the issuer check off by default, checks neither ``serviceurl`` nor endorsements,
accepts a token without ``exp`` and fetches keys blocking the event loop. Here keys are fetched with aiohttp, kept for a
day and refetched for an unknown ``kid`` at most once per cool-down, so forged key ids cannot make the gateway hammer
Microsoft; a failed fetch is ``ConnectionError`` (503, and the Connector retries).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import aiohttp
import jwt
from microsoft_agents.hosting.core.authorization.authentication_constants import AuthenticationConstants

from switchboard.channels.base import header_values
from switchboard.errors import SignatureError

__all__ = [
    "BOT_FRAMEWORK_ISSUER",
    "CLOCK_SKEW_S",
    "BotFrameworkKeys",
    "SigningKey",
    "TokenValidator",
    "VerifiedToken",
]

logger = logging.getLogger(__name__)

BOT_FRAMEWORK_ISSUER: Final = AuthenticationConstants.AGENTS_SDK_TOKEN_ISSUER
"""``https://api.botframework.com``: the issuer of the tokens the Bot Connector sends."""
CLOCK_SKEW_S: Final = 300.0
"""The Bot Framework's documented clock skew for ``exp`` / ``nbf``."""
_KEYS_TTL_S: Final = 24 * 3600.0
_REFRESH_COOLDOWN_S: Final = 300.0
_FETCH_TIMEOUT: Final = aiohttp.ClientTimeout(total=10, connect=5)
_MAX_DOCUMENT: Final = 1 << 20
_MAX_TOKEN: Final = 16_384
_CHANNEL: Final = "teams"


@dataclass(frozen=True, slots=True)
class SigningKey:
    """One published key: its RSA public key and the channels it is endorsed for (empty: no endorsements)."""

    key: jwt.PyJWK
    endorsements: frozenset[str]


class BotFrameworkKeys:
    """The signing keys of one OpenID metadata document, fetched asynchronously and cached.

    Args:
        metadata_url: The OpenID metadata (``…/.well-known/openidconfiguration``); its ``jwks_uri`` holds the keys.
        http: Returns the connection pool to fetch with.
        refresh_cooldown_s: Least time between two fetches caused by an unknown ``kid``.
        clock: Monotonic seconds (tests pass their own).
    """

    def __init__(
        self,
        metadata_url: str,
        http: Callable[[], aiohttp.ClientSession],
        *,
        refresh_cooldown_s: float = _REFRESH_COOLDOWN_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.metadata_url = metadata_url
        self._http = http
        self._cooldown = refresh_cooldown_s
        self._clock = clock
        self._keys: dict[str, SigningKey] = {}
        self._fetched_at: float | None = None
        self._lock = asyncio.Lock()
        self.fetches = 0
        """How many times the key set was fetched (what the cool-down bounds)."""

    async def key(self, kid: str) -> SigningKey | None:
        """The key named ``kid``, fetching the key set when it is stale or lacks ``kid`` (within the cool-down).

        Raises:
            ConnectionError: the metadata or the key set could not be fetched and no fresh copy is held.
        """
        now = self._clock()
        if self._fetched_at is not None and now - self._fetched_at < _KEYS_TTL_S and kid in self._keys:
            return self._keys[kid]
        async with self._lock:
            now = self._clock()
            fresh = self._fetched_at is not None and now - self._fetched_at < _KEYS_TTL_S
            if kid in self._keys and fresh:
                return self._keys[kid]
            if not fresh or self._fetched_at is None or now - self._fetched_at >= self._cooldown:
                try:
                    await self._refresh()
                except ConnectionError:
                    if not fresh:
                        raise
                    logger.warning("teams: refreshing the signing keys failed; keeping the ones held")
            return self._keys.get(kid)

    async def _refresh(self) -> None:
        metadata = await self._get_json(self.metadata_url)
        jwks_uri = metadata.get("jwks_uri")
        if not isinstance(jwks_uri, str) or not jwks_uri.startswith(("https://", "http://")):
            raise ConnectionError("the OpenID metadata names no jwks_uri")
        document = await self._get_json(jwks_uri)
        found = document.get("keys")
        if not isinstance(found, list):
            raise ConnectionError("the key set has no keys")
        keys: dict[str, SigningKey] = {}
        for item in found:
            parsed = _signing_key(item)
            if parsed is not None:
                keys[parsed[0]] = parsed[1]
        self._keys = keys
        self._fetched_at = self._clock()
        self.fetches += 1
        logger.info("teams: %d signing keys loaded from the OpenID metadata", len(keys))

    async def _get_json(self, url: str) -> dict[str, Any]:
        try:
            async with self._http().get(url, timeout=_FETCH_TIMEOUT) as resp:
                if resp.status != 200:
                    raise ConnectionError(f"HTTP {resp.status} fetching the Bot Framework signing keys")
                raw = await resp.content.read(_MAX_DOCUMENT + 1)
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise ConnectionError(f"could not fetch the Bot Framework signing keys: {type(exc).__name__}") from None
        if len(raw) > _MAX_DOCUMENT:
            raise ConnectionError("the signing-key document is over 1 MiB")
        try:
            document = json.loads(raw)
        except ValueError:
            raise ConnectionError("the signing-key document is not JSON") from None
        if not isinstance(document, dict):
            raise ConnectionError("the signing-key document is not a JSON object")
        return document


def _signing_key(item: object) -> tuple[str, SigningKey] | None:
    """``(kid, key)`` of one JWK, or ``None`` for a key that cannot sign RS256 tokens."""
    if not isinstance(item, dict) or not isinstance(item.get("kid"), str) or item.get("kty") != "RSA":
        return None
    if item.get("use", "sig") != "sig":
        return None
    endorsements = item.get("endorsements") or []
    if not isinstance(endorsements, list):
        return None
    try:
        key = jwt.PyJWK({k: v for k, v in item.items() if k != "endorsements"}, algorithm="RS256")
    except (jwt.PyJWTError, ValueError, TypeError, KeyError):
        return None
    return item["kid"], SigningKey(key, frozenset(str(e) for e in endorsements))


def _bearer(headers: Mapping[str, str]) -> str:
    values = header_values(headers, "Authorization")
    if not values:
        raise SignatureError("missing Authorization header (the Bot Connector sends a bearer token)", channel=_CHANNEL)
    scheme, _, token = values[0].partition(" ")
    if len(values) != 1 or scheme.lower() != "bearer" or not token or len(token) > _MAX_TOKEN:
        raise SignatureError("malformed Authorization header", channel=_CHANNEL)
    return token.strip()


class TokenValidator:
    """Checks the Bot Connector's token on one activity.

    Every activity the Bot Connector posts carries ``Authorization: Bearer <JWT>``. It is accepted only when:

    - the header names ``RS256`` (``none``, ``HS256`` and every other algorithm are refused before any key is looked
      up) and a ``kid`` found among the signing keys of the OpenID metadata (``SWITCHBOARD_TEAMS__OPENID_METADATA_URL``
      → ``jwks_uri``), and the signature verifies with that key;
    - the key's ``endorsements``, when it has some, name the activity's ``channelId`` (``msteams``);
    - ``iss`` is ``https://api.botframework.com``, ``aud`` the bot's app id, and ``exp`` / ``nbf`` hold within the Bot
      Framework's 5-minute clock skew (``exp``, ``iss`` and ``aud`` must be present: PyJWT checks ``exp`` only when a
      token has one);
    - the ``serviceurl`` claim equals the activity's ``serviceUrl``, so a replayed or forged activity cannot point the
      bot's replies at another host.

    Everything that needs no activity is checked first (:meth:`TokenValidator.authenticate`), before the body is parsed,
    so an unauthenticated request costs no JSON parse; the endorsement and ``serviceurl`` checks follow on the parsed
    activity (:meth:`VerifiedToken.check`).

    Args:
        app_id: The bot's Microsoft app id (the audience).
        keys: The signing keys.
    """

    def __init__(self, app_id: str, keys: BotFrameworkKeys) -> None:
        self.app_id = app_id
        self.keys = keys

    async def authenticate(self, headers: Mapping[str, str]) -> VerifiedToken:
        """Check the request's bearer token on its own — everything that needs no activity — before the body is read.

        An unauthenticated request therefore costs no parse of its body; :meth:`VerifiedToken.check` then binds the
        token to the parsed activity.

        Raises:
            SignatureError: 401 for a missing, malformed, forged, expired or misdirected token.
            ConnectionError: the signing keys could not be fetched (answer 503; the Connector retries).
        """
        token = _bearer(headers)
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise SignatureError("the bearer token is not a JWT", channel=_CHANNEL) from None
        if header.get("alg") != "RS256":
            raise SignatureError("the token is not signed with RS256", channel=_CHANNEL)
        kid = header.get("kid")
        if not isinstance(kid, str) or not kid or len(kid) > 256:
            raise SignatureError("the token names no signing key", channel=_CHANNEL)
        found = await self.keys.key(kid)
        if found is None:
            raise SignatureError("the token's signing key is not among the Bot Framework's keys", channel=_CHANNEL)
        try:
            claims = jwt.decode(
                token,
                found.key,
                algorithms=["RS256"],
                audience=self.app_id,
                issuer=BOT_FRAMEWORK_ISSUER,
                leeway=CLOCK_SKEW_S,
                options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.PyJWTError as exc:
            raise SignatureError(f"the token did not verify ({type(exc).__name__})", channel=_CHANNEL) from None
        claimed = claims.get(AuthenticationConstants.SERVICE_URL_CLAIM)
        if not isinstance(claimed, str):
            raise SignatureError("the token has no serviceurl claim", channel=_CHANNEL)
        return VerifiedToken(claimed, found.endorsements)

    async def validate(self, headers: Mapping[str, str], service_url: str | None, channel_id: str | None) -> None:
        """Accept the request's bearer token for an activity with ``service_url`` and ``channel_id``, or refuse it.

        Raises:
            SignatureError: 401 for a missing, malformed, forged, expired or misdirected token.
            ConnectionError: the signing keys could not be fetched (answer 503; the Connector retries).
        """
        (await self.authenticate(headers)).check(service_url, channel_id)


@dataclass(frozen=True, slots=True)
class VerifiedToken:
    """A bearer token whose signature, issuer, audience and lifetime held; not yet bound to an activity."""

    service_url: str
    """The ``serviceurl`` claim."""
    endorsements: frozenset[str]
    """The signing key's endorsements (empty: none)."""

    def check(self, service_url: str | None, channel_id: str | None) -> None:
        """Bind the token to the activity: its key is endorsed for ``channel_id``, its claim names ``service_url``.

        Raises:
            SignatureError: 401 when either does not hold.
        """
        if self.endorsements and (channel_id is None or channel_id not in self.endorsements):
            raise SignatureError("the signing key is not endorsed for the activity's channel", channel=_CHANNEL)
        if service_url is None or self.service_url != service_url:
            raise SignatureError("the token's serviceurl claim does not match the activity", channel=_CHANNEL)
