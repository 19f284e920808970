"""Reading a mailbox over IMAP: search a folder, read one message's text and list its attachments.

Folders are opened read-only (``EXAMINE``) and bodies fetched with ``BODY.PEEK``, so reading changes no flag. A
message's structure (``BODYSTRUCTURE``) is read first: only its text part is fetched, up to a byte cap; attachments
are listed (name, type, size) and never downloaded. Everything read is the sender's text: untrusted data.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import email.header
import imaplib
import itertools
import quopri
import re
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from email.parser import BytesHeaderParser
from email.policy import default as default_policy
from html.parser import HTMLParser
from typing import Any

from switchboard.connectors.email.network import Imap, ImapTls, tls_context
from switchboard.connectors.email.settings import MailSettings
from switchboard.egress.addresses import AddressGuard

__all__ = ["MailError", "Mailbox", "imap_quote"]

_SUMMARY_FIELDS = "BODY.PEEK[HEADER.FIELDS (FROM TO CC SUBJECT DATE MESSAGE-ID)]"
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")


class MailError(Exception):
    """A mail operation failed; the message is safe to show (never a credential, never the server's raw reply)."""


def imap_quote(text: str) -> str:
    """``text`` as an IMAP quoted string.

    Raises:
        MailError: it holds a line break or NUL (which no quoted string may carry).
    """
    if any(c in text for c in "\r\n\0"):
        raise MailError("line breaks are not allowed here")
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


# ---------------------------------------------------------------------------------------------- IMAP responses

_TOKEN = re.compile(rb'\s*(?:(\()|(\))|"((?:[^"\\]|\\.)*)"|((?:[^\s()"\[\]]|\[[^\]]*\])+))', re.DOTALL)
"""A parenthesis, a quoted string, or an atom (``BODY[HEADER.FIELDS (FROM)]<0>`` is one atom, brackets and all)."""
_LITERAL_AT_END = re.compile(rb"\{(\d+)\}\s*$")


_OPEN, _CLOSE = object(), object()


class _Literal(bytes):
    """A literal string of the response (never an atom such as ``NIL``)."""


def _tokens(data: list[Any]) -> Iterator[Any]:
    """The tokens of a response as imaplib hands it over: bytes, and ``(text ending in {n}, literal)`` pairs."""
    for piece in data:
        if isinstance(piece, tuple):
            head, literal = piece
            yield from _scan(_LITERAL_AT_END.sub(b"", head))
            yield _Literal(literal)
        elif isinstance(piece, bytes):
            yield from _scan(piece)


def _scan(text: bytes) -> Iterator[Any]:
    for match in _TOKEN.finditer(text):
        opened, closed, quoted, atom = match.groups()
        if opened:
            yield _OPEN
        elif closed:
            yield _CLOSE
        elif quoted is not None:
            yield _Literal(re.sub(rb"\\(.)", rb"\1", quoted))
        elif atom:
            yield atom


def _parse(tokens: Iterator[Any]) -> list[Any]:
    """Nested lists of the tokens; ``NIL`` is ``None``, strings are ``str`` (decoded as UTF-8, as IMAP4rev1 allows)."""
    stack: list[list[Any]] = [[]]
    for piece in tokens:
        if piece is _OPEN:
            stack.append([])
        elif piece is _CLOSE:
            if len(stack) > 1:
                done = stack.pop()
                stack[-1].append(done)
        elif isinstance(piece, _Literal):
            stack[-1].append(bytes(piece).decode("utf-8", "replace"))
        else:
            stack[-1].append(None if piece.upper() == b"NIL" else piece.decode("ascii", "replace"))
    return stack[0]


def _after(items: list[Any], key: str) -> Any:
    """The value after ``key`` in a FETCH response's attribute list."""
    for index, item in enumerate(items[:-1]):
        if isinstance(item, str) and item.upper() == key:
            return items[index + 1]
    return None


# ---------------------------------------------------------------------------------------------- body structure


@dataclass(frozen=True, slots=True)
class _Part:
    section: str
    mime_type: str
    params: dict[str, str]
    encoding: str
    size: int
    disposition: str | None
    filename: str | None


def _pairs(value: Any) -> dict[str, str]:
    if not isinstance(value, list):
        return {}
    return {str(k).lower(): str(v) for k, v in zip(value[::2], value[1::2], strict=False) if k is not None}


def _decoded_name(params: dict[str, str]) -> str | None:
    for key in ("filename", "name"):
        if key in params:
            raw = params[key]
        elif f"{key}*" in params:  # RFC 2231: charset'language'percent-encoded
            charset, _, rest = params[f"{key}*"].partition("'")
            try:
                return urllib.parse.unquote(rest.partition("'")[2], encoding=charset or "utf-8", errors="replace")
            except LookupError:
                return urllib.parse.unquote(rest.partition("'")[2], errors="replace")
        else:
            continue
        try:
            return str(email.header.make_header(email.header.decode_header(raw)))
        except (ValueError, LookupError):
            return raw
    return None


def _leaves(structure: list[Any], section: str = "") -> Iterator[_Part]:
    """Every leaf part of a ``BODYSTRUCTURE``, with its section number (``1``, ``1.2``, …)."""
    if structure and isinstance(structure[0], list):  # multipart: the parts, then the subtype and extensions
        children = list(itertools.takewhile(lambda item: isinstance(item, list), structure))
        for index, child in enumerate(children, 1):
            yield from _leaves(child, f"{section}.{index}" if section else str(index))
        return
    if len(structure) < 7:
        return
    main, sub = str(structure[0] or "").lower(), str(structure[1] or "").lower()
    params = _pairs(structure[2])
    try:
        size = int(structure[6] or 0)
    except (TypeError, ValueError):
        size = 0
    # after the 7 basic fields: text has a line count; message/rfc822 an envelope, a body and a line count; then
    # the extension fields (md5, disposition, ...)
    if main == "text":
        extensions = structure[8:]
    elif (main, sub) == ("message", "rfc822"):
        extensions = structure[10:]
    else:
        extensions = structure[7:]
    disposition: str | None = None
    disposition_params: dict[str, str] = {}
    if len(extensions) > 1 and isinstance(extensions[1], list) and extensions[1]:
        disposition = str(extensions[1][0]).lower() if extensions[1][0] else None
        disposition_params = _pairs(extensions[1][1] if len(extensions[1]) > 1 else None)
    yield _Part(
        section=section or "1",
        mime_type=f"{main}/{sub}",
        params=params,
        encoding=str(structure[5] or "7bit").lower(),
        size=size,
        disposition=disposition,
        filename=_decoded_name(disposition_params) or _decoded_name(params),
    )


def _is_attachment(part: _Part) -> bool:
    return part.disposition == "attachment" or part.filename is not None or not part.mime_type.startswith("text/")


def _decode(raw: bytes, part: _Part) -> str:
    if part.encoding == "base64":
        compact = re.sub(rb"[^A-Za-z0-9+/=]", b"", raw)
        try:
            raw = base64.b64decode(compact[: len(compact) - len(compact) % 4])
        except (binascii.Error, ValueError):
            raw = b""
    elif part.encoding == "quoted-printable":
        raw = quopri.decodestring(raw)
    charset = part.params.get("charset", "utf-8")
    try:
        return raw.decode(charset, "replace")
    except LookupError:
        return raw.decode("utf-8", "replace")


class _Text(HTMLParser):
    """The visible text of an HTML body (scripts and styles dropped)."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "head"):
            self._hidden += 1
        elif tag in ("br", "p", "div", "li", "tr", "h1", "h2", "h3"):
            self.parts.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "head") and self._hidden:
            self._hidden -= 1

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.parts.append(data)


def _html_text(html: str) -> str:
    parser = _Text()
    parser.feed(html)
    parser.close()
    return re.sub(r"\n\s*\n+", "\n\n", "".join(parser.parts)).strip()


# ---------------------------------------------------------------------------------------------- the mailbox


def _header_fields(raw: bytes) -> dict[str, Any]:
    headers = BytesHeaderParser(policy=default_policy).parsebytes(raw)

    def text(name: str) -> str:
        try:
            value = headers.get(name)
        except (ValueError, IndexError):  # a header the parser cannot make sense of: shown as absent
            return ""
        return " ".join(str(value).split()) if value is not None else ""

    return {
        "from": text("From"),
        "to": text("To"),
        "cc": text("Cc"),
        "subject": text("Subject"),
        "date": text("Date"),
        "message_id": text("Message-ID"),
    }


def _imap_date(day: dt.date) -> str:
    return f"{day.day:02d}-{_MONTHS[day.month - 1]}-{day.year:04d}"


class Mailbox:
    """One account's IMAP side: a connection per operation, logged in and out around it."""

    def __init__(self, settings: MailSettings, guard: AddressGuard) -> None:
        self.settings = settings
        self.guard = guard

    def _connect(self) -> imaplib.IMAP4:
        s = self.settings
        try:
            if s.imap_tls == "tls":
                imap: imaplib.IMAP4 = ImapTls(s.imap_host, s.imap_port, self.guard, tls_context(s), s.timeout_s)
            else:
                imap = Imap(s.imap_host, s.imap_port, self.guard, s.imap_tls, s.timeout_s)
                if s.imap_tls == "starttls":
                    imap.starttls(tls_context(s))
        except (OSError, imaplib.IMAP4.error) as exc:
            raise MailError(f"the IMAP server {s.imap_host} could not be reached: {_reason(exc)}") from None
        try:
            imap.login(s.username, s.password.get_secret_value())
        except imaplib.IMAP4.error:
            _close(imap)
            raise MailError(f"the IMAP server {s.imap_host} refused the login of {s.username}") from None
        return imap

    def _open(self, imap: imaplib.IMAP4, folder: str) -> None:
        status, _ = imap.select(imap_quote(folder), readonly=True)
        if status != "OK":
            raise MailError(f"there is no folder {folder!r}")

    def search(self, folder: str, query: str, since: dt.date | None, limit: int) -> list[dict[str, Any]]:
        """The newest ``limit`` messages of ``folder`` matching ``query`` (anywhere in the message) since ``since``.

        Raises:
            MailError: the server could not be reached, refused the login, or has no such folder.
        """
        imap = self._connect()
        try:
            self._open(imap, folder)
            criteria: list[str] = []
            if since is not None:
                criteria += ["SINCE", _imap_date(since)]
            if query and query.isascii():
                criteria += ["TEXT", imap_quote(query)]
            elif query:
                imap.literal = query.encode()  # type: ignore[assignment]  # imaplib sends bytes as the last argument
                criteria = ["CHARSET", "UTF-8", *criteria, "TEXT"]
            status, data = imap.uid("SEARCH", *(criteria or ["ALL"]))
            if status != "OK":
                raise MailError("the IMAP server refused the search")
            uids = sorted({int(n) for n in b" ".join(d for d in data if isinstance(d, bytes)).split()})[-limit:]
            if not uids:
                return []
            status, data = imap.uid("FETCH", ",".join(map(str, uids)), f"(UID RFC822.SIZE FLAGS {_SUMMARY_FIELDS})")
            if status != "OK":
                raise MailError("the IMAP server refused to fetch the messages")
            found = [_summary(response) for response in _responses(data)]
            return sorted((f for f in found if f is not None), key=lambda f: -int(f["uid"]))
        except imaplib.IMAP4.error as exc:
            raise MailError(f"the IMAP server failed: {_reason(exc)}") from None
        finally:
            _close(imap)

    def read(self, folder: str, uid: int) -> dict[str, Any]:
        """One message: its headers, its text (capped), and its attachments listed, never fetched.

        Raises:
            MailError: the server could not be reached, refused the login, or has no such folder or message.
        """
        imap = self._connect()
        try:
            self._open(imap, folder)
            status, data = imap.uid("FETCH", str(uid), "(UID RFC822.SIZE BODYSTRUCTURE BODY.PEEK[HEADER])")
            responses = _responses(data) if status == "OK" else []
            if not responses:
                raise MailError(f"there is no message {uid} in {folder!r}")
            items = responses[0]
            header = _after(items, "BODY[HEADER]")
            structure = _after(items, "BODYSTRUCTURE")
            try:
                leaves = list(_leaves(structure)) if isinstance(structure, list) else []
            except (TypeError, ValueError, IndexError):
                raise MailError(f"the structure of message {uid} could not be read") from None
            texts = [p for p in leaves if not _is_attachment(p)]
            body_part = next((p for p in texts if p.mime_type == "text/plain"), texts[0] if texts else None)
            text, truncated = "", False
            if body_part is not None:
                cap = self.settings.max_fetch_bytes
                status, data = imap.uid("FETCH", str(uid), f"(BODY.PEEK[{body_part.section}]<0.{cap}>)")
                raw = next((bytes(p[1]) for p in data if isinstance(p, tuple)), b"") if status == "OK" else b""
                text = _decode(raw, body_part).replace("\r\n", "\n")
                if body_part.mime_type == "text/html":
                    text = _html_text(text)
                text = text.strip()
                truncated = body_part.size > cap
            limit = self.settings.max_body_chars
            truncated = truncated or len(text) > limit
            attachments = [
                {"filename": p.filename or "", "content_type": p.mime_type, "size": p.size}
                for p in leaves
                if _is_attachment(p)
            ]
            return {
                "uid": uid,
                "folder": folder,
                **_header_fields(header.encode() if isinstance(header, str) else b""),
                "body": text[:limit],
                "body_truncated": truncated,
                "attachments": attachments,
            }
        except imaplib.IMAP4.error as exc:
            raise MailError(f"the IMAP server failed: {_reason(exc)}") from None
        finally:
            _close(imap)


def _responses(data: list[Any]) -> list[list[Any]]:
    """The attribute list of each ``* n FETCH (...)`` response."""
    parsed = _parse(_tokens(data))
    return [item for item in parsed if isinstance(item, list)]


def _summary(items: list[Any]) -> dict[str, Any] | None:
    uid = _after(items, "UID")
    if uid is None:
        return None
    header = next((v for k, v in itertools.pairwise(items) if str(k).upper().startswith("BODY[")), "")
    flags = _after(items, "FLAGS")
    return {
        "uid": int(uid),
        **_header_fields(header.encode() if isinstance(header, str) else b""),
        "size": int(_after(items, "RFC822.SIZE") or 0),
        "seen": isinstance(flags, list) and any(str(f).lower() == "\\seen" for f in flags),
    }


def _reason(exc: BaseException) -> str:
    """What went wrong (the login's failure is reported without the server's reply, which may echo what was sent)."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc) or type(exc).__name__
    return str(exc)[:200] or type(exc).__name__


def _close(imap: imaplib.IMAP4) -> None:
    with contextlib.suppress(OSError, imaplib.IMAP4.error):
        imap.logout()
