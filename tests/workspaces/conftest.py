"""A local S3-compatible server the suite starts itself (``python -m moto.server`` on a loopback port), and stores.

Each test gets a bucket of its own; the server runs once per session in its own process, speaking the real S3 wire
protocol over HTTP, so the stores under test go through aiobotocore exactly as against AWS or MinIO.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from aiobotocore.session import get_session

from switchboard.core.workspaces.disk import Quotas, Workspaces
from switchboard.core.workspaces.s3 import S3Workspaces

KEY_ID, SECRET = "test-key-id", "test-secret-key"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="session")
def s3_url() -> Iterator[str]:
    """The S3 API root of the session's moto server (its own process: the tests' event loop never waits on it)."""
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60  # a bound on start-up, not a timing assertion
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the moto server did not start") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture
async def s3(s3_url: str) -> AsyncIterator[Any]:
    """A plain S3 client on the server (to look at what a store wrote, or plant keys)."""
    client = get_session().create_client(
        "s3", endpoint_url=s3_url, region_name="us-east-1", aws_access_key_id=KEY_ID, aws_secret_access_key=SECRET
    )
    async with client as opened:
        yield opened


@pytest.fixture
async def bucket(s3: Any) -> str:
    """A fresh bucket for this test."""
    name = f"ws-{uuid.uuid4().hex[:12]}"
    await s3.create_bucket(Bucket=name)
    return name


StoreFactory = Callable[..., S3Workspaces]


@pytest.fixture
async def make_store(s3_url: str, bucket: str) -> AsyncIterator[StoreFactory]:
    """``make_store(root, quotas=…, prefix=…)``: a store over the test's bucket, with its working copies at ``root``
    (two roots stand for two workers on two hosts)."""
    opened: list[S3Workspaces] = []

    def make(root: Path, *, quotas: Quotas | None = None, prefix: str = "deploy") -> S3Workspaces:
        store = S3Workspaces(
            root,
            bucket=bucket,
            prefix=prefix,
            endpoint_url=s3_url,
            region="us-east-1",
            access_key_id=KEY_ID,
            secret_access_key=SECRET,
            addressing_style="path",
            workspaces=Workspaces(root, quotas or Quotas()),
        )
        opened.append(store)
        return store

    yield make
    for store in opened:
        await store.aclose()


async def keys(s3: Any, bucket: str) -> list[str]:
    """Every key in ``bucket``, sorted."""
    found: list[str] = []
    async for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
        found += [str(item["Key"]) for item in page.get("Contents", ())]
    return sorted(found)
