"""The Kubernetes manifests as `kubectl kustomize` renders them, and their objects looked up by kind.

    manifests = render("scaled")  # every object of deploy/kubernetes/overlays/scaled
    indexer = manifests.one("Deployment", "indexer")
    for container in manifests.containers(indexer): ...

Rendering needs `kubectl` (its kustomize); tests that need it are skipped without it.
"""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
KUBERNETES = ROOT / "deploy" / "kubernetes"
OVERLAYS = sorted(path.name for path in (KUBERNETES / "overlays").iterdir() if path.is_dir())
WORKLOADS = ("Deployment", "StatefulSet")
RENDER_TIMEOUT = 60.0

Obj = dict[str, Any]


@dataclass
class Manifests:
    overlay: str
    objects: list[Obj]

    def of_kind(self, kind: str) -> list[Obj]:
        return [o for o in self.objects if o["kind"] == kind]

    def find(self, kind: str, name: str) -> Obj | None:
        found = [o for o in self.of_kind(kind) if o["metadata"]["name"] == name]
        assert len(found) <= 1, f"{kind}/{name} twice"
        return found[0] if found else None

    def one(self, kind: str, name: str) -> Obj:
        found = self.find(kind, name)
        assert found is not None, f"{self.overlay}: no {kind}/{name}"
        return found

    def workloads(self) -> list[Obj]:
        return [o for o in self.objects if o["kind"] in WORKLOADS]

    @staticmethod
    def pod(workload: Obj) -> Obj:
        return dict(workload["spec"]["template"]["spec"])

    def containers(self, workload: Obj, init: bool = False) -> list[Obj]:
        pod = self.pod(workload)
        return list(pod.get("containers", [])) + (list(pod.get("initContainers", [])) if init else [])

    def config_files(self, name: str) -> dict[str, str]:
        """The files of a ConfigMap, by the name the workloads use (generated names carry a hash)."""
        maps = [m for m in self.of_kind("ConfigMap") if m["metadata"]["name"].startswith(f"{name}-")]
        maps += [m for m in self.of_kind("ConfigMap") if m["metadata"]["name"] == name]
        assert len(maps) == 1, f"{self.overlay}: ConfigMap {name}: {len(maps)} found"
        return dict(maps[0].get("data", {}))

    def selects(self, selector: Obj, workload: Obj) -> bool:
        labels = workload["spec"]["template"]["metadata"]["labels"]
        return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def render(overlay: str) -> Manifests:
    """`kubectl kustomize deploy/kubernetes/overlays/<overlay>`, parsed."""
    return render_folder(KUBERNETES / "overlays" / overlay, overlay)


def render_folder(folder: Path, name: str) -> Manifests:
    """`kubectl kustomize FOLDER`, parsed: an overlay of the repository's, or one a test writes."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed (its kustomize renders the manifests)")
    done = subprocess.run(
        [kubectl, "kustomize", str(folder)],
        capture_output=True,
        text=True,
        timeout=RENDER_TIMEOUT,
        check=False,
    )
    assert done.returncode == 0, f"kubectl kustomize {name}:\n{done.stderr}"
    return Manifests(name, [o for o in yaml.safe_load_all(done.stdout) if o])


def kustomization(overlay: str) -> Obj:
    """An overlay's kustomization.yaml, parsed."""
    return dict(yaml.safe_load((KUBERNETES / "overlays" / overlay / "kustomization.yaml").read_text()))


def env_entries(container: Obj) -> Iterator[Obj]:
    yield from container.get("env", [])
