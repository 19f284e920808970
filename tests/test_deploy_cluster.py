"""The shipped cluster deployment (``config/compose.cluster.yaml`` over ``config/compose.yaml``) is the same deployment
on a Redis Cluster.

Three primaries and three replicas in cluster mode with AOF and ``noeviction``, each announcing its service name; a
one-shot service forming the cluster with one replica per primary, once; every Switchboard role on a
``redis+cluster://`` URL naming every node, which the settings accept, and waiting for the cluster. The single-server
file's checks (scaling, the proxy, the shared approval key and workspaces, ``switchboard check``, the image) run here
again on the merged file.
"""

from __future__ import annotations

import ipaddress
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from switchboard.queue.embedded import find_server_binary
from switchboard.settings import Settings
from switchboard.settings.cluster import parse_cluster_url
from tests.cluster.servers import ClusterNode, free_ports
from tests.test_deploy import (  # noqa: F401  (collected here too: each runs on this module's `compose`, the merged file)
    COMPOSE,
    ROOT,
    command,
    environment,
    switchboard_services,
    test_every_command_is_a_long_lived_role_the_cli_and_the_image_run,
    test_every_process_shares_one_approval_key_supplied_from_outside,
    test_every_process_shares_one_workspace_store,
    test_every_variable_set_is_a_setting,
    test_only_the_web_tier_keeps_the_images_healthcheck,
    test_scaled_services_can_be_scaled,
    test_several_web_processes_and_several_workers,
    test_switchboard_check_finds_no_problem_in_that_environment,
    test_the_image_fits_the_compose_file,
    test_the_optional_listener_role_is_opt_in,
    test_the_web_tier_is_reached_only_through_the_load_balancing_proxy,
    test_the_worker_stops_within_its_grace_period,
    volume_targets,
)

CLUSTER = ROOT / "config" / "compose.cluster.yaml"
NODE_PORT = 6379


@dataclass(frozen=True)
class _Override:
    """A value tagged ``!override``: it replaces the base file's instead of being merged into it."""

    value: Any


class _ComposeLoader(yaml.SafeLoader):
    """YAML with Compose's ``!override`` tag (2.24.4) on mappings."""


_ComposeLoader.add_constructor(
    "!override",
    lambda loader, node: _Override(loader.construct_mapping(node, deep=True)),  # type: ignore[arg-type]
)


def merged(base: Any, override: Any, where: str = "") -> Any:
    """Compose's merge of an override file, as far as these files need it: mappings merged key by key, a scalar
    replaced, an ``!override`` value replacing; a list set in both files is refused (Compose merges each kind its own
    way), so the result cannot silently differ from Compose's."""
    if isinstance(override, _Override):
        return override.value
    if isinstance(base, dict) and isinstance(override, dict):
        out = dict(base)
        for key, value in override.items():
            out[key] = merged(base[key], value, f"{where}.{key}") if key in base else unwrapped(value)
        return out
    assert not (isinstance(base, list) and isinstance(override, list)), f"{where}: a list in both files"
    return unwrapped(override)


def unwrapped(value: Any) -> Any:
    if isinstance(value, _Override):
        return value.value
    if isinstance(value, dict):
        return {k: unwrapped(v) for k, v in value.items()}
    return value


@pytest.fixture(scope="module")
def override() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.load(CLUSTER.read_text(), Loader=_ComposeLoader)
    return loaded


@pytest.fixture(scope="module")
def compose(override: dict[str, Any]) -> dict[str, Any]:
    """The merged file, as ``docker compose -f config/compose.yaml -f config/compose.cluster.yaml`` runs it."""
    result: dict[str, Any] = merged(yaml.safe_load(COMPOSE.read_text()), override)
    return result


def node_options(service: dict[str, Any], compose: dict[str, Any]) -> dict[str, str]:
    """A ``redis-server`` node's options: its config file's (a compose ``configs`` entry), then its arguments."""
    args = command(service)
    options: dict[str, str] = {}
    mounted = {c["target"]: c["source"] for c in service.get("configs") or []}
    if len(args) > 1 and args[1] in mounted:
        for line in compose["configs"][mounted[args[1]]]["content"].splitlines():
            key, _, value = line.strip().partition(" ")
            if key and not key.startswith("#"):
                options[key] = value.strip()
        args = [args[0], *args[2:]]
    for flag, value in zip(args[1::2], args[2::2], strict=True):
        assert flag.startswith("--"), f"{flag}: options as --name value"
        options[flag.removeprefix("--")] = value
    return options


def cluster_nodes(compose: dict[str, Any]) -> dict[str, dict[str, str]]:
    """``{service: options}`` of the services running a cluster-mode Redis (or Valkey) server."""
    nodes = {
        name: node_options(s, compose)
        for name, s in compose["services"].items()
        if command(s)[:1] in (["redis-server"], ["valkey-server"]) and "single-redis" not in (s.get("profiles") or [])
    }
    assert nodes, "no cluster node"
    return nodes


def node_address(service: dict[str, Any]) -> str:
    return str(service["networks"]["default"]["ipv4_address"])


def init_service(compose: dict[str, Any]) -> tuple[str, list[str]]:
    """The one-shot service forming the cluster, and its ``--cluster create`` arguments."""
    (found,) = [
        (name, line.split())
        for name, s in compose["services"].items()
        for line in " ".join(command(s)).splitlines()
        if "--cluster create" in line
    ]
    name, words = found
    return name, words[words.index("create") + 1 :]


def test_three_primaries_and_three_replicas_in_cluster_mode_with_aof_and_noeviction(compose: dict[str, Any]) -> None:
    nodes = cluster_nodes(compose)
    _, create = init_service(compose)
    replicas_each = int(create[create.index("--cluster-replicas") + 1])
    assert len(nodes) == 6 and replicas_each == 1, "3 primaries, a replica each"
    data_volumes = set()
    for name, options in nodes.items():
        assert options["cluster-enabled"] == "yes"
        assert options["appendonly"] == "yes" and options["appendfsync"] == "everysec"
        assert options["maxmemory-policy"] == "noeviction", f"{name}: an evicted key is a lost session or lease"
        assert int(options.get("port", NODE_PORT)) == NODE_PORT
        # CLUSTER SLOTS answers with the name each node announces: the clients reach the nodes by service name
        assert options["cluster-announce-hostname"] == name
        assert options["cluster-preferred-endpoint-type"] == "hostname"
        assert "cluster-announce-ip" not in options
        service = compose["services"][name]
        mounted = volume_targets(service)
        assert "/data" in mounted, f"{name}: its AOF and nodes.conf must outlive the container"
        data_volumes.add(mounted["/data"])
        assert "container_name" not in service and not service.get("ports") and "deploy" not in service
        assert service["healthcheck"]["test"]
    assert len(data_volumes) == len(nodes) and data_volumes <= set(compose["volumes"]), "a volume per node"


def test_every_node_has_a_fixed_address_in_the_network_apart_from_the_proxys(compose: dict[str, Any]) -> None:
    """CLUSTER MEET takes addresses: the nodes meet, and find each other again after a restart, at fixed ones."""
    (subnet,) = [ipaddress.ip_network(c["subnet"]) for c in compose["networks"]["default"]["ipam"]["config"]]
    taken = [node_address(s) for s in compose["services"].values() if (s.get("networks") or {}).get("default")]
    assert len(taken) == len(set(taken)), "two services at one address"
    for name in cluster_nodes(compose):
        address = ipaddress.ip_address(node_address(compose["services"][name]))
        assert address in subnet and int(address) - int(subnet.network_address) > 128, f"{name}: high in the subnet"


def test_the_init_service_forms_the_cluster_once(compose: dict[str, Any]) -> None:
    name, create = init_service(compose)
    service = compose["services"][name]
    nodes = cluster_nodes(compose)
    addresses = [a for a in create if not a.startswith("-") and ":" in a]
    assert addresses == [f"{node_address(compose['services'][n])}:{NODE_PORT}" for n in nodes], "every node, in order"
    assert create[create.index("--cluster-replicas") + 1] == "1" and "--cluster-yes" in create
    script = command(service)[-1]
    # a later start finds the nodes already met (create would refuse them) and only waits for the slots to be served
    assert "cluster_known_nodes" in script and script.index("cluster_known_nodes") < script.index("--cluster create")
    assert "cluster_state:ok" in script and "exit 1" in script
    assert service["depends_on"] == {n: {"condition": "service_healthy"} for n in nodes}
    assert service["restart"] == "no" and "deploy" not in service


@pytest.mark.cluster
@pytest.mark.timeout(120)
def test_the_init_script_forms_the_cluster_then_finds_it_formed(compose: dict[str, Any], tmp_path: Path) -> None:
    """The six nodes with the file's options (on loopback ports) and the init service's own script, run twice: the
    first run forms 3 primaries with a replica each, announcing the service names; the second changes nothing.
    ``redis-cli`` is a shim mapping the compose names and addresses to the loopback ports (the embedded server's
    ``valkey-cli`` behind it)."""
    binary = find_server_binary()
    cli = Path(binary).with_name("valkey-cli")
    if not cli.is_file():
        pytest.skip("the embedded server ships no valkey-cli")
    options = cluster_nodes(compose)
    ports = free_ports(2 * len(options))
    nodes = {
        name: ClusterNode(port=ports[2 * i], bus_port=ports[2 * i + 1], data_dir=tmp_path / name)
        for i, name in enumerate(options)
    }
    mapping = {name: f"127.0.0.1:{node.port}" for name, node in nodes.items()}
    mapping |= {f"{node_address(compose['services'][name])}:{NODE_PORT}": mapping[name] for name in nodes}
    shim = tmp_path / "bin" / "redis-cli"
    shim.parent.mkdir()
    shim.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        f"mapping, args = {mapping!r}, []\n"
        "for arg in sys.argv[1:]:\n"
        "    if args[-1:] == ['-h'] and arg in mapping:\n"
        "        host, port = mapping[arg].split(':')\n"
        "        args += [host, '-p', port]\n"
        "    else:\n"
        "        args.append(mapping.get(arg, arg))\n"
        f"os.execv({str(cli)!r}, [{str(cli)!r}, *args])\n"
    )
    shim.chmod(0o755)
    name, _ = init_service(compose)
    script = command(compose["services"][name])[-1].replace("$$", "$")  # compose's escape for a literal $
    env = {"PATH": f"{shim.parent}:/usr/bin:/bin"}
    try:
        for name, node in nodes.items():
            node.data_dir.mkdir()
            args = [binary]
            for key, value in options[name].items():
                if key != "port":
                    args += [f"--{key}", value]
            args += ["--port", str(node.port), "--cluster-port", str(node.bus_port), "--bind", "127.0.0.1"]
            args += ["--dir", str(node.data_dir), "--save", "", "--logfile", str(node.data_dir / "server.log")]
            node.spawn(args)
        for node in nodes.values():
            node.wait_ready()

        first = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=90, check=False)
        assert first.returncode == 0, first.stdout + first.stderr
        assert "Performing hash slots allocation" in first.stdout
        roles, epochs = {}, {}
        for name, node in nodes.items():
            with node.client() as c:
                assert c.cluster("info")["cluster_state"] == "ok"
                roles[name] = c.info("replication")["role"]
                epochs[name] = c.cluster("info")["cluster_current_epoch"]
                if roles[name] == "master":
                    assert c.config_get("maxmemory-policy")["maxmemory-policy"] == "noeviction"
        assert sorted(roles.values()) == ["master"] * 3 + ["slave"] * 3
        with next(iter(nodes.values())).client() as c:
            endpoints = {entry[2][0] for entry in c.execute_command("CLUSTER", "SLOTS")}
        primaries = {name for name, role in roles.items() if role == "master"}
        assert endpoints == {p.encode() for p in primaries}, "clients are sent to the service names"

        again = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=90, check=False)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "Performing hash slots allocation" not in again.stdout
        for name, node in nodes.items():
            with node.client() as c:
                assert c.cluster("info")["cluster_current_epoch"] == epochs[name]
                assert c.info("replication")["role"] == roles[name]
    finally:
        for node in nodes.values():
            node.stop()


def test_every_role_is_on_a_cluster_url_naming_every_node(compose: dict[str, Any]) -> None:
    nodes = cluster_nodes(compose)
    roles = switchboard_services(compose)
    assert {command(s)[1] for s in roles.values()} == {"web", "worker", "discord"}
    urls = set()
    for name, service in roles.items():
        url = environment(service)["SWITCHBOARD_REDIS_URL"]
        settings = Settings(redis_url=url)  # refused at start-up (and here) when malformed
        assert settings.queue.ack_replicas == 0, "refused with a cluster"
        parsed = parse_cluster_url(url)
        assert parsed.nodes == tuple((n, NODE_PORT) for n in nodes), f"{name}: every node is a seed, by service name"
        assert not parsed.tls and parsed.password is None
        urls.add(url)
    assert len(urls) == 1


def test_every_role_waits_for_the_cluster_and_nothing_for_the_single_server(compose: dict[str, Any]) -> None:
    init, _ = init_service(compose)
    for name, service in switchboard_services(compose).items():
        assert service["depends_on"] == {init: {"condition": "service_completed_successfully"}}, name
    single = compose["services"]["redis"]
    assert single["profiles"] == ["single-redis"], "the single server of compose.yaml stays off"
    for service in compose["services"].values():
        assert "redis" not in (service.get("depends_on") or {})


def test_docker_compose_accepts_the_merged_file(tmp_path: Path) -> None:
    """``docker compose config`` validates and merges the two files (no daemon needed)."""
    docker = shutil.which("docker")
    if docker is None:
        pytest.skip("docker is not installed")
    version = subprocess.run([docker, "compose", "version"], capture_output=True, text=True, check=False)
    if version.returncode != 0:
        pytest.skip(f"docker compose is not available: {(version.stderr or version.stdout).strip().splitlines()[0]}")
    result = subprocess.run(
        [docker, "compose", "-f", str(COMPOSE), "-f", str(CLUSTER), "config", "--format", "json"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "SWITCHBOARD_APPROVAL_KEY": "placeholder"},
    )
    assert result.returncode == 0, result.stderr
    config = yaml.safe_load(result.stdout)
    assert set(config["services"]) >= {"web", "worker", "redis-1", "redis-6", "redis-cluster-init"}
    assert "redis" not in config["services"], "profile single-redis is off"
    assert set(config["services"]["web"]["depends_on"]) == {"redis-cluster-init"}
