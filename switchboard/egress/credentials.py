"""Short-lived credentials: tokens egress obtains itself (OAuth2 client credentials, token exchange) and injects.

A request carries ``{{credential:NAME}}`` (or ``{{credential:NAME:scope …}}``, a subset of the configured scope) in a
header; :class:`CredentialBroker` hands the forwarder a bearer token for the request's tenant and scope. Tokens are
kept in this process's memory only, until ``refresh_margin_s`` before they expire; concurrent requests for one
missing token share one fetch. The token endpoint is reached by the forwarder's own guarded client (address checks,
the upstream CA), never through the caller. A token never appears in a log, an event or a response (responses are
redacted of it like a secret).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import quote, urlencode

from switchboard.egress.placeholders import PlaceholderRefusedError, Secret
from switchboard.egress.policy import host_matches
from switchboard.settings.computer import EgressCredential

__all__ = [
    "CREDENTIAL",
    "CredentialBroker",
    "CredentialError",
    "Filled",
    "TokenReply",
    "credential_placeholder",
    "refuse_elsewhere",
]

logger = logging.getLogger(__name__)

CREDENTIAL: Final = re.compile(r"\{\{\s*credential:([A-Za-z0-9_]{1,64})(?::([A-Za-z0-9_.:/ -]{1,512}?))?\s*\}\}")
"""``{{credential:NAME}}`` or ``{{credential:NAME:scope1 scope2}}``."""
_MARKER: Final = re.compile(rb"\{\{\s*credential:", re.IGNORECASE)
_UNSTATED_LIFETIME_S: Final = 300.0
"""How long a token whose response names no ``expires_in`` is used (a 401 still replaces it sooner)."""
_SHOWN: Final = 200
"""Characters of a token endpoint's ``error_description`` passed on."""

TokenReply = tuple[int, bytes]
"""The token endpoint's status and body."""


def credential_placeholder(name: str) -> str:
    """The text a token of credential ``name`` is shown as (in a response that echoes it)."""
    return "{{credential:" + name.upper() + "}}"


def refuse_elsewhere(headers: Sequence[tuple[str, str]], elsewhere: Sequence[bytes]) -> None:
    """Refuse a credential placeholder in a header name, the URL or the body (it is filled in header values only).

    Raises:
        PlaceholderRefusedError: ``placeholder_outside_headers``.
    """
    if any(_MARKER.search(part) for part in elsewhere) or any(
        _MARKER.search(name.encode("latin-1", "replace")) for name, _ in headers
    ):
        raise PlaceholderRefusedError("placeholder_outside_headers")


class CredentialError(Exception):
    """No token: ``reason`` is a refusal code, ``detail`` says what to fix (never a secret or a token)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(frozen=True, slots=True)
class _Token:
    value: str
    good_until: float


@dataclass(frozen=True, slots=True)
class Filled:
    """Headers with tokens in place of credential placeholders, and what was put in (to redact and to refresh)."""

    headers: list[tuple[str, str]]
    used: tuple[tuple[str, str, str, str], ...]
    """``(name, tenant, scope, token)`` of each token put in."""

    @property
    def names(self) -> tuple[str, ...]:
        """``credential:NAME`` of each credential used (what the event log records)."""
        return tuple(dict.fromkeys(f"credential:{name}" for name, _t, _s, _v in self.used))

    def hidden(self, credentials: Mapping[str, EgressCredential]) -> tuple[Secret, ...]:
        """The tokens put in, as secrets a response is redacted of."""
        return tuple(
            _as_secret(name, value, credentials[name]) for name, _tenant, _scope, value in dict.fromkeys(self.used)
        )


def _as_secret(name: str, value: str, credential: EgressCredential) -> Secret:
    from pydantic import SecretStr

    return Secret(name, SecretStr(value), credential.hosts, shown=credential_placeholder(name))


Fetch = Callable[[str, str, Mapping[str, str], bytes, tuple[str, ...]], Awaitable[TokenReply]]
"""``(credential name, token URL, headers, form body, secret names used) -> (status, body)``; raises
:class:`CredentialError` when the endpoint cannot be reached."""


class CredentialBroker:
    """Obtains, caches and refreshes the tokens of the configured credentials (one per process)."""

    def __init__(
        self,
        credentials: Mapping[str, EgressCredential],
        secrets: Mapping[str, Secret],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Build the broker.

        Args:
            credentials: the configured credentials (any case; placeholders name them in upper case).
            secrets: the deployment's egress secrets by upper-case name (client secrets, subject tokens).
            clock: seconds, monotonic (tests move it on).
        """
        self.credentials = {name.upper(): c for name, c in credentials.items()}
        self.secrets = secrets
        self.clock = clock
        self._cache: dict[tuple[str, str, str], _Token] = {}
        self._inflight: dict[tuple[str, str, str], asyncio.Future[_Token]] = {}

    async def fill(
        self, headers: Sequence[tuple[str, str]], host: str, tenant: str, *, secure: bool, fetch: Fetch
    ) -> Filled:
        """Put a token in place of each credential placeholder in ``headers`` (values only).

        Raises:
            PlaceholderRefusedError: ``unknown_credential``, ``credential_unbound`` (``host`` is not one of its
                hosts), ``placeholder_insecure`` or ``credential_scope`` (more than the configured scope).
            CredentialError: no token could be obtained.
        """
        wanted: list[tuple[str, str]] = []
        for _name, value in headers:
            if "{{" not in value:
                continue
            if _MARKER.search(CREDENTIAL.sub("", value).encode("latin-1", "replace")):
                raise PlaceholderRefusedError("unknown_credential")  # malformed: never sent on as it is
            for match in CREDENTIAL.finditer(value):
                wanted.append((match.group(1).upper(), " ".join((match.group(2) or "").split())))
        if not wanted:
            return Filled(list(headers), ())
        tokens: dict[tuple[str, str], str] = {}
        for name, asked in wanted:
            credential = self.credentials.get(name)
            if credential is None:
                raise PlaceholderRefusedError("unknown_credential")
            if not host_matches(host, credential.hosts):
                raise PlaceholderRefusedError("credential_unbound")
            if not secure:
                raise PlaceholderRefusedError("placeholder_insecure")
            scope = asked or credential.scope
            if asked and credential.scope and not set(asked.split()) <= set(credential.scope.split()):
                raise PlaceholderRefusedError("credential_scope")
            if (name, asked) not in tokens:
                tokens[(name, asked)] = await self.token(name, tenant, scope, fetch)
        used: list[tuple[str, str, str, str]] = []

        def put(match: re.Match[str]) -> str:
            name, asked = match.group(1).upper(), " ".join((match.group(2) or "").split())
            value = tokens[(name, asked)]
            used.append((name, tenant, asked or self.credentials[name].scope, value))
            return value

        out = [(n, CREDENTIAL.sub(put, v) if "{{" in v else v) for n, v in headers]
        return Filled(out, tuple(used))

    async def token(self, name: str, tenant: str, scope: str, fetch: Fetch) -> str:
        """A live token of credential ``name`` for ``tenant`` and ``scope``: cached, else fetched once for everyone.

        Raises:
            CredentialError: the token endpoint refused or could not be reached.
        """
        key = (name, tenant, scope)
        cached = self._cache.get(key)
        if cached is not None and cached.good_until > self.clock():
            return cached.value
        pending = self._inflight.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._obtain(key, fetch))
            self._inflight[key] = pending
            pending.add_done_callback(functools.partial(self._settled, key))
        token = await asyncio.shield(pending)
        return token.value

    def _settled(self, key: tuple[str, str, str], done: asyncio.Future[_Token]) -> None:
        """A fetch ended: the next request for ``key`` may start another (after a failure, or once it expires)."""
        self._inflight.pop(key, None)
        if not done.cancelled():
            done.exception()  # retrieved here too: every waiter may have gone

    def invalidate(self, used: Sequence[tuple[str, str, str, str]]) -> None:
        """Forget tokens an upstream refused (401), unless another request has already replaced them."""
        for name, tenant, scope, value in used:
            cached = self._cache.get((name, tenant, scope))
            if cached is not None and cached.value == value:
                del self._cache[(name, tenant, scope)]

    def live(self, host: str) -> tuple[Secret, ...]:
        """Every cached token that may be sent to ``host``: what a response from it is redacted of."""
        return tuple(
            _as_secret(name, token.value, self.credentials[name])
            for (name, _tenant, _scope), token in self._cache.items()
            if host_matches(host, self.credentials[name].hosts)
        )

    def _form(self, name: str, credential: EgressCredential, tenant: str, scope: str) -> tuple[dict[str, str], bytes]:
        """The token request's headers and form body (RFC 6749 §4.4, RFC 8693 §2.1)."""
        form: dict[str, str] = {}
        if credential.type == "oauth2_client_credentials":
            form["grant_type"] = "client_credentials"
        else:
            subject = self.secrets[(credential.subject_token_secret or "").upper()]
            form["grant_type"] = "urn:ietf:params:oauth:grant-type:token-exchange"
            form["subject_token"] = subject.value.get_secret_value()
            form["subject_token_type"] = credential.subject_token_type
            form["requested_token_type"] = "urn:ietf:params:oauth:token-type:access_token"  # noqa: S105 (a type URI)
        if scope:
            form["scope"] = scope
        if credential.audience:
            form["audience"] = credential.audience
        headers = {"Content-Type": "application/x-www-form-urlencoded", "Accept": "application/json"}
        client = credential.client(tenant)
        if client is not None:
            secret = self.secrets.get((client.client_secret_secret or "").upper())
            password = secret.value.get_secret_value() if secret is not None else ""
            if credential.client_auth == "basic":
                pair = f"{quote(client.client_id, safe='')}:{quote(password, safe='')}"
                headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
            else:
                form["client_id"] = client.client_id
                if password:
                    form["client_secret"] = password
        return headers, urlencode(form).encode()

    def _used_secrets(self, credential: EgressCredential, tenant: str) -> tuple[str, ...]:
        client = credential.client(tenant)
        names = [client.client_secret_secret if client else None, credential.subject_token_secret]
        return tuple(n.upper() for n in names if n)

    async def _obtain(self, key: tuple[str, str, str], fetch: Fetch) -> _Token:
        name, tenant, scope = key
        credential = self.credentials[name]
        headers, body = self._form(name, credential, tenant, scope)
        started = self.clock()
        try:
            status, data = await fetch(
                name, credential.token_url, headers, body, self._used_secrets(credential, tenant)
            )
            token = self._parse(name, credential, tenant, status, data, started)
        except CredentialError as err:
            logger.warning("egress: no token for tenant %s: %s", tenant, err.detail)
            raise
        self._cache[key] = token
        logger.info(
            "egress: credential %s: a new token for tenant %s, scope %r, used for %.0f s",
            name,
            tenant,
            scope,
            token.good_until - started,
        )
        return token

    def _parse(
        self, name: str, credential: EgressCredential, tenant: str, status: int, data: bytes, started: float
    ) -> _Token:
        """The token of a token endpoint's answer, or the error that says what to fix."""
        where = f"credential {name}: the token endpoint {credential.token_url}"
        try:
            answer = json.loads(data) if data else {}
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            reason = "credential_unavailable" if status >= 500 else "credential_rejected"
            raise CredentialError(reason, f"{where} answered HTTP {status} without a JSON body")
        if status >= 500:
            raise CredentialError("credential_unavailable", f"{where} answered HTTP {status}; try again later")
        if status != 200 or "error" in answer:
            code = self._clean(str(answer.get("error", "unknown_error")), credential, tenant)
            told = self._clean(str(answer.get("error_description", "")), credential, tenant)
            hint = {
                "invalid_client": "check client_id and the client secret's egress secret",
                "invalid_scope": "ask for scopes the client is granted",
                "unauthorized_client": "the client may not use this grant type",
                "invalid_grant": "check the subject token's egress secret",
            }.get(code, "check the credential's settings")
            detail = f"{where} answered HTTP {status} {code}" + (f": {told}" if told else "") + f" ({hint})"
            raise CredentialError("credential_rejected", detail)
        value = answer.get("access_token")
        kind = str(answer.get("token_type", "")).lower()
        if not isinstance(value, str) or not value or "\r" in value or "\n" in value:
            raise CredentialError("credential_rejected", f"{where} answered without an access_token")
        if kind != "bearer":
            raise CredentialError("credential_rejected", f"{where} issued a {kind or 'typeless'} token, not a Bearer")
        lifetime = answer.get("expires_in")
        if isinstance(lifetime, str) and lifetime.isdigit():  # some servers send it as a string
            lifetime = int(lifetime)
        seconds = _UNSTATED_LIFETIME_S
        if isinstance(lifetime, int | float) and not isinstance(lifetime, bool) and lifetime > 0:
            seconds = float(lifetime)
        margin = min(credential.refresh_margin_s, seconds / 2)
        return _Token(value=value, good_until=started + seconds - margin)

    def _clean(self, text: str, credential: EgressCredential, tenant: str) -> str:
        """A token endpoint's words, printable, short, and without any secret of the request in them."""
        for secret_name in self._used_secrets(credential, tenant):
            secret = self.secrets.get(secret_name)
            if secret is not None and secret.value.get_secret_value():
                text = text.replace(secret.value.get_secret_value(), "{{secret:" + secret_name + "}}")
        return "".join(c for c in text if c.isprintable())[:_SHOWN]
