{{/* Chart name, truncated to the DNS label limit. */}}
{{- define "faultmesh.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/* Full name: <release>-<chart> unless the release name already contains the chart name. */}}
{{- define "faultmesh.fullname" -}}
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

{{- define "faultmesh.labels" -}}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
app.kubernetes.io/name: {{ include "faultmesh.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/* Selector labels; pass (dict "root" $ "component" "clusterd"). */}}
{{- define "faultmesh.selectorLabels" -}}
app.kubernetes.io/name: {{ include "faultmesh.name" .root }}
app.kubernetes.io/instance: {{ .root.Release.Name }}
app.kubernetes.io/component: {{ .component }}
{{- end -}}

{{- define "faultmesh.image" -}}
{{- printf "%s:%s" .Values.image.repository (default .Chart.AppVersion .Values.image.tag) -}}
{{- end -}}

{{- define "faultmesh.clusterdServiceName" -}}
{{- default (printf "%s-clusterd" (include "faultmesh.fullname" .)) .Values.clusterd.serviceName -}}
{{- end -}}

{{/* host:port the agents dial. */}}
{{- define "faultmesh.clusterdAddr" -}}
{{- printf "%s.%s.svc:%d" (include "faultmesh.clusterdServiceName" .) .Release.Namespace (int .Values.clusterd.grpcPort) -}}
{{- end -}}

{{- define "faultmesh.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (printf "%s-clusterd" (include "faultmesh.fullname" .)) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{/* The Secret (key `token`) of the bearer token between the components: clusterd.tokenSecret,
else the one the chart generates (security.generateToken, with clusterd in this release); "" when
no token is used. */}}
{{- define "faultmesh.tokenSecretName" -}}
{{- if .Values.clusterd.tokenSecret -}}
{{- .Values.clusterd.tokenSecret -}}
{{- else if and .Values.security.generateToken .Values.clusterd.enabled -}}
{{- printf "%s-token" (include "faultmesh.fullname" .) -}}
{{- end -}}
{{- end -}}

{{- define "faultmesh.bmcSecretName" -}}
{{- default (printf "%s-bmc" (include "faultmesh.fullname" .)) .Values.noded.bmc.existingSecret -}}
{{- end -}}

{{/* clusterd requests/limits per cluster size. Measured by bench/clusterd_scale.py (clusterd RSS
with every node connected and cluster-info published: 1k 169 MiB, 4k 337 MiB, 16k 1007 MiB; steady
CPU under 0.05 cores): requests = 1.5x RSS, limits = 3x; see docs/deploy.md "Sizing clusterd". */}}
{{- define "faultmesh.clusterdResources" -}}
{{- $presets := dict
  "1k" (dict "requests" (dict "cpu" "100m" "memory" "256Mi") "limits" (dict "cpu" "1" "memory" "512Mi"))
  "4k" (dict "requests" (dict "cpu" "250m" "memory" "512Mi") "limits" (dict "cpu" "2" "memory" "1Gi"))
  "16k" (dict "requests" (dict "cpu" "500m" "memory" "1536Mi") "limits" (dict "cpu" "4" "memory" "3Gi")) -}}
{{- if eq .Values.clusterd.scale "custom" -}}
{{- toYaml .Values.clusterd.resources -}}
{{- else -}}
{{- toYaml (mergeOverwrite (deepCopy (get $presets .Values.clusterd.scale)) .Values.clusterd.resources) -}}
{{- end -}}
{{- end -}}

{{/* Daemon config file (YAML keys are flag names); pass (dict "cfg" map). */}}
{{- define "faultmesh.daemonConfig" -}}
{{- if .cfg -}}
{{- toYaml .cfg -}}
{{- else -}}
{}
{{- end -}}
{{- end -}}

{{/* Fault-table file -> "service flag" (the daemon that reads it and with which flag). */}}
{{- define "faultmesh.tableFlagMap" -}}
NodeDConfiguration.json: "noded --levels-file"
faultCode.json: "deviced --fault-code-file"
faultCustomization.json: "deviced --fault-customization-file"
SwitchFaultCode.json: "deviced --switch-fault-code-file"
relationFaultCustomization.json: "deviced --relation-fault-file"
faultDuration.json: "deviced --fault-duration-file"
publicFaultConfiguration.json: "clusterd --public-fault-config"
{{- end -}}

{{/* Flags pointing a daemon at the tables given in .Values.faultTables; pass (dict "root" $ "service" "noded"). */}}
{{- define "faultmesh.tableFlags" -}}
{{- $map := include "faultmesh.tableFlagMap" .root | fromYaml -}}
{{- range $file := keys .root.Values.faultTables | sortAlpha }}
{{- $target := get $map $file }}
{{- if $target }}
{{- $parts := splitList " " $target }}
{{- if eq (index $parts 0) $.service }}
- {{ printf "%s=/etc/faultmesh/fault-tables/%s" (index $parts 1) $file }}
{{- end }}
{{- end }}
{{- end }}
{{- end -}}
