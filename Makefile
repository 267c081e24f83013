# gpu-scheduler — build, test and demo. `make demo` and `make test` are the quick start.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Reinstall when the project's dependencies change.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

# The control plane of each supported Kubernetes minor (1.34 ... 1.37), built from that
# release's Go modules by tools/k8s/build.sh into .cache/k8s/<version>-<hash>/ and
# cached there. The newest is the lab's default; `make test` also runs a smoke e2e on
# the oldest; `make e2e K8S_MINOR=1.35` runs the whole e2e suite on any of them.
K8S_BUILD := tools/k8s/build.sh
K8S_MINORS := $(shell $(K8S_BUILD) --minors)
K8S_OLDEST := $(firstword $(K8S_MINORS))
K8S_MINOR ?= $(lastword $(K8S_MINORS))
export GPU_SCHEDULER_K8S_BIN := $(shell $(K8S_BUILD) --path)
HAVE_GO := $(shell command -v go 2>/dev/null)
# actionlint and helm-docs, for `make lint`: tools/k8s/linters is their Go module (a `tool`
# directive each), built by tools/k8s/build.sh into .cache/k8s/linters-<hash>/.
LINTERS := $(shell $(K8S_BUILD) --path linters)
# What `make image` needs; without it the real-node e2e tests say so and skip (CI: fail).
HAVE_IMAGE_TOOLS := $(shell command -v buildah >/dev/null && command -v debootstrap >/dev/null \
  && command -v gcc >/dev/null && [ "$$(id -u)" = 0 ] && echo yes)

.PHONY: test lint linters docs unit install controlplane controlplanes plugins kueue prometheus registry e2e image demo bench bench-scale clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,bench]'
	@rm -f $(VENV)/.installed-* && touch $@

# The Kubernetes binary (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet, kubectl; helm in the newest minor's) of one minor; skipped when built.
controlplane:
	$(K8S_BUILD) $(K8S_MINOR)

controlplane-%:
	$(K8S_BUILD) $*

# kube-scheduler with gpu-scheduler's framework plugins (plugins/cmd/kube-scheduler),
# built from one minor's module into .cache/k8s/<version>-plugins-<hash>/; the e2e
# tests of the plugins path run it on the newest and the oldest minor.
plugins:
	$(K8S_BUILD) plugins $(K8S_MINOR)

plugins-%:
	$(K8S_BUILD) plugins $*

# Kueue (sigs.k8s.io/kueue/cmd/kueue and its config/), for the gang and topology e2e
# tests: tools/k8s/kueue is its own Go module; built into .cache/k8s/kueue-<version>-<hash>/.
kueue:
	$(K8S_BUILD) kueue

# Every supported minor (the version matrix).
controlplanes: $(addprefix controlplane-,$(K8S_MINORS))

# The whole e2e suite on one minor: make e2e K8S_MINOR=1.34 (helm from the newest; the
# oldest for the version tests, which run against every minor under test).
e2e: $(STAMP) controlplane-$(K8S_MINOR) controlplane-$(lastword $(K8S_MINORS)) \
    controlplane-$(K8S_OLDEST) plugins-$(K8S_MINOR) plugins-$(lastword $(K8S_MINORS)) \
    plugins-$(K8S_OLDEST) kueue registry $(if $(HAVE_IMAGE_TOOLS),image)
	GPU_SCHEDULER_K8S_BIN=$$($(K8S_BUILD) --path $(K8S_MINOR)) $(BIN)/pytest tests/e2e

# The project image from the Dockerfile (buildah, no daemon) on a Debian base made with
# debootstrap, and the pause image; cached under .cache/images/ by their inputs.
image:
	tools/image/build.sh

linters:
	$(K8S_BUILD) linters

# promtool and promql-names (Prometheus' PromQL parser), for tests/unit/test_monitoring.py:
# tools/k8s/prometheus is their Go module, built into .cache/k8s/prometheus-<version>-<hash>/.
prometheus:
	$(K8S_BUILD) prometheus

# The CNCF distribution registry (github.com/distribution/distribution/v3/cmd/registry),
# for the real-node e2e that releases this checkout to it and installs the README's way:
# tools/k8s/registry is its Go module, built into .cache/k8s/registry-<version>-<hash>/.
registry:
	$(K8S_BUILD) registry

# ruff; the house's size rule (tools/sizes.py: product files <= 450 lines, functions
# <= 80); actionlint on .github/workflows/ (and shellcheck on their run: scripts where
# shellcheck is installed); and the chart's values table in docs/configuration.md and
# the chart's README.md equal to what helm-docs makes of charts/gpu-scheduler/values.yaml
# (`make docs` rewrites both).
# The last two need Go to build them: without it they are skipped here, failed in CI.
lint: $(STAMP) $(if $(HAVE_GO),linters)
	$(BIN)/ruff check .
	$(BIN)/python tools/sizes.py
ifdef HAVE_GO
	$(LINTERS)/actionlint
	HELM_DOCS=$(LINTERS)/helm-docs tools/helm_docs.sh --check
else
	@echo "no Go: actionlint and the chart's values table not checked"; [ "$$CI" != true ]
endif

# The chart's values table in docs/configuration.md and the chart's README.md, from
# values.yaml's `# --` comments.
docs: linters
	HELM_DOCS=$(LINTERS)/helm-docs tools/helm_docs.sh

unit: $(STAMP)
	$(BIN)/pytest tests/unit

# The README's test command: lint (first: `make lint`), unit, HTTP and property tests,
# the Go plugins' tests and their conformance to the extender (tests/unit/test_plugins.py),
# the alerts' promtool tests and the dashboard's queries (tests/unit/test_monitoring.py),
# and the end-to-end tests on the real control plane (built first where Go is installed;
# in CI it must be), one of them on a real node running the image (built first where
# buildah is installed), installed the README's way from a registry on loopback.
test: lint $(STAMP) $(if $(HAVE_GO),controlplane controlplane-$(K8S_OLDEST) plugins \
    plugins-$(K8S_OLDEST) kueue prometheus registry) $(if $(HAVE_IMAGE_TOOLS),image)
	$(BIN)/pytest

demo: $(STAMP) controlplane $(if $(HAVE_IMAGE_TOOLS),image)
	$(BIN)/python -m lab $(DEMO_ARGS)

bench: $(STAMP) controlplane
	$(BIN)/python tests/bench/extender_bench.py

# The extender's memory through its first list of 5,000 GPU nodes and 50,000 bound pods
# (~9 KiB each, as listed) on the lab: RSS and VmHWM of gunicorn's master and worker,
# sampled from start to 15 s after /readyz. Building the lab takes minutes. To compare
# source trees in one run: make bench-scale SCALE_TREES="--tree before=DIR --tree after=."
SCALE_TREES ?=
bench-scale: $(STAMP) controlplane
	$(BIN)/python tests/bench/relist_memory.py --nodes 5000 --pods 50000 $(SCALE_TREES)

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
