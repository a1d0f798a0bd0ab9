{{/*
Names, labels and the values checks shared by every template.
*/}}

{{- define "keyrange.name" -}}
{{- default .Chart.Name .Values.nameOverride | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{/*
"<release>-<chart>", or the release name alone when it already contains the chart name.
Truncated to 63 characters because some Kubernetes name fields are DNS labels.
*/}}
{{- define "keyrange.fullname" -}}
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

{{- define "keyrange.chart" -}}
{{- printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" | trunc 63 | trimSuffix "-" -}}
{{- end -}}

{{- define "keyrange.namespace" -}}
{{- .Release.Namespace -}}
{{- end -}}

{{- define "keyrange.selectorLabels" -}}
app.kubernetes.io/name: {{ include "keyrange.name" . }}
app.kubernetes.io/instance: {{ .Release.Name }}
{{- end -}}

{{- define "keyrange.labels" -}}
helm.sh/chart: {{ include "keyrange.chart" . }}
{{ include "keyrange.selectorLabels" . }}
app.kubernetes.io/version: {{ .Values.image.tag | default .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
{{- with .Values.commonLabels }}
{{ toYaml . }}
{{- end }}
{{- end -}}

{{/*
The coordinator pods only: the migration Job and the test pod carry other components, so the
Service, PDB and NetworkPolicy never select them.
*/}}
{{- define "keyrange.coordinatorSelectorLabels" -}}
{{ include "keyrange.selectorLabels" . }}
app.kubernetes.io/component: coordinator
{{- end -}}

{{/*
The label a client pod carries to pass the NetworkPolicy when networkPolicy.allowExternal is false.
*/}}
{{- define "keyrange.clientLabel" -}}
{{ include "keyrange.fullname" . }}-client
{{- end -}}

{{- define "keyrange.serviceAccountName" -}}
{{- if .Values.serviceAccount.create -}}
{{- default (include "keyrange.fullname" .) .Values.serviceAccount.name -}}
{{- else -}}
{{- default "default" .Values.serviceAccount.name -}}
{{- end -}}
{{- end -}}

{{- define "keyrange.image" -}}
{{- if .Values.image.digest -}}
{{- printf "%s@%s" .Values.image.repository .Values.image.digest -}}
{{- else -}}
{{- printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "keyrange.secretName" -}}
{{- include "keyrange.fullname" . -}}
{{- end -}}

{{/*
Whether the chart makes its own Secret: for a database URL given in values, or for tokens
given in values or generated. "true" or "".
*/}}
{{- define "keyrange.createSecret" -}}
{{- if or .Values.database.url (not .Values.auth.existingSecret.name) -}}
true
{{- end -}}
{{- end -}}

{{/*
A random value that outlives upgrades: the one stored under key in the named Secret when the
cluster has it (`lookup`), a new one otherwise. Remembered for the rest of the render, so the
Secret and the checksum annotation of the pods that read it see the same value.
Called with (list $ secretName key length).
*/}}
{{- define "keyrange.persistentRandom" -}}
{{- $root := index . 0 -}}
{{- $secretName := index . 1 -}}
{{- $key := index . 2 -}}
{{- $cacheKey := printf "%s/%s" $secretName $key -}}
{{- if not (hasKey $root.Values "keyrangeGenerated") -}}
{{- $_ := set $root.Values "keyrangeGenerated" dict -}}
{{- end -}}
{{- $cache := $root.Values.keyrangeGenerated -}}
{{- if not (hasKey $cache $cacheKey) -}}
{{- $existing := lookup "v1" "Secret" (include "keyrange.namespace" $root) $secretName -}}
{{- $stored := "" -}}
{{- if and $existing (hasKey ($existing.data | default dict) $key) -}}
{{- $stored = index $existing.data $key | b64dec -}}
{{- end -}}
{{- $_ := set $cache $cacheKey ($stored | default (randAlphaNum (index . 3))) -}}
{{- end -}}
{{- index $cache $cacheKey -}}
{{- end -}}

{{/*
Whether the chart generates the tokens: none listed and no Secret of yours. "true" or "".
*/}}
{{- define "keyrange.generateTokens" -}}
{{- $auth := .Values.auth -}}
{{- if not (or $auth.existingSecret.name $auth.adminTokens $auth.clientTokens) -}}
true
{{- end -}}
{{- end -}}

{{/*
The admin tokens the chart's Secret holds: the listed ones, or one generated and kept.
*/}}
{{- define "keyrange.adminTokensJson" -}}
{{- if include "keyrange.generateTokens" . -}}
{{- list (include "keyrange.persistentRandom" (list . (include "keyrange.secretName" .) "admin-token" 40)) | toJson -}}
{{- else -}}
{{- .Values.auth.adminTokens | toJson -}}
{{- end -}}
{{- end -}}

{{/*
Where a plain admin token lives (for KEDA's TriggerAuthentication and NOTES.txt): the chart's
Secret under admin-token when the chart holds admin tokens, else worker.autoscaling.tokenSecret.
Returns "name/key", or "" when there is none.
*/}}
{{- define "keyrange.adminTokenRef" -}}
{{- $own := .Values.worker.autoscaling.tokenSecret -}}
{{- if $own.name -}}
{{- printf "%s/%s" $own.name $own.key -}}
{{- else if and (not .Values.auth.existingSecret.name) (or .Values.auth.adminTokens (include "keyrange.generateTokens" .)) -}}
{{- printf "%s/admin-token" (include "keyrange.secretName" .) -}}
{{- end -}}
{{- end -}}

{{/*
Where the worker's client token lives: worker.tokenSecret, or the client token the chart
generated. Returns "name/key", or "" when there is none.
*/}}
{{- define "keyrange.workerTokenRef" -}}
{{- $own := .Values.worker.tokenSecret -}}
{{- if $own.name -}}
{{- printf "%s/%s" $own.name $own.key -}}
{{- else if include "keyrange.generateTokens" . -}}
{{- printf "%s/worker-token" (include "keyrange.secretName" .) -}}
{{- end -}}
{{- end -}}

{{/*
The client tokens the chart's Secret holds: the listed ones, or, with generated tokens, one
for the worker Deployment (any group).
*/}}
{{- define "keyrange.clientTokensValue" -}}
{{- if include "keyrange.generateTokens" . -}}
{{- list (dict "token" (include "keyrange.persistentRandom" (list . (include "keyrange.secretName" .) "worker-token" 40)) "group_prefixes" list) | toJson -}}
{{- else -}}
{{- include "keyrange.clientTokensJson" . -}}
{{- end -}}
{{- end -}}

{{/*
No database given: the chart runs a single-replica Postgres beside the coordinator, for
trying Keyrange out (templates/postgresql.yaml). "true" or "".
*/}}
{{- define "keyrange.bundledPostgres" -}}
{{- $db := .Values.database -}}
{{- if not (or $db.url $db.existingSecret.name $db.secretParts.name) -}}
true
{{- end -}}
{{- end -}}

{{- define "keyrange.workerName" -}}
{{- printf "%s-worker" (include "keyrange.fullname" . | trunc 56 | trimSuffix "-") -}}
{{- end -}}

{{- define "keyrange.workerSelectorLabels" -}}
{{ include "keyrange.selectorLabels" . }}
app.kubernetes.io/component: worker
{{- end -}}

{{/* The worker image: worker.image.repository, or the coordinator's image (it has the SDK). */}}
{{- define "keyrange.workerImage" -}}
{{- $image := .Values.worker.image -}}
{{- if not $image.repository -}}
{{- include "keyrange.image" . -}}
{{- else if $image.digest -}}
{{- printf "%s@%s" $image.repository $image.digest -}}
{{- else -}}
{{- printf "%s:%s" $image.repository ($image.tag | default .Chart.AppVersion) -}}
{{- end -}}
{{- end -}}

{{- define "keyrange.postgresqlName" -}}
{{- printf "%s-postgresql" (include "keyrange.fullname" . | trunc 52 | trimSuffix "-") -}}
{{- end -}}

{{- define "keyrange.postgresqlSelectorLabels" -}}
{{ include "keyrange.selectorLabels" . }}
app.kubernetes.io/component: postgresql
{{- end -}}

{{/*
KEYRANGE_DATABASE_URL from one of four sources:
- none given: the bundled Postgres, its generated password in a Secret of its own;
- database.url: a key of the chart's Secret;
- database.existingSecret: a key of a Secret you manage (a managed database, Vault, ...);
- database.secretParts: fields of a Secret such as CloudNativePG's "<cluster>-app", composed
  into the URL with Kubernetes' $(VAR) expansion. The PG* names are libpq's own, so they mean
  the same thing to anyone reading the pod spec.
*/}}
{{- define "keyrange.databaseEnv" -}}
{{- $db := .Values.database -}}
{{- if include "keyrange.bundledPostgres" . }}
{{- $pg := .Values.postgresql }}
- name: PGPASSWORD
  valueFrom:
    secretKeyRef:
      name: {{ include "keyrange.postgresqlName" . }}
      key: password
- name: KEYRANGE_DATABASE_URL
  value: {{ printf "postgresql+asyncpg://%s:$(PGPASSWORD)@%s:5432/%s" $pg.username (include "keyrange.postgresqlName" .) $pg.database | quote }}
{{- else if $db.url }}
- name: KEYRANGE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ include "keyrange.secretName" . }}
      key: database-url
{{- else if $db.existingSecret.name }}
- name: KEYRANGE_DATABASE_URL
  valueFrom:
    secretKeyRef:
      name: {{ $db.existingSecret.name }}
      key: {{ $db.existingSecret.key }}
{{- else if $db.secretParts.name }}
{{- $parts := $db.secretParts }}
{{- range $env, $key := dict "PGHOST" $parts.hostKey "PGPORT" $parts.portKey "PGUSER" $parts.usernameKey "PGPASSWORD" $parts.passwordKey "PGDATABASE" $parts.databaseKey }}
- name: {{ $env }}
  valueFrom:
    secretKeyRef:
      name: {{ $parts.name }}
      key: {{ $key }}
{{- end }}
- name: KEYRANGE_DATABASE_URL
  value: {{ printf "postgresql+asyncpg://$(PGUSER):$(PGPASSWORD)@$(PGHOST):$(PGPORT)/$(PGDATABASE)%s" (ternary (printf "?%s" $parts.query) "" (ne $parts.query "")) | quote }}
{{- end }}
{{- end -}}

{{- define "keyrange.tokenEnv" -}}
{{- $auth := .Values.auth -}}
{{- if $auth.existingSecret.name }}
- name: KEYRANGE_ADMIN_TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ $auth.existingSecret.name }}
      key: {{ $auth.existingSecret.adminTokensKey }}
      optional: true
- name: KEYRANGE_CLIENT_TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ $auth.existingSecret.name }}
      key: {{ $auth.existingSecret.clientTokensKey }}
      optional: true
{{- else }}
- name: KEYRANGE_ADMIN_TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ include "keyrange.secretName" . }}
      key: admin-tokens
- name: KEYRANGE_CLIENT_TOKENS
  valueFrom:
    secretKeyRef:
      name: {{ include "keyrange.secretName" . }}
      key: client-tokens
{{- end }}
{{- end -}}

{{/*
The tokens in the JSON shapes KEYRANGE_ADMIN_TOKENS and KEYRANGE_CLIENT_TOKENS expect.
*/}}
{{- define "keyrange.clientTokensJson" -}}
{{- $tokens := list -}}
{{- range .Values.auth.clientTokens -}}
{{- $tokens = append $tokens (dict "token" .token "group_prefixes" (.groupPrefixes | default list)) -}}
{{- end -}}
{{- toJson $tokens -}}
{{- end -}}

{{/*
Pod volume and mount for /tmp: the only writable path under a read-only root filesystem.
*/}}
{{- define "keyrange.tmpVolume" -}}
- name: tmp
  emptyDir:
    sizeLimit: {{ .Values.tmpVolumeSizeLimit }}
{{- end -}}

{{- define "keyrange.tmpVolumeMount" -}}
- name: tmp
  mountPath: /tmp
{{- end -}}

{{/*
Every check the schema cannot express. All messages are gathered first and reported in one
failure, so a broken values file is fixed in one pass instead of one error per `helm install`.
*/}}
{{- define "keyrange.validateValues" -}}
{{- $messages := list -}}
{{- $messages = append $messages (include "keyrange.validateValues.database" .) -}}
{{- $messages = append $messages (include "keyrange.validateValues.kafka" .) -}}
{{- $messages = append $messages (include "keyrange.validateValues.auth" .) -}}
{{- $messages = append $messages (include "keyrange.validateValues.sessionTimeouts" .) -}}
{{- $messages = append $messages (include "keyrange.validateValues.pdb" .) -}}
{{- $messages = append $messages (include "keyrange.validateValues.autoscaling" .) -}}
{{- $messages = append $messages (include "keyrange.validateValues.networkPolicy" .) -}}
{{- $messages = append $messages (include "keyrange.validateValues.shutdown" .) -}}
{{- $messages = append $messages (include "keyrange.validateValues.worker" .) -}}
{{- $messages = without $messages "" -}}
{{- if $messages -}}
{{- printf "\nVALUES VALIDATION:\n%s" (join "\n" $messages) | fail -}}
{{- end -}}
{{- end -}}

{{- define "keyrange.validateValues.database" -}}
{{- $db := .Values.database -}}
{{- $sources := 0 -}}
{{- range (list $db.url $db.existingSecret.name $db.secretParts.name) -}}
{{- if . -}}{{- $sources = add1 $sources -}}{{- end -}}
{{- end -}}
{{- if gt $sources 1 -}}
database: set only one of database.url, database.existingSecret.name and database.secretParts.name.
{{- else if and $db.url (not (hasPrefix "postgresql+asyncpg://" $db.url)) -}}
database.url: must start with postgresql+asyncpg:// (the coordinator uses the asyncpg driver).
{{- end -}}
{{- end -}}

{{- define "keyrange.validateValues.kafka" -}}
{{- $kafka := .Values.kafka -}}
{{- $tlsProtocol := has $kafka.securityProtocol (list "SSL" "SASL_SSL") -}}
{{- $saslProtocol := has $kafka.securityProtocol (list "SASL_PLAINTEXT" "SASL_SSL") -}}
{{- $messages := list -}}
{{- if not $kafka.bootstrapServers -}}
{{- $messages = append $messages "kafka.bootstrapServers: required (host:port[,host:port...]); the coordinator reads partition counts and high watermarks from the cluster." -}}
{{- end -}}
{{- if and $kafka.tls.existingSecret (not $tlsProtocol) -}}
{{- $messages = append $messages "kafka.tls.existingSecret: set, but kafka.securityProtocol does not use TLS (use SSL or SASL_SSL)." -}}
{{- end -}}
{{- if ne (empty $kafka.tls.certKey) (empty $kafka.tls.keyKey) -}}
{{- $messages = append $messages "kafka.tls.certKey and kafka.tls.keyKey: set both (mutual TLS) or neither." -}}
{{- end -}}
{{- if and $saslProtocol (not (and $kafka.sasl.mechanism $kafka.sasl.username $kafka.sasl.existingSecret.name)) -}}
{{- $messages = append $messages (printf "kafka.sasl: %s needs kafka.sasl.mechanism, kafka.sasl.username and kafka.sasl.existingSecret.name (the Secret holding the password)." $kafka.securityProtocol) -}}
{{- end -}}
{{- if and (not $saslProtocol) (or $kafka.sasl.mechanism $kafka.sasl.existingSecret.name) -}}
{{- $messages = append $messages "kafka.sasl: set, but kafka.securityProtocol does not use SASL (use SASL_PLAINTEXT or SASL_SSL)." -}}
{{- end -}}
{{- join "\n" $messages -}}
{{- end -}}

{{/*
The Kafka security settings (docs/kafka-security.md) as "NAME: value" lines, each name the
given prefix plus the coordinator's setting name: KEYRANGE_KAFKA_ for the coordinator's
ConfigMap, KEYRANGE_WORKER_KAFKA_ for the worker. Only what differs from the defaults
(PLAINTEXT); the SASL password never appears here, it comes from its Secret.
Called with (list $ prefix).
*/}}
{{- define "keyrange.kafkaSecuritySettings" -}}
{{- $root := index . 0 -}}
{{- $prefix := index . 1 -}}
{{- $kafka := $root.Values.kafka -}}
{{- $dir := include "keyrange.kafkaTlsDir" $root -}}
{{- $settings := dict -}}
{{- if ne $kafka.securityProtocol "PLAINTEXT" -}}
{{- $_ := set $settings "SECURITY_PROTOCOL" $kafka.securityProtocol -}}
{{- end -}}
{{- if has $kafka.securityProtocol (list "SSL" "SASL_SSL") -}}
{{- with $kafka.tls -}}
{{- if and .existingSecret .caKey -}}
{{- $_ := set $settings "SSL_CAFILE" (printf "%s/%s" $dir .caKey) -}}
{{- end -}}
{{- if and .existingSecret .certKey -}}
{{- $_ := set $settings "SSL_CERTFILE" (printf "%s/%s" $dir .certKey) -}}
{{- $_ := set $settings "SSL_KEYFILE" (printf "%s/%s" $dir .keyKey) -}}
{{- end -}}
{{- $_ := set $settings "SSL_CHECK_HOSTNAME" (toString .checkHostname) -}}
{{- end -}}
{{- end -}}
{{- if $kafka.sasl.mechanism -}}
{{- $_ := set $settings "SASL_MECHANISM" $kafka.sasl.mechanism -}}
{{- $_ := set $settings "SASL_USERNAME" $kafka.sasl.username -}}
{{- end -}}
{{- range $name, $value := $settings }}
{{ printf "%s%s" $prefix $name }}: {{ $value | quote }}
{{- end -}}
{{- end -}}

{{/* The SASL password from its Secret, as <prefix>SASL_PASSWORD. Called with (list $ prefix). */}}
{{- define "keyrange.kafkaSaslPasswordEnv" -}}
{{- with (index . 0).Values.kafka.sasl.existingSecret -}}
{{- if .name -}}
- name: {{ printf "%sSASL_PASSWORD" (index $ 1) }}
  valueFrom:
    secretKeyRef:
      name: {{ .name }}
      key: {{ .passwordKey }}
{{- end -}}
{{- end -}}
{{- end -}}

{{/* The Kafka TLS Secret as a pod volume and its read-only mount. */}}
{{- define "keyrange.kafkaTlsVolume" -}}
{{- with .Values.kafka.tls.existingSecret -}}
- name: kafka-tls
  secret:
    secretName: {{ . }}
    defaultMode: 0440
{{- end -}}
{{- end -}}

{{- define "keyrange.kafkaTlsVolumeMount" -}}
{{- if .Values.kafka.tls.existingSecret -}}
- name: kafka-tls
  mountPath: {{ include "keyrange.kafkaTlsDir" . }}
  readOnly: true
{{- end -}}
{{- end -}}

{{/* Where the Kafka TLS Secret is mounted. */}}
{{- define "keyrange.kafkaTlsDir" -}}
/etc/keyrange/kafka-tls
{{- end -}}

{{- define "keyrange.validateValues.auth" -}}
{{- $auth := .Values.auth -}}
{{- $listed := or $auth.adminTokens $auth.clientTokens -}}
{{- if and $auth.existingSecret.name $listed -}}
auth: set either auth.existingSecret.name or auth.adminTokens/auth.clientTokens, not both.
{{- end -}}
{{- end -}}

{{- define "keyrange.validateValues.sessionTimeouts" -}}
{{- $config := .Values.config -}}
{{- if gt (int $config.sessionTimeoutMinMs) (int $config.sessionTimeoutMaxMs) -}}
config.sessionTimeoutMinMs: must not exceed config.sessionTimeoutMaxMs.
{{- end -}}
{{- end -}}

{{- define "keyrange.validateValues.pdb" -}}
{{- $pdb := .Values.pdb -}}
{{- if $pdb.enabled -}}
{{- $min := ne (toString $pdb.minAvailable) "" -}}
{{- $max := ne (toString $pdb.maxUnavailable) "" -}}
{{- if and $min $max -}}
pdb: set only one of pdb.minAvailable and pdb.maxUnavailable.
{{- else if not (or $min $max) -}}
pdb: set pdb.minAvailable or pdb.maxUnavailable.
{{- end -}}
{{- end -}}
{{- end -}}

{{- define "keyrange.validateValues.autoscaling" -}}
{{- $hpa := .Values.autoscaling -}}
{{- if and $hpa.enabled (gt (int $hpa.minReplicas) (int $hpa.maxReplicas)) -}}
autoscaling.minReplicas: must not exceed autoscaling.maxReplicas.
{{- end -}}
{{- end -}}

{{- define "keyrange.validateValues.networkPolicy" -}}
{{- $np := .Values.networkPolicy -}}
{{- if and $np.enabled (not $np.allowExternalEgress) (not $np.extraEgress) -}}
networkPolicy.extraEgress: with allowExternalEgress false, add egress rules for Postgres and Kafka, or the coordinator cannot reach either.
{{- end -}}
{{- end -}}

{{- define "keyrange.validateValues.shutdown" -}}
{{- if le (int .Values.terminationGracePeriodSeconds) (int .Values.preStopSleepSeconds) -}}
terminationGracePeriodSeconds: must exceed preStopSleepSeconds, or pods are killed before uvicorn can finish in-flight requests.
{{- end -}}
{{- end -}}

{{- define "keyrange.validateValues.worker" -}}
{{- $worker := .Values.worker -}}
{{- $messages := list -}}
{{- if $worker.enabled -}}
{{- if not $worker.target -}}
{{- $messages = append $messages "worker.target: required with worker.enabled (module:Name of a WorkerTask class or a handler, as `keyrange worker` takes it)." -}}
{{- end -}}
{{- if not $worker.topics -}}
{{- $messages = append $messages "worker.topics: required with worker.enabled." -}}
{{- end -}}
{{- if not $worker.group -}}
{{- $messages = append $messages "worker.group: required with worker.enabled." -}}
{{- end -}}
{{- if not (include "keyrange.workerTokenRef" .) -}}
{{- $messages = append $messages "worker.tokenSecret.name: required when tokens are given: a Secret holding a client token allowed for worker.group." -}}
{{- end -}}
{{- $scaling := $worker.autoscaling -}}
{{- if $scaling.enabled -}}
{{- if gt (int $scaling.minReplicas) (int $scaling.maxReplicas) -}}
{{- $messages = append $messages "worker.autoscaling.minReplicas: must not exceed worker.autoscaling.maxReplicas." -}}
{{- end -}}
{{- if not (include "keyrange.adminTokenRef" .) -}}
{{- $messages = append $messages "worker.autoscaling.tokenSecret.name: required with auth.existingSecret or without admin tokens: a Secret holding one plain admin token, which KEDA presents to the coordinator." -}}
{{- end -}}
{{- end -}}
{{- end -}}
{{- join "\n" $messages -}}
{{- end -}}
