"""kuberl's Kubernetes operator: RLTrainingJob -> a KubeRay cluster with one worker group per role.

Modules: ``builders`` (spec -> manifests), ``health`` (pods -> role health), ``progress`` (driver
reports), ``status`` (observations -> status and actions), ``reconcile`` (API calls), ``handlers``
(kopf), ``metrics``, ``kube`` (a small API client), ``cli`` (`kuberl operator`, `kuberl render`).
"""
