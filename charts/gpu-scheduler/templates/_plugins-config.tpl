{{/* deploy/scheduler/plugins/scheduler-config.yaml: the plugins path's profile. The
plugins take the extender's settings (extender.config), so one value changes both
paths: the weights gpu, scarcity, fragmentation, spot and group (zone, its old name), defaultPlacement,
heartbeatWindow, groupLevels; disabled drops SpotScheduler (spot), AZScheduler (group),
a score of GPUScheduler's (scarcity, fragmentation) or the heartbeat check (heartbeat); the agents' Leases are in the release's namespace. */}}
{{- define "gpu-scheduler.pluginsSchedulerConfig" -}}
{{- $config := .Values.extender.config -}}
{{- $weights := $config.weights | default dict -}}
{{- $disabled := list -}}
{{- range $config.disabled | default list -}}
{{- $disabled = append $disabled (ternary "group" . (eq . "zone")) -}}
{{- end -}}
{{- if has "gpu" $disabled -}}
{{- fail "extender.config.disabled names gpu, which the plugins path cannot switch off (GPUScheduler counts the GPUs): use scheduler.path extender" -}}
{{- end -}}
{{- $enabled := list -}}
{{- if not (has "spot" $disabled) -}}
{{- $enabled = append $enabled (dict "name" "SpotScheduler" "weight" (int (dig "spot" 5 $weights))) -}}
{{- end -}}
{{- /* GPUScheduler adds up three of the extender's scores (gpu, scarcity,
fragmentation) as their weighted mean: its weight in the profile is their sum. */ -}}
{{- $parts := dict -}}
{{- $sum := 0 -}}
{{- range $name, $default := dict "gpu" 5 "scarcity" 15 "fragmentation" 8 -}}
{{- $weight := ternary 0 (int (dig $name $default $weights)) (has $name $disabled) -}}
{{- $_ := set $parts $name $weight -}}
{{- $sum = add $sum $weight -}}
{{- end -}}
{{- $enabled = append $enabled (dict "name" "GPUScheduler" "weight" (max $sum 1)) -}}
{{- $group := not (has "group" $disabled) -}}
{{- if $group -}}
{{- /* zone, where given, wins over group, as in the extender (it reads the keys in
order, and the chart writes them sorted). */ -}}
{{- $enabled = append $enabled (dict "name" "AZScheduler" "weight" (int (dig "zone" (dig "group" 15 $weights) $weights))) -}}
{{- end -}}
{{- /* The extender reads plain seconds too (900); the plugins take a Go duration. */ -}}
{{- $window := $config.heartbeatWindow -}}
{{- if has "heartbeat" $disabled -}}
{{- $window = "0s" -}}
{{- else if and (kindIs "string" $window) (regexMatch "^[0-9]+(\\.[0-9]+)?$" $window) -}}
{{- $window = printf "%ss" $window -}}
{{- else if not (or (kindIs "string" $window) (kindIs "invalid" $window)) -}}
{{- $window = printf "%vs" $window -}}
{{- end -}}
{{- $args := dict "defaultPlacement" ($config.defaultPlacement | default "binpack") "namespace" .Release.Namespace "weights" $parts -}}
{{- if not (kindIs "invalid" $window) -}}
{{- $_ := set $args "heartbeatWindow" $window -}}
{{- end -}}
{{ include "gpu-scheduler.schedulerHead" . }}
profiles:
  - schedulerName: gpu-scheduler
    plugins:
      multiPoint:
        enabled:
          {{- toYaml $enabled | nindent 10 }}
          # DefaultPreemption with the extender's gang rule, in its place.
          - name: GangPreemption
        disabled:
          - name: DefaultPreemption
      {{- with .Values.scheduler.profile.extraScorePlugins }}
      score:
        enabled:
          {{- toYaml . | nindent 10 }}
      {{- end }}
    pluginConfig:
      - name: GPUScheduler
        args:
          {{- toYaml $args | nindent 10 }}
      {{- if $group }}
      - name: AZScheduler
        args:
          {{- with $config.groupLevels }}
          groupLevels:
            {{- toYaml . | nindent 12 }}
          {{- else }} {}
          {{- end }}
      {{- end }}
      {{- include "gpu-scheduler.builtinPluginConfig" . | nindent 6 }}
{{- with .Values.scheduler.profile.extraExtenders }}
extenders:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}
