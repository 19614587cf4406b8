"""deploy/kubernetes: every overlay renders, validates against the Kubernetes API, and holds its promises.

Each overlay is rendered by `kubectl kustomize` and every object validated offline, strictly (an
unknown field is an error), against the API schemas of the oldest Kubernetes release the manifests
support and of the current one (the package kubernetes-validate ships both), and cert-manager's
objects against models of cert-manager's own CRDs (the package cloudcoil-models-cert-manager). Then
the objects are read for what a deployment needs: probes on the health ports, requests and limits,
an unprivileged read-only container, disruption budgets, spreading, the autoscalers, secrets only
from Secrets, a shutdown that fits its grace period, and network policies.
tests/system/test_kubernetes_references.py checks namespaces, references, images and parameters;
tests/system/test_kubernetes_mtls.py the certificates of the link.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

import kubernetes_validate
import pydantic
import pytest
import yaml

from commands.ports import free_port
from tests.support.kubernetes import KUBERNETES, OVERLAYS, Manifests, render
from tests.support.processes import start_process
from tests.support.redis import START_TIMEOUT
from tests.support.sentinel import DOWN_AFTER_MS, FAILOVER_TIMEOUT_MS, QUORUM, node
from tests.support.stack import wait_until
from toolsearch.config import Config, parse_config
from toolsearch.sections.state_url import parse_sentinel_url

# 1.30: the oldest release the manifests support (preStop's sleep action is on by default from it);
# the latest: the newest release whose schemas the package ships
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.utils.latest_version())
CERT_MANAGER_API = "cert-manager.io/v1"
SECRET_WORDS = re.compile(r"SECRET|PASSWORD|TOKEN|AUTH|KEY", re.IGNORECASE)
CONFIG_MOUNT = "/etc/toolsearch/toolsearch.yaml"


@pytest.fixture(scope="module", params=OVERLAYS)
def manifests(request: pytest.FixtureRequest) -> Manifests:
    return render(str(request.param))


def toolsearch_config(manifests: Manifests, env: dict[str, str] | None = None) -> Config:
    """The ConfigMap's file as the containers load it (catalog paths as the image has them)."""
    text = manifests.config_files("toolsearch-config")["toolsearch.yaml"]
    raw = yaml.safe_load(text)
    for server in raw.get("catalog_servers", []):
        # the image copies examples/ to /app/examples (Dockerfile); the check reads the repository's
        server["catalog"] = str(KUBERNETES.parents[1] / server["catalog"].removeprefix("/app/"))
    return parse_config(raw, Path(CONFIG_MOUNT), env or {})


def test_there_is_a_small_and_a_scaled_overlay() -> None:
    assert {"small", "scaled"} <= set(OVERLAYS)


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
def test_every_object_validates_against_the_kubernetes_api_schemas(
    manifests: Manifests, version: str
) -> None:
    assert manifests.objects
    for obj in manifests.objects:
        if obj["apiVersion"] == CERT_MANAGER_API:
            continue  # a custom resource: validated against cert-manager's CRDs below
        where = f"{manifests.overlay}: {obj['kind']}/{obj['metadata']['name']}"
        try:
            kubernetes_validate.validate(obj, version, strict=True)
        except kubernetes_validate.utils.ValidationError as exc:
            raise AssertionError(f"{where} is invalid for Kubernetes {version}: {exc.message}") from None


def test_the_validation_refuses_what_the_api_would(manifests: Manifests) -> None:
    broken = yaml.safe_load(yaml.safe_dump(manifests.one("Deployment", "router")))
    broken["spec"]["template"]["spec"]["containers"][0]["livenessProbe"]["periodSecond"] = 10
    for version in KUBERNETES_VERSIONS:
        with pytest.raises(kubernetes_validate.utils.ValidationError):
            kubernetes_validate.validate(broken, version, strict=True)
    # a field newer than the oldest supported release is refused for it: the floor is real
    newer = yaml.safe_load(yaml.safe_dump(manifests.one("Deployment", "router")))
    newer["spec"]["template"]["spec"]["resources"] = {"limits": {"cpu": "1"}}  # pod-level: from 1.32
    with pytest.raises(kubernetes_validate.utils.ValidationError):
        kubernetes_validate.validate(newer, KUBERNETES_VERSIONS[0], strict=True)
    kubernetes_validate.validate(newer, KUBERNETES_VERSIONS[-1], strict=True)


def validate_cert_manager(obj: dict[str, Any]) -> None:
    """Strictly, as the API server with cert-manager's CRDs would: unknown and misspelt fields too."""
    from cloudcoil.models.cert_manager import v1

    models = {"Certificate": v1.Certificate, "Issuer": v1.Issuer}
    assert obj["kind"] in models, f"no model for {obj['kind']}: add it"
    models[obj["kind"]].model_validate(obj, strict=True, extra="forbid", by_alias=True, by_name=False)


def test_cert_managers_objects_validate_against_its_crds(manifests: Manifests) -> None:
    for obj in [o for o in manifests.objects if o["apiVersion"] == CERT_MANAGER_API]:
        try:
            validate_cert_manager(obj)
        except pydantic.ValidationError as exc:
            where = f"{manifests.overlay}: {obj['kind']}/{obj['metadata']['name']}"
            raise AssertionError(f"{where}: {exc}") from None
    if not manifests.of_kind("Certificate"):
        return
    # and the check refuses what cert-manager's webhook and the API server would
    certificate = yaml.safe_load(yaml.safe_dump(manifests.of_kind("Certificate")[0]))
    for field, value in (("secretNam", "x"), ("usages", ["server-auth"]), ("duration", 90)):
        wrong = {**certificate, "spec": {**certificate["spec"], field: value}}
        with pytest.raises(pydantic.ValidationError):
            validate_cert_manager(wrong)


def test_every_container_has_startup_readiness_and_liveness_probes(manifests: Manifests) -> None:
    for workload in manifests.workloads():
        for container in manifests.containers(workload):
            for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
                assert probe in container, f"{workload['metadata']['name']}/{container['name']}: no {probe}"


def test_every_container_requests_and_limits_cpu_and_memory(manifests: Manifests) -> None:
    for workload in manifests.workloads():
        for container in manifests.containers(workload, init=True):
            resources = container.get("resources", {})
            for kind in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(resources.get(kind, {})), (
                    workload["metadata"]["name"],
                    container,
                )


def test_every_container_runs_unprivileged_on_a_read_only_root(manifests: Manifests) -> None:
    for workload in manifests.workloads():
        pod = manifests.pod(workload)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod.get("automountServiceAccountToken") is False  # none of them calls the API
        for container in manifests.containers(workload, init=True):
            context = container["securityContext"]
            assert context["allowPrivilegeEscalation"] is False, container["name"]
            assert context["readOnlyRootFilesystem"] is True, container["name"]
            assert context["capabilities"] == {"drop": ["ALL"]}, container["name"]
    namespace = manifests.one("Namespace", "toolsearch")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_every_workload_has_a_disruption_budget_and_spreads_over_nodes(manifests: Manifests) -> None:
    budgets = manifests.of_kind("PodDisruptionBudget")
    for workload in manifests.workloads():
        name = workload["metadata"]["name"]
        assert [b for b in budgets if manifests.selects(b["spec"]["selector"], workload)], f"{name}: no PDB"
        spread = manifests.pod(workload).get("topologySpreadConstraints", [])
        assert "kubernetes.io/hostname" in {c["topologyKey"] for c in spread}, name
        for constraint in spread:
            assert manifests.selects(constraint["labelSelector"], workload), name


def test_the_indexer_is_reached_through_a_headless_service_every_replica_round_robin(
    manifests: Manifests,
) -> None:
    config = toolsearch_config(manifests)
    service = manifests.one("Service", "indexer")
    assert service["spec"]["clusterIP"] == "None"
    assert manifests.selects(
        {"matchLabels": service["spec"]["selector"]}, manifests.one("Deployment", "indexer")
    )
    listen_port = int(config.indexer.listen.rpartition(":")[2])
    assert config.router.indexer == [f"dns:///indexer:{listen_port}"]
    assert {p["port"] for p in service["spec"]["ports"]} >= {listen_port}


def test_the_small_overlay_runs_one_of_each_in_memory_and_no_autoscaler() -> None:
    small = render("small")
    assert not small.of_kind("HorizontalPodAutoscaler") and not small.of_kind("StatefulSet")
    for workload in small.workloads():
        assert workload["spec"]["replicas"] == 1, workload["metadata"]["name"]
    indexer = small.one("Deployment", "indexer")
    assert indexer["spec"]["strategy"] == {"type": "Recreate"}  # never two memory states at once
    env = {e["name"] for c in small.containers(indexer) for e in c.get("env", [])}
    assert "TOOLSEARCH_INDEXER_STATE" not in env
    assert toolsearch_config(small).indexer.state == "memory"


def test_the_scaled_overlay_autoscales_routers_and_indexers_apart_on_redis_with_sentinel() -> None:
    scaled = render("scaled")
    autoscalers = {
        h["spec"]["scaleTargetRef"]["name"]: h["spec"] for h in scaled.of_kind("HorizontalPodAutoscaler")
    }
    assert set(autoscalers) == {"router", "indexer"}
    for name, spec in autoscalers.items():
        assert spec["minReplicas"] >= 2 and spec["maxReplicas"] > spec["minReplicas"], name
        assert spec["metrics"][0]["resource"]["name"] == "cpu"
        assert "replicas" not in scaled.one("Deployment", name)["spec"]  # the autoscaler's to set
    indexer = scaled.containers(scaled.one("Deployment", "indexer"))[0]
    env = {e["name"]: e for e in indexer["env"]}
    address = parse_sentinel_url(env["TOOLSEARCH_INDEXER_STATE"]["value"])
    redis = scaled.one("StatefulSet", "redis")
    assert redis["spec"]["replicas"] == 3 == len(address.sentinels)
    assert [host for host, _ in address.sentinels] == [f"redis-{n}.redis" for n in range(3)]
    ports = {p["name"]: p["port"] for p in scaled.one("Service", "redis")["spec"]["ports"]}
    assert {port for _, port in address.sentinels} == {ports["sentinel"]}
    assert scaled.one("Service", "redis")["spec"]["clusterIP"] == "None"
    assert env["TOOLSEARCH_REDIS_PASSWORD"]["valueFrom"]["secretKeyRef"].get("optional") is False
    assert int(env["TOOLSEARCH_INDEXER_STATE_ACKS"]["value"]) >= 1  # a new session is on a replica
    assert {c["name"] for c in scaled.containers(redis)} == {"redis", "sentinel"}


def test_the_sentinels_run_with_the_timing_the_failover_was_measured_with() -> None:
    script = (KUBERNETES / "components" / "redis-sentinel" / "configure.sh").read_text()
    assert f"down-after-milliseconds $SERVICE {DOWN_AFTER_MS}" in script
    assert f"failover-timeout $SERVICE {FAILOVER_TIMEOUT_MS}" in script
    assert f'sentinel monitor $SERVICE $PRIMARY 6379 {QUORUM}"' in script


def secret_keys(value: object, path: str = "") -> list[str]:
    """Every key of a parsed YAML document whose name says it holds a secret, as dotted paths."""
    found = []
    if isinstance(value, dict):
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if SECRET_WORDS.search(str(key)):
                found.append(where)
            found += secret_keys(item, where)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found += secret_keys(item, f"{path}.{index}")
    return found


def test_secrets_come_only_from_secrets_never_from_the_config_map(manifests: Manifests) -> None:
    # the configuration names variables (keys ending in _env), never holds a value
    document = yaml.safe_load(manifests.config_files("toolsearch-config")["toolsearch.yaml"])
    keys = secret_keys(document)
    assert keys and all(key.endswith("_env") for key in keys), keys
    # scripts take passwords from the environment the Secret fills
    for config_map in manifests.of_kind("ConfigMap"):
        for name, text in config_map.get("data", {}).items():
            for line in text.splitlines():
                if re.search(
                    r"pass\b|auth-pass|requirepass|masterauth", line
                ) and not line.lstrip().startswith("#"):
                    assert "$REDIS_PASSWORD" in line, f"{config_map['metadata']['name']}/{name}: {line}"
    for workload in manifests.workloads():
        for container in manifests.containers(workload, init=True):
            for entry in container.get("env", []):
                if SECRET_WORDS.search(entry["name"]):
                    assert "secretKeyRef" in entry.get("valueFrom", {}), (container["name"], entry["name"])
            for source in container.get("envFrom", []):
                assert "secretRef" in source or "configMapRef" not in source
    # every variable the configuration names for a secret reaches the container that reads it
    config = toolsearch_config(manifests)
    wanted = {
        "router": {config.router.indexer_secret_env},
        "indexer": {config.indexer.shared_secret_env, config.indexer.state_password_env},
    }
    for name, variables in wanted.items():
        (container,) = manifests.containers(manifests.one("Deployment", name))
        given = {e["name"] for e in container["env"] if "secretKeyRef" in e.get("valueFrom", {})}
        assert variables - {None} <= given, (name, variables, given)


def test_a_stop_waits_out_the_load_balancers_then_the_shutdown_grace(manifests: Manifests) -> None:
    config = toolsearch_config(manifests)
    graces = {
        "router": config.router.shutdown_grace,
        "indexer": config.indexer.shutdown_grace,
        "bridge": config.bridge.shutdown_grace,
    }
    for name, grace in graces.items():
        workload = manifests.one("Deployment", name)
        (container,) = manifests.containers(workload)
        pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert pause >= 3  # endpoints leave kube-proxy and DNS within seconds
        assert manifests.pod(workload)["terminationGracePeriodSeconds"] >= pause + grace + 2, name


def test_only_the_routers_are_reachable_and_only_routers_and_indexers_reach_the_rest(
    manifests: Manifests,
) -> None:
    policies = manifests.of_kind("NetworkPolicy")
    deny = [p for p in policies if p["spec"]["podSelector"] == {} and not p["spec"].get("ingress")]
    assert deny and deny[0]["spec"]["policyTypes"] == ["Ingress"]
    # component -> source -> ports it may reach ("*": anywhere; "monitoring": that namespace)
    allowed: dict[str, dict[str, set[int]]] = {}
    for workload in manifests.workloads():
        component = workload["spec"]["template"]["metadata"]["labels"]["app.kubernetes.io/component"]
        for policy in policies:
            if policy["spec"]["podSelector"] and manifests.selects(policy["spec"]["podSelector"], workload):
                for rule in policy["spec"].get("ingress", []):
                    ports = {int(p["port"]) for p in rule["ports"]}
                    sources = allowed.setdefault(component, {})
                    for peer in rule.get("from", [{"*": {}}]):
                        if "namespaceSelector" in peer:
                            source = peer["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
                        else:
                            source = peer.get("podSelector", {}).get("matchLabels", {})
                            source = (
                                source.get("app.kubernetes.io/component", "*") if peer != {"*": {}} else "*"
                            )
                        sources.setdefault(source, set()).update(ports)
    config = toolsearch_config(manifests)
    router_health = int(str(config.router.health_listen).rpartition(":")[2])
    indexer_health = int(str(config.indexer.health_listen).rpartition(":")[2])
    router_port = int(config.router.listen.rpartition(":")[2])
    indexer_port = int(config.indexer.listen.rpartition(":")[2])
    # the MCP port from anywhere; the health ports (metrics) only from the monitoring namespace
    assert allowed.pop("router") == {"*": {router_port}, "monitoring": {router_health}}
    assert allowed.pop("indexer") == {"router": {indexer_port}, "monitoring": {indexer_health}}
    assert set(allowed.pop("bridge")) <= {"router", "indexer"}
    if "redis" in allowed:
        assert set(allowed.pop("redis")) == {"indexer", "redis"}  # never the routers
    for component, sources in allowed.items():
        assert set(sources) <= {"router", "indexer"}, component


def test_the_probes_of_router_and_indexer_go_to_their_health_ports(manifests: Manifests) -> None:
    config = toolsearch_config(manifests)
    listens = {
        "router": (config.router.health_listen, config.router.listen),
        "indexer": (config.indexer.health_listen, config.indexer.listen),
    }
    for name, (health_listen, serving_listen) in listens.items():
        (container,) = manifests.containers(manifests.one("Deployment", name))
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert health_listen is not None, f"{name}: no health_listen in the ConfigMap"
        assert (
            ports["health"] == int(health_listen.rpartition(":")[2]) != int(serving_listen.rpartition(":")[2])
        )
        for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container[kind]
            # an HTTP GET of the health port: no Host check (the kubelet's Host is the pod's IP) and
            # no TLS (the link's mutual TLS would refuse the kubelet's gRPC probe)
            assert probe["httpGet"]["port"] == "health", (name, kind)
            assert probe["httpGet"]["path"] in ("/healthz", "/readyz"), (name, kind)
        assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"  # ready: serving
        assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"  # alive: restart otherwise
    # the indexer's health port reaches Prometheus through its headless Service; the routers' stays
    # off the Service clients are sent to
    indexer_ports = {p["name"]: p["port"] for p in manifests.one("Service", "indexer")["spec"]["ports"]}
    assert indexer_ports["health"] == int(str(config.indexer.health_listen).rpartition(":")[2])
    assert [p["name"] for p in manifests.one("Service", "router")["spec"]["ports"]] == ["http"]


def test_the_redis_pods_configuration_is_one_redis_server_accepts(tmp_path: Path) -> None:
    # the init container's script, run here as it runs in a pod (no sentinel answers yet: first start)
    script = KUBERNETES / "components" / "redis-sentinel" / "configure.sh"
    binary, shell = shutil.which("redis-server"), shutil.which("sh")
    if binary is None or shell is None:
        pytest.skip("redis-server is not installed (scripts/ensure-redis installs it)")
    for pod, primary in (("redis-0", True), ("redis-1", False)):
        folder = tmp_path / pod
        folder.mkdir()
        env = {
            "CONFIG_DIR": str(folder),
            "POD_NAMESPACE": "toolsearch",
            "CLUSTER_DOMAIN": "cluster.local",  # the scaled overlay's parameter
            "HOSTNAME": pod,
            "REDIS_PASSWORD": "pw",
        }
        out = start_process([shell, str(script)], ready_url=None, env=env).wait_exit(30)
        assert "primary redis-0.redis.toolsearch.svc.cluster.local" in out, out
        redis_conf = (folder / "redis.conf").read_text()
        assert ("replicaof" not in redis_conf) is primary
        assert "requirepass pw" in redis_conf and "masterauth pw" in redis_conf
        sentinel_conf = (folder / "sentinel.conf").read_text()
        assert (
            "sentinel monitor toolsearch redis-0.redis.toolsearch.svc.cluster.local 6379 2" in sentinel_conf
        )
        # a real redis-server reads every line of it (only the data folder and the port are local)
        local = folder / "local.conf"
        local.write_text(
            redis_conf.replace("dir /data", f"dir {folder}").replace("replicaof ", "# replicaof ")
        )
        port = free_port()
        server = start_process(
            [binary, str(local), "--port", str(port), "--bind", "127.0.0.1"], ready_url=None
        )
        try:
            wait_until(lambda p=port: _pings(p), START_TIMEOUT, server)
            assert node(port, "pw").config_get("min-replicas-to-write")["min-replicas-to-write"] == "1"
        finally:
            server.stop()


def _pings(port: int) -> bool:
    try:
        return bool(node(port, "pw").ping())
    except Exception:
        return False
