#!/usr/bin/env bash
# The control plane of one supported Kubernetes minor, built from that release's Go
# modules into .cache/k8s/<version>-<hash>/k8s (git-ignored), keyed by the module's
# files; skipped when already there.
#
#   tools/k8s/build.sh [MINOR]          build (MINOR: 1.34 ... 1.37; default the newest)
#   tools/k8s/build.sh --path [MINOR]   print where that build is (or would be) only
#   tools/k8s/build.sh --minors         list the supported minors, oldest first
#   tools/k8s/build.sh kueue            Kueue (sigs.k8s.io/kueue/cmd/kueue) and its
#                                       config/ (CRDs, webhooks, RBAC, Configuration)
#   tools/k8s/build.sh --path kueue     where that build is (or would be)
#   tools/k8s/build.sh linters          actionlint and helm-docs (`make lint` runs them)
#   tools/k8s/build.sh --path linters   the folder they are (or would be) in
#   tools/k8s/build.sh prometheus       promtool (github.com/prometheus/prometheus/cmd/
#                                       promtool) and promql-names (our PromQL parser
#                                       check), for the monitoring tests
#   tools/k8s/build.sh --path prometheus   the folder they are (or would be) in
#   tools/k8s/build.sh registry         the CNCF distribution registry (github.com/
#                                       distribution/distribution/v3/cmd/registry), the
#                                       OCI registry the install e2e pushes to
#   tools/k8s/build.sh --path registry  where that build is (or would be)
#   tools/k8s/build.sh plugins [MINOR]  kube-scheduler with gpu-scheduler's framework
#                                       plugins (plugins/cmd/kube-scheduler), built from
#                                       that minor's module into .cache/k8s/
#                                       <version>-plugins-<hash>/kube-scheduler
#   tools/k8s/build.sh --path plugins [MINOR]   where that build is (or would be)
#   tools/k8s/build.sh --tags MINOR     the Go build tags that minor's plugins need
#   tools/k8s/build.sh --version MINOR  the Kubernetes release that minor builds (v1.NN.P)
#
# The newest minor's module is tools/k8s itself (it also carries helm: helm.go); each
# older one is tools/k8s/v1.NN, a go.mod of its own that links tools/k8s/components.go.
# Kueue is tools/k8s/kueue, a go.mod of its own (a `tool` directive), as its Kubernetes
# libraries are older than ours; its config/ is copied from the module beside the binary,
# so the lab installs what that release ships. The linters are tools/k8s/linters, one
# go.mod with a `tool` directive for each, built into .cache/k8s/linters-<hash>/.
# Prometheus' tools are tools/k8s/prometheus, a go.mod of its own (a `tool` directive for
# promtool, and promql-names/, a small program on Prometheus' PromQL parser), built into
# .cache/k8s/prometheus-<version>-<hash>/. The registry is tools/k8s/registry, a go.mod
# with a `tool` directive, built into .cache/k8s/registry-<version>-<hash>/.
set -euo pipefail
cd "$(dirname "$0")"
HERE=$(pwd)
ROOT=$(cd ../.. && pwd)

minors() {
  { for dir in v1.*/; do [ -f "$dir/go.mod" ] && echo "${dir%/}" | sed 's/^v//'; done
    sed -n 's/^\s*k8s.io\/kubernetes v\([0-9]*\.[0-9]*\)\..*/\1/p' go.mod; } | sort -t. -k2n -u
}
newest() { minors | tail -1; }

module_dir() {  # the Go module of one minor
  local minor=$1
  if [ "$minor" = "$(newest)" ]; then echo "$HERE"; elif [ -f "v$minor/go.mod" ]; then
    echo "$HERE/v$minor"; else
    echo "unsupported Kubernetes minor $minor (supported: $(minors | tr '\n' ' '))" >&2; exit 2; fi
}

version_of() { sed -n 's/^\s*k8s.io\/kubernetes \(v[0-9.]*\).*/\1/p' "$1/go.mod" | head -1; }

ldflags() {  # the versions the binaries report, as upstream's release builds stamp them
  local version=$1 dir=$2 helm
  local minor=${version#v1.}; minor=${minor%%.*}
  echo -n "-s -w -X main.Version=$version -X k8s.io/component-base/version.gitVersion=$version"
  echo -n " -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor"
  echo -n " -X k8s.io/component-base/version.gitTreeState=clean"
  helm=$(sed -n 's|^\s*helm.sh/helm/v4 \(v[0-9.]*\).*|\1|p' "$dir/go.mod")
  [ -z "$helm" ] || echo -n " -X helm.sh/helm/v4/internal/version.version=$helm"
}

path_of() {
  local dir version flags hash
  dir=$(module_dir "$1"); version=$(version_of "$dir"); flags=$(ldflags "$version" "$dir")
  hash=$( (cat "$dir/go.mod" "$dir/go.sum" "$dir"/*.go; echo "$flags") | sha1sum | cut -c1-8)
  echo "$ROOT/.cache/k8s/$version-$hash/k8s"
}

# The plugins (plugins/, a Go module each minor's module requires and replaces with the
# folder): the framework's types moved in 1.35, and pkg/fwk picks them by a build tag.
PLUGINS_MAIN=github.com/gpu-scheduler/gpu-scheduler/plugins/cmd/kube-scheduler
# k8s1_34: the framework's types before they moved; k8s1_34/35/36: DefaultPreemption's
# victims were single pods before 1.37 (plugins/pkg/gangpreemption).
tags_of() { case $1 in 1.34|1.35|1.36) echo "k8s${1/./_}" ;; esac; }
plugins_path() {
  local minor=$1 dir version flags hash
  dir=$(module_dir "$minor"); version=$(version_of "$dir"); flags=$(ldflags "$version" "$dir")
  # Keyed by what goes into the binary: not the tests (plugins/test/, *_test.go).
  hash=$( (cat "$dir/go.mod" "$dir/go.sum"; cd "$ROOT/plugins" && find . -path ./test -prune -o \
    -type f \( -name '*.go' ! -name '*_test.go' -o -name go.mod -o -name go.sum \) -print \
    | LC_ALL=C sort | xargs cat; echo "$flags $(tags_of "$minor")") | sha1sum | cut -c1-8)
  echo "$ROOT/.cache/k8s/$version-plugins-$hash/kube-scheduler"
}

build_plugins() {
  local minor=$1 bin dir version start
  bin=$(plugins_path "$minor"); dir=$(module_dir "$minor"); version=$(version_of "$dir")
  [ -x "$bin" ] && { echo "kube-scheduler $version with the plugins: $bin"; return 0; }
  mkdir -p "$(dirname "$bin")"; start=$SECONDS
  echo "building kube-scheduler $version with the plugins into $(dirname "$bin")" \
    "(cold: the scheduler's packages, shared with the control plane's build)"
  (cd "$dir" && go build -trimpath -tags "$(tags_of "$minor")" \
    -ldflags="$(ldflags "$version" "$dir")" -o "$bin.tmp" "$PLUGINS_MAIN")
  mv "$bin.tmp" "$bin"
  echo "kube-scheduler $version with the plugins ready in $((SECONDS - start)) s: $bin"
}

KUEUE_TOOL=sigs.k8s.io/kueue/cmd/kueue
kueue_version() { sed -n 's|^\s*sigs.k8s.io/kueue \(v[0-9.]*\).*|\1|p' "$HERE/kueue/go.mod" | head -1; }
kueue_path() {
  local hash
  hash=$(cat "$HERE/kueue/go.mod" "$HERE/kueue/go.sum" | sha1sum | cut -c1-8)
  echo "$ROOT/.cache/k8s/kueue-$(kueue_version)-$hash/kueue"
}

build_kueue() {
  local bin version start src
  bin=$(kueue_path); version=$(kueue_version)
  [ -x "$bin" ] && [ -d "$(dirname "$bin")/config" ] && { echo "kueue $version: $bin"; return 0; }
  mkdir -p "$(dirname "$bin")"
  echo "building Kueue $version into $(dirname "$bin") (cold: 4-10 min on 2 cores)"
  start=$SECONDS
  (cd "$HERE/kueue" && go build -v -trimpath -ldflags="-s -w" -o "$bin.tmp" "$KUEUE_TOOL" 2>&1) \
    | awk -v v="$version" '{ n++; printf "\r[kueue %s] %5d packages built: %-60.60s", v, n, $0; fflush() } END { print "" }'
  src=$(cd "$HERE/kueue" && go list -m -f '{{.Dir}}' sigs.k8s.io/kueue)
  rm -rf "$(dirname "$bin")/config" && cp -r "$src/config" "$(dirname "$bin")/config"
  chmod -R u+w "$(dirname "$bin")/config"
  test -x "$bin.tmp" && mv "$bin.tmp" "$bin"
  echo "kueue $version ready in $((SECONDS - start)) s: $bin"
}

LINTERS=(github.com/rhysd/actionlint/cmd/actionlint github.com/norwoodj/helm-docs/cmd/helm-docs)
linter_version() { sed -n "s|^\s*$1 v\([0-9.]*\).*|\1|p" "$HERE/linters/go.mod" | head -1; }
linter_ldflags() {  # the versions they report, as their release builds stamp them
  echo -n "-s -w -X github.com/rhysd/actionlint.version=$(linter_version github.com/rhysd/actionlint)"
  echo -n " -X main.version=$(linter_version github.com/norwoodj/helm-docs)"
}
linters_path() {
  local hash
  hash=$( (cat "$HERE/linters/go.mod" "$HERE/linters/go.sum"; linter_ldflags) | sha1sum | cut -c1-8)
  echo "$ROOT/.cache/k8s/linters-$hash"
}

build_linters() {  # one set of ldflags for both: each -X names a variable only one has
  local dir tool name start
  dir=$(linters_path)
  [ -x "$dir/actionlint" ] && [ -x "$dir/helm-docs" ] && { echo "linters: $dir"; return 0; }
  mkdir -p "$dir"; start=$SECONDS
  echo "building actionlint $(linter_version github.com/rhysd/actionlint) and helm-docs" \
    "$(linter_version github.com/norwoodj/helm-docs) into $dir (cold: about a minute)"
  for tool in "${LINTERS[@]}"; do
    name=${tool##*/}
    (cd "$HERE/linters" && go build -trimpath -ldflags="$(linter_ldflags)" -o "$dir/$name.tmp" "$tool")
    mv "$dir/$name.tmp" "$dir/$name"
  done
  echo "linters ready in $((SECONDS - start)) s: $dir"
}

PROM_MODULE=github.com/prometheus/prometheus
prometheus_version() { sed -n "s|^\(require \)\?\s*$PROM_MODULE \(v[0-9.]*\).*|\2|p" "$HERE/prometheus/go.mod" | head -1; }
prometheus_ldflags() {  # the version promtool reports: module v0.MMM.P is Prometheus 3.MM.P
  local v minor
  v=$(prometheus_version); minor=${v#v0.}; minor=${minor%%.*}
  echo -n "-s -w -X github.com/prometheus/common/version.Version=$((minor / 100)).$((minor % 100)).${v##*.}"
  echo -n " -X github.com/prometheus/common/version.Branch=HEAD"
}
prometheus_path() {
  local hash
  hash=$( (cd "$HERE/prometheus" && cat go.mod go.sum promql-names/*.go; prometheus_ldflags) \
    | sha1sum | cut -c1-8)
  echo "$ROOT/.cache/k8s/prometheus-$(prometheus_version)-$hash"
}

build_prometheus() {
  local dir tool name start
  dir=$(prometheus_path)
  [ -x "$dir/promtool" ] && [ -x "$dir/promql-names" ] && { echo "prometheus tools: $dir"; return 0; }
  mkdir -p "$dir"; start=$SECONDS
  echo "building promtool and promql-names from $PROM_MODULE $(prometheus_version) into $dir" \
    "(cold: 5-10 min on 2 cores)"
  for tool in "$PROM_MODULE/cmd/promtool" ./promql-names; do
    name=${tool##*/}
    (cd "$HERE/prometheus" && go build -trimpath -ldflags="$(prometheus_ldflags)" -o "$dir/$name.tmp" "$tool")
    mv "$dir/$name.tmp" "$dir/$name"
  done
  echo "prometheus tools ready in $((SECONDS - start)) s: $dir"
}

REGISTRY_TOOL=github.com/distribution/distribution/v3/cmd/registry
registry_version() {
  sed -n 's|^\s*github.com/distribution/distribution/v3 \(v[0-9.]*\).*|\1|p' "$HERE/registry/go.mod" | head -1
}
registry_ldflags() {  # the version it reports, as its release builds stamp it
  echo -n "-s -w -X github.com/distribution/distribution/v3/version.version=$(registry_version)"
}
registry_path() {
  local hash
  hash=$( (cat "$HERE/registry/go.mod" "$HERE/registry/go.sum"; registry_ldflags) | sha1sum | cut -c1-8)
  echo "$ROOT/.cache/k8s/registry-$(registry_version)-$hash/registry"
}

build_registry() {
  local bin start
  bin=$(registry_path)
  [ -x "$bin" ] && { echo "registry $(registry_version): $bin"; return 0; }
  mkdir -p "$(dirname "$bin")"; start=$SECONDS
  echo "building the distribution registry $(registry_version) into $(dirname "$bin") (cold: about a minute)"
  (cd "$HERE/registry" && go build -trimpath -ldflags="$(registry_ldflags)" -o "$bin.tmp" "$REGISTRY_TOOL")
  mv "$bin.tmp" "$bin"
  echo "registry ready in $((SECONDS - start)) s: $bin"
}

case "${1:-}" in
  --minors) minors; exit 0 ;;
  --path) case "${2:-}" in kueue) kueue_path ;; linters) linters_path ;;
    prometheus) prometheus_path ;; registry) registry_path ;;
    plugins) plugins_path "${3:-$(newest)}" ;;
    *) path_of "${2:-$(newest)}" ;; esac; exit 0 ;;
  --tags) module_dir "$2" >/dev/null; tags_of "$2"; exit 0 ;;
  --version) version_of "$(module_dir "$2")"; exit 0 ;;
  plugins) build_plugins "${2:-$(newest)}"; exit 0 ;;
  kueue) build_kueue; exit 0 ;;
  linters) build_linters; exit 0 ;;
  prometheus) build_prometheus; exit 0 ;;
  registry) build_registry; exit 0 ;;
esac
minor=${1:-$(newest)}
bin=$(path_of "$minor")
[ -x "$bin" ] && { echo "control plane $minor: $bin"; exit 0; }
dir=$(module_dir "$minor"); version=$(version_of "$dir")
mkdir -p "$(dirname "$bin")"
echo "building the control plane $version into $(dirname "$bin") (cold: 15-25 min on 2 cores)"
start=$SECONDS
(cd "$dir" && go build -v -trimpath -ldflags="$(ldflags "$version" "$dir")" -o "$bin.tmp" . 2>&1) \
  | awk -v v="$version" '{ n++; printf "\r[control plane %s] %5d packages built: %-60.60s", v, n, $0; fflush() } END { print "" }'
test -x "$bin.tmp" && mv "$bin.tmp" "$bin"
echo "control plane $version ready in $((SECONDS - start)) s: $bin"
