{{/* Labels of every object: the same as the kustomize install's, plus Helm's own. */}}
{{- define "echorl.labels" -}}
app.kubernetes.io/part-of: echorl
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "echorl.operatorImage" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{/* The operator's --namespace options, or --all-namespaces. */}}
{{- define "echorl.scope" -}}
{{- if .Values.watchNamespaces -}}
{{- range .Values.watchNamespaces }}
- {{ printf "--namespace=%s" . | quote }}
{{- end }}
{{- else }}
- "--all-namespaces"
{{- end }}
{{- end -}}
