"""Value sets the chart is rendered with: the defaults, everything changed, and everything off."""

NON_DEFAULT = {
    "fullnameOverride": "rl-operator",
    "image": {"repository": "registry.example.com/ml/kuberl-operator", "tag": "0.1.0-rc.1", "pullPolicy": "Always"},
    "imagePullSecrets": [{"name": "regcred"}],
    "runtimeImage": {"repository": "registry.example.com/ml/kuberl-runtime", "tag": "0.1.0-cu130"},
    "crds": {"install": True, "keep": False},
    "watchNamespaces": ["team-a", "team-b"],
    "operatorPolicy": {"enabled": True, "deniedNamespaces": ["billing"]},
    "networkPolicy": {"enabled": True, "metricsNamespaces": ["prometheus", "obs"], "metricsCIDRs": ["192.0.2.0/24"]},
    "jobPolicy": {"enabled": True, "allowedImages": ["registry.example.com/ml/"], "allowedVolumeClaims": ["ckpt"],
                  "forbiddenMountPaths": ["/opt", "/etc"], "allowedPriorityClasses": ["batch"],
                  "allowedRuntimeClasses": ["nvidia"], "allowedDeviceClasses": ["gpu.nvidia.com"],
                  "allowWildcardTolerations": True},
    "serviceAccount": {"create": True, "name": "kuberl-op",
                       "annotations": {"eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/kuberl"}},
    "operator": {"verbose": True, "extraArgs": [], "extraEnv": [{"name": "TZ", "value": "UTC"}]},
    "metrics": {"enabled": True, "port": 9090},
    "health": {"port": 9091, "path": "/livez"},
    "livenessProbe": {"initialDelaySeconds": 20, "periodSeconds": 30, "timeoutSeconds": 3, "failureThreshold": 5},
    "resources": {"requests": {"cpu": "250m", "memory": "384Mi"}, "limits": {"cpu": 1, "memory": "1Gi"}},
    "podAnnotations": {"example.com/team": "ml-infra"},
    "podLabels": {"team": "ml-infra"},
    "nodeSelector": {"kubernetes.io/os": "linux"},
    "tolerations": [{"key": "dedicated", "operator": "Equal", "value": "system", "effect": "NoSchedule"}],
    "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
        {"matchExpressions": [{"key": "node-role.kubernetes.io/control-plane", "operator": "DoesNotExist"}]}]}}},
    "priorityClassName": "system-cluster-critical",
    "service": {"type": "ClusterIP", "port": 9090, "annotations": {"example.com/scrape": "yes"}},
    "serviceMonitor": {"enabled": True, "release": "prom", "labels": {"team": "ml-infra"},
                       "interval": "15s", "scrapeTimeout": "5s"},
    "podMonitor": {"enabled": True, "release": "prom", "labels": {"team": "ml-infra"}, "interval": "10s",
                   "scrapeTimeout": "5s", "namespaces": ["team-a"], "driver": {"port": 9400},
                   "ray": {"enabled": False}},
    "prometheusRule": {"enabled": True, "release": "prom", "labels": {"team": "ml-infra"},
                       "additionalAlertLabels": {"team": "ml-infra"}, "disabled": ["KuberlTrainThroughputDropped"]},
    "dashboard": {"enabled": True, "label": "grafana_dashboard", "labelValue": "1", "namespace": "monitoring",
                  "folder": "", "labels": {"team": "ml-infra"}},
}

MINIMAL = {
    "crds": {"install": False, "keep": True},
    "rbac": {"create": False},
    "operatorPolicy": {"enabled": False, "deniedNamespaces": []},
    "networkPolicy": {"enabled": False, "metricsNamespaces": [], "metricsCIDRs": []},
    "jobPolicy": {"enabled": False},
    "serviceAccount": {"create": False, "name": "preexisting"},
    "metrics": {"enabled": False, "port": 8080},
    "dashboard": {"enabled": False},
}

VALUE_SETS = {"default": {}, "non-default": NON_DEFAULT, "minimal": MINIMAL}
