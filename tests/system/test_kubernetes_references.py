"""deploy/kubernetes: each overlay is whole in its namespace, and a re-apply changes only what it owns.

Rendered by `kubectl kustomize`, every object of an overlay must land in the namespace the overlay
names (a component's objects too), and every reference between objects must resolve there: the
Secrets and ConfigMaps containers read, the Services the configuration names by DNS name, the
claims of a StatefulSet's volume templates, the targets of autoscalers, budgets and policies. An
autoscaled Deployment sets no `replicas` (an apply would cut the fleet back), images are named
once per overlay with the release's tag, and the overlay's parameters reach where they are used.
"""

from __future__ import annotations

import os
import re
import tomllib
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.support.kubernetes import (
    KUBERNETES,
    OVERLAYS,
    ROOT,
    Manifests,
    Obj,
    kustomization,
    render,
    render_folder,
)

CLUSTER_SCOPED = {"Namespace"}
NAMESPACED = {
    "ConfigMap",
    "Service",
    "Deployment",
    "StatefulSet",
    "PodDisruptionBudget",
    "HorizontalPodAutoscaler",
    "NetworkPolicy",
    "Certificate",
    "Issuer",
}
# a Service named in the configuration, a URL or an environment value: NAME:PORT or POD.NAME:PORT
HOST_PORT = re.compile(r"(?<![\w.$-])([a-z][a-z0-9-]*(?:\.[a-z][a-z0-9-]*)?):(\d{2,5})(?!\d)")
# the Secrets docs/kubernetes.md tells the operator to create, with their keys (`name/key`)
DOCUMENTED_SECRET = re.compile(r"`(toolsearch-[a-z-]+)/([a-z-]+)`|every key of `(toolsearch-[a-z-]+)`")
TLS_SECRET_KEYS = {"tls.crt", "tls.key", "ca.crt"}  # what cert-manager writes in a Certificate's Secret
PROJECT_VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


@pytest.fixture(scope="module", params=OVERLAYS)
def manifests(request: pytest.FixtureRequest) -> Manifests:
    return render(str(request.param))


def pod_specs(manifests: Manifests) -> Iterator[tuple[str, Obj]]:
    for workload in manifests.workloads():
        yield workload["metadata"]["name"], manifests.pod(workload)


def documented_secrets() -> dict[str, set[str] | None]:
    """Secret name -> the keys the operator creates (None: any key, an envFrom Secret)."""
    found: dict[str, set[str] | None] = {}
    for name, key, whole in DOCUMENTED_SECRET.findall((ROOT / "docs" / "kubernetes.md").read_text()):
        if whole:
            found[whole] = None
        else:
            keys = found.setdefault(name, set())
            if keys is not None:
                keys.add(key)
    return found


def test_every_object_lands_in_the_namespace_the_overlay_names(manifests: Manifests) -> None:
    namespace = kustomization(manifests.overlay)["namespace"]
    (created,) = manifests.of_kind("Namespace")
    assert created["metadata"]["name"] == namespace
    for obj in manifests.objects:
        kind, name = obj["kind"], obj["metadata"]["name"]
        assert kind in NAMESPACED | CLUSTER_SCOPED, f"{kind}: say whether it is namespaced here"
        if kind in NAMESPACED:
            assert obj["metadata"].get("namespace") == namespace, f"{manifests.overlay}: {kind}/{name}"


def test_every_secret_and_config_map_a_pod_reads_is_in_the_overlay_or_created_by_the_operator(
    manifests: Manifests,
) -> None:
    config_maps = {m["metadata"]["name"]: set(m.get("data", {})) for m in manifests.of_kind("ConfigMap")}
    # a Certificate's Secret is written by cert-manager in the Certificate's namespace
    secrets: dict[str, set[str] | None] = {
        c["spec"]["secretName"]: TLS_SECRET_KEYS for c in manifests.of_kind("Certificate")
    }
    secrets |= documented_secrets()
    assert "toolsearch-secrets" in secrets
    for workload, pod in pod_specs(manifests):
        for volume in pod.get("volumes", []):
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, (workload, volume)
            if "secret" in volume:
                assert volume["secret"]["secretName"] in secrets, (workload, volume)
        containers = pod.get("containers", []) + pod.get("initContainers", [])
        for container in containers:
            for entry in container.get("env", []):
                source = entry.get("valueFrom", {})
                if "secretKeyRef" in source:
                    ref = source["secretKeyRef"]
                    keys = secrets.get(ref["name"], set())
                    assert keys is None or ref["key"] in keys, (workload, entry["name"], ref)
                if "configMapKeyRef" in source:
                    ref = source["configMapKeyRef"]
                    assert ref["key"] in config_maps.get(ref["name"], set()), (workload, ref)
            for source in container.get("envFrom", []):
                if "secretRef" in source:
                    assert source["secretRef"]["name"] in secrets, (workload, source)
                if "configMapRef" in source:
                    assert source["configMapRef"]["name"] in config_maps, (workload, source)


def configuration_texts(manifests: Manifests) -> Iterator[tuple[str, str]]:
    """(where, text) of everything that names hosts: the ConfigMaps' files, env values, arguments."""
    for config_map in manifests.of_kind("ConfigMap"):
        for key, text in config_map.get("data", {}).items():
            # a commented example (an inference server's Service the operator adds) names nothing yet
            configured = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
            yield f"ConfigMap {config_map['metadata']['name']}/{key}", configured
    for workload, pod in pod_specs(manifests):
        for container in pod.get("containers", []) + pod.get("initContainers", []):
            for entry in container.get("env", []):
                if "value" in entry:
                    yield f"{workload}/{container['name']} env {entry['name']}", str(entry["value"])
            yield f"{workload}/{container['name']} args", " ".join(map(str, container.get("args", [])))


def test_every_service_the_configuration_names_resolves_in_the_overlays_namespace(
    manifests: Manifests,
) -> None:
    services = {s["metadata"]["name"]: s["spec"] for s in manifests.of_kind("Service")}
    sets = {s["metadata"]["name"]: s["spec"] for s in manifests.of_kind("StatefulSet")}
    named: set[str] = set()
    for where, text in configuration_texts(manifests):
        for host, port in HOST_PORT.findall(text):
            pod, _, service = host.rpartition(".")
            assert service in services, f"{where}: {host}:{port} names no Service of the overlay"
            assert int(port) in {p["port"] for p in services[service]["ports"]}, f"{where}: {host}:{port}"
            if pod:
                # POD.SERVICE: a StatefulSet's pod, published by its headless Service
                owner = [n for n, spec in sets.items() if spec["serviceName"] == service]
                assert owner and services[service].get("clusterIP") == "None", f"{where}: {host}"
                index = int(pod.removeprefix(f"{owner[0]}-"))
                assert 0 <= index < sets[owner[0]]["replicas"], f"{where}: {host}"
            named.add(service)
        # a fully qualified name is this namespace's, and under the cluster-domain parameter
        assert ".svc.cluster.local" not in text, f"{where}: the cluster domain is a parameter"
        for namespace in re.findall(r"\.([\w${}-]+)\.svc\b", text):
            assert namespace == "${POD_NAMESPACE}", f"{where}: names the namespace {namespace}"
    assert {"indexer", "bridge", "catalog"} <= named, named  # what the configuration reaches at least


def test_every_selector_and_target_finds_its_object(manifests: Manifests) -> None:
    workloads = {(w["kind"], w["metadata"]["name"]): w for w in manifests.workloads()}
    for autoscaler in manifests.of_kind("HorizontalPodAutoscaler"):
        target = autoscaler["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) in workloads, autoscaler["metadata"]["name"]
    for kind in ("PodDisruptionBudget", "Service", "NetworkPolicy"):
        for obj in manifests.of_kind(kind):
            spec = obj["spec"]
            selector = spec.get("selector") if kind != "NetworkPolicy" else spec["podSelector"]
            if kind == "Service":
                selector = {"matchLabels": selector}
            if selector:  # the default-deny policy selects every pod
                hits = [w for w in workloads.values() if manifests.selects(selector, w)]
                assert hits, f"{manifests.overlay}: {kind}/{obj['metadata']['name']} selects nothing"
    issuers = {i["metadata"]["name"]: i["spec"] for i in manifests.of_kind("Issuer")}
    issued = {c["spec"]["secretName"] for c in manifests.of_kind("Certificate")}
    for certificate in manifests.of_kind("Certificate"):
        ref = certificate["spec"]["issuerRef"]
        assert ref["kind"] == "Issuer" and ref["name"] in issuers, certificate["metadata"]["name"]
    for name, spec in issuers.items():
        if "ca" in spec:
            assert spec["ca"]["secretName"] in issued, f"Issuer {name}: no Certificate makes its CA"


def test_every_volume_mount_is_a_volume_or_a_claim_template_of_its_workload(manifests: Manifests) -> None:
    for workload in manifests.workloads():
        volumes = {v["name"] for v in manifests.pod(workload).get("volumes", [])}
        claims = {t["metadata"]["name"] for t in workload["spec"].get("volumeClaimTemplates", [])}
        assert not volumes & claims, workload["metadata"]["name"]
        mounted = set()
        for container in manifests.containers(workload, init=True):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes | claims, (workload["metadata"]["name"], mount)
                mounted.add(mount["name"])
        assert claims <= mounted, f"{workload['metadata']['name']}: a claim template no container mounts"


def test_no_replicas_where_an_autoscaler_owns_the_count(manifests: Manifests) -> None:
    scaled = {a["spec"]["scaleTargetRef"]["name"] for a in manifests.of_kind("HorizontalPodAutoscaler")}
    for workload in manifests.workloads():
        name = workload["metadata"]["name"]
        # with the field set, every `kubectl apply` would put the count back and cut the fleet
        assert ("replicas" in workload["spec"]) is (name not in scaled), f"{manifests.overlay}: {name}"
    overlay = kustomization(manifests.overlay)
    assert not scaled & {r["name"] for r in overlay.get("replicas", [])}, manifests.overlay


def test_images_are_named_once_in_the_overlay_with_the_releases_tag(manifests: Manifests) -> None:
    named = {entry["name"]: entry for entry in kustomization(manifests.overlay)["images"]}
    base_images = set()
    for path in [*KUBERNETES.glob("base/*.yaml"), *KUBERNETES.glob("components/*/*.yaml")]:
        base_images |= set(re.findall(r"^\s+image: (\S+)", path.read_text(), re.MULTILINE))
    # the base names each image without a registry or a tag: the overlay says both, once
    assert all(":" not in image and "/" not in image for image in base_images), base_images
    for workload in manifests.workloads():
        for container in manifests.containers(workload, init=True):
            image = container["image"]
            repository, _, tag = image.rpartition(":")
            registry = repository.split("/")[0]
            assert "." in registry, f"{image}: name the registry (unqualified names mean Docker Hub)"
            assert tag and tag != "latest" and "/" not in tag, f"{image}: a release's tag, never latest"
            assert container["imagePullPolicy"] == "IfNotPresent"  # a tag is never moved
    for name in base_images & {"toolsearch", "toolsearch-router", "toolsearch-bridge", "toolsearch-model"}:
        assert named[name]["newTag"] == PROJECT_VERSION, f"{name}: the release's version is {PROJECT_VERSION}"
    assert set(named) <= base_images  # nothing named that no container runs


def test_the_overlays_parameters_reach_where_they_are_used(tmp_path: Path) -> None:
    # an overlay of an operator's own, as docs/kubernetes.md describes: its namespace and parameters
    folder = tmp_path / "overlay"
    folder.mkdir()
    up = Path(os.path.relpath(KUBERNETES, folder))  # kustomize takes relative paths only
    parameters = yaml.safe_load((KUBERNETES / "overlays" / "scaled" / "parameters.yaml").read_text())
    parameters["data"] = {"cluster-domain": "corp.internal", "monitoring-namespace": "observability"}
    (folder / "parameters.yaml").write_text(yaml.safe_dump(parameters))
    scaled = kustomization("scaled")
    (folder / "kustomization.yaml").write_text(
        yaml.safe_dump(
            {
                "namespace": "tools",
                "resources": [str(up / "base"), "parameters.yaml"],
                "components": [str(up / "overlays" / "scaled" / c) for c in scaled["components"]],
                "images": scaled["images"],
            }
        )
    )
    mine = render_folder(folder, "an operator's overlay")
    assert {o["metadata"].get("namespace", "tools") for o in mine.objects} == {"tools"}
    assert not mine.find("ConfigMap", "toolsearch-parameters")  # read by kustomize, never applied
    for name in ("router", "indexer"):
        policy = mine.one("NetworkPolicy", name)
        peers = [peer for rule in policy["spec"]["ingress"] for peer in rule.get("from", [])]
        namespaces = {
            p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"]
            for p in peers
            if "namespaceSelector" in p
        }
        assert namespaces == {"observability"}, name
    (configure,) = mine.pod(mine.one("StatefulSet", "redis"))["initContainers"]
    assert {"name": "CLUSTER_DOMAIN", "value": "corp.internal"} in configure["env"]
