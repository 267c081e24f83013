{{/* Labels on every object (deploy/kustomization.yaml's `labels`). */}}
{{- define "gpu-scheduler.labels" -}}
app.kubernetes.io/part-of: gpu-scheduler
{{- end }}

{{/* The project's image: by digest when one is given, else by tag. */}}
{{- define "gpu-scheduler.image" -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{- define "gpu-scheduler.pullPolicy" -}}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{- define "gpu-scheduler.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
{{ toYaml . }}
{{- end }}
{{- end }}

{{/* nodeSelector, tolerations, affinity of a component's values, when set. */}}
{{- define "gpu-scheduler.placement" -}}
{{- with .nodeSelector }}
nodeSelector:
{{ toYaml . | indent 2 }}
{{- end }}
{{- with .tolerations }}
tolerations:
{{ toYaml . }}
{{- end }}
{{- with .affinity }}
affinity:
{{ toYaml . | indent 2 }}
{{- end }}
{{- end }}

{{/* The pod security context every component runs with. */}}
{{- define "gpu-scheduler.podSecurity" -}}
securityContext:
  runAsNonRoot: true
  runAsUser: 65532
  runAsGroup: 65532
  fsGroup: 65532
  seccompProfile:
    type: RuntimeDefault
{{- end }}

{{- define "gpu-scheduler.containerSecurity" -}}
securityContext:
  allowPrivilegeEscalation: false
  readOnlyRootFilesystem: true
  capabilities:
    drop: [ALL]
{{- end }}

{{- define "gpu-scheduler.agentUser" -}}
system:serviceaccount:{{ .Release.Namespace }}:gpu-scheduler-agent
{{- end }}

{{/* scheduler.path: extender (the official kube-scheduler asks our extender) or
plugins (our kube-scheduler with the framework plugins compiled in, no extender;
docs/concepts/paths.md). Anything else fails the install. */}}
{{- define "gpu-scheduler.path" -}}
{{- $path := .Values.scheduler.path -}}
{{- if not (has $path (list "extender" "plugins")) -}}
{{- fail (printf "scheduler.path must be extender (the official kube-scheduler and our extender) or plugins (our kube-scheduler with the framework plugins, no extender) (got %v)" $path) -}}
{{- end -}}
{{ $path }}
{{- end }}

{{/* The Kubernetes release each supported minor's plugins image is built from: what
the release workflow pushes as gpu-scheduler-kube-scheduler:<v1.NN.P>-<version>
(tools/k8s/build.sh --version 1.NN; tests/unit/test_chart_paths.py holds them equal). */}}
{{- define "gpu-scheduler.pluginsReleases" -}}
{{- dict "34" "v1.34.4" "35" "v1.35.4" "36" "v1.36.3" "37" "v1.37.2" | toJson -}}
{{- end }}

{{/* kube-scheduler's tag. Extender path: the cluster's own version unless a tag is
given (v1.34.4-eks-1a2b3c → v1.34.4). Plugins path: the release's image for the
cluster's minor, <v1.NN.P>-<appVersion>, unless scheduler.plugins.image.tag is given. */}}
{{- define "gpu-scheduler.schedulerTag" -}}
{{- $cluster := semver .Capabilities.KubeVersion.Version -}}
{{- if eq (include "gpu-scheduler.path" .) "plugins" -}}
{{- $release := get (include "gpu-scheduler.pluginsReleases" . | fromJson) (toString $cluster.Minor) -}}
{{- if not (or .Values.scheduler.plugins.image.tag $release) -}}
{{- fail (printf "no gpu-scheduler-kube-scheduler image is released for Kubernetes %s (the plugins path has one per minor, 1.34 to 1.37): set scheduler.plugins.image.tag" .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- .Values.scheduler.plugins.image.tag | default (printf "%s-%s" $release .Chart.AppVersion) -}}
{{- else -}}
{{- .Values.scheduler.image.tag | default (printf "v%d.%d.%d" $cluster.Major $cluster.Minor $cluster.Patch) -}}
{{- end -}}
{{- end }}

{{/* kube-scheduler's image (scheduler.image on the extender path,
scheduler.plugins.image on the plugins path), never newer than the API server nor more
than one minor older (Kubernetes' version-skew policy for kube-scheduler). */}}
{{- define "gpu-scheduler.schedulerImage" -}}
{{- $cluster := semver .Capabilities.KubeVersion.Version -}}
{{- $tag := include "gpu-scheduler.schedulerTag" . -}}
{{- $image := .Values.scheduler.image -}}
{{- $value := "scheduler.image.tag" -}}
{{- if eq (include "gpu-scheduler.path" .) "plugins" -}}
{{- $image = .Values.scheduler.plugins.image -}}
{{- $value = "scheduler.plugins.image.tag" -}}
{{- end -}}
{{- if not .Values.scheduler.image.skipVersionCheck -}}
{{- $want := semver $tag -}}
{{- if or (ne $want.Major $cluster.Major) (gt $want.Minor $cluster.Minor) (lt $want.Minor (sub $cluster.Minor 1)) -}}
{{- fail (printf "%s %s does not suit this cluster's Kubernetes %s: kube-scheduler must not be newer than its API server, and at most one minor older (leave the tag empty to follow the cluster, or set scheduler.image.skipVersionCheck)" $value $tag .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}
{{ $image.repository }}:{{ $tag }}
{{- end }}

{{/* nodeSelector, tolerations and affinity of a Deployment that may run in the node's
network (webhook, extender): with hostNetwork, required pod anti-affinity on the
hostname is added to the values' affinity, so two replicas never meet on one node's
port. Takes (dict "values" .Values.<component> "name" <app.kubernetes.io/name>). */}}
{{- define "gpu-scheduler.hostPlacement" -}}
{{- $v := .values -}}
{{- $affinity := deepCopy ($v.affinity | default dict) -}}
{{- if $v.hostNetwork -}}
{{- $anti := $affinity.podAntiAffinity | default dict -}}
{{- $term := dict "topologyKey" "kubernetes.io/hostname" "labelSelector" (dict "matchLabels" (dict "app.kubernetes.io/name" .name)) -}}
{{- $terms := append ($anti.requiredDuringSchedulingIgnoredDuringExecution | default list) $term -}}
{{- $_ := set $anti "requiredDuringSchedulingIgnoredDuringExecution" $terms -}}
{{- $_ := set $affinity "podAntiAffinity" $anti -}}
{{- end -}}
{{- include "gpu-scheduler.placement" (dict "nodeSelector" $v.nodeSelector "tolerations" $v.tolerations "affinity" $affinity) -}}
{{- if $v.hostNetwork }}
hostNetwork: true
dnsPolicy: ClusterFirstWithHostNet
{{- end }}
{{- end }}

{{/* A port a component listens on; in the node's network (hostNetwork) it must not be
privileged, in the NodePort range, or one the kubelet, kube-proxy, etcd or a common
node agent or CNI holds. Takes (dict "what" <value name> "port" <n> "host" <bool>). */}}
{{- define "gpu-scheduler.checkPort" -}}
{{- $port := int .port -}}
{{- if or (lt $port 1) (gt $port 65535) -}}
{{- fail (printf "%s: %v is not a TCP port" .what .port) -}}
{{- end -}}
{{- if .host -}}
{{- $taken := list 2379 2380 4240 4244 5473 9099 9100 9808 10248 10249 10250 10255 10256 10257 10259 61678 61679 -}}
{{- if or (lt $port 1024) (and (ge $port 30000) (le $port 32767)) (has $port $taken) -}}
{{- fail (printf "%s: %d cannot be used with hostNetwork: it is privileged (below 1024), in the NodePort range (30000-32767), or held on nodes by the kubelet, kube-proxy, etcd, node-exporter or a CNI (%s)" .what $port (join ", " $taken)) -}}
{{- end -}}
{{- end -}}
{{- end }}

{{/* The agent's platform (agent.platform): gpu-operator, gke or eks; auto resolved
at install by a lookup of the RuntimeClass and the cluster's version. An unknown value
fails the install. */}}
{{- define "gpu-scheduler.agentPlatform" -}}
{{- $platform := .Values.agent.platform -}}
{{- $known := list "auto" "gpu-operator" "gke" "eks" -}}
{{- if not (has $platform $known) -}}
{{- fail (printf "agent.platform %v is not one of %s: gpu-operator (the NVIDIA container runtime as RuntimeClass %s), eks (nvidia is the nodes' default runtime), gke (Google's drivers from the host), auto (the first that fits the cluster)" $platform (join ", " $known) .Values.agent.runtimeClassName) -}}
{{- end -}}
{{- if ne $platform "auto" -}}
{{ $platform }}
{{- else if and .Values.agent.runtimeClassName (lookup "node.k8s.io/v1" "RuntimeClass" "" .Values.agent.runtimeClassName) -}}
gpu-operator
{{- else if contains "-gke." .Capabilities.KubeVersion.Version -}}
gke
{{- else -}}
eks
{{- end -}}
{{- end }}

{{/* certificates.mode: internal, cert-manager or external; tool (0.1.0's name for
external, and its default) is taken as external. Anything else fails the install, and
so does certificates.caBundle outside mode external: in mode internal the certificate
controller owns the webhook's caBundle, in mode cert-manager cert-manager's CA
injector does, and a rendered value would be put back over theirs on every upgrade. */}}
{{- define "gpu-scheduler.certMode" -}}
{{- $mode := .Values.certificates.mode -}}
{{- if not (has $mode (list "internal" "cert-manager" "external" "tool")) -}}
{{- fail (printf "certificates.mode must be one of internal, cert-manager, external (or tool, 0.1.0's name for external) (got %v)" $mode) -}}
{{- end -}}
{{- if eq $mode "tool" }}{{ $mode = "external" }}{{ end -}}
{{- if and .Values.certificates.caBundle (ne $mode "external") -}}
{{- fail (printf "certificates.caBundle is set, but certificates.mode is %s: %s fills the webhook's caBundle, and a rendered value would be put back over it on every upgrade (GPU pods refused). Unset it (--set certificates.caBundle=\"\"), or use certificates.mode external" $mode (ternary "the certificate controller (gpu-scheduler-certs)" "cert-manager's CA injector" (eq $mode "internal"))) -}}
{{- end -}}
{{ $mode }}
{{- end }}

{{/* The webhook's failurePolicy as rendered. Mode internal: Ignore until the
certificate controller arms the webhook (sets webhook.failurePolicy once the caBundle is
in place and a webhook pod is Ready), so an install that never comes up refuses no
pod; an upgrade renders the live value when it already is the configured one, so it
neither disarms a webhook that serves nor conflicts, under server-side apply, with the
controller's write. Where lookup sees no cluster (helm template, --dry-run=client):
Ignore. Modes cert-manager and external have no controller: the configured value. */}}
{{- define "gpu-scheduler.webhookFailurePolicy" -}}
{{- $want := .Values.webhook.failurePolicy -}}
{{- if not (has $want (list "Fail" "Ignore")) -}}
{{- fail (printf "webhook.failurePolicy must be Fail or Ignore (got %v)" $want) -}}
{{- end -}}
{{- if ne (include "gpu-scheduler.certMode" .) "internal" -}}
{{ $want }}
{{- else -}}
{{- $live := "" -}}
{{- $config := lookup "admissionregistration.k8s.io/v1" "MutatingWebhookConfiguration" "" "gpu-scheduler-webhook" -}}
{{- range (dig "webhooks" list $config) -}}
{{- if eq .name "pods.gpu-scheduler.io" }}{{ $live = .failurePolicy }}{{ end -}}
{{- end -}}
{{ ternary $want "Ignore" (eq $live $want) }}
{{- end -}}
{{- end }}

{{/* webhook.excludeNamespaces plus the release namespace, as a JSON list; null counts
as none (the release namespace alone), anything but a list fails the install. */}}
{{- define "gpu-scheduler.excludeNamespaces" -}}
{{- $exclude := .Values.webhook.excludeNamespaces -}}
{{- if kindIs "invalid" $exclude -}}
{{- $exclude = list -}}
{{- else if not (kindIs "slice" $exclude) -}}
{{- fail (printf "webhook.excludeNamespaces must be a list of namespace names, e.g. [kube-system, gpu-operator] or [] (got %s %v)" (kindOf $exclude) $exclude) -}}
{{- end -}}
{{- append $exclude .Release.Namespace | uniq | toJson -}}
{{- end }}

{{/* The agent's node and pod (its pod owns the node's heartbeat Lease). */}}
{{- define "gpu-scheduler.agentIdentity" -}}
- name: NODE_NAME
  valueFrom:
    fieldRef:
      fieldPath: spec.nodeName
# The agent's pod: it owns the node's heartbeat Lease, in this namespace.
- name: POD_NAMESPACE
  valueFrom:
    fieldRef:
      fieldPath: metadata.namespace
- name: POD_NAME
  valueFrom:
    fieldRef:
      fieldPath: metadata.name
- name: POD_UID
  valueFrom:
    fieldRef:
      fieldPath: metadata.uid
{{- end }}

{{/* The plain agent's placement: agent.nodeSelector, tolerations and affinity, and with
agent.sharing.enabled each node term also refuses the nodes labelled
gpu-scheduler.io/gpu-sharing (the sharing agent runs there): one agent per node. */}}
{{- define "gpu-scheduler.agentPlacement" -}}
{{- $placement := pick (deepCopy .Values.agent) "nodeSelector" "tolerations" "affinity" -}}
{{- if .Values.agent.sharing.enabled -}}
{{- $required := dig "affinity" "nodeAffinity" "requiredDuringSchedulingIgnoredDuringExecution" "nodeSelectorTerms" list $placement -}}
{{- if not $required -}}
{{- fail "agent.sharing.enabled needs agent.affinity with required nodeSelectorTerms (the plain agent must keep off the sharing nodes)" -}}
{{- end -}}
{{- range $required -}}
{{- $_ := set . "matchExpressions" (append (default list .matchExpressions) (dict "key" "gpu-scheduler.io/gpu-sharing" "operator" "DoesNotExist")) -}}
{{- end -}}
{{- end -}}
{{- toYaml $placement -}}
{{- end }}
