"""The local control plane's own pieces, without starting it: pins, cache keys, certificates, kubeconfigs."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
from localkube import pins, pki


def test_pins_are_read_from_the_build_modules() -> None:
    v = pins.versions()
    assert v["kubernetes"].startswith("v1.") and v["etcd"].startswith("v3.6.")
    assert {b.name for b in pins.BINARIES} == {
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
        "kubectl",
        "kwok",
        "ray-operator",
        "kubelet",
        "kube-proxy",
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "bridge",
        "loopback",
        "host-local",
        "coredns",
        "buildkitd",
        "buildctl",
    }
    for b in pins.BINARIES:
        assert (pins.GOMOD / b.module / "go.sum").is_file(), b


def test_the_cache_key_names_the_versions_and_changes_with_the_toolchain() -> None:
    key = pins.cache_key("go1.26.8")
    v = pins.versions()
    assert all(version in key for version in v.values())
    assert key != pins.cache_key("go1.27.0") and key == pins.cache_key("go1.26.8")


def test_kubernetes_binaries_carry_their_release_version() -> None:
    flags = pins.ldflags(next(b for b in pins.BINARIES if b.name == "kube-apiserver"))
    assert f"k8s.io/component-base/version.gitVersion={pins.versions()['kubernetes']}" in flags


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_certificates_and_kubeconfig(tmp_path: Path) -> None:
    path = pki.ensure(tmp_path / "pki")
    text = subprocess.run(
        ["openssl", "x509", "-in", str(path / "apiserver.crt"), "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "IP Address:127.0.0.1" in text and "DNS:kubernetes.default.svc" in text
    admin = subprocess.run(
        ["openssl", "x509", "-in", str(path / "admin.crt"), "-noout", "-subject"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "O = system:masters" in admin
    subprocess.run(
        ["openssl", "verify", "-CAfile", str(path / "ca.crt"), str(path / "admin.crt")], check=True, capture_output=True
    )
    config = json.loads(pki.kubeconfig("https://127.0.0.1:6443", path, token="t", namespace="ns"))
    assert config["users"][0]["user"] == {"token": "t"} and config["contexts"][0]["context"]["namespace"] == "ns"


@pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")
def test_a_component_that_does_not_start_is_named_with_its_log_and_a_fix(tmp_path: Path) -> None:
    from localkube.stack import Cluster, StartError

    (tmp_path / "cache" / "bin").mkdir(parents=True)
    (tmp_path / "cache" / "crds").mkdir()
    etcd = tmp_path / "cache" / "bin" / "etcd"
    etcd.write_text("#!/bin/sh\necho 'member dir: version mismatch'\nexit 1\n")
    etcd.chmod(0o755)
    with pytest.raises(StartError) as failed:
        Cluster(tmp_path / "state", tmp_path / "cache", tie_to_parent=True, log=lambda line: None).start()
    text = str(failed.value)
    assert text.startswith("etcd exited") and "version mismatch" in text and "fix:" in text
    assert not (tmp_path / "state" / "procs.json").exists()  # nothing left running or recorded
