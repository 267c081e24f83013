#!/usr/bin/env bash
# Make the webhook's TLS Secret with `gpu-scheduler certs` and inject the caBundle into
# the MutatingWebhookConfiguration. Run after `kubectl apply -k deploy/`; run it again
# any time (e.g. monthly from cron/CI): a valid pair is kept, a pair within 30 days of
# expiry is re-signed by the same CA (the caBundle stays valid), and the webhook pods
# pick up the updated Secret without a restart. Keep DIR (it holds ca.key) private.
#
#   deploy/webhook/install-certs.sh [DIR]        (default DIR: ./certs-out)
#
# Environment: NAMESPACE, SERVICE, SECRET, WEBHOOK, GPU_SCHEDULER (the command).
set -euo pipefail

dir=${1:-certs-out}
namespace=${NAMESPACE:-gpu-scheduler}
service=${SERVICE:-gpu-scheduler-webhook}
secret=${SECRET:-gpu-scheduler-webhook-tls}
webhook=${WEBHOOK:-gpu-scheduler-webhook}
gpu_scheduler=${GPU_SCHEDULER:-gpu-scheduler}

$gpu_scheduler certs generate --out "$dir" --service "$service" --namespace "$namespace"

kubectl -n "$namespace" create secret tls "$secret" \
  --cert "$dir/tls.crt" --key "$dir/tls.key" --dry-run=client -o yaml \
  | kubectl apply -f -

bundle=$($gpu_scheduler certs ca-bundle "$dir")
kubectl patch mutatingwebhookconfiguration "$webhook" --type=json -p \
  "[{\"op\":\"add\",\"path\":\"/webhooks/0/clientConfig/caBundle\",\"value\":\"$bundle\"}]"
echo "secret $namespace/$secret and caBundle of $webhook are up to date"
