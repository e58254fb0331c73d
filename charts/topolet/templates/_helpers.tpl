{{/*
The objects of the chart come from the copies of daemonset/'s files under files/ (tests/chart/
chart_files.py keeps them equal to the originals): each is read, parsed, and given the release's
namespace and the standard labels; the templates then change only what a value asks for.
*/}}

{{/* Standard labels of every object. */}}
{{- define "topolet.labels" -}}
app.kubernetes.io/name: topolet
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/part-of: topolet
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end }}

{{/* The image reference: repository@digest when a digest is set, else repository:tag. The image
has no default: one nobody pushed would install "successfully" and never pull. */}}
{{- define "topolet.image" -}}
{{- if not .Values.image.repository -}}
{{- fail "image.repository is not set: push topolet's image (make image-push REGISTRY=registry.example.com/team prints the --set flags) and install with --set image.repository=<registry>/topolet --set image.digest=<digest>" -}}
{{- end -}}
{{- if .Values.image.digest -}}
{{ .Values.image.repository }}@{{ .Values.image.digest }}
{{- else -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}
{{- end }}

{{/*
The objects of one file under files/, as YAML `{objects: [...]}` (fromYaml it): every document
with a kind, its namespace (where the file gives one) and its ServiceAccount subjects' namespaces set
to the release's, the standard labels added, and the user names the admission policies match
(system:serviceaccount:topolet-system:...) moved to the release's namespace.
Argument: (list $ "path under files/").
*/}}
{{- define "topolet.fileObjects" -}}
{{- $root := index . 0 -}}
{{- $path := index . 1 -}}
{{- $text := $root.Files.Get (printf "files/%s" $path) -}}
{{- if not $text }}{{ fail (printf "chart file files/%s is missing" $path) }}{{ end -}}
{{- $text = replace "system:serviceaccount:topolet-system:" (printf "system:serviceaccount:%s:" $root.Release.Namespace) $text -}}
{{- $standard := include "topolet.labels" $root | fromYaml -}}
{{- $objects := list -}}
{{- range $doc := regexSplit "(?m)^---[ \t]*$" $text -1 -}}
{{- $obj := fromYaml $doc -}}
{{- if hasKey $obj "Error" }}{{ fail (printf "files/%s: %s" $path $obj.Error) }}{{ end -}}
{{- if $obj.kind -}}
{{- if hasKey $obj.metadata "namespace" -}}
{{- $_ := set $obj.metadata "namespace" $root.Release.Namespace -}}
{{- end -}}
{{- $_ := set $obj.metadata "labels" (mustMergeOverwrite (dict) $standard ($obj.metadata.labels | default dict)) -}}
{{- range $subject := $obj.subjects | default list -}}
{{- if and (eq $subject.kind "ServiceAccount") (hasKey $subject "namespace") -}}
{{- $_ := set $subject "namespace" $root.Release.Namespace -}}
{{- end -}}
{{- end -}}
{{- $objects = append $objects $obj -}}
{{- end -}}
{{- end -}}
{{- toYaml (dict "objects" $objects) -}}
{{- end }}

{{/* Every object of a file under files/, unchanged but for topolet.fileObjects. Argument: (list $ path). */}}
{{- define "topolet.file" -}}
{{- range $obj := (include "topolet.fileObjects" . | fromYaml).objects }}
---
{{ toYaml $obj }}
{{- end }}
{{- end }}

{{/* The one object of KIND in a file under files/. Argument: (list $ path kind); YAML, fromYaml it. */}}
{{- define "topolet.fileObject" -}}
{{- $found := list -}}
{{- range $obj := (include "topolet.fileObjects" (list (index . 0) (index . 1)) | fromYaml).objects -}}
{{- if eq $obj.kind (index $ 2) }}{{ $found = append $found $obj }}{{ end -}}
{{- end -}}
{{- if ne (len $found) 1 }}{{ fail (printf "files/%s: %d objects of kind %s, want 1" (index . 1) (len $found) (index . 2)) }}{{ end -}}
{{- toYaml (first $found) -}}
{{- end }}

{{/* The pods' imagePullSecrets, as YAML `{secrets: [{name: ...}]}` (fromYaml it): image.pullSecrets,
then a parent chart's global.imagePullSecrets (names, or {name: ...} as some parents write them),
each name once. */}}
{{- define "topolet.imagePullSecrets" -}}
{{- $names := list -}}
{{- $global := (.Values.global | default dict).imagePullSecrets | default list -}}
{{- range $secret := concat (.Values.image.pullSecrets | default list) $global -}}
{{- $name := $secret -}}
{{- if kindIs "map" $secret }}{{ $name = $secret.name }}{{ end -}}
{{- $names = append $names $name -}}
{{- end -}}
{{- $secrets := list -}}
{{- range $name := uniq $names }}{{ $secrets = append $secrets (dict "name" $name) }}{{ end -}}
{{- toYaml (dict "secrets" $secrets) -}}
{{- end }}

{{/* Node affinity to the architectures the image is built for, joined with EXTRA's node affinity (may be empty). Argument: (list $ extra). */}}
{{- define "topolet.affinity" -}}
{{- $root := index . 0 -}}
{{- $affinity := deepCopy (index . 1 | default dict) -}}
{{- $arch := dict "key" "kubernetes.io/arch" "operator" "In" "values" $root.Values.architectures -}}
{{- $node := $affinity.nodeAffinity | default dict -}}
{{- $required := get $node "requiredDuringSchedulingIgnoredDuringExecution" | default dict -}}
{{- $terms := $required.nodeSelectorTerms | default (list (dict "matchExpressions" list)) -}}
{{- $joined := list -}}
{{- range $term := $terms -}}
{{- $joined = append $joined (set (deepCopy $term) "matchExpressions" (append ($term.matchExpressions | default list) $arch)) -}}
{{- end -}}
{{- $_ := set $required "nodeSelectorTerms" $joined -}}
{{- $_ = set $node "requiredDuringSchedulingIgnoredDuringExecution" $required -}}
{{- $_ = set $affinity "nodeAffinity" $node -}}
{{- toYaml $affinity -}}
{{- end }}

{{/*
A component's own pod values, applied in place to its pod `template` and `container` (renders
nothing): `extraEnv` appended (a name given twice would leave the env ambiguous, and server-side
apply refuses it), `podAnnotations` over the base's, and `podLabels`, never one of the chart's own
pod labels (they include the selector's: one changed would orphan the pods).
Argument: (list "agent"|"controller" values template container).
*/}}
{{- define "topolet.podValues" -}}
{{- $prefix := index . 0 -}}
{{- $values := index . 1 -}}
{{- $template := index . 2 -}}
{{- $container := index . 3 -}}
{{- $env := $container.env | default list -}}
{{- $chartSets := list -}}
{{- range $env }}{{ $chartSets = append $chartSets .name }}{{ end -}}
{{- range $var := $values.extraEnv -}}
{{- range $env }}{{ if eq .name $var.name }}{{ fail (printf "%s.extraEnv: %s is set twice (the chart sets %s)" $prefix $var.name (join " and " $chartSets)) }}{{ end }}{{ end -}}
{{- $env = append $env $var -}}
{{- end -}}
{{- $_ := set $container "env" $env -}}
{{- $_ = set $template.metadata "annotations" (merge (deepCopy ($values.podAnnotations | default dict)) ($template.metadata.annotations | default dict)) -}}
{{- range $key, $value := $values.podLabels -}}
{{- if hasKey $template.metadata.labels $key }}{{ fail (printf "%s.podLabels: %s is one of the chart's own pod labels (the selectors rely on them): remove it" $prefix $key) }}{{ end -}}
{{- $_ = set $template.metadata.labels $key $value -}}
{{- end -}}
{{- end }}

{{/*
"true" when the Prometheus Operator's KIND (PodMonitor, PrometheusRule) may be rendered: the API
server serves monitoring.coreos.com/v1 KIND, or no cluster is seen (`helm template`: rendered as
asked); "" otherwise. Argument: (list $ KIND).
*/}}
{{- define "topolet.operatorServes" -}}
{{- $root := index . 0 -}}
{{- if or (not (lookup "v1" "Namespace" "" "kube-system")) ($root.Capabilities.APIVersions.Has (printf "monitoring.coreos.com/v1/%s" (index . 1))) -}}
true
{{- end -}}
{{- end }}
