"""NetworkPolicy enforcement on the real node: SIG Network's kube-network-policies (cluster/gomod/netpol, built like
the rest) and what it needs.

The bridge CNI enforces no NetworkPolicy, so without this a job's policy would be an object and nothing more. The
controller runs beside the kubelet, in the node's network namespace, as the ServiceAccount
``kube-system/kube-network-policies`` (list and watch pods, namespaces and NetworkPolicies, as its own install
manifest grants). It keeps an nftables table (``inet kube-network-policies``) that sends the first packet of every
new connection to or from a pod some policy selects to an NFQUEUE, where it reads the policies and accepts or drops
it; packets of established connections pass in the kernel. What the node itself sends as root (the kubelet's
probes) passes too, as on a real cluster.

It needs the kernel's nftables queue expression (CONFIG_NFT_QUEUE); where the kernel has none, as on the
Firecracker VMs this project's CI runs on, nothing enforces the policies: `kernel_problem` says so, the node starts
without it, and docs/security.md says what that leaves untested.

It reads its API credentials only from the in-cluster paths (``/var/run/secrets/kubernetes.io/serviceaccount``), so
it runs in a mount namespace of its own with a tmpfs on /run holding the account's token and the cluster's CA,
and with ``KUBERNETES_SERVICE_HOST``/``_PORT`` naming the API server's relay on the node's link.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from . import api as kapi

NAME = "kube-network-policies"
NAMESPACE = "kube-system"
TABLE = ("inet", NAME)  # the nftables table it keeps in the node's namespace once its caches are in sync
QUEUE = 100
TOKEN_SECONDS = 30 * 24 * 3600  # a cluster outlives a test session: `make cluster` may run for days
SECRETS = "/run/secrets/kubernetes.io/serviceaccount"  # /var/run is /run: where client-go's in-cluster config reads

# Runs in a new mount namespace (unshare -m, private), before exec: the in-cluster files, then the controller.
MOUNT_CREDENTIALS = (
    f'mount -t tmpfs -o size=1m,mode=0755 tmpfs /run && mkdir -p {SECRETS} && '
    f'cp "$KUBERL_NETPOL_CREDENTIALS/token" "$KUBERL_NETPOL_CREDENTIALS/ca.crt" {SECRETS}/ && exec "$@"'
)


# What the controller's table needs of the kernel, checked (nft -c: nothing is applied) in the node's namespace.
QUEUE_CHECK = ("table inet kuberl_queue_check {\n"
               " chain c { type filter hook postrouting priority 95; queue num 1; }\n}\n")
UNENFORCED = ("NetworkPolicy is not enforced on this node: the kernel has no nftables queue (CONFIG_NFT_QUEUE), "
              "which kube-network-policies needs")


def objects() -> list[tuple[str, dict[str, Any]]]:
    """(resource, object) pairs: its ServiceAccount and the cluster-wide reads it needs."""
    account = {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": NAME, "namespace": NAMESPACE}}
    role = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": NAME},
            "rules": [{"apiGroups": [""], "resources": ["pods", "namespaces"], "verbs": ["list", "watch"]},
                      {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"],
                       "verbs": ["list", "watch"]}]}
    binding = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": NAME},
               "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": NAME},
               "subjects": [{"kind": "ServiceAccount", "name": NAME, "namespace": NAMESPACE}]}
    return [(kapi.SERVICEACCOUNTS, account), (kapi.CLUSTERROLES, role), (kapi.CLUSTERROLEBINDINGS, binding)]


def credentials(admin: kapi.Api, ca: Path, folder: Path) -> Path:
    """Its ServiceAccount and rights applied, and a token of it with the cluster's CA written into `folder`."""
    for resource, obj in objects():
        admin.apply(resource, obj["metadata"]["name"], json.dumps(obj),
                    namespace=obj["metadata"].get("namespace"))
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = folder / "token"
    token.write_text(admin.token(NAMESPACE, NAME, TOKEN_SECONDS))
    token.chmod(0o600)
    (folder / "ca.crt").write_bytes(ca.read_bytes())
    return folder


PREFIX = ("unshare", "-m", "--propagation", "private", "--", "sh", "-c", MOUNT_CREDENTIALS, NAME)  # execs argv


def env(host: str, port: int, credentials_dir: Path) -> dict[str, str]:
    """The in-cluster config's address of the API server, and where MOUNT_CREDENTIALS finds the files."""
    return {"KUBERNETES_SERVICE_HOST": host, "KUBERNETES_SERVICE_PORT": str(port),
            "KUBERL_NETPOL_CREDENTIALS": str(credentials_dir)}


def argv(binary: str, node: str) -> list[str]:
    """Enforcement for `node`'s pods; fails closed (no bypass of the queue while it is down); metrics on loopback."""
    return [binary, f"--hostname-override={node}", f"--nfqueue-id={QUEUE}", "--disable-nri",
            "--metrics-bind-address=127.0.0.1:9080", "--fail-open=false"]
