#!/usr/bin/env bash
# The chart's values table, made by helm-docs from charts/gpu-scheduler/values.yaml (a
# `# --` comment above a value is its description) with charts/gpu-scheduler/
# README.md.gotmpl, kept between the lines <!-- helm-docs:start --> and
# <!-- helm-docs:end --> in docs/configuration.md and in the chart's own README.md
# (what `helm show readme` and chart indexes show).
#
#   tools/helm_docs.sh           write the table there (make docs)
#   tools/helm_docs.sh --check   exit 1, showing the diff, when what is there differs (make lint)
#
# HELM_DOCS: the helm-docs binary (default: where tools/k8s/build.sh linters puts it).
set -euo pipefail
cd "$(dirname "$0")/.."
DOCS=${DOCS:-docs/configuration.md charts/gpu-scheduler/README.md}
START='<!-- helm-docs:start -->' END='<!-- helm-docs:end -->'
HELM_DOCS=${HELM_DOCS:-$(tools/k8s/build.sh --path linters)/helm-docs}

tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
"$HELM_DOCS" --chart-search-root charts/gpu-scheduler --template-files README.md.gotmpl \
  --sort-values-order file --dry-run --log-level warning >"$tmp/table" 2>"$tmp/log"
# helm-docs reports a bad template or values file as a warning, and exits 0.
if [ ! -s "$tmp/table" ] || [ -s "$tmp/log" ]; then cat "$tmp/log" >&2; exit 1; fi

status=0
for DOC in $DOCS; do
  if [ ! -f "$DOC" ]; then  # not written yet: nothing to hold equal (CI: fail)
    echo "$DOC is missing: no chart values table to check" >&2
    if [ "${CI:-}" = true ]; then status=1; fi
    continue
  fi
  markers=$(grep -nxF -e "$START" -e "$END" "$DOC" | cut -d: -f2- | tr '\n' ' ')
  [ "$markers" = "$START $END " ] || {
    echo "$DOC: needs the line $START, then the line $END, once each" >&2; status=1; continue; }
  awk -v start="$START" -v end="$END" -v table="$tmp/table" '
    $0 == end { inside = 0 }
    !inside { print }
    $0 == start { print ""; while ((getline line < table) > 0) print line; print ""; inside = 1 }
  ' "$DOC" >"$tmp/doc"
  if [ "${1:-}" = --check ]; then
    diff -u --label "$DOC (committed)" --label "$DOC (helm-docs)" "$DOC" "$tmp/doc" >&2 || {
      echo "$DOC: the chart values table is not what values.yaml makes; run: make docs" >&2
      status=1; }
  elif ! cmp -s "$DOC" "$tmp/doc"; then
    cat "$tmp/doc" >"$DOC" && echo "$DOC: values table rewritten"
  fi
done
exit $status
