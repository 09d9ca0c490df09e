{{/* Names and labels shared by the templates. */}}
{{- define "statetier.name" -}}
{{- .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "statetier.fullname" -}}
{{- if contains .Chart.Name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name .Chart.Name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}

{{- define "statetier.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{ include "statetier.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- end -}}

{{- define "statetier.selectorLabels" -}}
app.kubernetes.io/name: {{ include "statetier.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "statetier.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "statetier.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "statetier.webhookService" -}}
{{- printf "%s-webhook" (include "statetier.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "statetier.tlsSecret" -}}
{{- printf "%s-webhook-tls" (include "statetier.fullname" .) | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "statetier.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}
