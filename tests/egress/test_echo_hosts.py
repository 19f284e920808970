"""A host bound to a secret gets it back out of every response: whatever the request carried, however encoded.

The local HTTPS server of ``tests/egress/conftest.py`` plays the hostile host: ``/store`` keeps the credential a
request sent and ``/recall`` shows it to a later request without one; ``/encoded-echo`` answers compressed although
the proxy asked for ``identity``. The client here reads the bytes the proxy sends as they are, then decodes them as
``curl --compressed`` would.
"""

from __future__ import annotations

import gzip
import zlib

import aiohttp
import pytest

from switchboard.egress.placeholders import placeholder
from tests.egress.conftest import SECRET_VALUE, SHARED_VALUE, World

TOKEN = placeholder("GITHUB_TOKEN")


async def _fetch(world: World, url: str, headers: dict[str, str] | None = None) -> tuple[int, dict[str, str], bytes]:
    """Status, headers and the body exactly as the proxy sent it (not decompressed)."""
    proxy = f"http://{world.grant.token}:grant@{world.proxy.host}:{world.proxy.port}"
    async with (
        aiohttp.ClientSession(auto_decompress=False) as http,
        http.get(
            url, proxy=proxy, ssl=world.client_tls() if url.startswith("https") else None, headers=headers or {}
        ) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.read()


def _as_curl_compressed_shows(headers: dict[str, str], body: bytes) -> bytes:
    """The body decoded by its ``Content-Encoding`` (what ``curl --compressed`` prints)."""
    for coding in reversed([c.strip() for c in headers.get("Content-Encoding", "").split(",") if c.strip()]):
        body = gzip.decompress(body) if coding in ("gzip", "x-gzip") else zlib.decompress(body)
    return body


async def test_a_stored_secret_read_back_without_a_placeholder_is_redacted(world: World) -> None:
    url = world.url("api.example.test", "/store", tls=True)
    status, _, _ = await _fetch(world, url, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200 and world.tls.stored == f"Bearer {SECRET_VALUE}"  # the host holds the real value
    status, headers, body = await _fetch(world, world.url("api.example.test", "/recall", tls=True))
    assert status == 200
    assert body == f"you stored: Bearer {TOKEN}".encode()
    assert headers["X-Stored"] == f"Bearer {TOKEN}"
    assert SECRET_VALUE not in repr(headers)


async def test_a_shared_secret_bound_to_the_host_is_redacted_too(world: World) -> None:
    world.public.stored = f"k={SHARED_VALUE}"  # what another client (or agent) left there
    status, headers, body = await _fetch(world, world.url("other.example.test", "/recall"))
    assert status == 200 and SHARED_VALUE.encode() not in body and SHARED_VALUE not in repr(headers)
    assert placeholder("SHARED").encode() in body


@pytest.mark.parametrize("coding", ["gzip", "x-gzip", "deflate", "gzip, gzip", "deflate, gzip"])
@pytest.mark.parametrize("chunked", [False, True])
async def test_a_compressed_echo_is_decoded_and_redacted(world: World, coding: str, chunked: bool) -> None:
    query = f"?enc={coding}" + ("&chunked=1" if chunked else "")
    url = world.url("api.example.test", "/encoded-echo" + query, tls=True)
    status, headers, body = await _fetch(world, url, {"Authorization": f"Bearer {TOKEN}"})
    assert status == 200
    assert world.tls.hits[0]["headers"]["Accept-Encoding"] == "identity"  # asked for, and ignored by the host
    shown = _as_curl_compressed_shows(headers, body)
    assert shown == f"seen: Bearer {TOKEN}".encode()
    assert "Content-Encoding" not in headers  # decoded by the proxy
    assert SECRET_VALUE.encode() not in shown


@pytest.mark.parametrize("coding", ["br", "zstd", "compress", "gzip, br"])
async def test_an_encoding_the_proxy_cannot_decode_is_refused_where_redaction_applies(
    world: World, coding: str
) -> None:
    url = world.url("api.example.test", f"/encoded-echo?enc={coding}", tls=True)
    status, _, body = await _fetch(world, url)
    assert (status, body) == (502, b"egress refused: response_encoding\n")
    assert world.sink.events[-1].reason == "response_encoding"


@pytest.mark.parametrize("coding", ["gzip", "deflate"])
async def test_a_body_that_does_not_decode_is_refused(world: World, coding: str) -> None:
    url = world.url("api.example.test", f"/encoded-echo?enc={coding}&truncated=1", tls=True)
    status, _, body = await _fetch(world, url, {"Authorization": f"Bearer {TOKEN}"})
    assert (status, body) == (502, b"egress refused: response_encoding\n")


async def test_a_body_that_decodes_past_the_response_cap_is_refused(world: World) -> None:
    cap = world.forwarder.policy.max_response_bytes
    url = world.url("api.example.test", f"/encoded-echo?enc=gzip&pad={cap * 50}", tls=True)
    status, _, body = await _fetch(world, url)
    assert (status, body) == (502, b"egress refused: response_too_large\n")  # the compressed body was small


async def test_a_host_no_secret_is_bound_to_gets_its_encoded_body_untouched(world: World) -> None:
    url = world.url("plain.example.test", "/encoded-echo?enc=gzip")
    status, headers, body = await _fetch(world, url, {"Accept-Encoding": "gzip"})
    assert status == 200 and headers["Content-Encoding"] == "gzip"
    assert gzip.decompress(body) == b"seen: "
    assert world.public.hits[0]["headers"]["Accept-Encoding"] == "gzip"
