#!/usr/bin/env bash
# Certificates for the install, from one private CA made by `gpu-scheduler certs`:
#   gpu-scheduler-webhook-tls    the webhook's serving pair
#   gpu-scheduler-extender-tls   the extender's serving pair; its ca.crt is also the CA
#                                its verbs require client certificates from
#   gpu-scheduler-scheduler-tls  kube-scheduler's client pair for the extender
# Each Secret's ca.crt is the trust bundle. The script also puts the bundle into the
# MutatingWebhookConfiguration's caBundle and restarts kube-scheduler when its files
# changed (it reads them only at start).
#
#   deploy/install-certs.sh [DIR]             make or renew, and publish
#   deploy/install-certs.sh rotate-ca [DIR]   replace the CA without refusing a request
#
# Run it after `kubectl apply -k deploy/`, and again any time (monthly from cron/CI):
# valid pairs are kept, a pair within 30 days of expiry is re-signed by the same CA.
# The webhook and the extender reload changed Secrets without a restart.
#
# rotate-ca: (1) a new CA is made and published beside the old one in every bundle;
# (2) after WAIT seconds (the kubelet refreshes Secret volumes within about a minute),
# the new CA signs new leaves, which are published; (3) after WAIT again, the old CA
# leaves the bundles. No peer ever meets a certificate it does not trust.
#
# DIR (default ./certs-out) holds the CA key: keep it private and keep it.
# Environment: NAMESPACE (gpu-scheduler), WEBHOOK (gpu-scheduler-webhook, the
# MutatingWebhookConfiguration), SCHEDULER (gpu-scheduler, the Deployment), WAIT (90),
# GPU_SCHEDULER (the command, default gpu-scheduler).
set -euo pipefail

phase=publish
if [ "${1:-}" = rotate-ca ]; then phase=rotate-ca; shift; fi
dir=${1:-certs-out}
namespace=${NAMESPACE:-gpu-scheduler}
webhook=${WEBHOOK:-gpu-scheduler-webhook}
scheduler=${SCHEDULER:-gpu-scheduler}
wait_s=${WAIT:-90}
gpu_scheduler=${GPU_SCHEDULER:-gpu-scheduler}

issue() {  # NAME SERVICE [--client]: a leaf in $dir/NAME signed by $dir/ca
  $gpu_scheduler certs generate --ca-dir "$dir/ca" --out "$dir/$1" \
    --service "$2" --namespace "$namespace" "${@:3}"
}

secret() {  # NAME: Secret gpu-scheduler-NAME-tls from $dir/NAME
  kubectl -n "$namespace" create secret generic "gpu-scheduler-$1-tls" \
    --type=kubernetes.io/tls --from-file=tls.crt="$dir/$1/tls.crt" \
    --from-file=tls.key="$dir/$1/tls.key" --from-file=ca.crt="$dir/$1/ca.crt" \
    --dry-run=client -o yaml | kubectl apply -f -
}

fingerprint() { cat "$dir/scheduler/tls.crt" "$dir/scheduler/ca.crt" 2>/dev/null | sha256sum; }

publish() {
  local before=""
  # Only a change to pairs kube-scheduler already loaded needs its restart; on the
  # first run its pods wait for the Secret and read it when they start.
  [ -f "$dir/scheduler/tls.crt" ] && before=$(fingerprint)
  issue webhook gpu-scheduler-webhook
  issue extender gpu-scheduler-extender
  issue scheduler gpu-scheduler --client
  for name in webhook extender scheduler; do secret "$name"; done
  bundle=$($gpu_scheduler certs ca-bundle "$dir/ca")
  kubectl patch mutatingwebhookconfiguration "$webhook" --type=json -p \
    "[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$bundle\"}]"
  if [ -n "$before" ] && [ "$before" != "$(fingerprint)" ] \
      && kubectl -n "$namespace" get deployment "$scheduler" >/dev/null 2>&1; then
    kubectl -n "$namespace" rollout restart deployment "$scheduler"
    kubectl -n "$namespace" rollout status deployment "$scheduler" --timeout=300s
  fi
}

settle() {
  echo "waiting ${wait_s}s for the kubelets to refresh the Secret volumes"
  sleep "$wait_s"
}

if [ "$phase" = publish ]; then
  publish
  echo "Secrets gpu-scheduler-{webhook,extender,scheduler}-tls and the caBundle of $webhook are up to date"
  exit 0
fi
[ -f "$dir/ca/ca.key" ] || { echo "no CA in $dir/ca: run $0 $dir first" >&2; exit 2; }
$gpu_scheduler certs rotate-ca begin --ca-dir "$dir/ca"
publish   # every bundle: old + new CA
settle
$gpu_scheduler certs rotate-ca switch --ca-dir "$dir/ca"
publish   # leaves signed by the new CA; bundles still hold both
settle
$gpu_scheduler certs rotate-ca finish --ca-dir "$dir/ca"
publish   # bundles: the new CA only
echo "CA replaced; the old one is no longer trusted"
