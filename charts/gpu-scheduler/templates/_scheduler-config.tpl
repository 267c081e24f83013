{{/* The KubeSchedulerConfiguration of scheduler.path: the extender's below, the
plugins' in _plugins-config.tpl. */}}
{{- define "gpu-scheduler.schedulerConfig" -}}
{{- if eq (include "gpu-scheduler.path" .) "plugins" -}}
{{ include "gpu-scheduler.pluginsSchedulerConfig" . }}
{{- else -}}
{{ include "gpu-scheduler.extenderSchedulerConfig" . }}
{{- end -}}
{{- end }}

{{/* What both paths' configurations begin with: the client's limit, node sampling,
the scheduler's own leader-election lease. */}}
{{- define "gpu-scheduler.schedulerHead" -}}
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  qps: 300
  burst: 600
percentageOfNodesToScore: 0
leaderElection:
  leaderElect: true
  resourceName: gpu-scheduler
  resourceNamespace: {{ .Release.Namespace }}
{{- end }}

{{/* The built-in plugins' args both profiles carry (a pluginConfig list's items). */}}
{{- define "gpu-scheduler.builtinPluginConfig" -}}
- name: NodeResourcesFit
  args:
    scoringStrategy:
      type: MostAllocated
      resources:
        - name: nvidia.com/gpu
          weight: 5
        - name: cpu
          weight: 1
        - name: memory
          weight: 1
- name: PodTopologySpread
  args:
    {{- if .Values.scheduler.profile.systemDefaultSpreading }}
    defaultingType: System
    {{- else }}
    defaultingType: List
    defaultConstraints: []
    {{- end }}
{{- end }}

{{/* deploy/scheduler/scheduler-config.yaml, with the release's namespace and TLS choice. */}}
{{- define "gpu-scheduler.extenderSchedulerConfig" -}}
{{ include "gpu-scheduler.schedulerHead" . }}
profiles:
  - schedulerName: gpu-scheduler
    {{- $scheduler := semver (include "gpu-scheduler.schedulerTag" .) }}
    {{- $podGroupOff := and (not .Values.scheduler.profile.podGroupPreemption) (ge (int $scheduler.Minor) 37) }}
    {{- if or .Values.scheduler.profile.extraScorePlugins $podGroupOff }}
    plugins:
      {{- with .Values.scheduler.profile.extraScorePlugins }}
      score:
        enabled:
          {{- toYaml . | nindent 10 }}
      {{- end }}
      {{- if $podGroupOff }}
      # No workload-aware preemption of PodGroups: its dry run never reaches the
      # extender's preempt verb (scheduler.profile.podGroupPreemption).
      podGroupPostFilter:
        disabled:
          - name: DefaultPreemption
      {{- end }}
    {{- end }}
    pluginConfig:
      {{- include "gpu-scheduler.builtinPluginConfig" . | nindent 6 }}
extenders:
  - urlPrefix: {{ if .Values.extender.tls }}https{{ else }}http{{ end }}://gpu-scheduler-extender.{{ .Release.Namespace }}.svc:8888
    filterVerb: filter
    prioritizeVerb: prioritize
    preemptVerb: preempt
    weight: 10
    enableHTTPS: {{ .Values.extender.tls }}
    {{- if .Values.extender.tls }}
    tlsConfig:
      certFile: /etc/gpu-scheduler/tls/tls.crt
      keyFile: /etc/gpu-scheduler/tls/tls.key
      caFile: /etc/gpu-scheduler/tls/ca.crt
    {{- end }}
    httpTimeout: 5s
    nodeCacheCapable: true
    ignorable: false
  {{- with .Values.scheduler.profile.extraExtenders }}
  {{- toYaml . | nindent 2 }}
  {{- end }}
{{- end }}

{{/* Whether the gpu-scheduler profile scores anything the extender's pick does not
account for (docs/concepts/policies.md, "One round trip a pod"): then the filter must
return every node that fits, so kube-scheduler weighs it. */}}
{{- define "gpu-scheduler.profileOverridesPick" -}}
{{- $p := .Values.scheduler.profile -}}
{{- if or $p.extraScorePlugins $p.systemDefaultSpreading $p.extraExtenders }}true{{ end -}}
{{- end }}

{{/* The extender's configuration file: extender.config, the pick off where the
profile would be overridden by it. */}}
{{- define "gpu-scheduler.extenderConfig" -}}
{{- $config := deepCopy .Values.extender.config -}}
{{- if include "gpu-scheduler.profileOverridesPick" . }}
{{- $_ := set $config "filterChooses" false -}}
{{- end }}
{{- toYaml $config }}
{{- end }}
