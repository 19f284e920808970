"""Who is signed in to the console: sign-in sessions in Redis, the proxy header, throttling, CSRF.

A sign-in is a random token in an ``HttpOnly``, ``SameSite=Strict`` cookie, stored only as its SHA-256, with a CSRF
token every write must echo. A trusted proxy's auth header may name the operator instead. Failed sign-ins are
throttled per address and per address and name, never per name alone, so a stranger guessing a password never locks
the operator out; each try is counted before its check, so concurrent tries cannot slip past a limit together.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import ipaddress
import json
import math
import secrets
from dataclasses import dataclass
from typing import Final, Literal

from aiohttp import web
from redis.exceptions import RedisError

from switchboard.errors import QueueUnavailableError
from switchboard.queue import scripts
from switchboard.queue.keys import GlobalKeys
from switchboard.settings import Settings
from switchboard.settings.console import Operator
from switchboard.web.appkeys import REDIS, SETTINGS
from switchboard.web.clientaddr import client_address, from_trusted_proxy

__all__ = [
    "COOKIE",
    "CSRF_HEADER",
    "Signin",
    "Throttle",
    "authenticate",
    "cookie_secure",
    "end_signin",
    "start_signin",
]

COOKIE: Final = "sb_console"
CSRF_HEADER: Final = "X-CSRF-Token"
COOKIE_PATH: Final = "/console"
_TOKEN_MAX_CHARS: Final = 128
_KEYS: Final = GlobalKeys()
Via = Literal["password", "proxy"]


@dataclass(frozen=True, slots=True)
class Signin:
    """A signed-in operator: who, the CSRF token their writes carry, how they signed in, and a new cookie to set."""

    operator: Operator
    csrf: str
    via: Via
    new_token: str | None = None
    """Set when this request made the sign-in (the proxy header): the cookie the response must carry."""

    def csrf_ok(self, presented: str | None) -> bool:
        """Whether ``presented`` is this sign-in's CSRF token (constant time)."""
        if presented is None or not presented.isascii():  # header bytes that are not UTF-8 arrive surrogate-escaped
            return False
        return hmac.compare_digest(presented, self.csrf)


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def _timeout(request: web.Request) -> float:
    settings: Settings = request.config_dict[SETTINGS]
    return settings.queue.ingest_timeout_s


def _from_trusted_proxy(request: web.Request) -> bool:
    return from_trusted_proxy(request, request.config_dict[SETTINGS].trusted_proxies)


def cookie_secure(request: web.Request) -> bool:
    """Whether the sign-in cookie gets ``Secure`` (``SWITCHBOARD_CONSOLE__COOKIE_SECURE``)."""
    mode = request.config_dict[SETTINGS].console.cookie_secure
    if mode != "auto":
        return mode == "always"
    if request.secure:
        return True
    proto = request.headers.get("X-Forwarded-Proto", "").split(",")[0].strip().lower()
    return proto == "https" and _from_trusted_proxy(request)


def set_cookie(request: web.Request, response: web.StreamResponse, token: str) -> None:
    """Put the sign-in ``token`` in ``response``'s cookie (HttpOnly, SameSite=Strict, path ``/console``)."""
    response.set_cookie(
        COOKIE,
        token,
        path=COOKIE_PATH,
        httponly=True,
        samesite="Strict",
        secure=cookie_secure(request),
        max_age=request.config_dict[SETTINGS].console.session_ttl_s,
    )


def clear_cookie(response: web.StreamResponse) -> None:
    """Make the browser forget the sign-in cookie."""
    response.del_cookie(COOKIE, path=COOKIE_PATH)


async def start_signin(request: web.Request, operator: Operator, via: Via) -> Signin:
    """Store a new sign-in for ``operator``; its token is in ``new_token`` (for the cookie).

    Raises:
        QueueUnavailableError: Redis did not answer in time.
    """
    token = secrets.token_urlsafe(32)
    signin = Signin(operator=operator, csrf=secrets.token_urlsafe(32), via=via, new_token=token)
    body = json.dumps({"operator": operator.name, "csrf": signin.csrf, "via": via})
    ttl = request.config_dict[SETTINGS].console.session_ttl_s
    try:
        async with asyncio.timeout(_timeout(request)):
            await request.config_dict[REDIS].set(_KEYS.console_login(_hash(token)), body, ex=ttl)
    except (TimeoutError, RedisError, OSError) as exc:
        raise QueueUnavailableError("console sign-in not stored") from exc
    return signin


async def end_signin(request: web.Request) -> None:
    """Delete the sign-in the request's cookie names (if any).

    Raises:
        QueueUnavailableError: Redis did not answer in time.
    """
    token = _cookie_token(request)
    if token is None:
        return
    try:
        async with asyncio.timeout(_timeout(request)):
            await request.config_dict[REDIS].delete(_KEYS.console_login(_hash(token)))
    except (TimeoutError, RedisError, OSError) as exc:
        raise QueueUnavailableError("console sign-out not stored") from exc


def _cookie_token(request: web.Request) -> str | None:
    token = request.cookies.get(COOKIE)
    if not token or len(token) > _TOKEN_MAX_CHARS or not token.isascii():
        return None
    return token


async def _stored(request: web.Request) -> Signin | None:
    token = _cookie_token(request)
    if token is None:
        return None
    settings: Settings = request.config_dict[SETTINGS]
    try:
        async with asyncio.timeout(_timeout(request)):
            raw = await request.config_dict[REDIS].getex(
                _KEYS.console_login(_hash(token)), ex=settings.console.session_ttl_s
            )
    except (TimeoutError, RedisError, OSError) as exc:
        raise QueueUnavailableError("console sign-in lookup failed") from exc
    if raw is None:
        return None
    record = json.loads(raw)
    operator = settings.file.console.operator(str(record["operator"]))
    if operator is None:  # removed from the YAML file since: no longer an operator
        return None
    return Signin(operator=operator, csrf=str(record["csrf"]), via=record["via"])


async def authenticate(request: web.Request) -> Signin | None:
    """The operator the request is from, or ``None`` (anonymous).

    Raises:
        QueueUnavailableError: Redis did not answer in time.
    """
    settings: Settings = request.config_dict[SETTINGS]
    stored = await _stored(request)
    header = settings.console.auth_header
    names = request.headers.getall(header, []) if header is not None and _from_trusted_proxy(request) else []
    if len(names) > 1:  # the client's own header next to the proxy's: which one the proxy wrote is unknowable
        return None
    name = names[0].strip() if names else ""
    if not name:  # no (believable) proxy header: only a password sign-in counts
        return stored if stored is not None and stored.via == "password" else None
    if stored is not None and stored.operator.name == name:
        return stored
    operator = settings.file.console.operator(name)
    if operator is None:
        return None
    return await start_signin(request, operator, "proxy")


def _network(address: str) -> str:
    """The unit a sign-in throttle counts: an IPv4 address, or the ``/64`` of an IPv6 one.

    One IPv6 subscriber gets a whole ``/64`` and may use any address of it: counted per address, each guess could
    come from a fresh one.
    """
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return address
    return str(ipaddress.ip_network(f"{ip}/64", strict=False)) if ip.version == 6 else address


class Throttle:
    """Failed sign-ins per client address (fixed window) and per address and name (growing waits), in Redis."""

    def __init__(self, request: web.Request, name: str) -> None:
        """The counters that apply to a sign-in as ``name`` by ``request``'s client."""
        settings: Settings = request.config_dict[SETTINGS]
        console = settings.console
        self._redis = request.config_dict[REDIS]
        self._timeout_s = settings.queue.ingest_timeout_s
        self._window_s = console.login_window_s
        address = _network(client_address(request, settings.trusted_proxies))
        self._address = _KEYS.console_failures(address)
        self._address_limit = console.login_failures_per_address
        pair = _hash(f"{address}\x1f{name}")
        self._pair = [_KEYS.console_pair_failures(pair), _KEYS.console_wait(pair)]  # one hash tag: one slot
        self._pair_args: list[scripts.ScriptArg] = [
            console.login_failures_per_name,
            round(console.login_delay_s * 1000),
            console.login_window_s * 1000,
            console.login_window_s,
        ]

    async def admit(self) -> int:
        """Count this try against the address, then the address and name; ``0``: go on, else the seconds to wait.

        The try is counted before its password is checked, so concurrent tries cannot all read a count below the
        limit and all be checked. A refused try is taken back off the address's count (and never makes a count for
        its name), and so is one that signs in (:meth:`succeeded`): what stays counted are failures.

        Raises:
            QueueUnavailableError: Redis did not answer in time.
        """
        count, ttl = await self._add(self._address, 1)
        if count > self._address_limit:
            await self._add(self._address, -1)
            return ttl if ttl > 0 else self._window_s
        try:
            async with asyncio.timeout(self._timeout_s):
                wait_ms = int(await scripts.CONSOLE_THROTTLE(self._redis, self._pair, self._pair_args))
        except (TimeoutError, RedisError, OSError) as exc:
            raise QueueUnavailableError("sign-in throttle not stored") from exc
        if wait_ms > 0:
            await self._add(self._address, -1)
            return max(1, math.ceil(wait_ms / 1000))
        return 0

    async def succeeded(self) -> None:
        """Take a try that signed in back off the address's count, and forget the address and name's failures.

        Raises:
            QueueUnavailableError: Redis did not answer in time.
        """
        await self._add(self._address, -1)
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._redis.delete(*self._pair)
        except (TimeoutError, RedisError, OSError) as exc:
            raise QueueUnavailableError("sign-in throttle not stored") from exc

    async def _add(self, key: str, delta: int) -> tuple[int, int]:
        try:
            async with asyncio.timeout(self._timeout_s):
                async with self._redis.pipeline(transaction=True) as pipe:
                    pipe.incrby(key, delta)
                    pipe.expire(key, self._window_s, nx=True)  # a window starts at its first try; never endless
                    pipe.ttl(key)
                    count, _, ttl = await pipe.execute()
        except (TimeoutError, RedisError, OSError) as exc:
            raise QueueUnavailableError("sign-in throttle not stored") from exc
        return int(count), int(ttl)
