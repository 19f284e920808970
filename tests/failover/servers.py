"""A primary, its replica and three Sentinels on this machine, all the embedded server's binary.

Every process is the ``valkey-server`` that :func:`~switchboard.queue.embedded.find_server_binary` finds (the one the
embedded default runs): the data nodes with AOF on, the Sentinels with ``--sentinel`` and a config file of their own
(a Sentinel rewrites it). Short Sentinel timings, so a failover takes a couple of seconds. Tests for issue #26
(failover without loss of acknowledged messages); process handling in :mod:`tests.servers`.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis

from switchboard.queue.embedded import find_server_binary
from tests.servers import ServerProcess, free_ports

__all__ = ["SERVICE", "Node", "ReplicatedRedis"]

SERVICE = "switchboard"
"""The name the Sentinels monitor the primary under."""
DOWN_AFTER_MS = 1000
"""How long the primary may be silent before a Sentinel calls it down."""


@dataclass
class Node(ServerProcess):
    """One server process: a data node or a Sentinel."""

    port: int
    data_dir: Path
    sentinel: bool = False
    process: subprocess.Popen[bytes] | None = None
    args: list[str] = field(default_factory=list)

    def start(self, binary: str, *extra: str) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        log = str(self.data_dir / "server.log")
        if self.sentinel:
            self.args = [binary, str(self.data_dir / "sentinel.conf"), "--sentinel", "--logfile", log]
        else:
            self.args = [
                binary,
                "--port", str(self.port),
                "--bind", "127.0.0.1",
                "--dir", str(self.data_dir),
                "--appendonly", "yes",
                "--appendfsync", "everysec",
                "--save", "",
                "--repl-diskless-sync", "yes",
                "--repl-diskless-sync-delay", "0",
                "--repl-ping-replica-period", "1",
                "--daemonize", "no",
                "--loglevel", "warning",
                "--logfile", log,
                *extra,
            ]  # fmt: skip
        self.spawn(self.args)


@dataclass
class ReplicatedRedis:
    """A primary with ``replicas`` replicas and ``sentinels`` Sentinels (quorum: a majority); a context manager."""

    root: Path
    replicas: int = 1
    sentinels: int = 3
    data: list[Node] = field(default_factory=list)
    """The data nodes; ``data[0]`` is the first primary."""
    watchers: list[Node] = field(default_factory=list)
    """The Sentinels."""

    @property
    def url(self) -> str:
        """The ``redis+sentinel://`` URL of this set."""
        hosts = ",".join(f"127.0.0.1:{s.port}" for s in self.watchers)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def start(self, timeout: float = 20.0) -> ReplicatedRedis:
        binary = find_server_binary()
        ports = free_ports(1 + self.replicas + self.sentinels)
        self.data = [Node(ports[i], self.root / f"node{i}") for i in range(1 + self.replicas)]
        self.watchers = [
            Node(ports[1 + self.replicas + i], self.root / f"sentinel{i}", sentinel=True) for i in range(self.sentinels)
        ]
        try:
            primary = self.data[0]
            primary.start(binary)
            primary.wait_ready()
            for node in self.data[1:]:
                node.start(binary, "--replicaof", "127.0.0.1", str(primary.port))
                node.wait_ready()
            quorum = self.sentinels // 2 + 1
            for watcher in self.watchers:
                watcher.data_dir.mkdir(parents=True, exist_ok=True)
                (watcher.data_dir / "sentinel.conf").write_text(
                    f"port {watcher.port}\nbind 127.0.0.1\ndaemonize no\ndir {watcher.data_dir}\n"
                    f"sentinel monitor {SERVICE} 127.0.0.1 {primary.port} {quorum}\n"
                    f"sentinel down-after-milliseconds {SERVICE} {DOWN_AFTER_MS}\n"
                    f"sentinel failover-timeout {SERVICE} 5000\n"
                    f"sentinel parallel-syncs {SERVICE} 1\n"
                )
                watcher.start(binary)
            for watcher in self.watchers:
                watcher.wait_ready()
            self.wait_settled(primary, timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def primary(self) -> Node:
        """The data node the Sentinels name as primary now."""
        for watcher in self.watchers:
            if watcher.process is None:
                continue
            with contextlib.suppress(redis.RedisError), watcher.client() as c:
                _host, port = c.sentinel_get_master_addr_by_name(SERVICE)
                return next(n for n in self.data if n.port == int(port))
        raise RuntimeError("no Sentinel answered")

    def replicas_online(self, primary: Node) -> int:
        """Replicas attached to ``primary`` and streaming from it."""
        with primary.client() as c:
            info = c.info("replication")
        return sum(
            1 for k, v in info.items() if k.startswith("slave") and isinstance(v, dict) and v["state"] == "online"
        )

    def wait_settled(self, primary: Node, timeout: float = 20.0) -> None:
        """Until every Sentinel names ``primary``, knows the others, and every live replica streams from it."""
        deadline = time.monotonic() + timeout
        live_replicas = sum(1 for n in self.data if n is not primary and n.process is not None)
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, StopIteration):
                named = {self._named(w) for w in self.watchers if w.process is not None}
                peers = min(int(self._master(w)["num-other-sentinels"]) for w in self.watchers)
                settled = named == {primary.port} and peers == self.sentinels - 1
                if settled and self.replicas_online(primary) >= live_replicas:
                    return
            time.sleep(0.05)
        raise TimeoutError(f"the Sentinels did not settle on {primary.port} within {timeout} s")

    def _named(self, watcher: Node) -> int:
        with watcher.client() as c:
            return int(c.sentinel_get_master_addr_by_name(SERVICE)[1])

    def _master(self, watcher: Node) -> dict[str, object]:
        with watcher.client(decode_responses=True) as c:
            return dict(c.sentinel_master(SERVICE))

    def wait_promoted(self, old: Node, timeout: float = 20.0) -> Node:
        """Until the Sentinels name a primary other than ``old`` and it accepts writes; returns it."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError, RuntimeError, StopIteration):
                node = self.primary()
                if node is not old:
                    with node.client() as c:
                        if c.info("replication")["role"] == "master":
                            return node
            time.sleep(0.05)
        raise TimeoutError(f"no replica was promoted within {timeout} s")

    def rejoin(self, node: Node, primary: Node) -> None:
        """Restart a killed data node on its data dir as a replica of ``primary`` (as a supervisor would)."""
        node.start(find_server_binary(), "--replicaof", "127.0.0.1", str(primary.port))
        node.wait_ready()

    def stop(self) -> None:
        for node in [*self.watchers, *self.data]:
            node.stop()

    def remove(self) -> None:
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> ReplicatedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
