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

{{/* An image reference: repository@digest when a digest is given (the tag is then left out), else
repository:tag, the tag defaulting to the chart's appVersion. */}}
{{- define "kuberl.imageRef" -}}
{{- if .image.digest -}}
{{- printf "%s@%s" .image.repository .image.digest -}}
{{- else -}}
{{- printf "%s:%s" .image.repository (default .appVersion .image.tag) -}}
{{- end -}}
{{- end -}}

{{- define "kuberl.image" -}}
{{- include "kuberl.imageRef" (dict "image" .Values.image "appVersion" .Chart.AppVersion) -}}
{{- end -}}

{{- define "kuberl.runtimeImage" -}}
{{- include "kuberl.imageRef" (dict "image" .Values.runtimeImage "appVersion" .Chart.AppVersion) -}}
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
    operator writes status through the status subresource (patch). It never GETs: it reads from its cache.
    It deletes a finished job past its spec.ttlSecondsAfterFinished (an admission policy holds it to those).
  - pods: kopf indexes and watches them (list, watch, label-selected); worker pods of a failed role are
    deleted so the role restarts as a gang. With gangScheduling, patch: the operator lifts its scheduling
    gate from a job's pods (an admission policy holds the patch to that), and lists every pod of the cluster
    (cluster-wide, below) to learn each node's free capacity.
  - what a job owns (ServiceAccount, Role, RoleBinding, ConfigMaps, RayCluster, Job, claim templates):
    indexed from watches (list, watch, label-selected), so the operator reads them from memory (adopt,
    never duplicate); create, patch (owner references, spec ConfigMap), delete (suspend, deletion).
  - secrets: create only. The operator makes each job's Ray token Secret and never reads, changes or
    deletes one (garbage collection removes it with its job), so it cannot read any Secret of the cluster.
  - events: kopf and the operator post Events (create).
Creating the driver's Role needs no escalate/bind: the operator holds what it grants (configmaps get, patch):
the one verb it holds only to grant it is configmaps get.
*/}}
{{- define "kuberl.namespacedRules" -}}
- apiGroups: [kuberl.io]
  resources: [rltrainingjobs]
  verbs: [list, watch, patch, delete]
- apiGroups: [kuberl.io]
  resources: [rltrainingjobs/status]
  verbs: [patch]
- apiGroups: [""]
  resources: [pods]
  verbs: [list, watch, delete{{ if .Values.gangScheduling.enabled }}, patch{{ end }}]
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch, create, patch, delete]
- apiGroups: [""]
  resources: [secrets]
  verbs: [create]
- apiGroups: [""]
  resources: [serviceaccounts]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [batch]
  resources: [jobs]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [rbac.authorization.k8s.io]
  resources: [roles, rolebindings]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [ray.io]
  resources: [rayclusters]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [resource.k8s.io]
  resources: [resourceclaimtemplates]
  verbs: [list, watch, create, patch, delete]
- apiGroups: [networking.k8s.io]
  resources: [networkpolicies]
  verbs: [create]
- apiGroups: [""]
  resources: [events]
  verbs: [create]
{{- end -}}

{{/*
Cluster-scoped reads kopf makes: CRDs (to notice the RLTrainingJob CRD appear or change) and, when it
watches a list of namespaces, namespaces (to notice them appear). With gangScheduling, the nodes and every
pod (list): a job's gang is let through when it fits what the nodes have free, whoever's pods hold the rest.
*/}}
{{- define "kuberl.clusterRules" -}}
- apiGroups: [apiextensions.k8s.io]
  resources: [customresourcedefinitions]
  verbs: [list, watch]
{{- if .Values.gangScheduling.enabled }}
- apiGroups: [""]
  resources: [nodes]
  verbs: [list]
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: [pods]
  verbs: [list]
{{- end }}
{{- end }}
{{- if .Values.watchNamespaces }}
- apiGroups: [""]
  resources: [namespaces]
  verbs: [list, watch]
{{- end }}
{{- end -}}

{{/*
The operator policies' rules on the pods a Job or RayCluster it makes would run: CEL over
variables.specs (the pod specs) and variables.containers (their containers and init containers).
*/}}
{{- define "kuberl.podSpecRules" -}}
- expression: >-
    variables.specs.all(s, !(has(s.hostNetwork) && s.hostNetwork) && !(has(s.hostPID) && s.hostPID) &&
    !(has(s.hostIPC) && s.hostIPC))
  message: the kuberl operator's pods do not share the host's network, PID or IPC namespace
  reason: Forbidden
- expression: >-
    variables.specs.all(s, !has(s.volumes) || s.volumes.all(v, !has(v.hostPath) &&
    (!has(v.projected) || (variables.apiToken && v.projected.sources.all(p,
    (has(p.serviceAccountToken) && !has(p.serviceAccountToken.audience)) ||
    (has(p.configMap) && p.configMap.name == 'kube-root-ca.crt') || has(p.downwardAPI)))) &&
    (!has(v.secret) || v.secret.secretName == variables.token)))
  messageExpression: >-
    'the kuberl operator\'s pods mount no host path, no Secret but ' + variables.token + ', and no projected volume' +
    (variables.apiToken ? ' but the pod\'s own API token (its ServiceAccount token, the cluster CA, the namespace)' : '')
  reason: Forbidden
- expression: >-
    variables.containers.all(c, !(has(c.securityContext) && has(c.securityContext.privileged) &&
    c.securityContext.privileged) && (!has(c.env) || c.env.all(e, !has(e.valueFrom) ||
    !has(e.valueFrom.secretKeyRef) || e.valueFrom.secretKeyRef.name == variables.token ||
    (e.name in ['HF_TOKEN', 'WANDB_API_KEY', 'MLFLOW_TRACKING_TOKEN']
    {{- with .Values.jobPolicy.allowedCredentialSecrets }} && e.valueFrom.secretKeyRef.name in {{ include "kuberl.celList" . }}{{ end }}))) &&
    (!has(c.envFrom) || c.envFrom.all(e, !has(e.secretRef))))
  messageExpression: >-
    'the kuberl operator\'s containers are not privileged and read no Secret but ' + variables.token +
    ' and the job\'s credentials (HF_TOKEN, WANDB_API_KEY, MLFLOW_TRACKING_TOKEN{{ with .Values.jobPolicy.allowedCredentialSecrets }} from {{ join ", " . }}{{ end }})'
  reason: Forbidden
{{- end -}}

{{/* A list of strings as a CEL list literal: ['a', 'b']. */}}
{{- define "kuberl.celList" -}}
[{{ range $i, $v := . }}{{ if $i }}, {{ end }}'{{ $v }}'{{ end }}]
{{- end -}}
