"""Containers of the rendered Kubernetes manifests run as local processes on loopback.

    cluster = LocalCluster(render("small"), tmp_path, secrets={("toolsearch-secrets", "indexer-secret"): "s"})
    proc = cluster.start("Deployment", "indexer")  # its command, arguments, environment; waits on its probes

What a cluster gives a container is given here as locally as it can be: each Service name and port
becomes 127.0.0.1 and a free port (rewritten wherever the manifests or the ConfigMap's files name
them, as the cluster's DNS would answer), the container's own listening ports the same free ports,
its mounts folders (the ConfigMap's files written out; a Secret volume the folder given for that
Secret, such as tests/support/cert_manager.py issues; the model image's folder is the repository's
models/, which that image is built from; the toolsearch image's /app/examples is the repository's
examples/, as the Dockerfile copies it), its environment resolved from values, Secrets and the
downward API. The image's ENTRYPOINT (`toolsearch`) is this interpreter's `-m commands.cli`, and
its PATH (the virtualenv first) this interpreter's folder first. The probes are run as the kubelet
would, each within its own budget; an HTTP probe's Host is the pod's IP and the port, as the
kubelet's is (`POD_IP`, an address no request is sent to).
"""

from __future__ import annotations

import math
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import psutil

from commands.health_check import check_grpc, check_http
from commands.ports import free_port
from tests.support.kubernetes import ROOT, Manifests, Obj
from tests.support.processes import Proc, start_process

POD_IP = "10.244.0.17"  # the Host of the kubelet's HTTP probes: the pod's address, as a cluster gives one
ENTRYPOINT = [sys.executable, "-m", "commands.cli"]  # the images' ENTRYPOINT ["toolsearch"]
PROBE_POLL = 0.2  # seconds between probe attempts while waiting (the kubelet's period is longer)
IMAGE_PATHS = {"/app/examples": ROOT / "examples"}  # Dockerfile: COPY examples/ /app/examples/
MODEL_IMAGE_FOLDER = ROOT / "models"  # deploy/kubernetes/model/Dockerfile copies models/ to /models


def memory_bytes(quantity: str) -> int:
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "K": 10**3, "M": 10**6, "G": 10**9}
    for suffix, factor in units.items():
        if quantity.endswith(suffix):
            return int(float(quantity.removesuffix(suffix)) * factor)
    return int(quantity)


def cpus(quantity: str) -> float:
    return float(quantity.removesuffix("m")) / 1000 if quantity.endswith("m") else float(quantity)


def tree_rss(pid: int) -> int:
    """Resident memory of a process and its children (the bridge's stdio servers are its children)."""
    try:
        parent = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [parent, *parent.children(recursive=True)])
    except psutil.NoSuchProcess:
        return 0


@dataclass
class LocalCluster:
    """Services, mounts and secrets of one rendered overlay, mapped to this machine."""

    manifests: Manifests
    workdir: Path
    secrets: Mapping[tuple[str, str], str]
    # "name:port" -> "127.0.0.1:local port"; given ones (a pod's own name) come before the Services'
    hosts: dict[str, str] = field(default_factory=dict)
    ports: dict[int, int] = field(default_factory=dict)  # container port -> local port
    procs: dict[str, Proc] = field(default_factory=dict)
    secret_folders: Mapping[str, Path] = field(default_factory=dict)  # Secret volumes' files, by Secret

    def __post_init__(self) -> None:
        for service in self.manifests.of_kind("Service"):
            name = service["metadata"]["name"]
            for entry in service["spec"]["ports"]:
                local = self.ports.setdefault(int(entry["port"]), free_port())
                self.hosts.setdefault(f"{name}:{entry['port']}", f"127.0.0.1:{local}")
        for workload in self.manifests.workloads():  # ports no Service names: the health ports
            for container in self.manifests.containers(workload):
                for entry in container.get("ports", []):
                    self.ports.setdefault(int(entry["containerPort"]), free_port())
        (namespace,) = self.manifests.of_kind("Namespace")
        self.namespace = str(namespace["metadata"]["name"])
        config = self.workdir / "etc-toolsearch"
        config.mkdir(parents=True, exist_ok=True)
        self.mounts: dict[str, Path] = {
            "/etc/toolsearch": config,
            "/app/models": MODEL_IMAGE_FOLDER,
            **IMAGE_PATHS,
        }
        for workload in self.manifests.workloads():
            volumes = {v["name"]: v for v in self.manifests.pod(workload).get("volumes", [])}
            for container in self.manifests.containers(workload):
                for mount in container.get("volumeMounts", []):
                    path = mount["mountPath"]
                    volume = volumes.get(mount["name"], {})  # a StatefulSet's claims are not volumes
                    if "secret" in volume:
                        secret = volume["secret"]["secretName"]
                        # the kubelet holds the pod in ContainerCreating until the Secret exists
                        assert secret in self.secret_folders, f"{container['name']}: no Secret {secret}"
                        self.mounts[path] = self.secret_folders[secret]
                    if "emptyDir" in volume and path != "/tmp" and path not in self.mounts:
                        folder = self.workdir / "empty-dirs" / path.strip("/").replace("/", "-")
                        folder.mkdir(parents=True, exist_ok=True)
                        self.mounts[path] = folder
        for name, text in self.manifests.config_files("toolsearch-config").items():
            (config / name).write_text(self.rewrite(text))

    def url(self, service: str, port: int, path: str = "") -> str:
        return f"http://{self.hosts[f'{service}:{port}']}{path}"

    def rewrite(self, text: str) -> str:
        """Service names and wildcard listens as loopback addresses; container paths as local ones."""
        for name, local in self.hosts.items():
            text = re.sub(rf"(?<![\w.-]){re.escape(name)}(?!\d)", local, text)
        for port, local in self.ports.items():
            text = re.sub(rf"0\.0\.0\.0:{port}(?!\d)", f"127.0.0.1:{local}", text)
        return self.rewrite_paths(text, getattr(self, "mounts", {}))

    def _argv(self, container: Obj) -> list[str]:
        command = container.get("command")
        args = [self.rewrite(str(a)) for a in container.get("args", [])]
        argv = [*(command or ENTRYPOINT), *args]
        ports = {
            str(p["containerPort"]): str(self.ports[int(p["containerPort"])]) for p in container["ports"]
        }
        for index in range(1, len(argv)):  # `--port 9100`, `--host 0.0.0.0` of the catalog server
            if argv[index - 1] == "--port" and argv[index] in ports:
                argv[index] = ports[argv[index]]
            if argv[index - 1] == "--host" and argv[index] == "0.0.0.0":
                argv[index] = "127.0.0.1"
        return argv

    def _env(self, container: Obj) -> dict[str, str]:
        bin_dir = str(Path(sys.executable).parent)
        env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "HOSTNAME": container["name"]}
        for entry in container.get("env", []):
            source = entry.get("valueFrom")
            if source is None:
                env[entry["name"]] = self.rewrite(str(entry.get("value", "")))
            elif "secretKeyRef" in source:
                ref = source["secretKeyRef"]
                value = self.secrets.get((ref["name"], ref["key"]))
                if value is None:
                    # the kubelet refuses to start a container whose required secret key is missing
                    assert ref.get("optional"), (
                        f"{container['name']}: Secret {ref['name']} has no {ref['key']}"
                    )
                    continue
                env[entry["name"]] = value
            elif "resourceFieldRef" in source:
                ref = source["resourceFieldRef"]
                kind, resource = ref["resource"].split(".")
                value = cpus(container["resources"][kind][resource]) / cpus(str(ref.get("divisor", "1")))
                env[entry["name"]] = str(math.ceil(value))
            elif "fieldRef" in source:
                assert source["fieldRef"]["fieldPath"] == "metadata.namespace", source
                env[entry["name"]] = self.namespace
            else:
                raise AssertionError(f"{container['name']}: unknown env source {source}")
        for source in container.get("envFrom", []):
            ref = source.get("secretRef", {})
            given = {k: v for (name, k), v in self.secrets.items() if name == ref.get("name")}
            assert given or ref.get("optional"), f"{container['name']}: no Secret {ref.get('name')}"
            env.update(given)
        return env

    @staticmethod
    def rewrite_paths(text: str, mounts: Mapping[str, Path]) -> str:
        for container_path, local_path in mounts.items():
            text = text.replace(container_path, str(local_path))
        return text

    def probe(self, container: Obj, probe: Obj) -> str | None:
        """One attempt of a probe; None when it passes, else why not."""
        timeout = float(probe.get("timeoutSeconds", 1))
        by_name = {p.get("name"): int(p["containerPort"]) for p in container["ports"]}
        if "httpGet" in probe:
            port = probe["httpGet"]["port"]
            number = by_name[port] if isinstance(port, str) else int(port)
            url = f"http://127.0.0.1:{self.ports[number]}{probe['httpGet']['path']}"
            return check_http(url, timeout, host=f"{POD_IP}:{number}")
        if "grpc" in probe:
            return check_grpc(f"127.0.0.1:{self.ports[int(probe['grpc']['port'])]}", timeout=timeout)
        if "exec" in probe:
            done = subprocess.run(
                [self.rewrite(a) for a in probe["exec"]["command"]], timeout=timeout, check=False
            )
            return None if done.returncode == 0 else f"exit {done.returncode}"
        raise AssertionError(f"{container['name']}: unknown probe {probe}")

    def wait_probe(self, container: Obj, kind: str, proc: Proc, budget: float | None = None) -> float:
        """Wait until the probe passes within its budget (period x failure threshold); seconds taken."""
        probe = container[kind]
        if budget is None:
            budget = probe.get("initialDelaySeconds", 0) + probe.get("periodSeconds", 10) * probe.get(
                "failureThreshold", 3
            )
        started = time.monotonic()
        while (problem := self.probe(container, probe)) is not None:
            if proc.returncode is not None:
                raise AssertionError(f"{container['name']} exited {proc.returncode}:\n{proc.output()}")
            if time.monotonic() - started > budget:
                raise AssertionError(
                    f"{container['name']}: {kind} failed for {budget:g} s ({problem}):\n{proc.output()}"
                )
            time.sleep(PROBE_POLL)
        return time.monotonic() - started

    def start(
        self, kind: str, name: str, env: Mapping[str, str] | None = None, key: str | None = None
    ) -> Proc:
        """Start a workload's one container, then wait for its startup, readiness and liveness probes."""
        workload = self.manifests.one(kind, name)
        (container,) = self.manifests.containers(workload)
        argv = self._argv(container)
        environment = {**self._env(container), **(env or {})}
        proc = start_process(argv, ready_url=None, env=environment)
        self.procs[key or name] = proc
        for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
            # after the startup probe, the others answer at once or within one failure window
            self.wait_probe(
                container, probe, proc, None if probe == "startupProbe" else _after_start(container[probe])
            )
        return proc

    def stop_all(self, before: Callable[[str, Proc], None] | None = None) -> None:
        for name, proc in reversed(list(self.procs.items())):
            if before is not None:
                before(name, proc)
            proc.stop()
        self.procs.clear()


def _after_start(probe: Obj) -> float:
    return float(probe.get("periodSeconds", 10) * probe.get("failureThreshold", 3))
