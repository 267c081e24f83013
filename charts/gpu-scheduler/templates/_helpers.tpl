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
