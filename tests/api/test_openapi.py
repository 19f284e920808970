"""The OpenAPI document: valid 3.1 (a real validator), the same routes as the router, the copy in docs; and fuzzing.

Fuzzing sends malformed bodies behind valid tokens: each is refused ``400`` (``413`` when too large), never a
``5xx``, and nothing is written to Redis.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import redis.asyncio as aioredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from openapi_spec_validator import validate

from switchboard.web.api.routes import MAX_BODY_BYTES
from switchboard.web.api.spec import PREFIX, openapi_document
from tests.api.conftest import SENDER, STARTER, Api

DOCS_COPY = Path(__file__).resolve().parents[2] / "docs" / "api" / "openapi.json"
FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture, HealthCheck.data_too_large],
    derandomize=True,
)


def test_the_document_is_valid_openapi_3_1() -> None:
    document = openapi_document()

    validate(document)
    assert document["openapi"].startswith("3.1")


def test_the_copy_in_docs_is_the_served_document() -> None:
    assert json.loads(DOCS_COPY.read_text()) == openapi_document(), (
        "python -m switchboard.web.api.spec > docs/api/openapi.json"
    )


async def test_every_documented_route_exists_and_every_api_route_is_documented(api: Api) -> None:
    served = {
        (route.method, route.resource.canonical)
        for route in api.client.app.router.routes()
        if route.resource is not None and route.resource.canonical.startswith(PREFIX + "/") and route.method != "HEAD"
    }
    documented = {(method.upper(), path) for path, ops in openapi_document()["paths"].items() for method in ops}

    assert served == documented and len(served) == 4


async def test_the_document_is_served_without_a_token(api: Api) -> None:
    assert await api.call("GET", "/openapi.json", None) == (200, openapi_document())


_json = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=10), inner, max_size=3),
    max_leaves=12,
)
_wrong = st.one_of(st.integers(), st.booleans(), st.lists(st.text(max_size=5), max_size=2), st.just(""))
_malformed = st.one_of(
    st.binary(max_size=500).filter(lambda b: not b.strip().startswith(b"{")),
    _json.filter(lambda v: not isinstance(v, dict)).map(lambda v: json.dumps(v).encode()),
    st.builds(  # the right shape, one field of the wrong type or empty
        lambda field, value: json.dumps(
            {"channel": "telegram", "conversation": "1", "text": "t", "event": "e"} | {field: value}
        ).encode(),
        st.sampled_from(["channel", "conversation", "account", "thread", "text", "event"]),
        _wrong,
    ),
    st.builds(  # an unknown field
        lambda name: json.dumps({"channel": "telegram", "conversation": "1", "text": "t", "x" + name: 1}).encode(),
        st.text(max_size=8),
    ),
    st.integers(1, 50_000).map(lambda n: b"[" * n),
    st.just(b'{"channel": "telegram", "conversation": "1", "text": "\\ud800"}'),
)


@FUZZ
@given(route=st.sampled_from(["/messages", "/turns"]), body=_malformed)
async def test_malformed_bodies_are_400_and_write_nothing(
    api: Api, async_redis: aioredis.Redis, route: str, body: bytes
) -> None:
    token = SENDER if route == "/messages" else STARTER
    status, answer = await api.call("POST", route, token, body, {"Idempotency-Key": "fuzz-1"})

    assert status == 400, (body[:200], status, answer)
    assert await async_redis.dbsize() == 0


@pytest.mark.parametrize("route", ["/messages", "/turns"])
@pytest.mark.parametrize("size", [MAX_BODY_BYTES + 1, 4 * MAX_BODY_BYTES])
async def test_an_oversized_body_is_413_and_writes_nothing(
    api: Api, async_redis: aioredis.Redis, route: str, size: int
) -> None:
    token = SENDER if route == "/messages" else STARTER
    filler = "x" * size
    body: Any = {"channel": "telegram", "conversation": "1", "text": filler, "event": "e"}
    body.pop("text" if route == "/turns" else "event")
    if route == "/turns":
        body["data"] = filler
    status, answer = await api.call("POST", route, token, json.dumps(body).encode(), {"Idempotency-Key": "k"})

    assert status == 413 and answer["error"]["code"] == "too_large"
    assert await async_redis.dbsize() == 0
