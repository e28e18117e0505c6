"""Certificates for a local control plane (openssl; EC P-256 keys, made once per state folder).

A CA; a serving certificate for 127.0.0.1 (and the in-cluster names and addresses of the
`kubernetes` Service, and the real node's way in); client certificates for the admin (group
system:masters), the controller-manager, the scheduler, and the real node's kubelet, kube-proxy and
CoreDNS (their built-in RBAC identities); the kubelet's serving certificate; and the service-account
signing key pair.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
from pathlib import Path

# The real node (node.py): its side of the link and the `kubernetes` Service's cluster IP.
NODE_LINK_HOST, NODE_LINK_NODE, KUBERNETES_SERVICE_IP = "10.89.0.1", "10.89.0.2", "10.96.0.1"
SERVER_SANS = [
    "IP:127.0.0.1",
    f"IP:{NODE_LINK_HOST}",
    f"IP:{KUBERNETES_SERVICE_IP}",
    "DNS:localhost",
    "DNS:kubernetes",
    "DNS:kubernetes.default",
    "DNS:kubernetes.default.svc",
    "DNS:kubernetes.default.svc.cluster.local",
]
CLIENTS = {  # file stem -> subject
    "admin": "/O=system:masters/CN=kuberl-admin",
    "controller-manager": "/CN=system:kube-controller-manager",
    "scheduler": "/CN=system:kube-scheduler",
    "kube-proxy": "/CN=system:kube-proxy",  # bound to system:node-proxier by default
    "coredns": "/CN=kuberl:coredns",  # bound by node.py to a ClusterRole that reads Services and endpoints
    "fake-gpu": "/CN=kuberl:fake-gpu",  # the node's DRA driver: bound by node.py to ResourceSlices and claims
}
NODE_NAME = "node-0"  # the real node: its kubelet is system:node:<name> in system:nodes (the Node authorizer)
EC = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"]


def openssl(*args: str, cwd: Path) -> None:
    proc = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {proc.stderr.strip()[-400:]}")


def leaf(pki: Path, stem: str, subject: str, usage: str, sans: list[str] | None = None) -> None:
    ext = pki / f"{stem}.ext"
    lines = [
        "basicConstraints=CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={usage}",
    ]
    if sans:
        lines.append("subjectAltName=" + ",".join(sans))
    ext.write_text("\n".join(lines) + "\n")
    openssl("req", "-new", "-nodes", *EC, "-keyout", f"{stem}.key", "-out", f"{stem}.csr", "-subj", subject, cwd=pki)
    openssl(
        "x509",
        "-req",
        "-in",
        f"{stem}.csr",
        "-CA",
        "ca.crt",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "825",
        "-out",
        f"{stem}.crt",
        "-extfile",
        ext.name,
        cwd=pki,
    )
    (pki / f"{stem}.csr").unlink()
    ext.unlink()


def ensure(pki: Path) -> Path:
    """Make every certificate and key under ``pki`` unless it is there already (a client added since, alone)."""
    if (pki / "done").exists():
        for stem, subject in CLIENTS.items():
            if not (pki / f"{stem}.crt").exists():
                leaf(pki, stem, subject, "clientAuth")
        return pki
    if shutil.which("openssl") is None:
        raise RuntimeError("openssl is not on PATH (apt-get install openssl): it makes the cluster's certificates")
    pki.mkdir(parents=True, exist_ok=True)
    pki.chmod(0o700)
    openssl(
        "req",
        "-x509",
        "-new",
        "-nodes",
        *EC,
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "3650",
        "-subj",
        "/CN=kuberl-local-ca",
        "-addext",
        "keyUsage=critical,keyCertSign,cRLSign",
        cwd=pki,
    )
    leaf(pki, "apiserver", "/CN=kube-apiserver", "serverAuth", SERVER_SANS)
    for stem, subject in CLIENTS.items():
        leaf(pki, stem, subject, "clientAuth")
    leaf(pki, "kubelet", f"/O=system:nodes/CN=system:node:{NODE_NAME}", "clientAuth")
    leaf(pki, "kubelet-serving", f"/CN={NODE_NAME}", "serverAuth", [f"IP:{NODE_LINK_NODE}", f"DNS:{NODE_NAME}"])
    openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "sa.key", cwd=pki)
    openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=pki)
    (pki / "done").write_text("")
    return pki


def b64(path: Path) -> str:
    return base64.b64encode(path.read_bytes()).decode()


def kubeconfig(
    server: str, pki: Path, client: str | None = None, token: str | None = None, namespace: str | None = None
) -> str:
    """A kubeconfig (JSON, which is YAML) with the CA embedded, for a client certificate or a token."""
    user = (
        {"token": token}
        if token
        else {"client-certificate-data": b64(pki / f"{client}.crt"), "client-key-data": b64(pki / f"{client}.key")}
    )
    context = {"cluster": "kuberl-local", "user": "user", **({"namespace": namespace} if namespace else {})}
    return (
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "current-context": "kuberl-local",
                "clusters": [
                    {
                        "name": "kuberl-local",
                        "cluster": {"server": server, "certificate-authority-data": b64(pki / "ca.crt")},
                    }
                ],
                "users": [{"name": "user", "user": user}],
                "contexts": [{"name": "kuberl-local", "context": context}],
            },
            indent=1,
        )
        + "\n"
    )
