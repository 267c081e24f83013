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

{{/* kube-scheduler's image: the cluster's own version unless a tag is given
(v1.34.4-eks-1a2b3c → v1.34.4), and never newer than the API server nor more than one
minor older (Kubernetes' version-skew policy for kube-scheduler). */}}
{{- define "gpu-scheduler.schedulerImage" -}}
{{- $cluster := semver .Capabilities.KubeVersion.Version -}}
{{- $tag := .Values.scheduler.image.tag | default (printf "v%d.%d.%d" $cluster.Major $cluster.Minor $cluster.Patch) -}}
{{- if not .Values.scheduler.image.skipVersionCheck -}}
{{- $want := semver $tag -}}
{{- if or (ne $want.Major $cluster.Major) (gt $want.Minor $cluster.Minor) (lt $want.Minor (sub $cluster.Minor 1)) -}}
{{- fail (printf "scheduler.image.tag %s does not suit this cluster's Kubernetes %s: kube-scheduler must not be newer than its API server, and at most one minor older (leave the tag empty to follow the cluster, or set scheduler.image.skipVersionCheck)" $tag .Capabilities.KubeVersion.Version) -}}
{{- end -}}
{{- end -}}
{{ .Values.scheduler.image.repository }}:{{ $tag }}
{{- end }}
