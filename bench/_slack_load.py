"""Signed Slack Events API load for wrk: each request's body differs, so each needs its own v0 signature.

wrk runs LuaJIT, which has no HMAC. The body is laid out so that everything that differs between requests
(the DM channel, ``ts`` and ``event_id``) comes last; HMAC-SHA256 of ``v0:{ts}:{body}`` is then the SHA-256
state after the key block and the constant prefix — computed here once, in Python — continued over the short
varying tail in Lua (a few 64-byte blocks per request, with LuaJIT's ``bit`` library). The Python fallback signs
with :mod:`hmac` directly; :func:`self_check` proves both agree before a run.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import struct
import time
from dataclasses import dataclass

from bench._load import PostLoad, _lua_str
from switchboard.channels.slack.fake.payloads import BOT_USER_ID, TEAM_ID

__all__ = ["SIGNING_SECRET", "SlackLoad", "midstate", "slack_load"]

SIGNING_SECRET = "bench-slack-signing-secret-0123456789abcdef"

_K = [
    0x428A2F98, 0x71374491, 0xB5C0FBCF, 0xE9B5DBA5, 0x3956C25B, 0x59F111F1, 0x923F82A4, 0xAB1C5ED5,
    0xD807AA98, 0x12835B01, 0x243185BE, 0x550C7DC3, 0x72BE5D74, 0x80DEB1FE, 0x9BDC06A7, 0xC19BF174,
    0xE49B69C1, 0xEFBE4786, 0x0FC19DC6, 0x240CA1CC, 0x2DE92C6F, 0x4A7484AA, 0x5CB0A9DC, 0x76F988DA,
    0x983E5152, 0xA831C66D, 0xB00327C8, 0xBF597FC7, 0xC6E00BF3, 0xD5A79147, 0x06CA6351, 0x14292967,
    0x27B70A85, 0x2E1B2138, 0x4D2C6DFC, 0x53380D13, 0x650A7354, 0x766A0ABB, 0x81C2C92E, 0x92722C85,
    0xA2BFE8A1, 0xA81A664B, 0xC24B8B70, 0xC76C51A3, 0xD192E819, 0xD6990624, 0xF40E3585, 0x106AA070,
    0x19A4C116, 0x1E376C08, 0x2748774C, 0x34B0BCB5, 0x391C0CB3, 0x4ED8AA4A, 0x5B9CCA4F, 0x682E6FF3,
    0x748F82EE, 0x78A5636F, 0x84C87814, 0x8CC70208, 0x90BEFFFA, 0xA4506CEB, 0xBEF9A3F7, 0xC67178F2,
]  # fmt: skip
_H0 = [0x6A09E667, 0xBB67AE85, 0x3C6EF372, 0xA54FF53A, 0x510E527F, 0x9B05688C, 0x1F83D9AB, 0x5BE0CD19]
_M = 0xFFFFFFFF


def _ror(x: int, n: int) -> int:
    return ((x >> n) | (x << (32 - n))) & _M


def _compress(state: list[int], block: bytes) -> list[int]:
    w = list(struct.unpack(">16I", block))
    for i in range(16, 64):
        s0 = _ror(w[i - 15], 7) ^ _ror(w[i - 15], 18) ^ (w[i - 15] >> 3)
        s1 = _ror(w[i - 2], 17) ^ _ror(w[i - 2], 19) ^ (w[i - 2] >> 10)
        w.append((w[i - 16] + s0 + w[i - 7] + s1) & _M)
    a, b, c, d, e, f, g, h = state
    for i in range(64):
        t1 = (h + (_ror(e, 6) ^ _ror(e, 11) ^ _ror(e, 25)) + ((e & f) ^ (~e & g)) + _K[i] + w[i]) & _M
        t2 = ((_ror(a, 2) ^ _ror(a, 13) ^ _ror(a, 22)) + ((a & b) ^ (a & c) ^ (b & c))) & _M
        a, b, c, d, e, f, g, h = (t1 + t2) & _M, a, b, c, (d + t1) & _M, e, f, g
    return [(x + y) & _M for x, y in zip(state, [a, b, c, d, e, f, g, h], strict=True)]


def midstate(secret: bytes, prefix: bytes) -> tuple[list[int], list[int], bytes]:
    """HMAC-SHA256 precomputation: (inner state after key block + whole blocks of ``prefix``, outer state, rest)."""
    key = secret if len(secret) <= 64 else hashlib.sha256(secret).digest()
    key = key.ljust(64, b"\0")
    inner = _compress(list(_H0), bytes(k ^ 0x36 for k in key))
    outer = _compress(list(_H0), bytes(k ^ 0x5C for k in key))
    whole = len(prefix) // 64 * 64
    for at in range(0, whole, 64):
        inner = _compress(inner, prefix[at : at + 64])
    return inner, outer, prefix[whole:]


_LUA_SHA = """
local bit = require("bit")
local band, bor, bxor, bnot, rshift, lshift, ror, tobit, tohex =
  bit.band, bit.bor, bit.bxor, bit.bnot, bit.rshift, bit.lshift, bit.ror, bit.tobit, bit.tohex
local byte, char, rep, floor = string.byte, string.char, string.rep, math.floor
local K = {%(k)s}
for i = 1, 64 do K[i] = tobit(K[i]) end
local w = {}
local function compress(H, s, pos)
  for i = 0, 15 do
    local a, b, c, d = byte(s, pos + i * 4, pos + i * 4 + 3)
    w[i] = bor(lshift(a, 24), lshift(b, 16), lshift(c, 8), d)
  end
  for i = 16, 63 do
    local v, u = w[i - 15], w[i - 2]
    w[i] = tobit(w[i - 16] + bxor(ror(v, 7), ror(v, 18), rshift(v, 3)) + w[i - 7]
                 + bxor(ror(u, 17), ror(u, 19), rshift(u, 10)))
  end
  local a, b, c, d, e, f, g, h = H[1], H[2], H[3], H[4], H[5], H[6], H[7], H[8]
  for i = 0, 63 do
    local t1 = tobit(h + bxor(ror(e, 6), ror(e, 11), ror(e, 25)) + bxor(band(e, f), band(bnot(e), g)) + K[i + 1] + w[i])
    local t2 = tobit(bxor(ror(a, 2), ror(a, 13), ror(a, 22)) + bxor(band(a, b), band(a, c), band(b, c)))
    h, g, f, e, d, c, b, a = g, f, e, tobit(d + t1), c, b, a, tobit(t1 + t2)
  end
  H[1], H[2], H[3], H[4] = tobit(H[1] + a), tobit(H[2] + b), tobit(H[3] + c), tobit(H[4] + d)
  H[5], H[6], H[7], H[8] = tobit(H[5] + e), tobit(H[6] + f), tobit(H[7] + g), tobit(H[8] + h)
end
local function finish(state, tail, total)
  local H = {state[1], state[2], state[3], state[4], state[5], state[6], state[7], state[8]}
  local bits = total * 8
  local pad = 64 - ((#tail + 9) %% 64)
  if pad == 64 then pad = 0 end
  local len = ""
  for i = 7, 0, -1 do len = len .. char(floor(bits / 2 ^ (8 * i)) %% 256) end
  local msg = tail .. "\\128" .. rep("\\0", pad) .. len
  for pos = 1, #msg, 64 do compress(H, msg, pos) end
  return H
end
local function digest_bytes(H)
  local out = {}
  for i = 1, 8 do
    local x = H[i]
    out[i] = char(band(rshift(x, 24), 255), band(rshift(x, 16), 255), band(rshift(x, 8), 255), band(x, 255))
  end
  return table.concat(out)
end
local function hexdigest(H)
  local out = {}
  for i = 1, 8 do out[i] = tohex(H[i], 8) end
  return table.concat(out)
end
"""


@dataclass
class SlackLoad(PostLoad):
    """:class:`PostLoad` whose every request is signed (``X-Slack-Signature`` over its own body)."""

    secret: str = SIGNING_SECRET
    timestamp: int = 0

    def request(self, n: int) -> tuple[bytes, dict[str, str]]:
        """Body and signed headers of the ``n``-th request."""
        body, headers = super().request(n)
        base = b"v0:" + str(self.timestamp).encode() + b":" + body
        headers["X-Slack-Request-Timestamp"] = str(self.timestamp)
        headers["X-Slack-Signature"] = "v0=" + hmac.new(self.secret.encode(), base, hashlib.sha256).hexdigest()
        return body, headers

    def lua(self) -> str:
        """A wrk script that builds each body and signs it, continuing a precomputed SHA-256 state."""
        prefix = b"v0:" + str(self.timestamp).encode() + b":" + self.parts[0].encode()
        inner, outer, rest = midstate(self.secret.encode(), prefix)
        consumed = len(prefix) - len(rest)
        out = ["-- generated by bench/_slack_load.py", _LUA_SHA % {"k": ", ".join(str(k) for k in _K)}]
        out.append(f"local counter = {self.start - 1}")
        out.append('wrk.method = "POST"')
        for name, value in self.headers.items():
            out.append(f"wrk.headers[{_lua_str(name)}] = {_lua_str(value)}")
        out.append(f'wrk.headers["X-Slack-Request-Timestamp"] = "{self.timestamp}"')
        out.append("local INNER = {" + ", ".join(f"tobit({x})" for x in inner) + "}")
        out.append("local OUTER = {" + ", ".join(f"tobit({x})" for x in outer) + "}")
        out.append(f"local REST = {_lua_str(rest.decode('latin-1'))}")
        out.append("local parts = {" + ", ".join(_lua_str(p) for p in self.parts) + "}")
        out.append("request = function()")
        out.append("  counter = counter + 1")
        out.append(f"  local chat = {self.chat_base} + (counter % {self.chats})")
        pieces = []
        for i in range(1, len(self.parts)):
            pieces.append("counter" if self.fields[i - 1] == "n" else "chat")
            pieces.append(f"parts[{i + 1}]")
        out.append("  local varying = " + " .. ".join(pieces))
        out.append("  local body = parts[1] .. varying")
        out.append(f"  local H = finish(INNER, REST .. varying, {64 + consumed} + #REST + #varying)")
        out.append("  local sig = hexdigest(finish(OUTER, digest_bytes(H), 96))")
        out.append('  wrk.headers["X-Slack-Signature"] = "v0=" .. sig')
        out.append(f"  return wrk.format(nil, {_lua_str(self.path)}, nil, body)")
        out.append("end")
        return "\n".join(out) + "\n"


def slack_load(*, path: str = "/webhooks/slack", start: int = 1, chats: int = 1000, size: int = 1500) -> SlackLoad:
    """Signed ``message.im`` events of about ``size`` bytes, distinct ``ts``/``event_id``, over ``chats`` DMs."""
    head = {
        "token": "unused",
        "team_id": TEAM_ID,
        "api_app_id": "A0SWITCH",
        "type": "event_callback",
        "event_time": 1700000000,
        "authorizations": [{"team_id": TEAM_ID, "user_id": BOT_USER_ID, "is_bot": True}],
    }
    opening = json.dumps(head)[:-1] + ', "event": {"type": "message", "channel_type": "im", "user": "U0HUMAN", '
    text = "benchmark " + "lorem ipsum dolor sit amet " * 80
    tail = ['", "ts": "', '.000100", "event_ts": "', '.000100"}, "event_id": "Ev', '"}']
    room = max(10, size - len(opening) - 60 - sum(map(len, tail)))
    first = opening + json.dumps({"text": text[:room]})[1:-1] + ', "channel": "D'
    return SlackLoad(
        path=path,
        parts=[first, *tail],
        fields=["chat", "n", "n", "n"],
        headers={"Content-Type": "application/json"},
        start=start,
        chats=chats,
        timestamp=int(time.time()),
    )


def self_check() -> None:
    """The precomputed HMAC agrees with :mod:`hmac` (the Lua code runs the same steps)."""
    spec = slack_load()
    prefix = b"v0:" + str(spec.timestamp).encode() + b":" + spec.parts[0].encode()
    body, headers = spec.request(7)
    inner, outer, rest = midstate(spec.secret.encode(), prefix)
    tail = rest + body[len(spec.parts[0].encode()) :]
    total = 64 + len(prefix) - len(rest) + len(tail)
    state = inner
    msg = tail + b"\x80" + b"\0" * ((55 - len(tail)) % 64) + struct.pack(">Q", total * 8)
    for at in range(0, len(msg), 64):
        state = _compress(state, msg[at : at + 64])
    digest = struct.pack(">8I", *state)
    msg = digest + b"\x80" + b"\0" * 23 + struct.pack(">Q", 96 * 8)
    signature = "v0=" + struct.pack(">8I", *_compress(outer, msg)).hex()
    assert signature == headers["X-Slack-Signature"], "midstate HMAC disagrees with hmac"
