"""deploy/kubernetes/components/indexer-mtls: the router-indexer link's certificates, from cert-manager.

The component asks cert-manager for a CA of the link's own and, from it, the indexer's server
certificate and the routers' client certificate; each side mounts its Secret and reads it through
TOOLSEARCH_INDEXER_TLS_DIR or TOOLSEARCH_ROUTER_INDEXER_TLS_DIR. These tests read the rendered objects
for that wiring (tests/system/test_kubernetes_processes.py runs the containers with certificates
issued from them), and check that the certificates issued from them verify the way the two sides
verify each other.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID

from tests.support.cert_manager import issue
from tests.support.kubernetes import KUBERNETES, Manifests, Obj, kustomization, render
from toolsearch.config import parse_config

WITH_MTLS = [
    o
    for o in ("scaled", "managed-redis")
    if "../../components/indexer-mtls" in kustomization(o)["components"]
]
HOURS_A_DAY = 24


@pytest.fixture(scope="module", params=WITH_MTLS)
def manifests(request: pytest.FixtureRequest) -> Manifests:
    return render(str(request.param))


def certificate(manifests: Manifests, name: str) -> Obj:
    return dict(manifests.one("Certificate", name)["spec"])


def hours(duration: str) -> int:
    assert duration.endswith("h") and duration[:-1].isdigit(), duration
    return int(duration[:-1])


def test_the_production_overlays_run_the_link_over_mutual_tls_and_the_small_one_needs_no_cert_manager() -> (
    None
):
    assert WITH_MTLS == ["scaled", "managed-redis"]
    small = render("small")
    assert not [o for o in small.objects if o["apiVersion"].startswith("cert-manager.io/")]


def test_each_side_mounts_its_certificates_secret_where_its_variable_points(manifests: Manifests) -> None:
    secrets = {
        "indexer": certificate(manifests, "indexer-tls"),
        "router": certificate(manifests, "router-tls"),
    }
    variables = {"indexer": "TOOLSEARCH_INDEXER_TLS_DIR", "router": "TOOLSEARCH_ROUTER_INDEXER_TLS_DIR"}
    for name, spec in secrets.items():
        workload = manifests.one("Deployment", name)
        pod = manifests.pod(workload)
        (volume,) = [v for v in pod["volumes"] if v.get("secret", {}).get("secretName") == spec["secretName"]]
        assert volume["secret"]["defaultMode"] == 0o440  # the key: the service user's group alone
        assert pod["securityContext"]["fsGroup"] == pod["securityContext"]["runAsGroup"]
        (container,) = manifests.containers(workload)
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == volume["name"]]
        assert mount["readOnly"] is True and "subPath" not in mount  # a subPath never sees a renewal
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert env[variables[name]] == mount["mountPath"]


def test_the_configuration_reads_the_secrets_files_as_the_link_needs_them(manifests: Manifests) -> None:
    text = manifests.config_files("toolsearch-config")["toolsearch.yaml"]
    raw = yaml.safe_load(text)
    raw.pop("catalog_servers")  # its catalog file is the image's; not the subject here
    env = {
        "TOOLSEARCH_INDEXER_TLS_DIR": "/etc/tls/indexer-tls",
        "TOOLSEARCH_ROUTER_INDEXER_TLS_DIR": "/etc/tls/router-tls",
    }
    config = parse_config(raw, Path("/etc/toolsearch/toolsearch.yaml"), env)
    assert config.indexer.tls is not None and config.router.indexer_tls is not None
    assert str(config.indexer.tls.client_ca) == "/etc/tls/indexer-tls/ca.crt"  # the link's CA only
    assert str(config.router.indexer_tls.ca) == "/etc/tls/router-tls/ca.crt"
    # the routers check the name they dial against the indexer's certificate
    dialled = {address.removeprefix("dns:///").rpartition(":")[0] for address in config.router.indexer}
    assert dialled <= set(certificate(manifests, "indexer-tls")["dnsNames"])


def test_the_certificates_come_from_the_links_own_ca_and_are_renewed_in_time(manifests: Manifests) -> None:
    ca = certificate(manifests, "toolsearch-link-ca")
    assert ca["isCA"] is True
    # a renewed root keeps its key, so pods started before and after a renewal trust each other
    assert ca["privateKey"]["rotationPolicy"] == "Never"
    (link,) = [i for i in manifests.of_kind("Issuer") if "ca" in i["spec"]]
    assert link["spec"]["ca"]["secretName"] == ca["secretName"]
    usages = {"indexer-tls": "server auth", "router-tls": "client auth"}
    for name, usage in usages.items():
        spec = certificate(manifests, name)
        assert spec["issuerRef"]["name"] == link["metadata"]["name"]
        assert usage in spec["usages"]
        # renewed 30 days ahead: the window docs/kubernetes.md gives for the rolling restart
        assert hours(spec["renewBefore"]) == 30 * HOURS_A_DAY < hours(spec["duration"])
        assert hours(spec["duration"]) < hours(ca["duration"]) - hours(ca["renewBefore"])
    docs = (KUBERNETES.parents[1] / "docs" / "kubernetes.md").read_text()
    assert "rollout restart deployment/indexer deployment/router" in docs


def test_the_issued_certificates_verify_as_each_side_verifies_the_other(
    manifests: Manifests, tmp_path: Path
) -> None:
    folders = issue(manifests, tmp_path)
    ca = x509.load_pem_x509_certificate((folders["toolsearch-link-ca"] / "tls.crt").read_bytes())
    for secret, usage in (
        ("indexer-tls", ExtendedKeyUsageOID.SERVER_AUTH),
        ("router-tls", ExtendedKeyUsageOID.CLIENT_AUTH),
    ):
        cert = x509.load_pem_x509_certificate((folders[secret] / "tls.crt").read_bytes())
        assert (folders[secret] / "ca.crt").read_bytes() == (
            folders["toolsearch-link-ca"] / "tls.crt"
        ).read_bytes()
        cert.verify_directly_issued_by(ca)
        assert usage in cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
