"""The policy layer itself: one request in, checked, secrets injected, sent on, capped, recorded.

The proxy and :class:`~switchboard.egress.client.EgressClient` both call :meth:`Forwarder.forward`, so every way out
of the host passes the same checks (grant, method, host, port, address, size, placeholders); redirects go back to the
client and are checked from the start. Responses from a host a secret is bound to are redacted (reason, header
values, body; a header named after a secret is dropped), decoded first; an encoding the proxy cannot decode is
refused. A ``{{credential:NAME}}`` placeholder gets a short-lived token egress obtains itself
(:mod:`switchboard.egress.credentials`); on a 401 the token is replaced once and the request sent again.
"""

from __future__ import annotations

import logging
import ssl
import time
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final
from urllib.parse import unquote_to_bytes

import aiohttp
from aiohttp.abc import AbstractResolver
from multidict import CIMultiDict
from yarl import URL

from switchboard.egress.addresses import AddressGuard, AddressRefusedError, GuardedResolver
from switchboard.egress.credentials import CredentialBroker, CredentialError, Filled, TokenReply, refuse_elsewhere
from switchboard.egress.events import EgressRequested, EgressSink
from switchboard.egress.placeholders import PlaceholderRefusedError, Secret, Substitution, redact, substitute
from switchboard.egress.policy import EgressPolicy, Grant, host_matches, is_ip_literal
from switchboard.queue.keys import tenant_of
from switchboard.settings import EgressSettings
from switchboard.types import SessionKey

__all__ = ["REFUSAL_STATUS", "Forwarder", "Outcome"]

logger = logging.getLogger(__name__)

REFUSAL_STATUS: Final = {
    "no_grant": 407,
    "bad_request": 400,
    "method_not_allowed": 405,
    "request_too_large": 413,
    "response_too_large": 502,
    "response_encoding": 502,
    "upstream_error": 502,
    "upstream_tls": 502,
    "upstream_timeout": 504,
    "credential_rejected": 502,
    "credential_unavailable": 502,
}
"""The status a refusal is answered with; every reason not listed here is 403."""

_HOP: Final = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "content-length",
        "host",
    }
)
_SKIP_AUTO: Final = ("User-Agent", "Accept", "Accept-Encoding", "Content-Type")
_NO_BODY: Final = frozenset({204, 304})
_GZIP, _ZLIB = 16 + zlib.MAX_WBITS, zlib.MAX_WBITS
_TOKEN_REPLY_BYTES: Final = 65536
"""Largest token endpoint answer read."""


def _inflate(data: bytes, coding: str, limit: int) -> bytes | str:
    """``data`` decoded from one content coding, or the refusal reason (unknown coding, broken, over ``limit``)."""
    if coding == "identity":
        return data
    if coding in ("gzip", "x-gzip"):
        tries = [_GZIP]
    elif coding == "deflate":
        tries = [_ZLIB, -_ZLIB]  # zlib-wrapped as HTTP says, or raw deflate as some servers send it
    else:
        return "response_encoding"
    for wbits in tries:
        out, rest = b"", data
        try:
            while rest:  # gzip may hold several members
                inflater = zlib.decompressobj(wbits)
                out += inflater.decompress(rest, limit + 1 - len(out))
                if len(out) > limit:
                    return "response_too_large"
                if not inflater.eof:
                    break
                rest = inflater.unused_data
                if wbits != _GZIP:
                    break
        except zlib.error:
            continue
        if inflater.eof and not (wbits != _GZIP and rest):
            return out
    return "response_encoding"


def _decoded(data: bytes, codings: list[str], limit: int) -> bytes | str:
    """``data`` decoded from every content coding applied (last applied, first undone), or the refusal reason."""
    if not data:
        return data
    for coding in reversed(codings):
        step = _inflate(data, coding, limit)
        if isinstance(step, str):
            return step
        data = step
    return data


@dataclass(frozen=True, slots=True)
class Outcome:
    """What the client is answered: the destination's response, or the proxy's refusal (``refused`` set)."""

    status: int
    reason: str
    headers: list[tuple[str, str]]
    body: bytes
    refused: str | None = None

    @classmethod
    def refusal(cls, reason: str, detail: str = "") -> Outcome:
        """A plain-text refusal naming its reason code (and ``detail``: what to fix, never a secret)."""
        headers = [("content-type", "text/plain; charset=utf-8")]
        if reason == "no_grant":
            headers.append(("proxy-authenticate", 'Basic realm="switchboard-egress"'))
        return cls(
            status=REFUSAL_STATUS.get(reason, 403),
            reason="Refused",
            headers=headers,
            body=f"egress refused: {reason}{': ' + detail if detail else ''}\n".encode(),
            refused=reason,
        )


class Forwarder:
    """Applies the egress policy to requests and sends the allowed ones on (one connection pool per process)."""

    def __init__(
        self,
        policy: EgressPolicy,
        settings: EgressSettings,
        sink: EgressSink,
        *,
        resolver: AbstractResolver | None = None,
    ) -> None:
        """Build the forwarder.

        Args:
            policy: agents' rules and the caps.
            settings: timeouts, internal networks, the extra upstream CA.
            sink: where each request's fact goes.
            resolver: the DNS resolver under the address check (the system's; tests map test names to loopback).
        """
        self.policy = policy
        self.settings = settings
        self.sink = sink
        self.guard = AddressGuard(settings.internal_networks)
        self._resolver = resolver
        self._session: aiohttp.ClientSession | None = None
        self._tls = ssl.create_default_context()
        if settings.upstream_ca_file is not None:
            self._tls.load_verify_locations(cafile=str(settings.upstream_ca_file))
        self._timeout = aiohttp.ClientTimeout(total=settings.timeout_s, sock_connect=settings.connect_timeout_s)
        secrets = {
            name.upper(): Secret(name.upper(), s.value, tuple(s.domains)) for name, s in settings.secrets.items()
        }
        self.credentials = CredentialBroker(settings.credentials, secrets)

    def _client(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(
                resolver=GuardedResolver(self.guard, self._resolver), use_dns_cache=False, ssl=self._tls, limit=256
            )
            # no cookie jar: one agent's cookies must never ride on another's requests
            self._session = aiohttp.ClientSession(
                connector=connector, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False, timeout=self._timeout
            )
        return self._session

    async def close(self) -> None:
        """Close the connection pool."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def precheck(self, grant: Grant | None, method: str, host: str, port: int) -> str | None:
        """The reason a request to ``host:port`` is refused before anything is sent, or ``None``."""
        if grant is None:
            return "no_grant"
        if method != "CONNECT" and method not in self.policy.methods:
            return "method_not_allowed"
        if not host:
            return "bad_request"
        if not self.policy.rules(grant.agent).allows(host):
            return "domain_not_allowed"
        if port not in self.policy.ports:
            return "port_not_allowed"
        if is_ip_literal(host):
            return self.guard.refusal(host.strip("[]"))
        return None

    async def forward(
        self, grant: Grant | None, method: str, url: URL, headers: Sequence[tuple[str, str]], body: bytes
    ) -> Outcome:
        """Check one request, send it on if allowed, and record it; never raises for a refusal or a network error."""
        started = time.perf_counter()
        host = (url.host or "").lower().rstrip(".")
        port = url.port or (443 if url.scheme == "https" else 80)
        substitution: Substitution | None = None
        filled: Filled | None = None
        detail = ""
        refused = self.precheck(grant, method, host, port)
        if refused is None and url.scheme not in ("http", "https"):
            refused = "bad_request"
        if refused is None and len(body) > self.policy.max_request_bytes:
            refused = "request_too_large"
        if refused is None and grant is not None:
            rules = self.policy.rules(grant.agent)
            try:
                # placeholders are never substituted outside headers, so decoding one level is enough to refuse
                # them clearly rather than send them on as text (``%7B%7Bsecret:`` is how clients encode them)
                raw = url.raw_path_qs.encode()
                elsewhere = [raw, unquote_to_bytes(raw), body, unquote_to_bytes(body.replace(b"+", b" "))]
                refuse_elsewhere(headers, elsewhere)
                substitution = substitute(
                    headers,
                    elsewhere,
                    rules.secrets,
                    lambda s: host_matches(host, s.domains),
                    secure=url.scheme == "https",  # the proxy's own leg to the destination is TLS
                )
                filled = await self._fill(grant, host, url, substitution)
            except PlaceholderRefusedError as err:
                refused = err.reason
            except CredentialError as err:
                refused, detail = err.reason, err.detail
        if refused is None and substitution is not None and filled is not None and grant is not None:
            outcome = await self._send(method, url, substitution, filled, body, host)
            if outcome.status == 401 and filled.used:  # the token may have been revoked early: replace it once
                self.credentials.invalidate(filled.used)
                try:
                    filled = await self._fill(grant, host, url, substitution)
                    outcome = await self._send(method, url, substitution, filled, body, host)
                except CredentialError as err:
                    outcome = Outcome.refusal(err.reason, err.detail)
        else:
            outcome = Outcome.refusal(refused or "bad_request", detail)
        names = (*(s.name for s in substitution.used), *filled.names) if substitution and filled else ()
        await self._record(grant, method, url, host, port, outcome, names, len(body), started)
        return outcome

    async def _fill(self, grant: Grant, host: str, url: URL, sub: Substitution) -> Filled:
        """``sub``'s headers with tokens in place of credential placeholders, for the grant's tenant."""

        async def fetch(
            name: str, token_url: str, headers: Mapping[str, str], form: bytes, secrets: tuple[str, ...]
        ) -> TokenReply:
            return await self._fetch_token(grant, name, URL(token_url), headers, form, secrets)

        tenant = tenant_of(SessionKey(grant.session))
        return await self.credentials.fill(sub.headers, host, tenant, secure=url.scheme == "https", fetch=fetch)

    async def _fetch_token(
        self, grant: Grant, name: str, url: URL, headers: Mapping[str, str], form: bytes, secrets: tuple[str, ...]
    ) -> TokenReply:
        """POST a token request through the guarded client (address checks, upstream CA) and record it.

        Raises:
            CredentialError: ``credential_unavailable``, naming why the endpoint was not reached.
        """
        started = time.perf_counter()
        host = (url.host or "").lower().rstrip(".")
        port = url.port or 443
        refused: str | None = None
        if port not in self.policy.ports:
            refused = "port_not_allowed"
        elif is_ip_literal(host):
            refused = self.guard.refusal(host.strip("[]"))
        reply: TokenReply | None = None
        if refused is None:
            sent = {**headers, "Accept-Encoding": "identity"}
            try:
                async with self._client().post(url, headers=sent, data=form, allow_redirects=False) as resp:
                    data = await resp.content.read(_TOKEN_REPLY_BYTES + 1)
                    reply = (resp.status, data) if len(data) <= _TOKEN_REPLY_BYTES else None
                    refused = "response_too_large" if reply is None else None
            except aiohttp.ClientConnectorCertificateError:
                refused = "upstream_tls"
            except aiohttp.ClientConnectorError as err:
                refused = err.os_error.reason if isinstance(err.os_error, AddressRefusedError) else "upstream_error"
            except TimeoutError:
                refused = "upstream_timeout"
            except (aiohttp.ClientError, ValueError):
                refused = "upstream_error"
        if reply is None:
            outcome = Outcome.refusal(refused or "upstream_error")
        else:
            outcome = Outcome(status=reply[0], reason="", headers=[], body=reply[1])
        await self._record(grant, "POST", url, host, port, outcome, secrets, len(form), started)
        if reply is None:
            raise CredentialError(
                "credential_unavailable",
                f"credential {name}: the token endpoint {url.with_query(None)} could not be reached ({refused})",
            )
        return reply

    async def refuse(self, grant: Grant | None, method: str, url: URL, reason: str) -> Outcome:
        """Record and return a refusal decided outside the policy (a malformed or oversized request)."""
        outcome = Outcome.refusal(reason)
        host = (url.host or "").lower().rstrip(".")
        port = url.port or (443 if url.scheme == "https" else 80)
        await self._record(grant, method, url, host, port, outcome, (), 0, time.perf_counter())
        return outcome

    async def _send(self, method: str, url: URL, sub: Substitution, filled: Filled, body: bytes, host: str) -> Outcome:
        """Send the request on; the response comes back redacted of every secret and token bound to ``host``."""
        hidden = self.policy.bound_to(host)
        extra = (*sub.used, *filled.hidden(self.credentials.credentials), *self.credentials.live(host))
        hidden = (*hidden, *(s for s in extra if s not in hidden))
        headers: CIMultiDict[str] = CIMultiDict((n, v) for n, v in filled.headers if n.lower() not in _HOP)
        if hidden:  # a secret can only be taken back out of a response the proxy can read
            headers["Accept-Encoding"] = "identity"
        try:
            async with self._client().request(
                method,
                url,
                headers=headers,
                data=body or None,
                allow_redirects=False,
                skip_auto_headers=_SKIP_AUTO,
            ) as resp:
                chunks: list[bytes] = []
                total = 0
                async for chunk in resp.content.iter_chunked(65536):
                    total += len(chunk)
                    if total > self.policy.max_response_bytes:
                        return Outcome.refusal("response_too_large")
                    chunks.append(chunk)
                raw_headers = resp.raw_headers
                status, reason = resp.status, resp.reason or ""
        except aiohttp.ClientConnectorCertificateError:
            return Outcome.refusal("upstream_tls")
        except aiohttp.ClientConnectorError as err:
            if isinstance(err.os_error, AddressRefusedError):
                return Outcome.refusal(err.os_error.reason)
            return Outcome.refusal("upstream_error")
        except TimeoutError:
            return Outcome.refusal("upstream_timeout")
        except (aiohttp.ClientError, ValueError):
            return Outcome.refusal("upstream_error")
        out = [
            (name.decode("latin-1"), redact(value, hidden).decode("latin-1"))
            for name, value in raw_headers
            if name.decode("latin-1").lower() not in _HOP or (method == "HEAD" and name.lower() == b"content-length")
            if redact(name, hidden) == name  # a header named after a secret is dropped: no placeholder fits a name
        ]
        reason = redact(reason.encode("latin-1", "replace"), hidden).decode("latin-1")
        data = b"".join(chunks) if status not in _NO_BODY else b""
        if hidden and method != "HEAD":
            named = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in raw_headers]
            codings = [
                c.strip().lower()
                for header in ("content-encoding", "transfer-encoding")  # applied in this order, undone backwards
                for name, value in named
                if name == header
                for c in value.split(",")
                if c.strip() and c.strip().lower() != "chunked"  # aiohttp undid the chunked framing
            ]
            decoded = _decoded(data, codings, self.policy.max_response_bytes)
            if isinstance(decoded, str):
                return Outcome.refusal(decoded)
            data = redact(decoded, hidden)
            out = [(n, v) for n, v in out if n.lower() != "content-encoding"]  # sent on decoded
        return Outcome(status=status, reason=reason, headers=out, body=data)

    async def _record(
        self,
        grant: Grant | None,
        method: str,
        url: URL,
        host: str,
        port: int,
        outcome: Outcome,
        names: Sequence[str],
        bytes_out: int,
        started: float,
    ) -> None:
        event = EgressRequested(
            agent=grant.agent if grant else None,
            session=grant.session if grant else None,
            method=method[:16],
            scheme=url.scheme,
            host=host[:253],
            port=port,
            path=url.raw_path[:200],
            status=outcome.status,
            decision="refused" if outcome.refused else "allowed",
            reason=outcome.refused,
            bytes_out=bytes_out if outcome.refused is None else 0,
            bytes_in=len(outcome.body) if outcome.refused is None else 0,
            secrets=tuple(names) if outcome.refused is None else (),
            duration_ms=round((time.perf_counter() - started) * 1000, 3),
        )
        try:
            await self.sink.record(event)
        except Exception as err:  # Redis down: the request already happened; a lost fact must not fail it
            logger.warning("egress: could not record a request (%s)", type(err).__name__)
