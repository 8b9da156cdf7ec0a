{{/* Chart name, overridable. */}}
{{- define "batchpilot.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" }}
{{- end }}

{{/* Resource-name prefix: "<release>-<chart>", or "<release>" when that already contains the chart name. */}}
{{- define "batchpilot.fullname" -}}
{{- if .Values.fullnameOverride }}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- $name := default .Chart.Name .Values.nameOverride }}
{{- if contains $name .Release.Name }}
{{- .Release.Name | trunc 63 | trimSuffix "-" }}
{{- else }}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" }}
{{- end }}
{{- end }}
{{- end }}

{{- define "batchpilot.selectorLabels" -}}
app.kubernetes.io/name: {{ include "batchpilot.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end }}

{{- define "batchpilot.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" }}
{{ include "batchpilot.selectorLabels" . }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: batchpilot
{{- end }}

{{- define "batchpilot.serviceAccountName" -}}
{{- if .Values.serviceAccount.create }}
{{- default (printf "%s-operator" (include "batchpilot.fullname" .)) .Values.serviceAccount.name }}
{{- else }}
{{- required "serviceAccount.name is required when serviceAccount.create is false" .Values.serviceAccount.name }}
{{- end }}
{{- end }}

{{/* "repository:tag" of an image block (call with dict "image" <block> "root" $); the tag defaults to appVersion. */}}
{{- define "batchpilot.image" -}}
{{- printf "%s:%s" .image.repository (default .root.Chart.AppVersion .image.tag) }}
{{- end }}

{{/* Every container: non-root (UID 10001, the images' user), read-only root fs, no privilege escalation, no capabilities. */}}
{{- define "batchpilot.containerSecurityContext" -}}
runAsNonRoot: true
runAsUser: 10001
runAsGroup: 10001
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: ["ALL"]
seccompProfile:
  type: RuntimeDefault
{{- end }}

{{/*
The operator's RBAC: exactly batchpilot.operator.rbac.OPERATOR_RULES (tests/chart/test_rbac.py compares them).
Namespaced resources go into the Role of a namespaced install; cluster-scoped ones only into the ClusterRole.
*/}}
{{- define "batchpilot.rules.namespaced" -}}
- apiGroups: ["batchpilot.io"]
  resources: ["batchedmodels"]
  verbs: ["get", "list", "watch", "patch"]
- apiGroups: ["batchpilot.io"]
  resources: ["batchedmodels/status"]
  verbs: ["patch"]
- apiGroups: ["serving.kserve.io"]
  resources: ["inferenceservices"]
  verbs: ["get", "list", "watch", "create", "patch", "delete"]
- apiGroups: [""]
  resources: ["events"]
  verbs: ["create"]
{{- end }}

{{- define "batchpilot.rules.clusterScoped" -}}
- apiGroups: ["apiextensions.k8s.io"]
  resources: ["customresourcedefinitions"]
  verbs: ["list", "watch"]
{{- end }}
