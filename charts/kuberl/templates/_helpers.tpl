{{/* Names and labels shared by every template. */}}

{{- define "kuberl.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: the release name, unless it already contains the chart name. */}}
{{- define "kuberl.fullname" -}}
{{- if .Values.fullnameOverride -}}
{{- .Values.fullnameOverride | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- $name := default .Chart.Name .Values.nameOverride -}}
{{- if contains $name .Release.Name -}}
{{- .Release.Name | trunc 63 | trimSuffix "-" -}}
{{- else -}}
{{- printf "%s-%s" .Release.Name $name | trunc 63 | trimSuffix "-" -}}
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "kuberl.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Selector labels of the operator's pod (stable across upgrades: never add to them). */}}
{{- define "kuberl.selectorLabels" -}}
app.kubernetes.io/name: {{ include "kuberl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/component: operator
{{- end -}}

{{- define "kuberl.labels" -}}
helm.sh/chart: {{ include "kuberl.chart" . }}
app.kubernetes.io/name: {{ include "kuberl.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: kuberl
{{- end -}}

{{- define "kuberl.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "kuberl.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "kuberl.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "kuberl.runtimeImage" -}}
{{- printf "%s:%s" .Values.runtimeImage.repository (default .Chart.AppVersion .Values.runtimeImage.tag) -}}
{{- end -}}

{{/* Labels a prometheus-operator monitor needs: kube-prometheus-stack's `release` plus any extra. */}}
{{- define "kuberl.monitorLabels" -}}
{{- if .monitor.release }}
release: {{ .monitor.release | quote }}
{{- end }}
{{- with .monitor.labels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The namespaced permissions of the operator: exactly the verbs its code uses (tests/chart/test_rbac.py
derives them from operator/kuberl_operator and fails on any difference).
  - rltrainingjobs: kopf lists/watches them and patches finalizers and its annotations; the
    operator reads one (get) and writes status through the status subresource (patch).
  - pods, configmaps, batch jobs: kopf indexes and watches them (list, watch, label-selected);
    worker pods of a failed role are deleted so the role restarts as a gang.
  - what a job owns (ServiceAccount, Role, RoleBinding, Secret, ConfigMaps, RayCluster, Job):
    get before create (adopt, never duplicate), create, patch (owner references, spec ConfigMap),
    delete (suspend, deletion).
  - events: kopf and the operator post Events (create).
Creating the driver's Role needs no escalate/bind: the operator holds what it grants (configmaps get, patch).
*/}}
{{- define "kuberl.namespacedRules" -}}
- apiGroups: [kuberl.io]
  resources: [rltrainingjobs]
  verbs: [get, list, watch, patch]
- apiGroups: [kuberl.io]
  resources: [rltrainingjobs/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, delete]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [secrets, serviceaccounts]
  verbs: [get, create, patch, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [get, create, patch, delete]
- apiGroups: [ray.io]
  resources: [rayclusters]
  verbs: [get, create, patch, delete]
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates]
  verbs: [get, create, patch, delete]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/*
Cluster-scoped reads kopf makes: CRDs (to notice the RLTrainingJob CRD appear or change) and, when it
watches a list of namespaces, namespaces (to notice them appear).
*/}}
{{- define "kuberl.clusterRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- end -}}
