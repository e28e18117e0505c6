"""A real Kubernetes control plane on 127.0.0.1 for development and tests.

etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (fake nodes and kubelets) and
the KubeRay operator, built from pinned Go modules (``cluster/gomod/``) into a cache outside the
repository, and run as plain processes bound to 127.0.0.1 with their own certificates.

``python -m localkube up|down|build|status`` (run from ``cluster/``; `make cluster` does) or, in
tests, ``Cluster(state_dir).start()``. Standard library only.
"""
