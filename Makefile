# gpu-scheduler — build, test and demo. `make demo` and `make test` are the quick start.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Reinstall when the project's dependencies change.
STAMP := $(VENV)/.installed-$(shell sha1sum pyproject.toml | cut -c1-12)

K8S_VERSION := $(shell sed -n 's/^const Version = "\(.*\)"/\1/p' tools/k8s/main.go)
HELM_VERSION := $(shell sed -n 's|^\s*helm.sh/helm/v4 \(v[0-9.]*\).*|\1|p' tools/k8s/go.mod)
# Stamp the versions the binaries report (the API server's /version, which Helm's
# kubeVersion checks read; `helm version`), as upstream's release builds do.
K8S_MINOR := $(word 2,$(subst ., ,$(K8S_VERSION)))
K8S_LDFLAGS := -s -w \
  -X k8s.io/component-base/version.gitVersion=$(K8S_VERSION) \
  -X k8s.io/component-base/version.gitMajor=1 \
  -X k8s.io/component-base/version.gitMinor=$(K8S_MINOR) \
  -X k8s.io/component-base/version.gitTreeState=clean \
  -X helm.sh/helm/v4/internal/version.version=$(HELM_VERSION)
K8S_DIR := .cache/k8s/$(K8S_VERSION)-$(shell (cat tools/k8s/go.mod tools/k8s/go.sum tools/k8s/main.go; echo '$(K8S_LDFLAGS)') | sha1sum | cut -c1-8)
K8S_BIN := $(K8S_DIR)/k8s
export GPU_SCHEDULER_K8S_BIN := $(abspath $(K8S_BIN))
HAVE_GO := $(shell command -v go 2>/dev/null)
# What `make image` needs; without it the real-node e2e tests say so and skip (CI: fail).
HAVE_IMAGE_TOOLS := $(shell command -v buildah >/dev/null && command -v debootstrap >/dev/null \
  && command -v gcc >/dev/null && [ "$$(id -u)" = 0 ] && echo yes)

.PHONY: test lint unit install controlplane image demo bench clean

install: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test,bench]'
	@rm -f $(VENV)/.installed-* && touch $@

# The Kubernetes binary (etcd, kube-apiserver, kube-controller-manager, kube-scheduler,
# kubelet, kubectl and helm in one), built from the Kubernetes Go modules into a git-ignored
# folder keyed by version and by the module's files; skipped when already there.
controlplane: $(K8S_BIN)

$(K8S_BIN): tools/k8s/go.mod tools/k8s/go.sum tools/k8s/main.go
	@mkdir -p $(K8S_DIR)
	@echo "building the control plane $(K8S_VERSION) into $(K8S_DIR) (cold: 20-30 min on 2 cores; one line per package)"
	cd tools/k8s && go build -v -trimpath -ldflags='$(K8S_LDFLAGS)' -o $(abspath $(K8S_BIN)).tmp . 2>&1 \
	  | awk '{ n++; printf "\r[control plane] %5d packages built: %-70.70s", n, $$0; fflush() } END { print "" }'
	@test -x $(K8S_BIN).tmp && mv $(K8S_BIN).tmp $(K8S_BIN)
	@echo "control plane ready: $(K8S_BIN)"

# The project image from the Dockerfile (buildah, no daemon) on a Debian base made with
# debootstrap, and the pause image; cached under .cache/images/ by their inputs.
image:
	tools/image/build.sh

lint: $(STAMP)
	$(BIN)/ruff check .

unit: $(STAMP)
	$(BIN)/pytest tests/unit

# The README's test command: lint, unit, HTTP and property tests, and the end-to-end
# tests on the real control plane (built first where Go is installed; in CI it must be),
# one of them on a real node running the image (built first where buildah is installed).
test: $(STAMP) $(if $(HAVE_GO),controlplane) $(if $(HAVE_IMAGE_TOOLS),image)
	$(BIN)/ruff check .
	$(BIN)/pytest

demo: $(STAMP) controlplane $(if $(HAVE_IMAGE_TOOLS),image)
	$(BIN)/gpu-scheduler demo $(DEMO_ARGS)

bench: $(STAMP) controlplane
	$(BIN)/python tests/bench/extender_bench.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache
