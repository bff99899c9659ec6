{{- define "ctxpod.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "ctxpod.labels" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end -}}

{{- define "ctxpod.selector" -}}
app.kubernetes.io/name: {{ .Chart.Name }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: node
{{- end -}}

{{- define "ctxpod.peers" -}}{{ include "ctxpod.fullname" . }}-peers{{- end -}}
{{- define "ctxpod.etcd" -}}{{ include "ctxpod.fullname" . }}-etcd{{- end -}}
{{- define "ctxpod.kekSecret" -}}{{ .Values.kek.existingSecret | default (printf "%s-kek" (include "ctxpod.fullname" .)) }}{{- end -}}

{{/* etcd client URLs: the bundled StatefulSet's, or the external ones. */}}
{{- define "ctxpod.etcdEndpoints" -}}
{{- if .Values.etcd.bundled -}}
{{- $name := include "ctxpod.etcd" . -}}
{{- $list := list -}}
{{- range $i := until (int .Values.etcd.replicas) -}}
{{- $list = append $list (printf "http://%s-%d.%s.%s.svc:2379" $name $i $name $.Release.Namespace) -}}
{{- end -}}
{{- toJson $list -}}
{{- else -}}
{{- toJson .Values.etcd.endpoints -}}
{{- end -}}
{{- end -}}

{{- define "ctxpod.scheme" -}}{{ if .Values.tls.enabled }}https{{ else }}http{{ end }}{{- end -}}

{{/* "true" when each node takes its zone from its Kubernetes node's
  topology.kubernetes.io/zone label: pod.zoneFromNode, and no fixed pod.zone (which wins). */}}
{{- define "ctxpod.zoneFromNode" -}}{{ and .Values.pod.zoneFromNode (empty .Values.pod.zone) }}{{- end -}}
{{- define "ctxpod.zoneReader" -}}{{ printf "%s-%s-node-reader" (include "ctxpod.fullname" .) .Release.Namespace | trunc 63 | trimSuffix "-" }}{{- end -}}
{{/* The ctxpod.toml the node reads: the ConfigMap's, or its copy with the node's zone. */}}
{{- define "ctxpod.configFile" -}}
{{- if eq (include "ctxpod.zoneFromNode" .) "true" }}/etc/ctxpod/run/ctxpod.toml{{ else }}/etc/ctxpod/config/ctxpod.toml{{ end -}}
{{- end -}}
