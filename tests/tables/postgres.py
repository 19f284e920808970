"""A real PostgreSQL server for the tests: ``initdb`` + ``postgres`` from the Debian package, on a Unix socket.

Run as the ``postgres`` user when the suite runs as root (the server refuses root). Skips when no server is installed.
:func:`running_postgres` is the same server for anything else that needs one (``bench/tables.py``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

__all__ = ["NoPostgresError", "postgres_dsn", "running_cluster", "running_postgres"]


class NoPostgresError(RuntimeError):
    """No PostgreSQL server is installed on this host."""


def _bin(name: str) -> str | None:
    found = shutil.which(name)
    if found:
        return found
    for root in sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True):
        if (root / name).exists():
            return str(root / name)
    return None


@pytest.fixture(scope="session")
def postgres_dsn() -> Iterator[str]:
    """A fresh PostgreSQL cluster for the session; its DSN (Unix socket, trust auth, database ``postgres``)."""
    try:
        with running_postgres() as dsn:
            yield dsn
    except NoPostgresError as err:
        pytest.skip(str(err))


@contextmanager
def running_postgres() -> Iterator[str]:
    """A fresh PostgreSQL cluster while the block runs; its DSN (Unix socket, trust auth, database ``postgres``).

    Raises:
        NoPostgresError: no server is installed.
    """
    initdb, postgres, ready = _bin("initdb"), _bin("postgres"), _bin("pg_isready")
    if initdb is None or postgres is None or ready is None:
        raise NoPostgresError("no PostgreSQL server installed (Debian: apt-get install postgresql)")
    with running_cluster(initdb, postgres, ready) as dsn:
        yield dsn


@contextmanager
def running_cluster(initdb: str, postgres: str, ready: str, *settings: str) -> Iterator[str]:
    """A fresh cluster of these binaries while the block runs; its DSN (Unix socket, trust auth, ``postgres``).

    Run as the ``postgres`` user when the suite runs as root (the server refuses root). ``settings``: extra server
    settings, ``name=value``.
    """
    root = Path(tempfile.mkdtemp(prefix="sb-pg-"))
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
        [*as_user, initdb, "-D", str(data), "-A", "trust", "-U", user, "-E", "UTF8"], check=True, capture_output=True
    )
    options = ["-c", "listen_addresses=", "-c", "fsync=off", "-c", "max_connections=50"]
    for setting in settings:
        options += ["-c", setting]
    proc = subprocess.Popen(
        [*as_user, postgres, "-D", str(data), "-k", str(sock), *options],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        dsn = f"postgresql://{user}@/postgres?host={sock}"
        deadline = time.monotonic() + 30
        # The socket appears before the server has finished starting up: wait until it accepts connections.
        while subprocess.run([ready, "-q", "-h", str(sock), "-U", user, "-d", "postgres"], check=False).returncode:
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"PostgreSQL ({postgres}) did not start")
            time.sleep(0.05)
        yield dsn
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        shutil.rmtree(root, ignore_errors=True)
