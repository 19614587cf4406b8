"""The Certificates of rendered manifests issued here as cert-manager issues them in a cluster.

    folders = issue(render("scaled"), tmp_path)   # Secret name -> a folder with tls.crt, tls.key, ca.crt

cert-manager reads each Certificate, asks its Issuer (a `selfSigned` one, or a `ca` one that signs
with the key pair in a Secret) and writes a `kubernetes.io/tls` Secret: `tls.crt`, `tls.key` and
`ca.crt` (the issuing CA; a self-signed certificate's own). This does the same from the spec's
fields (commonName, dnsNames, isCA, usages, duration, privateKey), so the containers run with the
certificates the manifests ask for. One thing is added: every certificate that names DNS names also
names 127.0.0.1, the address the local cluster's DNS answers for every Service (tests/support/pods.py).
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests.support.kubernetes import Manifests

PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey
CURVES = {256: ec.SECP256R1(), 384: ec.SECP384R1(), 521: ec.SECP521R1()}
DEFAULT_DURATION = datetime.timedelta(days=90)  # cert-manager's when a Certificate names none
EXTENDED = {"server auth": ExtendedKeyUsageOID.SERVER_AUTH, "client auth": ExtendedKeyUsageOID.CLIENT_AUTH}
KEY_USAGES = {
    "digital signature": "digital_signature",
    "key encipherment": "key_encipherment",
    "cert sign": "key_cert_sign",
}


def _duration(text: str | None) -> datetime.timedelta:
    """A Go duration as cert-manager takes it (`2160h`, `90m`, `1h30m`)."""
    if not text:
        return DEFAULT_DURATION
    units = {"h": 3600, "m": 60, "s": 1}
    parts = re.findall(r"(\d+)([hms])", text)
    assert parts and "".join(n + u for n, u in parts) == text, f"unsupported duration {text!r}"
    return datetime.timedelta(seconds=sum(int(n) * units[u] for n, u in parts))


def _key(spec: dict[str, Any]) -> PrivateKey:
    private = spec.get("privateKey", {})
    if private.get("algorithm", "RSA") == "ECDSA":
        return ec.generate_private_key(CURVES[int(private.get("size", 256))])
    return rsa.generate_private_key(public_exponent=65537, key_size=int(private.get("size", 2048)))


def _certificate(
    spec: dict[str, Any], key: PrivateKey, signer: tuple[x509.Certificate, PrivateKey] | None
) -> x509.Certificate:
    now = datetime.datetime.now(datetime.UTC)
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, spec.get("commonName", ""))])
    issuer_name, signing_key = (signer[0].subject, signer[1]) if signer else (subject, key)
    is_ca = bool(spec.get("isCA"))
    usages = set(spec.get("usages", ["digital signature", "key encipherment"]))
    flags = dict.fromkeys(
        (*KEY_USAGES.values(), "content_commitment", "data_encipherment", "key_agreement"), False
    )
    flags |= {KEY_USAGES[u]: True for u in usages if u in KEY_USAGES}
    flags["key_cert_sign"] = flags["key_cert_sign"] or is_ca
    flags |= {"crl_sign": is_ca, "encipher_only": False, "decipher_only": False}
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + _duration(spec.get("duration")))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(x509.KeyUsage(**flags), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if extended := [EXTENDED[u] for u in usages if u in EXTENDED]:
        builder = builder.add_extension(x509.ExtendedKeyUsage(extended), critical=False)
    names: list[x509.GeneralName] = [x509.DNSName(name) for name in spec.get("dnsNames", [])]
    if names:
        names.append(x509.IPAddress(ipaddress.ip_address("127.0.0.1")))  # the local DNS's answer
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(signing_key, hashes.SHA256())


def _pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def issue(manifests: Manifests, folder: Path) -> dict[str, Path]:
    """Issue every Certificate of `manifests` through its Issuer; Secret name -> its folder."""
    issuers = {i["metadata"]["name"]: i["spec"] for i in manifests.of_kind("Issuer")}
    pending = {c["metadata"]["name"]: c["spec"] for c in manifests.of_kind("Certificate")}
    issued: dict[str, tuple[x509.Certificate, PrivateKey, x509.Certificate]] = {}  # by Secret name
    while pending:
        ready = []
        for name, spec in pending.items():
            ref = spec["issuerRef"]
            assert ref.get("kind", "Issuer") == "Issuer" and ref["name"] in issuers, f"{name}: no {ref}"
            issuer = issuers[ref["name"]]
            key = _key(spec)
            if "selfSigned" in issuer:
                cert = _certificate(spec, key, None)
                issued[spec["secretName"]] = (cert, key, cert)
            elif issuer["ca"]["secretName"] in issued:
                ca_cert, ca_key, _ = issued[issuer["ca"]["secretName"]]
                issued[spec["secretName"]] = (_certificate(spec, key, (ca_cert, ca_key)), key, ca_cert)
            else:
                continue  # its CA is not issued yet
            ready.append(name)
        assert ready, f"Certificates whose Issuer can never sign: {sorted(pending)}"
        for name in ready:
            del pending[name]
    folders = {}
    for secret, (cert, key, ca) in issued.items():
        target = folder / secret
        target.mkdir(parents=True, exist_ok=True)
        (target / "tls.crt").write_bytes(_pem(cert))
        (target / "ca.crt").write_bytes(_pem(ca))
        (target / "tls.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        folders[secret] = target
    return folders
