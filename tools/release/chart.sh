#!/usr/bin/env bash
# The chart as a release publishes it, and where (the release workflow's step, and the
# registry e2e's, tests/e2e/test_real_node.py):
#
#   tools/release/chart.sh REGISTRY OWNER VERSION
#
# packages charts/gpu-scheduler at VERSION (version and appVersion) with its images at
# REGISTRY/OWNER (gpu-scheduler and gpu-scheduler-kube-scheduler, where the release
# pushes them), into $DIST/gpu-scheduler-VERSION.tgz (DIST: dist), and pushes it to
# oci://REGISTRY/OWNER/charts. So a fork that releases to ghcr.io/<its owner>, or a
# platform team that publishes to its own registry, gets a chart whose default images
# are the ones pushed beside it. Log in to REGISTRY first (helm registry login). helm is
# $HELM, or helm on PATH.
set -euo pipefail
[ $# = 3 ] || { echo "usage: $0 REGISTRY OWNER VERSION" >&2; exit 2; }
registry=$1 owner=$2 version=$3
helm=${HELM:-helm}
dist=${DIST:-dist}
case $dist in /*) ;; *) dist=$PWD/$dist ;; esac
cd "$(dirname "$0")/../.."
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r charts/gpu-scheduler "$work/gpu-scheduler"
values=$work/gpu-scheduler/values.yaml
# The values' image repositories, ghcr.io/gpu-scheduler/<image>: both must move. (POSIX
# grep and sed, no -i: macOS's tools run it too.)
pattern='^\([[:space:]]*repository: \)ghcr\.io/gpu-scheduler/\(gpu-scheduler[a-z-]*\)$'
found=$(grep -c '^[[:space:]]*repository: ghcr\.io/gpu-scheduler/gpu-scheduler[a-z-]*$' "$values" || true)
[ "$found" = 2 ] || { echo "$values: $found image repositories under ghcr.io/gpu-scheduler, expected 2" >&2; exit 1; }
sed "s|$pattern|\1$registry/$owner/\2|" "$values" >"$values.new" && mv "$values.new" "$values"
mkdir -p "$dist"
"$helm" package "$work/gpu-scheduler" --version "$version" --app-version "$version" --destination "$dist"
"$helm" push "$dist/gpu-scheduler-$version.tgz" "oci://$registry/$owner/charts"
