"""Server processes the tests start themselves from the embedded server's binary: cluster nodes, replicas, Sentinels.

:class:`ServerProcess` is what every such process does (start it in its own session with the private umask, wait until
it answers, SIGKILL it as a crash, stop it gracefully); :mod:`tests.cluster.servers` and :mod:`tests.failover.servers`
say which arguments each kind of node runs with.
"""

from __future__ import annotations

import contextlib
import signal
import socket
import subprocess
import time
from pathlib import Path

import redis

from switchboard.queue.embedded import PRIVATE_UMASK

__all__ = ["ServerProcess", "free_ports"]


def free_ports(n: int) -> list[int]:
    """``n`` distinct loopback ports free now (held open together while chosen, so none repeats)."""
    socks: list[socket.socket] = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class ServerProcess:
    """One server process on a loopback ``port``, logging into ``data_dir``; mixed into each node's dataclass."""

    port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None

    def client(self, **kwargs: object) -> redis.Redis:
        """A plain client of this one process."""
        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, **kwargs)  # type: ignore[arg-type]

    def spawn(self, args: list[str]) -> None:
        """Start ``args`` in a session of its own (a kill of the test's group spares it), quiet, private files."""
        self.process = subprocess.Popen(
            args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            start_new_session=True, umask=PRIVATE_UMASK,
        )  # fmt: skip

    def wait_ready(self, timeout: float = 10.0) -> None:
        """Until it answers ``PING``; its log's tail in the error if it exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process is not None and self.process.poll() is not None:
                log = self.data_dir / "server.log"
                raise RuntimeError(
                    f"server on port {self.port} exited: {log.read_text()[-800:] if log.exists() else ''}"
                )
            with contextlib.suppress(redis.ConnectionError, redis.TimeoutError), self.client() as c:
                if c.ping():
                    return
            time.sleep(0.02)
        raise TimeoutError(f"server on port {self.port} did not answer within {timeout} s")

    def kill(self) -> None:
        """SIGKILL the process (a crash: nothing flushed, no goodbye)."""
        if self.process is not None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait()
            self.process = None

    def stop(self, timeout: float = 5.0) -> None:
        """SIGTERM, then SIGKILL if it has not exited within ``timeout``."""
        proc, self.process = self.process, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout)
