"""The shipped deployment (``config/compose.yaml``, ``config/Caddyfile``, ``Dockerfile``) scales as it is shipped.

Several web processes behind the reverse proxy and several workers, all with the same approval key (so a CodeAct
program paused on one worker resumes on another) and the same workspace store (so files follow a session), Redis
with AOF on; every ``SWITCHBOARD_*`` name it sets is one the settings read, and ``switchboard check`` finds no
problem in that environment.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from switchboard.cli.checks import config_problems, known_variables, unknown_variables
from switchboard.cli.main import _parser
from switchboard.settings import Settings, load_settings
from switchboard.web.app import create_app
from switchboard.worker.worker import SessionWorker

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "config" / "compose.yaml"
SWITCHBOARD_ROLES = ("web", "worker")
_REQUIRED = re.compile(r"^\$\{(?P<name>[A-Z][A-Z0-9_]*):\?(?P<message>.+)\}$")
_INTERPOLATION = re.compile(r"\$\{(?P<name>[A-Z][A-Z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    loaded: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    return loaded


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the list form: ["NAME=value", ...]
        env = dict(item.partition("=")[::2] for item in env)
    return {str(k): str(v) for k, v in env.items()}


def command(service: dict[str, Any]) -> list[str]:
    cmd = service.get("command") or []
    return cmd.split() if isinstance(cmd, str) else [str(part) for part in cmd]


def role_services(compose: dict[str, Any], role: str) -> dict[str, dict[str, Any]]:
    """The services running ``switchboard <role>``."""
    found = {name: s for name, s in compose["services"].items() if command(s)[:2] == ["switchboard", role]}
    assert found, f"no service runs `switchboard {role}`"
    return found


def replicas(service: dict[str, Any]) -> int:
    return int((service.get("deploy") or {}).get("replicas", 1))


def volume_targets(service: dict[str, Any]) -> dict[str, str]:
    """``{target: named volume}`` of a service's named-volume mounts (short and long syntax)."""
    found = {}
    for mount in service.get("volumes") or []:
        if isinstance(mount, str):
            source, _, rest = mount.partition(":")
            target = rest.split(":")[0]
        else:
            source, target = mount.get("source", ""), mount.get("target", "")
        if source and not source.startswith((".", "/", "~")):
            found[target] = source
    return found


def substituted(value: str, placeholders: dict[str, str]) -> str:
    """``value`` with compose's ``${NAME}``, ``${NAME:-default}`` and ``${NAME:?message}`` filled in."""

    def fill(match: re.Match[str]) -> str:
        name, op, arg = match["name"], match["op"], match["arg"]
        if name in placeholders:
            return placeholders[name]
        if op in (":-", "-"):
            return arg
        raise AssertionError(f"{name} has no placeholder and no default")

    return _INTERPOLATION.sub(fill, value)


def test_several_web_processes_and_several_workers(compose: dict[str, Any]) -> None:
    for role in SWITCHBOARD_ROLES:
        total = sum(replicas(s) for s in role_services(compose, role).values())
        assert total > 1, f"only {total} `switchboard {role}` process"


def test_the_web_tier_is_reached_only_through_the_load_balancing_proxy(compose: dict[str, Any]) -> None:
    for name, service in role_services(compose, "web").items():
        assert not service.get("ports"), f"{name} publishes a port: replicas cannot share it, the proxy fronts them"
    proxies = {name: s for name, s in compose["services"].items() if "caddy" in str(s.get("image", ""))}
    (proxy_name, proxy), *others = proxies.items()
    assert not others and {"80:80", "443:443"} <= set(map(str, proxy["ports"]))
    caddyfile = next(
        (COMPOSE.parent / m.split(":")[0]).resolve()
        for m in proxy["volumes"]
        if isinstance(m, str) and m.split(":")[1] == "/etc/caddy/Caddyfile"
    )
    text = caddyfile.read_text()
    for name, service in role_services(compose, "web").items():
        port = environment(service)["SWITCHBOARD_PORT"]
        assert re.search(rf"dynamic a {name} {port}\b", text), "the proxy must balance over every replica's address"
        assert environment(service)["SWITCHBOARD_HOST"] == "0.0.0.0"
        address = proxy["networks"]["default"]["ipv4_address"]
        trusted = environment(service)["SWITCHBOARD_TRUSTED_PROXIES"].split(",")
        assert trusted == [address], "the web tier must believe X-Forwarded-For from the proxy, and only from it"
        assert proxy_name in (service.get("depends_on") or {}) or name in (proxy.get("depends_on") or {})


def test_every_process_shares_one_approval_key_supplied_from_outside(compose: dict[str, Any]) -> None:
    variable = f"SWITCHBOARD_{'approval_key'.upper()}"
    assert "approval_key" in Settings.model_fields
    values = set()
    for role in SWITCHBOARD_ROLES:
        for name, service in role_services(compose, role).items():
            value = environment(service).get(variable)
            assert value is not None, f"{name} has no {variable}: each worker would generate its own key"
            match = _REQUIRED.match(value)
            assert match, f"{name}: {variable} must come from .env with ${{{variable}:?…}}, never written in the file"
            assert match["name"] == variable
            values.add(value)
    assert len(values) == 1


def test_every_process_shares_one_workspace_store(compose: dict[str, Any]) -> None:
    roots, volumes = set(), set()
    for role in SWITCHBOARD_ROLES:
        for name, service in role_services(compose, role).items():
            env = environment(service)
            settings = Settings.model_validate({"workspaces": {"root": env["SWITCHBOARD_WORKSPACES__ROOT"]}})
            backend = env.get("SWITCHBOARD_WORKSPACES__BACKEND", "local")
            assert backend == "local" and settings.workspaces.backend == "local"
            root = str(settings.workspace_path)
            mounted = volume_targets(service)
            assert root in mounted, f"{name} keeps workspaces at {root} but mounts no shared volume there"
            roots.add(root)
            volumes.add(mounted[root])
    assert len(roots) == 1 and len(volumes) == 1
    assert volumes <= set(compose["volumes"])


def test_every_variable_set_is_a_setting(compose: dict[str, Any]) -> None:
    exact, open_prefixes = known_variables()
    for role in SWITCHBOARD_ROLES:
        for name, service in role_services(compose, role).items():
            for variable in environment(service):
                assert variable in exact or variable.startswith(open_prefixes), f"{name}: {variable} is no setting"


def test_redis_keeps_an_append_only_file(compose: dict[str, Any]) -> None:
    redis = compose["services"]["redis"]
    args = command(redis)
    assert args[args.index("--appendonly") + 1] == "yes"
    assert "/data" in volume_targets(redis)
    for role in SWITCHBOARD_ROLES:
        for service in role_services(compose, role).values():
            assert environment(service)["SWITCHBOARD_REDIS_URL"].startswith("redis://redis:")
            assert service["depends_on"]["redis"]["condition"] == "service_healthy"


def test_switchboard_check_finds_no_problem_in_that_environment(compose: dict[str, Any], tmp_path: Path) -> None:
    """What ``check`` (and start-up) would refuse, with placeholders for the required secrets; image paths are
    mapped into the repository (the YAML file) and a private directory (data, workspaces)."""
    image_env = dockerfile_env()
    placeholders = {"SWITCHBOARD_APPROVAL_KEY": "placeholder-approval-key-0123456789abcdef"}
    for role in SWITCHBOARD_ROLES:
        for service in role_services(compose, role).values():
            env = image_env | {k: substituted(v, placeholders) for k, v in environment(service).items()}
            env["SWITCHBOARD_CONFIG"] = str(ROOT / "config" / Path(env["SWITCHBOARD_CONFIG"]).name)
            env["SWITCHBOARD_DATA_DIR"] = str(tmp_path / "data")
            env["SWITCHBOARD_WORKSPACES__ROOT"] = str(tmp_path / "workspaces")
            settings = load_settings(env)
            assert settings.approval_key is not None
            assert settings.approval_key.get_secret_value() == placeholders["SWITCHBOARD_APPROVAL_KEY"]
            assert config_problems(settings) == []
            assert unknown_variables(env, settings) == []


def dockerfile_env() -> dict[str, str]:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    env: dict[str, str] = {}
    for line in text.splitlines():
        if line.startswith("ENV "):
            env.update(re.findall(r"(\w+)=(\S+)", line))
    return env


def test_the_image_fits_the_compose_file(compose: dict[str, Any]) -> None:
    text = (ROOT / "Dockerfile").read_text().replace("\\\n", " ")
    user = re.findall(r"^USER (\S+)", text, re.M)
    assert user and user[-1] not in ("root", "0")
    env = dockerfile_env()
    assert env["SWITCHBOARD_CONFIG"].startswith("/app/config/")
    assert re.search(r"^COPY config /app/config", text, re.M)
    prepared = " ".join(line for line in text.splitlines() if line.startswith("RUN ") and "chown" in line)
    for role in SWITCHBOARD_ROLES:
        for name, service in role_services(compose, role).items():
            port = environment(service).get("SWITCHBOARD_PORT", "8080")
            assert f"EXPOSE {port}" in text
            for target in volume_targets(service):
                # a new named volume takes its owner from the image's directory: the non-root user must own it
                assert target in prepared, f"{name} mounts {target}, which the image does not create for {user[-1]}"


LONG_LIVED_ROLES = {"web", "worker", "discord"}
AFTER_DRAIN_S = 10
"""What a worker's stop takes after its drain window: cancelled drains queued again, its liveness thread joined
(at most 5 s), connections closed."""


def switchboard_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: s for name, s in compose["services"].items() if command(s)[:1] == ["switchboard"]}


def test_every_command_is_a_long_lived_role_the_cli_and_the_image_run(compose: dict[str, Any]) -> None:
    text = (ROOT / "Dockerfile").read_text()
    (cmd,) = re.findall(r"^CMD (\[.*\])$", text, re.M)
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert "switchboard" in scripts and re.search(r"^RUN pip install .* \.$", text, re.M), "the image installs it"
    commands = {"Dockerfile CMD": json.loads(cmd)} | {n: command(s) for n, s in switchboard_services(compose).items()}
    assert {c[1] for c in commands.values()} >= LONG_LIVED_ROLES
    for name, args in commands.items():
        parsed = _parser().parse_args(args[1:])  # exits (SystemExit) on a command the CLI does not know
        assert parsed.command in LONG_LIVED_ROLES, f"{name}: `{' '.join(args)}` is not a long-lived role"


def test_only_the_web_tier_keeps_the_images_healthcheck(compose: dict[str, Any]) -> None:
    text = (ROOT / "Dockerfile").read_text()
    (probe,) = re.findall(r"/healthz", text)
    app = create_app(Settings(redis_url="redis://localhost:6379/0"), listeners=False)
    routed = {resource.canonical for resource in app.router.resources()}
    assert probe in routed, "the image's HEALTHCHECK asks a path the web app does not route"
    for name, service in switchboard_services(compose).items():
        disabled = (service.get("healthcheck") or {}).get("disable") is True
        assert disabled == (command(service)[1] != "web"), f"{name}: only `web` serves /healthz"


def test_scaled_services_can_be_scaled(compose: dict[str, Any]) -> None:
    """``--scale`` refuses a fixed container name, and replicas cannot share a published host port."""
    for name, service in switchboard_services(compose).items():
        assert "container_name" not in service, f"{name}: a fixed container_name makes `--scale` fail"
        assert not service.get("ports"), f"{name}: replicas cannot share a published port"


def test_the_worker_stops_within_its_grace_period(compose: dict[str, Any], tmp_path: Path) -> None:
    for name, service in role_services(compose, "worker").items():
        env = {k: v for k, v in environment(service).items() if k != "SWITCHBOARD_APPROVAL_KEY"}
        settings = load_settings(env | {"SWITCHBOARD_DATA_DIR": str(tmp_path)})
        assert settings.redis_url is not None
        worker = SessionWorker(settings.redis_url, settings.queue, drainer_factory=lambda *_: None)  # type: ignore[arg-type,return-value]
        grace = re.fullmatch(r"(\d+)s", str(service["stop_grace_period"]))
        assert grace, f"{name}: stop_grace_period in seconds (the default, 10 s, is under the drain window)"
        assert int(grace[1]) >= worker.shutdown_grace_s + AFTER_DRAIN_S, f"{name}: turns killed, not handed back"


def test_the_optional_listener_role_is_opt_in(compose: dict[str, Any]) -> None:
    """``switchboard discord`` exits without a Discord bot: it starts only with ``--profile discord``."""
    exact, open_prefixes = known_variables()
    (listener,) = role_services(compose, "discord").values()
    assert listener["profiles"] == ["discord"]
    for variable in environment(listener):
        assert variable in exact or variable.startswith(open_prefixes), f"{variable} is no setting"
    for role in SWITCHBOARD_ROLES:
        for service in role_services(compose, role).values():
            assert not service.get("profiles"), "web and workers start without a profile"
