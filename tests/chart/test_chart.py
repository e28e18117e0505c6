"""The Helm chart, rendered by a real helm: lint, every object valid, and what each value turns on or off."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import pytest
import yaml

from tests.policy_cases import DEFAULT_REFUSED, STRICT, STRICT_REFUSED

from .render import CHART, K8S_VERSIONS, NAMESPACE, REPO, Helm, HelmFailed, by_kind, one, validate
from .values_sets import MINIMAL, NON_DEFAULT, VALUE_SETS

CRD_SOURCE = REPO / "crds" / "rltrainingjobs.kuberl.io.yaml"
CRD_COPY = CHART / "files" / "rltrainingjobs.kuberl.io.json"


@pytest.mark.parametrize("values", [{}, NON_DEFAULT], ids=["default", "non-default"])
def test_lint_strict(helm: Helm, values: dict, tmp_path: Path) -> None:
    values_file = tmp_path / "values.yaml"
    values_file.write_text(yaml.safe_dump(values))
    out = helm.run("lint", "--strict", str(CHART), "--namespace", NAMESPACE, "-f", str(values_file))
    assert "0 chart(s) failed" in out


@pytest.mark.parametrize("k8s_version", K8S_VERSIONS)
@pytest.mark.parametrize("name", VALUE_SETS)
def test_every_rendered_object_validates(helm: Helm, name: str, k8s_version: str) -> None:
    objects = helm.render(VALUE_SETS[name], kube_version=k8s_version)
    assert objects, "nothing rendered"
    problems = [p for obj in objects for p in validate(obj, k8s_version)]
    assert not problems, "\n".join(problems)
    names = [(o["kind"], o["metadata"].get("namespace"), o["metadata"]["name"]) for o in objects]
    assert len(names) == len(set(names)), f"duplicate objects: {names}"


def test_default_objects(helm: Helm) -> None:
    kinds = sorted(o["kind"] for o in helm.render())
    assert kinds == sorted(["CustomResourceDefinition", "ServiceAccount", "ClusterRole", "ClusterRoleBinding",
                            "Role", "RoleBinding", "PodDisruptionBudget",  # the leader Lease's; a standby kept
                            "Deployment", "Service", "ConfigMap", *["ValidatingAdmissionPolicy"] * 10,
                            *["ValidatingAdmissionPolicyBinding"] * 10])


def test_minimal_renders_only_the_operator(helm: Helm) -> None:
    objects = helm.render(MINIMAL)
    assert [o["kind"] for o in objects] == ["Deployment"]
    pod = objects[0]["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == "preexisting"
    container = pod["containers"][0]
    assert not any(a.startswith("--metrics-port") for a in container["args"])
    assert [p["name"] for p in container["ports"]] == ["health"]


def operator_container(objects: list[dict]) -> dict:
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


@pytest.mark.parametrize("name", ["default", "non-default"])
def test_deployment_is_hardened(helm: Helm, name: str) -> None:
    deploy = one(helm.render(VALUE_SETS[name]), "Deployment")
    spec = deploy["spec"]
    assert spec["replicas"] == VALUE_SETS[name].get("operator", {}).get("replicas", 2)
    assert spec["strategy"] == {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    spread = spec["template"]["spec"]["topologySpreadConstraints"]
    assert [c["topologyKey"] for c in spread] == ["kubernetes.io/hostname"], "a standby on another node"
    assert "--leader-elect" in spec["template"]["spec"]["containers"][0]["args"], "replicas act only as the leader"
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] > 0
    container = pod["containers"][0]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]
    assert {"cpu", "memory"} <= set(container["resources"]["requests"])
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("livenessProbe", "readinessProbe"):
        http = container[probe]["httpGet"]
        assert http["port"] == "health" and "health" in ports
        assert f"--liveness=http://$(POD_IP):{ports['health']}{http['path']}" in container["args"]
    assert f"--metrics-port={ports['metrics']}" in container["args"]
    assert "--metrics-address=$(POD_IP)" in container["args"]  # the pod's IP only, never 0.0.0.0
    assert {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}} in container["env"]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/tmp" in mounts


def operator_parser() -> argparse.ArgumentParser:
    from kuberl_operator import cli

    parser = argparse.ArgumentParser(prog="kuberl")
    cli.register(parser.add_subparsers(dest="command", required=True))
    return parser


@pytest.mark.parametrize("name", VALUE_SETS)
def test_operator_accepts_the_chart_args(helm: Helm, name: str) -> None:
    """Every flag the Deployment passes exists in `kuberl operator` (operator/kuberl_operator/cli.py)."""
    container = operator_container(helm.render(VALUE_SETS[name]))
    args = operator_parser().parse_args(container["args"])  # exits (SystemExit) on an unknown flag
    assert args.command == "operator"
    values = VALUE_SETS[name]
    assert args.namespace == values.get("watchNamespaces", [])
    assert args.all_namespaces == (not values.get("watchNamespaces"))
    assert args.liveness.startswith("http://$(POD_IP):")
    from kuberl_operator.builders import SCRATCH

    assert args.scratch == {**SCRATCH, **values.get("jobPods", {}).get("scratch", {})}  # the emptyDirs' sizeLimits
    network = {"enabled": True, "metricsNamespaces": ["monitoring"], "metricsCIDRs": [],
               **values.get("networkPolicy", {})}
    assert args.network_policy == network["enabled"]
    assert args.metrics_from == (network["metricsNamespaces"] if network["enabled"] else [])
    assert args.metrics_from_cidr == (network["metricsCIDRs"] if network["enabled"] else [])


def test_default_runtime_image_is_the_operators_default(helm: Helm) -> None:
    from kuberl_operator.builders import DEFAULT_IMAGE

    args = operator_parser().parse_args(operator_container(helm.render())["args"])
    assert args.image == DEFAULT_IMAGE


DIGEST = "sha256:" + "ab" * 32


def test_images_pinned_by_digest_render_repository_at_digest(helm: Helm) -> None:
    values = {"image": {"repository": "reg.example.com/kuberl-operator", "digest": DIGEST},
              "runtimeImage": {"repository": "reg.example.com/kuberl-runtime", "tag": "0.1.0", "digest": DIGEST}}
    container = operator_container(helm.render(values))
    assert container["image"] == f"reg.example.com/kuberl-operator@{DIGEST}"
    args = operator_parser().parse_args(container["args"])
    assert args.image == f"reg.example.com/kuberl-runtime@{DIGEST}"  # the digest wins over a tag
    for bad in ({"image": {"repository": "r", "tag": f"@{DIGEST}"}}, {"image": {"repository": "r", "digest": "abc"}}):
        with pytest.raises(HelmFailed):  # the old `tag: "@sha256:..."` rendered `r:@sha256:...`, which is invalid
            helm.render(bad)


def test_the_job_policy_bounds_config_depth_as_the_spec_model_does(helm: Helm) -> None:
    from kuberl.spec.model import CONFIG_MAX_DEPTH

    policy = next(o for o in helm.render() if o["kind"] == "ValidatingAdmissionPolicy"
                  and o["metadata"]["name"].endswith("-jobs"))
    rule = policy["spec"]["validations"][0]
    assert f"all(c{CONFIG_MAX_DEPTH}, type(c{CONFIG_MAX_DEPTH}) != map" in rule["expression"]
    assert f"c{CONFIG_MAX_DEPTH + 1}" not in rule["expression"]
    assert f"more than {CONFIG_MAX_DEPTH} deep" in rule["message"]


def test_the_job_policy_holds_every_built_in_role(helm: Helm) -> None:
    """Its per-role rules (images, node selection, tolerations) reach every role the spec has, the env role's
    pods of user code included."""
    from kuberl.spec import ROLES

    policy = next(o for o in helm.render() if o["kind"] == "ValidatingAdmissionPolicy"
                  and o["metadata"]["name"].endswith("-jobs"))
    (roles,) = [v["expression"] for v in policy["spec"]["variables"] if v["name"] == "roles"]
    assert re.findall(r"has\(object\.spec\.roles\.(\w+)\)", roles) == list(ROLES)


@pytest.mark.parametrize("values, cases", [({}, DEFAULT_REFUSED), (STRICT, STRICT_REFUSED)],
                         ids=["default", "allow-lists"])
def test_the_operator_checks_the_admission_policys_rules_with_its_words(helm: Helm, values: dict,
                                                                       cases: list) -> None:
    """The operator gets the chart's jobPolicy (--job-policy), and refuses each job the rendered admission policy
    refuses with one of that policy's messages, word for word."""
    from kuberl_operator.job_policy import parse, violations
    from tests.operator.test_job_policy import job

    objects = helm.render(values)
    policy = next(o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"
                  and o["metadata"]["name"].endswith("-jobs"))
    messages = {" ".join(v["message"].split()) for v in policy["spec"]["validations"]}
    args = one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    flag = parse(next(a for a in args if a.startswith("--job-policy=")).removeprefix("--job-policy="))
    for spec, words in cases:
        problems = violations(job(**spec), flag)
        assert problems and set(problems) <= messages and any(words in p for p in problems), (spec, problems)


def test_chart_version_follows_the_project() -> None:
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert chart["appVersion"] == project, "Chart.yaml appVersion must be pyproject's version (image tags follow it)"


# The CRD -----------------------------------------------------------------------------------------

def test_chart_crd_copy_equals_crds_dir() -> None:
    assert json.loads(CRD_COPY.read_text()) == yaml.safe_load(CRD_SOURCE.read_text()), (
        f"{CRD_COPY.relative_to(REPO)} differs from {CRD_SOURCE.relative_to(REPO)}: run `make crds` (or `make chart`)")


class Yaml11Loader(yaml.SafeLoader):
    """Reads booleans as YAML 1.1 does, like the Go YAML readers of kubectl and helm (y/n/yes/no/on/off)."""


Yaml11Loader.add_implicit_resolver(
    "tag:yaml.org,2002:bool",
    __import__("re").compile(r"^(?:y|Y|yes|Yes|YES|n|N|no|No|NO|true|True|TRUE|false|False|FALSE|on|On|ON|off|Off|OFF)$"),
    list("yYnNtTfFoO"))


def test_rendered_crd_reads_the_same_to_yaml_1_1_readers(helm: Helm) -> None:
    """What `helm install` sends is what we generated: no key turns into a boolean on the way."""
    text = helm.run("template", "kuberl", str(CHART), "--show-only", "templates/crd.yaml")
    assert yaml.load(text, Loader=Yaml11Loader)["spec"] == yaml.safe_load(CRD_SOURCE.read_text())["spec"]


def test_crds_dir_reads_the_same_to_yaml_1_1_readers() -> None:
    text = CRD_SOURCE.read_text()
    assert yaml.load(text, Loader=Yaml11Loader) == yaml.safe_load(text)


def test_crd_is_upgraded_kept_and_skippable(helm: Helm) -> None:
    crd = one(helm.render(), "CustomResourceDefinition")
    assert crd["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    source = yaml.safe_load(CRD_SOURCE.read_text())
    # What Helm applies is the generated CRD itself: same spec, same name, after the YAML round trip.
    assert crd["spec"] == source["spec"]
    assert crd["metadata"]["name"] == source["metadata"]["name"]
    # It is a template (upgraded by `helm upgrade`), not in the chart's crds/ folder (installed once, never upgraded).
    assert not (CHART / "crds").exists()

    unkept = one(helm.render({"crds": {"install": True, "keep": False}}), "CustomResourceDefinition")
    assert "helm.sh/resource-policy" not in (unkept["metadata"].get("annotations") or {})
    assert not by_kind(helm.render({"crds": {"install": False, "keep": True}}), "CustomResourceDefinition")


def test_examples_validate_against_the_rendered_crd(helm: Helm) -> None:
    from tests.operator.schemas import CrdSchema

    crd = one(helm.render(), "CustomResourceDefinition")
    version = next(v["name"] for v in crd["spec"]["versions"] if v.get("storage"))
    schema = CrdSchema(crd, version)
    examples = sorted((REPO / "examples").glob("*.yaml"))
    assert examples
    for path in examples:
        for doc in yaml.safe_load_all(path.read_text()):
            if doc and doc.get("kind") == crd["spec"]["names"]["kind"]:
                assert not schema.problems(doc), f"{path.name}: {schema.problems(doc)}"


# RBAC layout (the verbs themselves: test_rbac.py) ------------------------------------------------

def test_watch_namespaces_gives_roles_not_cluster_wide_rights(helm: Helm) -> None:
    objects = helm.render(NON_DEFAULT)
    roles = [r for r in by_kind(objects, "Role") if not r["metadata"]["name"].endswith("-leader")]
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    bindings = [b for b in by_kind(objects, "RoleBinding") if not b["metadata"]["name"].endswith("-leader")]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "kuberl-op", "namespace": NAMESPACE}]
        assert binding["roleRef"]["kind"] == "Role"
    cluster_role = one(objects, "ClusterRole")
    # gang scheduling (on by default) reads the nodes and every pod, to learn what the nodes have free
    assert {r for rule in cluster_role["rules"] for r in rule["resources"]} == {"customresourcedefinitions",
                                                                                "namespaces", "nodes", "pods"}
    assert {v for rule in cluster_role["rules"] for v in rule["verbs"]} == {"list", "watch"}
    assert {v for rule in cluster_role["rules"] if rule["resources"] != ["customresourcedefinitions"]
            and rule["resources"] != ["namespaces"] for v in rule["verbs"]} == {"list"}
    cluster_role = one(helm.render({**NON_DEFAULT, "gangScheduling": {"enabled": False}}), "ClusterRole")
    assert {r for rule in cluster_role["rules"] for r in rule["resources"]} == {"customresourcedefinitions",
                                                                                "namespaces"}


def test_gang_scheduling_adds_pod_patch_and_is_turned_off_with_its_rights(helm: Helm) -> None:
    pods = lambda objects: next(r for r in one(objects, "ClusterRole")["rules"]  # noqa: E731
                                if r["resources"] == ["pods"])["verbs"]
    on = helm.render()
    assert pods(on) == ["list", "watch", "delete", "patch"]
    assert "--no-gang-scheduling" not in operator_container(on)["args"]
    off = helm.render({"gangScheduling": {"enabled": False}})
    assert pods(off) == ["list", "watch", "delete"]
    assert "--no-gang-scheduling" in operator_container(off)["args"]
    assert not [r for r in one(off, "ClusterRole")["rules"] if r["resources"] == ["nodes"]]


def test_service_account_is_the_deployments(helm: Helm) -> None:
    for values in ({}, NON_DEFAULT):
        objects = helm.render(values)
        sa = one(objects, "ServiceAccount")["metadata"]["name"]
        assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == sa
        for binding in by_kind(objects, "ClusterRoleBinding") + by_kind(objects, "RoleBinding"):
            assert binding["subjects"][0]["name"] == sa


# Metrics: Service, ServiceMonitor, PodMonitor ----------------------------------------------------

def test_metrics_service_reaches_the_operator(helm: Helm) -> None:
    for values in ({}, NON_DEFAULT):
        objects = helm.render(values)
        service = one(objects, "Service")
        deploy = one(objects, "Deployment")
        pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
        assert service["spec"]["selector"].items() <= pod_labels.items()
        target = service["spec"]["ports"][0]["targetPort"]
        assert target in {p["name"] for p in operator_container(objects)["ports"]}


def test_monitors_are_off_by_default_and_toggle_independently(helm: Helm) -> None:
    assert not by_kind(helm.render(), "ServiceMonitor") and not by_kind(helm.render(), "PodMonitor")
    only_sm = helm.render({"serviceMonitor": {"enabled": True}})
    assert len(by_kind(only_sm, "ServiceMonitor")) == 1 and not by_kind(only_sm, "PodMonitor")
    only_pm = helm.render({"podMonitor": {"enabled": True}})
    assert len(by_kind(only_pm, "PodMonitor")) == 1 and not by_kind(only_pm, "ServiceMonitor")


@pytest.mark.parametrize("kind,key", [("ServiceMonitor", "serviceMonitor"), ("PodMonitor", "podMonitor")])
def test_monitor_release_label_knob(helm: Helm, kind: str, key: str) -> None:
    default = one(helm.render({key: {"enabled": True}}), kind)
    assert default["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    custom = one(helm.render({key: {"enabled": True, "release": "prom", "labels": {"team": "ml"}}}), kind)
    assert custom["metadata"]["labels"]["release"] == "prom" and custom["metadata"]["labels"]["team"] == "ml"
    none = one(helm.render({key: {"enabled": True, "release": ""}}), kind)
    assert "release" not in none["metadata"]["labels"]


def test_servicemonitor_selects_the_metrics_service(helm: Helm) -> None:
    objects = helm.render({"serviceMonitor": {"enabled": True}})
    monitor, service = one(objects, "ServiceMonitor"), one(objects, "Service")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["namespaceSelector"]["matchNames"] == [service["metadata"]["namespace"]]
    endpoint = monitor["spec"]["endpoints"][0]
    assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
    assert endpoint["honorLabels"] is True  # the operator's series carry `job` (operator/kuberl_operator/metrics.py)


def test_servicemonitor_needs_metrics(helm: Helm) -> None:
    with pytest.raises(HelmFailed, match="serviceMonitor.enabled=true needs metrics.enabled=true"):
        helm.render({"serviceMonitor": {"enabled": True}, "metrics": {"enabled": False, "port": 8080}})


def job_pod_templates() -> list[tuple[str, dict]]:
    """(container name of the training process, pod template) of every pod the operator creates for a job."""
    from kuberl.spec import load_manifest
    from kuberl_operator import builders

    job = load_manifest(REPO / "examples" / "ppo-gpu.yaml")
    opts = builders.BuildOptions(namespace="team-a")
    raw = yaml.safe_load((REPO / "examples" / "ppo-gpu.yaml").read_text())["spec"]
    templates = []
    for obj in builders.all_objects(job, raw, "token", opts):
        if obj["kind"] == "Job":
            templates.append(obj["spec"]["template"])
        elif obj["kind"] == "RayCluster":
            templates.append(obj["spec"]["headGroupSpec"]["template"])
            templates += [g["template"] for g in obj["spec"]["workerGroupSpecs"]]
    return templates


def matches(selector: dict, labels: dict) -> bool:
    ok = all(labels.get(k) == v for k, v in (selector.get("matchLabels") or {}).items())
    for expr in selector.get("matchExpressions") or []:
        present = expr["key"] in labels
        op = expr["operator"]
        ok &= {"Exists": present, "DoesNotExist": not present,
               "In": labels.get(expr["key"]) in expr.get("values", []),
               "NotIn": labels.get(expr["key"]) not in expr.get("values", [])}[op]
    return ok


def test_podmonitor_selects_every_pod_of_a_job(helm: Helm) -> None:
    monitor = one(helm.render({"podMonitor": {"enabled": True}}), "PodMonitor")
    templates = job_pod_templates()
    assert len(templates) >= 3
    for template in templates:
        assert matches(monitor["spec"]["selector"], template["metadata"]["labels"]), template["metadata"]["labels"]
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    assert set(monitor["spec"]["podTargetLabels"]) == {"kuberl.io/job", "kuberl.io/role"}


def test_podmonitor_driver_endpoint_targets_the_driver_container(helm: Helm) -> None:
    """The relabelling keeps exactly the driver's container, the way the operator names it, and sets
    the port a job's spec.trainer.metrics.prometheusPort must use."""
    import re

    monitor = one(helm.render({"podMonitor": {"enabled": True, "driver": {"port": 9400}}}), "PodMonitor")
    driver_ep = monitor["spec"]["podMetricsEndpoints"][0]
    assert driver_ep["honorLabels"] is False  # user code runs in the driver: its own labels never win
    assert {"sourceLabels": ["__meta_kubernetes_pod_label_kuberl_io_job"], "targetLabel": "job",
            "action": "replace"} in driver_ep["relabelings"]  # `job`: the pod's label, which the operator sets
    keeps = {r["sourceLabels"][0]: r["regex"] for r in driver_ep["relabelings"] if r.get("action") == "keep"}
    driver_templates = [t for t in job_pod_templates()
                        if t["metadata"]["labels"].get("app.kubernetes.io/component") == "driver"]
    assert len(driver_templates) == 1
    template = driver_templates[0]
    component = template["metadata"]["labels"]["app.kubernetes.io/component"]
    assert re.fullmatch(keeps["__meta_kubernetes_pod_label_app_kubernetes_io_component"], component)
    containers = [c["name"] for c in template["spec"]["containers"]]
    kept = [c for c in containers if re.fullmatch(keeps["__meta_kubernetes_pod_container_name"], c)]
    assert kept == ["driver"]
    address = next(r for r in driver_ep["relabelings"] if r.get("targetLabel") == "__address__")
    # Prometheus' pod discovery gives "<ip>" (no declared port) or "<ip>:<port>"; both become <ip>:9400.
    for source in ("10.1.2.3", "10.1.2.3:8080"):
        m = re.fullmatch(address["regex"], source)
        assert m and address["replacement"].replace("${1}", m.group(1)) == "10.1.2.3:9400"
    ray = helm.render({"podMonitor": {"enabled": True, "ray": {"enabled": True}}})
    assert [e.get("port") for e in one(ray, "PodMonitor")["spec"]["podMetricsEndpoints"]] == [None, "metrics"]


def test_podmonitor_follows_watched_namespaces(helm: Helm) -> None:
    monitor = one(helm.render({"podMonitor": {"enabled": True}, "watchNamespaces": ["team-a", "team-b"]}), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}
    monitor = one(helm.render(NON_DEFAULT), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}


# The dashboard ConfigMap (its queries: test_dashboard.py) -----------------------------------------

def test_dashboard_configmap(helm: Helm) -> None:
    cm = one(helm.render(), "ConfigMap")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["annotations"]["grafana_folder"] == "kuberl"
    (key, text), = cm["data"].items()
    assert key.endswith(".json")
    assert json.loads(text) == json.loads((CHART / "dashboards" / "kuberl-training.json").read_text())
    moved = one(helm.render(NON_DEFAULT), "ConfigMap")
    assert moved["metadata"]["namespace"] == "monitoring" and "annotations" not in moved["metadata"]
    assert not by_kind(helm.render({"dashboard": {"enabled": False}}), "ConfigMap")


def test_notes(helm: Helm) -> None:
    notes = helm.notes()
    assert "kubectl get rltj" in notes and "kept on `helm uninstall`" in notes
    assert "podMonitor.enabled=true" in notes
    notes = helm.notes({"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}})
    assert "--metrics-port 9500" in notes and "release=kube-prometheus-stack" in notes


def test_driver_serves_metrics_where_the_podmonitor_scrapes() -> None:
    """The operator starts each driver with /metrics on the PodMonitor's port, on all addresses."""
    from kuberl.spec import load_manifest
    from kuberl_operator import builders, names

    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert names.DRIVER_METRICS_PORT == values["podMonitor"]["driver"]["port"]
    job = load_manifest(REPO / "examples" / "ppo-gpu.yaml")
    raw = yaml.safe_load((REPO / "examples" / "ppo-gpu.yaml").read_text())["spec"]
    driver = next(o for o in builders.all_objects(job, raw, "t",
                                                  builders.BuildOptions(namespace="ns")) if o["kind"] == "Job")
    container = driver["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert args[args.index("--metrics-port") + 1] == str(names.DRIVER_METRICS_PORT)
    assert args[args.index("--metrics-address") + 1] == "0.0.0.0"
    assert {"name": "metrics", "containerPort": names.DRIVER_METRICS_PORT} in container["ports"]


def test_the_local_clusters_values_fit_its_node(helm: Helm) -> None:
    """cluster/values-local.yaml (`make install` into `make cluster`): local images, never pulled, and pod sizes
    that leave room on the real node's 2 cores for the quickstart's roles."""
    values = yaml.safe_load((REPO / "cluster" / "values-local.yaml").read_text())
    container = operator_container(helm.render(values))
    args = operator_parser().parse_args(container["args"])
    assert container["imagePullPolicy"] == "Never" and args.image.endswith(":0.1.0-cpu")
    assert args.head_resources == {"cpu": "200m", "memory": "2Gi"} == args.driver_resources


def test_one_operator_rolls_old_pod_first_and_a_pdb_never_blocks_drains(helm: Helm) -> None:
    """One replica: no surge pod (a node with room for one operator is enough), no PDB, no spread; minAvailable
    as high as the replicas is refused at render time."""
    objects = helm.render({"operator": {"replicas": 1}})
    spec = one(objects, "Deployment")["spec"]
    assert spec["strategy"]["rollingUpdate"] == {"maxSurge": 0, "maxUnavailable": 1}
    assert "topologySpreadConstraints" not in spec["template"]["spec"] and not by_kind(objects, "PodDisruptionBudget")
    with pytest.raises(HelmFailed, match="minAvailable must be below operator.replicas"):
        helm.render({"podDisruptionBudget": {"enabled": True, "minAvailable": 2}})
