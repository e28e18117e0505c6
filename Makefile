# kuberl — `make help` lists the targets.
PY      ?= python3
VENV    ?= .venv
BIN     := $(VENV)/bin
OUT     ?= runs/quickstart
PYTEST_ARGS ?=

.DEFAULT_GOAL := help
.PHONY: help venv install demo demo-grpo demo-fault test test-all lint crds chart images e2e bench clean

help: ## list the targets
	@grep -hE '^[a-z][a-zA-Z_-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  make %-12s %s\n", $$1, $$2}'

$(BIN)/kuberl: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q 'torch==2.13.0' -e '.[dev]'
	@touch $@

venv: $(BIN)/kuberl ## create .venv with the runtime, operator and dev extras (torch 2.13.0 CPU)

install: venv ## install the CRD into the current kube context and the operator with Helm
	kubectl apply -f crds/
	helm upgrade --install kuberl charts/kuberl --namespace kuberl-system --create-namespace

demo: venv ## CPU quickstart: PPO on a tiny model, reward curve in $(OUT)
	$(BIN)/kuberl run examples/quickstart.yaml --out $(OUT)

demo-grpo: venv ## the same task with GRPO (group sampling, no critic)
	$(BIN)/kuberl run examples/grpo.yaml --out runs/grpo

demo-fault: venv ## quickstart with the critic killed at step 3: only the critic restarts
	$(BIN)/kuberl run examples/quickstart.yaml --out runs/fault --steps 12 --fault critic:3

test: venv ## the test suite (runs inside a loopback-only network namespace)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

test-all: venv ## the test suite including slow tests
	$(BIN)/python -m pytest -q -m 'not e2e' $(PYTEST_ARGS)

lint: venv ## helm lint + compile check
	$(BIN)/python -m compileall -q runtime operator bench tests
	$(BIN)/python -m pytest -q tests/chart -k lint

crds: venv ## regenerate crds/ from the spec model
	$(BIN)/kuberl crd -o crds/rltrainingjobs.kuberl.io.yaml

chart: venv ## render the Helm chart with default values
	$(BIN)/python -m tests.chart.helm template charts/kuberl

images: ## build the operator and runtime images (needs a Docker engine)
	docker build -f images/operator/Dockerfile -t kuberl-operator:dev .
	docker build -f images/runtime/Dockerfile -t kuberl-runtime:dev .

e2e: venv ## end-to-end scenarios on a kind cluster with KubeRay (needs Docker + kind)
	$(BIN)/python -m pytest -q -m e2e tests/e2e

bench: venv ## CPU benchmark of one PPO step through the real code path
	$(BIN)/python bench/ppo_step.py --model tiny --device cpu

clean: ## remove the virtualenv and run outputs
	rm -rf $(VENV) runs
