"""The Kubernetes manifests (``deploy/kubernetes/``) are valid and fit the code they deploy.

Every object validates strictly (unknown fields fail) against the Kubernetes schemas of :data:`KUBERNETES_VERSION`
bundled in ``kubernetes-validate`` (no network). Beyond the schemas: the probes hit paths the web app serves (the
real app, on the real Redis, answers them), every variable set is one the settings read, every command is one the
CLI accepts, the autoscaler's metric is one ``/metrics`` exports, the grace periods cover the worker's drain and
the web tier's shutdown, and the selectors, ports, volumes and users agree with each other and with the image.
KEDA's ``ScaledObject`` is a custom resource outside the core schemas: its HPA ``behavior`` block is validated
against the core schema, the rest is checked field by field here.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml
from aiohttp.test_utils import TestClient
from kubernetes_validate.utils import all_versions
from prometheus_client.parser import text_string_to_metric_families

from switchboard.channels.registry import CHANNEL_MODULES
from switchboard.cli.checks import config_problems, known_variables, unknown_variables
from switchboard.cli.main import _parser
from switchboard.settings import Settings, load_settings
from switchboard.web.app import LISTENERS_STOP_S, create_app
from switchboard.worker.worker import SessionWorker

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "deploy" / "kubernetes"
KUBERNETES_VERSION = "1.33"
"""The oldest Kubernetes release the manifests are checked against (``autoscaling/v2``, ``policy/v1``)."""
KUBERNETES_VERSIONS = (KUBERNETES_VERSION, "1.37")
"""Every release checked: the oldest supported and the newest whose schemas ``kubernetes-validate`` bundles."""
NOT_KUBERNETES = {"prometheus-adapter-values.yaml"}
"""Files beside the manifests that are not Kubernetes objects (a Helm values fragment)."""
OPTIONAL = {"secret.example.yaml", "listener.yaml", "worker-keda.yaml"}
"""Manifests deliberately left out of ``kustomization.yaml`` (each named in a comment there)."""
CUSTOM_RESOURCES = {"keda.sh/v1alpha1"}
IMAGE = "switchboard"
"""The name the manifests give the repository's image (``kustomization.yaml`` ``images:`` rewrites it)."""
AFTER_DRAIN_S = 10
"""What a worker's stop takes after its drain window: cancelled drains queued again, its liveness thread joined
(at most 5 s), connections closed."""


def _documents(path: Path) -> list[dict[str, Any]]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def manifest_files() -> list[Path]:
    return sorted(
        p for p in MANIFESTS.rglob("*.yaml") if p.name != "kustomization.yaml" and p.name not in NOT_KUBERNETES
    )


def all_objects() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in manifest_files():
        for doc in _documents(path):
            yield f"{path.relative_to(MANIFESTS)}:{doc['kind']}/{doc['metadata']['name']}", doc


OBJECTS = dict(all_objects())


def objects(kind: str) -> dict[str, dict[str, Any]]:
    return {doc["metadata"]["name"]: doc for doc in OBJECTS.values() if doc["kind"] == kind}


def switchboard_containers() -> Iterator[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(deployment name, pod spec, container)`` of every container running the Switchboard image."""
    for name, deployment in objects("Deployment").items():
        pod = deployment["spec"]["template"]["spec"]
        for container in pod["containers"]:
            if container["image"] == IMAGE:
                yield name, pod, container


def role(container: dict[str, Any]) -> str:
    assert container["command"][0] == "switchboard"
    return str(container["command"][1])


def example_secret() -> dict[str, str]:
    (secret,) = _documents(MANIFESTS / "secret.example.yaml")
    return {str(k): str(v) for k, v in secret["stringData"].items()}


def container_env(container: dict[str, Any]) -> dict[str, str]:
    """The container's plain values, then what its ``envFrom`` Secret adds (the example's placeholders)."""
    env = {item["name"]: item["value"] for item in container.get("env", []) if "value" in item}
    for source in container.get("envFrom", []):
        assert source["secretRef"]["name"] == "switchboard", "the only Secret the app reads is `switchboard`"
        env = example_secret() | env
    return env


def config_text() -> str:
    return str(objects("ConfigMap")["switchboard-config"]["data"]["switchboard.yaml"])


def local_env(container: dict[str, Any], tmp_path: Path, redis_url: str | None = None) -> dict[str, str]:
    """The container's environment with its image paths mapped to private directories.

    With ``redis_url`` (to start the app on the test Redis) the channels' credentials are left out too: a started
    channel would call its platform (no test reaches the internet), and the probes do not depend on channels.
    """
    env = container_env(container)
    if redis_url is not None:
        channels = tuple(f"SWITCHBOARD_{name.upper()}__" for name in CHANNEL_MODULES)
        env = {k: v for k, v in env.items() if not k.startswith(channels)}
    config = tmp_path / "switchboard.yaml"
    config.write_text(config_text())
    env["SWITCHBOARD_CONFIG"] = str(config)
    env["SWITCHBOARD_DATA_DIR"] = str(tmp_path / "data")
    if "SWITCHBOARD_WORKSPACES__ROOT" in env:
        env["SWITCHBOARD_WORKSPACES__ROOT"] = str(tmp_path / "workspaces")
    if redis_url is not None:
        env["SWITCHBOARD_REDIS_URL"] = redis_url
    env["SWITCHBOARD_PORT"] = "0"
    return env


# ---------------------------------------------------------------- the schemas


def test_the_schemas_are_bundled_for_the_stated_versions() -> None:
    """Validation needs no network: the wheel ships the schemas of every release it knows."""
    bundled = [v.rsplit(".", 1)[0] for v in all_versions()]
    assert set(KUBERNETES_VERSIONS) <= set(bundled)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("where", sorted(OBJECTS))
def test_every_object_validates_strictly(where: str, version: str) -> None:
    doc = OBJECTS[where]
    if doc["apiVersion"] in CUSTOM_RESOURCES:
        pytest.skip("a custom resource: no core schema (checked by test_the_keda_scaledobject_fits)")
    assert kubernetes_validate.validate(doc, version, strict=True) == version


@pytest.mark.parametrize(
    "spoil",
    [
        lambda c: c["readinessProbe"]["httpGet"].update(pathh="/healthz"),  # a misspelt field
        lambda c: c["securityContext"].update(runAsNonRoot="yes"),  # a string for a boolean
        lambda c: c.update(terminationGracePeriodSeconds=45),  # a pod field on the container
    ],
    ids=["unknown-field", "wrong-type", "misplaced-field"],
)
def test_strict_validation_refuses_a_spoiled_manifest(spoil: Any) -> None:
    deployment = copy.deepcopy(objects("Deployment")["switchboard-web"])
    spoil(deployment["spec"]["template"]["spec"]["containers"][0])
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, KUBERNETES_VERSION, strict=True)


def test_the_kustomization_lists_every_manifest_but_the_optional_ones() -> None:
    for kustomization in MANIFESTS.rglob("kustomization.yaml"):
        text = kustomization.read_text()
        listed = set(yaml.safe_load(text)["resources"])
        here = {p.name for p in kustomization.parent.glob("*.yaml")} - {"kustomization.yaml"} - NOT_KUBERNETES
        assert listed <= here, f"{kustomization}: lists files that do not exist: {listed - here}"
        for name in here - listed:
            assert name in OPTIONAL and name in text, f"{name} is neither listed nor named as optional"
        for doc in OBJECTS.values():
            assert "namespace" not in doc["metadata"], "namespace-agnostic: `kubectl apply -k … -n NAMESPACE`"


# ---------------------------------------------------------------- the app behind the manifests


async def test_every_probe_is_answered_by_the_app(
    redis_url: str, tmp_path: Path, aiohttp_client: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    probed = 0
    for name, _pod, container in switchboard_containers():
        ports = {p["name"]: p["containerPort"] for p in container.get("ports", [])}
        probes = [container[k] for k in ("startupProbe", "readinessProbe", "livenessProbe") if k in container]
        if not probes:
            assert role(container) != "web", f"{name}: the web tier serves /healthz: probe it"
            continue
        env = container_env(container)
        assert role(container) == "web", f"{name}: only `switchboard web` serves HTTP"
        assert env["SWITCHBOARD_HOST"] == "0.0.0.0"
        settings = load_settings(local_env(container, tmp_path, redis_url))
        client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, listeners=False))
        for probe in probes:
            get = probe["httpGet"]
            assert ports[get["port"]] == int(env["SWITCHBOARD_PORT"]), f"{name}: the probe's port is not the app's"
            resp = await client.get(get["path"])
            assert resp.status == 200, f"{name}: GET {get['path']} answered {resp.status}"
            assert probe.get("timeoutSeconds", 1) >= 1  # /healthz gives Redis 1 s
            probed += 1
    assert probed >= 3


async def test_the_autoscalers_metric_is_one_metrics_exports(
    redis_url: str, tmp_path: Path, aiohttp_client: Any
) -> None:
    (web,) = [c for _, _, c in switchboard_containers() if role(c) == "web"]
    settings = load_settings(local_env(web, tmp_path, redis_url))
    client: TestClient[Any, Any] = await aiohttp_client(create_app(settings, listeners=False))
    resp = await client.get("/metrics")
    assert resp.status == 200
    exported = {family.name for family in text_string_to_metric_families(await resp.text())}

    (hpa,) = objects("HorizontalPodAutoscaler").values()
    names = {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "External"}
    assert names and names <= exported, f"the HPA scales on {names - exported}, which /metrics does not export"

    adapter = yaml.safe_load((MANIFESTS / "prometheus-adapter-values.yaml").read_text())
    served = {rule["name"]["as"] for rule in adapter["rules"]["external"]}
    assert names <= served, "prometheus-adapter does not serve the HPA's metric"
    for rule in adapter["rules"]["external"]:
        (series,) = re.findall(r'__name__="(\w+)"', rule["seriesQuery"])
        assert series in exported and re.fullmatch(rule["name"]["matches"], series)
        assert rule["metricsQuery"].startswith("max("), "every web process exports the same figure: never sum it"

    (scaled,) = objects("ScaledObject").values()
    for trigger in scaled["spec"]["triggers"]:
        assert trigger["type"] == "prometheus"
        query = trigger["metadata"]["query"]
        assert re.fullmatch(r"max\((\w+)\{[^}]*\}\)", query) and re.findall(r"\w+(?=\{)", query)[0] in exported


def test_the_keda_scaledobject_fits() -> None:
    """The custom resource, checked by hand: target, bounds, and its HPA behaviour against the core schema."""
    (scaled,) = objects("ScaledObject").values()
    (hpa,) = objects("HorizontalPodAutoscaler").values()
    spec = scaled["spec"]
    assert set(spec) <= {
        "scaleTargetRef",
        "minReplicaCount",
        "maxReplicaCount",
        "pollingInterval",
        "cooldownPeriod",
        "advanced",
        "triggers",
    }
    assert spec["scaleTargetRef"]["name"] == hpa["spec"]["scaleTargetRef"]["name"]
    assert spec["scaleTargetRef"]["name"] in objects("Deployment")
    assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
    for trigger in spec["triggers"]:
        assert float(trigger["metadata"]["threshold"]) > 0 and trigger["metadata"]["serverAddress"].startswith("http")
    as_hpa = copy.deepcopy(hpa)
    as_hpa["spec"]["behavior"] = spec["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    kubernetes_validate.validate(as_hpa, KUBERNETES_VERSION, strict=True)


def test_every_variable_set_is_one_the_settings_read() -> None:
    exact, open_prefixes = known_variables()
    aliases = {
        choice
        for field in Settings.model_fields.values()
        if field.validation_alias is not None
        for choice in getattr(field.validation_alias, "choices", [field.validation_alias])
    }
    checked = 0
    for name, _pod, container in switchboard_containers():
        for variable in container_env(container):
            if variable.startswith("SWITCHBOARD_"):
                assert variable in exact or variable.startswith(open_prefixes), f"{name}: {variable} is no setting"
            else:
                assert variable in aliases, f"{name}: {variable} is read by nothing"
            checked += 1
    assert checked > 10


@pytest.mark.parametrize("deployment", sorted({name for name, _, _ in switchboard_containers()}))
def test_each_role_starts_without_a_problem_check_would_report(deployment: str, tmp_path: Path) -> None:
    """What ``check`` (and start-up) would refuse in the pod's environment, with the example Secret's values."""
    (container,) = [c for name, _, c in switchboard_containers() if name == deployment]
    args = _parser().parse_args(container["command"][1:])  # a command the CLI accepts
    assert args.command in {"web", "worker", "discord"}, "a Deployment runs a long-lived role"
    env = local_env(container, tmp_path)
    settings = load_settings(env)
    assert config_problems(settings) == []
    assert unknown_variables(env, settings) == []
    assert settings.approval_key is not None, "every worker must share one approval key from the Secret"


def test_the_config_file_is_mounted_where_the_settings_read_it() -> None:
    for name, pod, container in switchboard_containers():
        config = Path(container_env(container)["SWITCHBOARD_CONFIG"])
        volumes = {v["name"]: v for v in pod["volumes"]}
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(config.parent)]
        configmap = objects("ConfigMap")[volumes[mount["name"]]["configMap"]["name"]]
        assert config.name in configmap["data"], f"{name}: {config} is not in the ConfigMap"


def test_the_worker_has_the_time_to_drain_and_hand_its_sessions_back(tmp_path: Path) -> None:
    (worker,) = [(pod, c) for _, pod, c in switchboard_containers() if role(c) == "worker"]
    pod, container = worker
    settings = load_settings(local_env(container, tmp_path))
    assert settings.redis_url is not None
    session_worker = SessionWorker(settings.redis_url, settings.queue, drainer_factory=lambda *_: None)  # type: ignore[arg-type,return-value]
    grace = pod["terminationGracePeriodSeconds"]
    assert grace >= session_worker.shutdown_grace_s + AFTER_DRAIN_S, (
        f"terminationGracePeriodSeconds {grace} < the drain window {session_worker.shutdown_grace_s:g} s "
        f"(SWITCHBOARD_QUEUE__LEASE_MS) + {AFTER_DRAIN_S} s: running turns would be killed instead of handed back"
    )


def test_rollouts_keep_every_role_serving() -> None:
    """A new pod must be up before an old one goes; without a readiness probe, up for a while."""
    for name, deployment in objects("Deployment").items():
        spec = deployment["spec"]
        assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0, name
        (container,) = spec["template"]["spec"]["containers"]
        if "readinessProbe" not in container:
            assert spec.get("minReadySeconds", 0) >= 10, f"{name}: a pod that exits at start would count as ready"


def test_the_web_tier_leaves_the_service_before_it_stops() -> None:
    (pod, container) = next((pod, c) for _, pod, c in switchboard_containers() if role(c) == "web")
    sleep = container["lifecycle"]["preStop"]["exec"]["command"]
    assert sleep[0] == "sleep" and int(sleep[1]) > 0
    shutdown_s = 2  # serve_web's runner shutdown_timeout
    assert pod["terminationGracePeriodSeconds"] >= int(sleep[1]) + shutdown_s + LISTENERS_STOP_S


def test_selectors_ports_and_budgets_agree() -> None:
    deployments = objects("Deployment") | objects("StatefulSet")
    for name, deployment in deployments.items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items(), name
    pods = [d["spec"]["template"] for d in deployments.values()]

    def matching(selector: dict[str, str]) -> list[dict[str, Any]]:
        return [p for p in pods if selector.items() <= p["metadata"]["labels"].items()]

    for name, service in objects("Service").items():
        (pod,) = matching(service["spec"]["selector"])
        port_names = {p["name"] for c in pod["spec"]["containers"] for p in c.get("ports", [])}
        for port in service["spec"]["ports"]:
            assert port["targetPort"] in port_names, f"{name}: targetPort {port['targetPort']} is no container port"
    budgets = [b["spec"]["selector"]["matchLabels"] for b in objects("PodDisruptionBudget").values()]
    for name, deployment in objects("Deployment").items():
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        covering = [selector for selector in budgets if selector.items() <= labels.items()]
        assert len(covering) == 1, f"{name} needs exactly one PodDisruptionBudget"
    for selector in budgets:
        assert matching(selector), f"the budget for {selector} covers no pod"
    (hpa,) = objects("HorizontalPodAutoscaler").values()
    assert hpa["spec"]["scaleTargetRef"]["name"] in objects("Deployment")


def test_containers_run_as_the_images_user_without_privileges() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text()
    (uid,) = re.findall(r"useradd .*--uid (\d+)", dockerfile)
    for name, pod, container in switchboard_containers():
        assert pod["securityContext"]["runAsUser"] == int(uid), f"{name}: not the image's user"
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["automountServiceAccountToken"] is False
        context = container["securityContext"]
        assert context["allowPrivilegeEscalation"] is False
        assert context["capabilities"]["drop"] == ["ALL"]
        assert context["readOnlyRootFilesystem"] is True
        env = container_env(container)
        writable = {m["mountPath"] for m in container["volumeMounts"] if not m.get("readOnly")}
        # a read-only image: everything the process writes is a mounted volume
        needed = {"/tmp", env["SWITCHBOARD_DATA_DIR"]} | {env.get("SWITCHBOARD_WORKSPACES__ROOT", "/tmp")}
        assert needed <= writable, f"{name}: {needed - writable} would be read-only"
        assert "resources" in container and "requests" in container["resources"]
        assert "memory" in container["resources"]["limits"]


def test_workers_and_web_share_one_workspace_volume() -> None:
    claims = set()
    for _name, pod, container in switchboard_containers():
        root = container_env(container).get("SWITCHBOARD_WORKSPACES__ROOT")
        if root is None:
            continue
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == root]
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        claims.add((volume["persistentVolumeClaim"]["claimName"], mount.get("subPath")))
    assert len(claims) == 1, "every process must see the same workspaces"
    ((claim, _),) = claims
    assert "ReadWriteMany" in objects("PersistentVolumeClaim")[claim]["spec"]["accessModes"]


def test_the_example_valkey_keeps_an_aof_and_never_evicts() -> None:
    conf = objects("ConfigMap")["switchboard-valkey"]["data"]["valkey.conf"]
    options = dict(line.split(None, 1) for line in conf.splitlines() if line.strip() and not line.startswith("#"))
    assert options["appendonly"] == "yes"
    assert options["appendfsync"] in {"everysec", "always"}
    assert options["maxmemory-policy"] == "noeviction"
    (valkey,) = objects("StatefulSet").values()
    container = valkey["spec"]["template"]["spec"]["containers"][0]
    (data,) = [m for m in container["volumeMounts"] if m["name"] == "data"]
    assert options["dir"] == data["mountPath"], "the AOF must be on the persistent volume"
    assert valkey["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "data"
    service = objects("Service")[valkey["spec"]["serviceName"]]
    url = "redis://:secret@{}:{}/0".format(service["metadata"]["name"], service["spec"]["ports"][0]["port"])
    assert Settings.model_validate({"redis_url": url}).redis_url == url
