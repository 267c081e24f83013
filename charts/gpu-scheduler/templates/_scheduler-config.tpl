{{/* deploy/scheduler/scheduler-config.yaml, with the release's namespace and TLS choice. */}}
{{- define "gpu-scheduler.schedulerConfig" -}}
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
profiles:
  - schedulerName: gpu-scheduler
    pluginConfig:
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
          defaultingType: List
          defaultConstraints: []
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
{{- end }}
