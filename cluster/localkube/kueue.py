"""Kueue in the local stack, started on demand (`Cluster.start_kueue`; `make cluster KUEUE=1`): its CRDs, its manager
as a process on 127.0.0.1, and the admission webhooks of its own kinds and of RayClusters (the one job framework it
manages here), served with a certificate of the cluster's CA and reached by URL, since no Service routes to a
process on the host.

The build copies the CRDs and the webhook manifests from the pinned module (`config_dir`); nothing is downloaded at
run time.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml

from . import api as kapi
from . import pki

FRAMEWORKS = ("ray.io/raycluster",)  # RLTrainingJobs reach Kueue as their RayCluster: one workload
# the webhooks registered: Kueue's own kinds and the frameworks above (a webhook of a kind whose controller is off
# would refuse every object of that kind while it answers nothing)
WEBHOOK_PATHS = ("-kueue-x-k8s-io-", "-ray-io-v1-raycluster")
NAMESPACE = "kueue-system"
GROUP = "kueue.x-k8s.io"  # its CRDs' API group


def configuration(webhook_port: int, probe_port: int, cert_dir: Path,
                  pods_ready: tuple[str, str] | None = None) -> dict[str, Any]:
    """Kueue's Configuration: every endpoint on 127.0.0.1, our certificate, no leader election (one process), no
    metrics endpoint, RayClusters managed when they carry a queue name. ``pods_ready``: waitForPodsReady's
    (timeout, recoveryTimeout), e.g. ("5m", "2m"); None leaves it off."""
    extra = {"waitForPodsReady": {"timeout": pods_ready[0], "recoveryTimeout": pods_ready[1],
                                  "blockAdmission": False}} if pods_ready else {}
    return {
        **extra,
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{probe_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": list(FRAMEWORKS)},
    }


def webhooks(manifest: str, port: int, ca_bundle: str) -> list[dict[str, Any]]:
    """Kueue's webhook configurations, kept to `WEBHOOK_PATHS`, each webhook called at https://127.0.0.1:port."""
    out = []
    for doc in yaml.safe_load_all(manifest):
        if not doc:
            continue
        conf = copy.deepcopy(doc)
        kept = []
        for hook in conf.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if any(p in path for p in WEBHOOK_PATHS):
                hook["clientConfig"] = {"url": f"https://127.0.0.1:{port}{path}", "caBundle": ca_bundle}
                kept.append(hook)
        conf["webhooks"] = kept
        conf["metadata"] = {"name": f"kueue-{conf['metadata']['name']}"}
        out.append(conf)
    return out


def serving_cert(pki_dir: Path, cert_dir: Path) -> None:
    """tls.crt and tls.key for 127.0.0.1, signed by the cluster's CA, where controller-runtime looks for them."""
    if not (pki_dir / "kueue-webhook.crt").exists():
        pki.leaf(pki_dir, "kueue-webhook", "/CN=kueue-webhook", "serverAuth", ["IP:127.0.0.1"])
    cert_dir.mkdir(parents=True, exist_ok=True)
    (cert_dir / "tls.crt").write_bytes((pki_dir / "kueue-webhook.crt").read_bytes())
    key = cert_dir / "tls.key"
    key.write_bytes((pki_dir / "kueue-webhook.key").read_bytes())
    key.chmod(0o600)


def etc_overlay(scratch: Path, cert_dir: Path) -> tuple[str, ...]:
    """The prefix that runs Kueue in a mount namespace of its own, where /etc is an overlay holding
    /etc/kueue/metrics/certs (our certificate): with its own certificate management off, Kueue reads its metrics
    certificate from that fixed path even when the metrics endpoint is off. The host's /etc is not touched."""
    upper, work = scratch / "upper", scratch / "work"
    upper.mkdir(parents=True, exist_ok=True)
    work.mkdir(parents=True, exist_ok=True)
    script = (f"mount -t overlay overlay -o lowerdir=/etc,upperdir={upper},workdir={work} /etc && "
              f"mkdir -p /etc/kueue/metrics && ln -sfn {cert_dir} /etc/kueue/metrics/certs && exec \"$@\"")
    return ("unshare", "--mount", "--propagation", "private", "--", "sh", "-c", script, "kueue")


def install_crds(admin: kapi.Api, crds: Path) -> list[str]:
    """Apply Kueue's CRDs; their names."""
    names = []
    for path in sorted(crds.glob("*.yaml")):
        doc = yaml.safe_load(path.read_text())
        admin.apply(kapi.CRDS, doc["metadata"]["name"], path.read_text(), namespace=None)
        names.append(doc["metadata"]["name"])
    return names


def clear_finalizers(admin: kapi.Api, crd: dict[str, Any]) -> None:
    """Remove the finalizers of every object of a CRD being deleted (its controller may be gone)."""
    version = next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))
    resource = f"{crd['spec']['group']}/{version}/{crd['spec']['names']['plural']}"
    namespaced = crd["spec"]["scope"] == "Namespaced"
    for obj in admin.list(resource, namespace=None):
        ns = obj["metadata"].get("namespace") if namespaced else None
        admin.patch(resource, obj["metadata"]["name"], {"metadata": {"finalizers": None}}, namespace=ns)
