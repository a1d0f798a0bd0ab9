"""The Helm chart, rendered offline and checked object by object.

Rendering and linting go through helm-python-sdk, which binds Helm's own Go SDK (v4) through a
bundled shared library: the same template engine, schema check and linter as the `helm` CLI,
with no binary and no cluster. Every rendered object is validated against the Kubernetes
OpenAPI schemas shipped with kubernetes-validate (offline, strict: unknown fields fail).
"""

from __future__ import annotations

import argparse
import base64
import copy
import hashlib
import json
import os
import re
import urllib.parse
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import helm_python as helm
import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import latest_version
from sqlalchemy.engine import make_url

from coordinator.settings import Settings

CHART_DIR = Path(__file__).resolve().parents[2] / "helm" / "keyrange"
CI_VALUES_FILES = sorted((CHART_DIR / "ci").glob("*-values.yaml"))
PRODUCTION_VALUES_FILES = [path for path in CI_VALUES_FILES if path.stem != "one-value-values"]
RELEASE = "kr"
NAMESPACE = "streaming"
FULLNAME = "kr-keyrange"
# The oldest Kubernetes the chart claims (Chart.yaml kubeVersion) and the newest schema set
# kubernetes-validate ships: an API removed or added in between shows up in one of the two.
KUBE_VERSIONS = ("1.25.0", latest_version())
# Custom resources: their schemas live in the operator's CRDs, not in Kubernetes.
CUSTOM_KINDS = {
    ("monitoring.coreos.com/v1", "ServiceMonitor"),
    ("monitoring.coreos.com/v1", "PodMonitor"),
    ("monitoring.coreos.com/v1", "PrometheusRule"),
    ("keda.sh/v1alpha1", "ScaledObject"),
    ("keda.sh/v1alpha1", "TriggerAuthentication"),
}

Manifest = dict[str, Any]


# `helm install k helm/keyrange --set kafka.bootstrapServers=kafka:9092` (issue 18 item 5).
ONE_VALUE: dict[str, Any] = {"kafka": {"bootstrapServers": "kafka:9092"}}

WORKER_ON_KEDA: dict[str, Any] = {
    "enabled": True,
    "target": "billing:Billing",
    "topics": ["orders", "refunds"],
    "group": "billing",
    "tokenSecret": {"name": "billing-token", "key": "token"},
    "autoscaling": {"enabled": True, "minReplicas": 0, "maxReplicas": 40},
}

SASL_SSL: dict[str, Any] = {
    "securityProtocol": "SASL_SSL",
    "tls": {"existingSecret": "kafka-ca", "caKey": "ca.crt", "certKey": "", "keyKey": ""},
    "sasl": {
        "mechanism": "SCRAM-SHA-512",
        "username": "keyrange",
        "existingSecret": {"name": "kafka-user", "passwordKey": "password"},
    },
}


def minimal_values() -> dict[str, Any]:
    return {
        "database": {"url": "postgresql+asyncpg://keyrange:pw@db.internal:5432/keyrange"},
        "kafka": {"bootstrapServers": "kafka:9092"},
        "auth": {"adminTokens": ["admin-token-0123456789"]},
    }


def with_values(**sections: dict[str, Any]) -> dict[str, Any]:
    """Minimal values with some top-level sections deep-merged over them."""
    values = minimal_values()
    for key, patch in sections.items():
        base = values.setdefault(key, {})
        if isinstance(base, dict) and isinstance(patch, dict):
            base.update(copy.deepcopy(patch))
        else:
            values[key] = copy.deepcopy(patch)
    return values


@pytest.fixture(scope="module")
def chart() -> Iterator[helm.Chart]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


def render(chart: helm.Chart, values: dict[str, Any]) -> list[Manifest]:
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects: list[Manifest] = []
    for path, text in sorted(manifests.items()):
        if path.endswith("NOTES.txt"):
            continue
        objects.extend(doc for doc in yaml.safe_load_all(text) if doc)
    return objects


def render_notes(chart: helm.Chart, values: dict[str, Any]) -> str:
    manifests = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return manifests["keyrange/templates/NOTES.txt"]


def kinds(objects: list[Manifest]) -> set[str]:
    return {obj["kind"] for obj in objects}


def one(objects: list[Manifest], kind: str) -> Manifest:
    found = [obj for obj in objects if obj["kind"] == kind]
    assert len(found) == 1, f"expected one {kind}, found {[o['metadata']['name'] for o in found]}"
    return found[0]


def container(pod_owner: Manifest) -> Manifest:
    spec = (
        pod_owner["spec"] if pod_owner["kind"] == "Pod" else pod_owner["spec"]["template"]["spec"]
    )
    containers: list[Manifest] = spec["containers"]
    assert len(containers) == 1
    return containers[0]


def pod_spec(pod_owner: Manifest) -> Manifest:
    if pod_owner["kind"] == "Pod":
        return pod_owner["spec"]  # type: ignore[no-any-return]
    return pod_owner["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def env_of(pod_owner: Manifest) -> dict[str, Manifest]:
    return {entry["name"]: entry for entry in container(pod_owner).get("env", [])}


def named(objects: list[Manifest], kind: str, name: str) -> Manifest:
    found = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(found) == 1, f"expected {kind}/{name}, found {len(found)}"
    return found[0]


def render_error(chart: helm.Chart, values: dict[str, Any]) -> str:
    with pytest.raises(helm.HelmError) as caught:
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return str(caught.value)


# --- lint and Kubernetes schemas --------------------------------------------------------------


@pytest.mark.parametrize("values_file", CI_VALUES_FILES, ids=lambda p: p.stem)
def test_strict_lint_reports_no_warning_or_error(values_file: Path) -> None:
    values = yaml.safe_load(values_file.read_text())
    for kube_version in KUBE_VERSIONS:
        report = helm.lint(
            CHART_DIR, values, strict=True, namespace=NAMESPACE, kube_version=f"v{kube_version}"
        )
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert report["errors"] == [] and problems == [], report


def test_strict_lint_passes_with_workers_scaled_by_keda() -> None:
    for values in (with_values(worker=WORKER_ON_KEDA), {**ONE_VALUE, "worker": WORKER_ON_KEDA}):
        report = helm.lint(CHART_DIR, values, strict=True, namespace=NAMESPACE)
        problems = [m for m in report["messages"] if m["severity"] >= 2]
        assert report["errors"] == [] and problems == [], report


def every_values_set() -> list[Any]:
    """The CI values files plus one with every optional object switched on."""
    sets = [
        pytest.param(yaml.safe_load(path.read_text()), id=path.stem) for path in CI_VALUES_FILES
    ]
    everything = with_values(
        autoscaling={"enabled": True, "targetMemoryUtilizationPercentage": 80},
        serviceMonitor={"enabled": True, "labels": {"release": "prometheus"}},
        prometheusRule={"enabled": True, "labels": {"release": "prometheus"}},
        grafanaDashboard={"enabled": True, "folder": "Kafka"},
        networkPolicy={
            "allowExternal": False,
            "allowExternalEgress": False,
            "extraEgress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}],
            "extraIngress": [
                {"from": [{"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}]}
            ],
        },
        pdb={"maxUnavailable": "", "minAvailable": "50%"},
        image={"digest": "sha256:" + "a" * 64},
        imagePullSecrets=["registry"],
        extraEnv=[{"name": "KEYRANGE_DEFAULT_ASSIGNOR", "value": "range"}],
        commonLabels={"team": "streaming"},
        commonAnnotations={"owner": "streaming"},
        podAnnotations={"example.com/scrape": "true"},
        tolerations=[{"key": "dedicated", "operator": "Equal", "value": "kafka"}],
        topologySpreadConstraints=[
            {
                "maxSkew": 1,
                "topologyKey": "topology.kubernetes.io/zone",
                "whenUnsatisfiable": "ScheduleAnyway",
                "labelSelector": {"matchLabels": {"app.kubernetes.io/name": "keyrange"}},
            }
        ],
        priorityClassName="high",
    )
    sets.append(pytest.param(everything, id="everything-on"))
    sets.append(pytest.param(ONE_VALUE, id="one-value"))
    sets.append(pytest.param(with_values(worker=WORKER_ON_KEDA), id="worker-on-keda"))
    locked_down = {
        **ONE_VALUE,
        "networkPolicy": {
            "allowExternal": False,
            "allowExternalEgress": False,
            "extraEgress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}],
        },
        "worker": WORKER_ON_KEDA,
        "kafka": {**SASL_SSL, "bootstrapServers": "kafka:9093"},
    }
    sets.append(pytest.param(locked_down, id="one-value-locked-down-with-workers"))
    return sets


@pytest.mark.parametrize("values", every_values_set())
@pytest.mark.parametrize("kube_version", KUBE_VERSIONS)
def test_every_object_validates_against_the_kubernetes_schemas(
    chart: helm.Chart, values: dict[str, Any], kube_version: str
) -> None:
    objects = render(chart, values)
    assert objects
    for obj in objects:
        if (obj["apiVersion"], obj["kind"]) in CUSTOM_KINDS:
            continue
        try:
            kubernetes_validate.validate(obj, kube_version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(part) for part in error.path)
            pytest.fail(f"{obj['kind']}/{obj['metadata']['name']}: {path}: {error.message}")


def test_service_monitor_targets_the_metrics_endpoint(chart: helm.Chart) -> None:
    objects = render(chart, with_values(serviceMonitor={"enabled": True, "interval": "15s"}))
    monitor = one(objects, "ServiceMonitor")
    assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
    assert monitor["spec"]["endpoints"] == [
        {"port": "http", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]
    service = one(objects, "Service")
    assert (
        monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    )


# --- the coordinator Deployment ---------------------------------------------------------------


def test_probes_use_livez_and_readyz_on_the_http_port(chart: helm.Chart) -> None:
    coordinator = container(one(render(chart, minimal_values()), "Deployment"))
    assert coordinator["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert coordinator["startupProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert coordinator["livenessProbe"]["httpGet"] == {"path": "/livez", "port": "http"}
    assert coordinator["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    startup = coordinator["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30


def test_shutdown_drains_before_sigterm_within_the_grace_period(chart: helm.Chart) -> None:
    deployment = one(render(chart, minimal_values()), "Deployment")
    pre_stop = container(deployment)["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop == ["python", "-c", "import time; time.sleep(5)"]
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] == 40
    no_sleep = one(render(chart, with_values(preStopSleepSeconds=0)), "Deployment")
    assert "lifecycle" not in container(no_sleep)


def test_probes_can_be_switched_off(chart: helm.Chart) -> None:
    values = with_values(readinessProbe={"enabled": False}, startupProbe={"enabled": False})
    coordinator = container(one(render(chart, values), "Deployment"))
    assert "readinessProbe" not in coordinator and "startupProbe" not in coordinator
    assert "livenessProbe" in coordinator


@pytest.mark.parametrize("kind", ["Deployment", "Job", "Pod"])
def test_every_pod_runs_non_root_with_a_read_only_root_filesystem(
    chart: helm.Chart, kind: str
) -> None:
    owner = one(render(chart, minimal_values()), kind)
    pod_security = pod_spec(owner)["securityContext"]
    assert pod_security["runAsNonRoot"] is True
    assert pod_security["runAsUser"] == 10001 and pod_security["fsGroup"] == 10001
    assert pod_security["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container(owner)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert pod_spec(owner)["automountServiceAccountToken"] is False


@pytest.mark.parametrize("kind", ["Deployment", "Job"])
def test_tmp_is_a_writable_empty_dir(chart: helm.Chart, kind: str) -> None:
    owner = one(render(chart, minimal_values()), kind)
    assert {"name": "tmp", "mountPath": "/tmp"} in container(owner)["volumeMounts"]
    volumes = {volume["name"]: volume for volume in pod_spec(owner)["volumes"]}
    assert "emptyDir" in volumes["tmp"]


def test_coordinator_serves_and_leaves_migrations_to_the_job(chart: helm.Chart) -> None:
    objects = render(chart, minimal_values())
    deployment = one(objects, "Deployment")
    coordinator = container(deployment)
    assert coordinator["command"] == ["keyrange"] and coordinator["args"] == ["serve"]
    assert env_of(deployment)["KEYRANGE_MIGRATE_ON_START"]["value"] == "false"
    config = one(objects, "ConfigMap")["data"]
    assert config["KEYRANGE_HOST"] == "0.0.0.0"
    assert config["KEYRANGE_PORT"] == "8080"
    assert config["KEYRANGE_KAFKA_BOOTSTRAP"] == "kafka:9092"
    assert coordinator["envFrom"] == [{"configMapRef": {"name": FULLNAME}}]


def test_configmap_carries_every_setting_as_a_keyrange_variable(chart: helm.Chart) -> None:
    values = with_values(
        config={
            "logLevel": "DEBUG",
            "logFormat": "text",
            "dbPoolSize": 20,
            "metadataRefreshMs": 5000,
            "maxIcRangesPerPartition": 500,
            "maxRangesPerRequest": 1000,
            "sessionTimeoutMinMs": 2000,
            "sessionTimeoutMaxMs": 60000,
            "heartbeatIntervalMs": 500,
            "maxMembersPerGroup": 50,
            "maxPartitionsPerGroup": 2000,
            "maxGroupsPerPrefix": 200,
            "offsetsRetentionMinutes": 1440,
            "allowedEndpointHosts": ["10.0.0.0/8", "*.svc.cluster.local"],
        }
    )
    config = one(render(chart, values), "ConfigMap")["data"]
    assert config == {
        "KEYRANGE_HOST": "0.0.0.0",
        "KEYRANGE_PORT": "8080",
        "KEYRANGE_KAFKA_BOOTSTRAP": "kafka:9092",
        "KEYRANGE_LOG_LEVEL": "DEBUG",
        "KEYRANGE_LOG_FORMAT": "text",
        "KEYRANGE_DB_POOL_SIZE": "20",
        "KEYRANGE_METADATA_REFRESH_MS": "5000",
        "KEYRANGE_MAX_IC_RANGES_PER_PARTITION": "500",
        "KEYRANGE_MAX_RANGES_PER_REQUEST": "1000",
        "KEYRANGE_SESSION_TIMEOUT_MIN_MS": "2000",
        "KEYRANGE_SESSION_TIMEOUT_MAX_MS": "60000",
        "KEYRANGE_HEARTBEAT_INTERVAL_MS": "500",
        "KEYRANGE_MAX_MEMBERS_PER_GROUP": "50",
        "KEYRANGE_MAX_PARTITIONS_PER_GROUP": "2000",
        "KEYRANGE_MAX_GROUPS_PER_PREFIX": "200",
        "KEYRANGE_OFFSETS_RETENTION_MINUTES": "1440",
        "KEYRANGE_ALLOWED_ENDPOINT_HOSTS": '["10.0.0.0/8","*.svc.cluster.local"]',
    }
    # What the coordinator reads of it: a JSON list, as pydantic-settings reads list settings.
    hosts = json.loads(config["KEYRANGE_ALLOWED_ENDPOINT_HOSTS"])
    assert Settings(allowed_endpoint_hosts=hosts).allowed_endpoint_hosts == hosts


def test_the_offset_mirror_is_rendered_only_when_switched_on(chart: helm.Chart) -> None:
    default = one(render(chart, with_values()), "ConfigMap")["data"]
    assert "KEYRANGE_MIRROR_OFFSETS" not in default
    values = with_values(config={"mirrorOffsets": "all", "mirrorGroupPrefix": "keyrange."})
    config = one(render(chart, values), "ConfigMap")["data"]
    assert config["KEYRANGE_MIRROR_OFFSETS"] == "all"
    assert config["KEYRANGE_MIRROR_GROUP_PREFIX"] == "keyrange."
    mirrored = Settings(mirror_offsets="all", mirror_group_prefix="keyrange.")
    assert (mirrored.mirror_offsets, mirrored.mirror_group_prefix) == ("all", "keyrange.")


def pod_annotations(chart: helm.Chart, values: dict[str, Any]) -> dict[str, str]:
    annotations: dict[str, str] = one(render(chart, values), "Deployment")["spec"]["template"][
        "metadata"
    ]["annotations"]
    return annotations


def test_checksum_annotations_roll_pods_when_config_or_secret_change(chart: helm.Chart) -> None:
    base = pod_annotations(chart, minimal_values())
    assert len(base["checksum/config"]) == 64 and len(base["checksum/secret"]) == 64

    config_changed = pod_annotations(chart, with_values(config={"logLevel": "DEBUG"}))
    assert config_changed["checksum/config"] != base["checksum/config"]
    assert config_changed["checksum/secret"] == base["checksum/secret"]

    rotated = with_values(auth={"adminTokens": ["admin-token-0123456789", "admin-token-new-98765"]})
    secret_changed = pod_annotations(chart, rotated)
    assert secret_changed["checksum/secret"] != base["checksum/secret"]
    assert secret_changed["checksum/config"] == base["checksum/config"]


def test_replicas_follow_replica_count_unless_autoscaled(chart: helm.Chart) -> None:
    deployment = one(render(chart, with_values(replicaCount=3)), "Deployment")
    assert deployment["spec"]["replicas"] == 3
    autoscaled = render(chart, with_values(replicaCount=3, autoscaling={"enabled": True}))
    assert "replicas" not in one(autoscaled, "Deployment")["spec"]
    hpa = one(autoscaled, "HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": FULLNAME,
    }
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)


def test_image_digest_wins_over_the_tag(chart: helm.Chart) -> None:
    digest = "sha256:" + "b" * 64
    tagged = container(one(render(chart, with_values(image={"tag": "1.2.3"})), "Deployment"))
    assert tagged["image"] == "keyrange:1.2.3"
    pinned = render(chart, with_values(image={"tag": "1.2.3", "digest": digest}))
    for kind in ("Deployment", "Job", "Pod"):
        assert container(one(pinned, kind))["image"] == f"keyrange@{digest}"


def test_service_selects_only_coordinator_pods(chart: helm.Chart) -> None:
    objects = render(chart, minimal_values())
    selector = one(objects, "Service")["spec"]["selector"]
    deployment_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    job_labels = one(objects, "Job")["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= deployment_labels.items()
    assert not selector.items() <= job_labels.items()
    assert one(objects, "Service")["spec"]["ports"] == [
        {"name": "http", "port": 8080, "targetPort": "http", "protocol": "TCP"}
    ]


# --- migrations -------------------------------------------------------------------------------


def test_migration_job_is_a_hook_that_waits_for_the_database(chart: helm.Chart) -> None:
    job = one(render(chart, with_values(migrations={"waitForDbSeconds": 45})), "Job")
    annotations = job["metadata"]["annotations"]
    assert annotations["helm.sh/hook"] == "post-install,pre-upgrade"
    assert int(annotations["helm.sh/hook-weight"]) == 0
    assert annotations["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    migrate = container(job)
    assert migrate["command"] == ["keyrange"]
    assert migrate["args"] == ["migrate", "--wait-for-db", "45"]
    assert pod_spec(job)["restartPolicy"] == "Never"
    assert env_of(job)["KEYRANGE_DATABASE_URL"]["valueFrom"]["secretKeyRef"] == {
        "name": FULLNAME,
        "key": "database-url",
    }


def test_disabling_the_job_makes_pods_migrate_on_start(chart: helm.Chart) -> None:
    objects = render(chart, with_values(migrations={"enabled": False}))
    assert "Job" not in kinds(objects)
    assert env_of(one(objects, "Deployment"))["KEYRANGE_MIGRATE_ON_START"]["value"] == "true"
    assert "each coordinator pod migrates on start" in render_notes(
        chart, with_values(migrations={"enabled": False})
    )


# --- database and token sources ---------------------------------------------------------------


def decoded_secret(objects: list[Manifest]) -> dict[str, str]:
    data: dict[str, str] = one(objects, "Secret")["data"]
    return {key: base64.b64decode(value).decode() for key, value in data.items()}


def test_chart_secret_holds_the_url_and_tokens_in_the_coordinator_json_shapes(
    chart: helm.Chart,
) -> None:
    values = with_values(
        auth={
            "adminTokens": ["admin-token-0123456789"],
            "clientTokens": [
                {"token": "client-token-orders-0001", "groupPrefixes": ["orders-"]},
                {"token": "client-token-anything-01"},
            ],
        }
    )
    objects = render(chart, values)
    secret = decoded_secret(objects)
    assert secret["database-url"] == "postgresql+asyncpg://keyrange:pw@db.internal:5432/keyrange"
    assert json.loads(secret["admin-tokens"]) == ["admin-token-0123456789"]
    assert json.loads(secret["client-tokens"]) == [
        {"token": "client-token-orders-0001", "group_prefixes": ["orders-"]},
        {"token": "client-token-anything-01", "group_prefixes": []},
    ]
    env = env_of(one(objects, "Deployment"))
    for variable, key in [
        ("KEYRANGE_DATABASE_URL", "database-url"),
        ("KEYRANGE_ADMIN_TOKENS", "admin-tokens"),
        ("KEYRANGE_CLIENT_TOKENS", "client-tokens"),
    ]:
        assert env[variable]["valueFrom"]["secretKeyRef"] == {"name": FULLNAME, "key": key}


def test_existing_database_secret_replaces_the_chart_url(chart: helm.Chart) -> None:
    values = with_values(database={"url": "", "existingSecret": {"name": "pg-url", "key": "uri"}})
    objects = render(chart, values)
    assert "database-url" not in decoded_secret(objects)
    for kind in ("Deployment", "Job"):
        reference = env_of(one(objects, kind))["KEYRANGE_DATABASE_URL"]["valueFrom"]
        assert reference["secretKeyRef"] == {"name": "pg-url", "key": "uri"}


def test_existing_secrets_for_database_and_tokens_leave_no_chart_secret(
    chart: helm.Chart,
) -> None:
    values = yaml.safe_load((CHART_DIR / "ci" / "existing-secrets-values.yaml").read_text())
    objects = render(chart, values)
    assert "Secret" not in kinds(objects)
    env = env_of(one(objects, "Deployment"))
    assert env["KEYRANGE_ADMIN_TOKENS"]["valueFrom"]["secretKeyRef"] == {
        "name": "keyrange-tokens",
        "key": "admin-tokens",
        "optional": True,
    }
    assert env["KEYRANGE_CLIENT_TOKENS"]["valueFrom"]["secretKeyRef"]["name"] == "keyrange-tokens"


def test_secret_parts_compose_the_url_from_a_cloudnativepg_app_secret(chart: helm.Chart) -> None:
    values = with_values(
        database={"url": "", "secretParts": {"name": "pg-app", "query": "ssl=require"}}
    )
    objects = render(chart, values)
    for kind in ("Deployment", "Job"):
        env_list = container(one(objects, kind))["env"]
        names = [entry["name"] for entry in env_list]
        env = {entry["name"]: entry for entry in env_list}
        expected_keys = {
            "PGHOST": "host",
            "PGPORT": "port",
            "PGUSER": "username",
            "PGPASSWORD": "password",
            "PGDATABASE": "dbname",
        }
        for variable, key in expected_keys.items():
            assert env[variable]["valueFrom"]["secretKeyRef"] == {"name": "pg-app", "key": key}
            # $(VAR) expands only variables defined earlier in the list.
            assert names.index(variable) < names.index("KEYRANGE_DATABASE_URL")
        assert env["KEYRANGE_DATABASE_URL"]["value"] == (
            "postgresql+asyncpg://$(PGUSER):$(PGPASSWORD)@$(PGHOST):$(PGPORT)/$(PGDATABASE)"
            "?ssl=require"
        )


def container_environment(
    objects: list[Manifest], kind: str, secrets: dict[str, dict[str, str]]
) -> dict[str, str]:
    return owner_environment(objects, one(objects, kind), secrets)


def owner_environment(
    objects: list[Manifest], owner: Manifest, secrets: dict[str, dict[str, str]]
) -> dict[str, str]:
    """The environment Kubernetes would give the container: envFrom ConfigMaps, then env with
    secret references resolved and $(VAR) references expanded, in order."""
    config_maps = {o["metadata"]["name"]: o["data"] for o in objects if o["kind"] == "ConfigMap"}
    spec = container(owner)
    environment: dict[str, str] = {}
    for source in spec.get("envFrom", []):
        environment.update(config_maps[source["configMapRef"]["name"]])
    for entry in spec.get("env", []):
        if "value" in entry:
            value = entry["value"]
            for name, known in environment.items():
                value = value.replace(f"$({name})", known)
            environment[entry["name"]] = value
        else:
            reference = entry["valueFrom"]["secretKeyRef"]
            secret = secrets.get(reference["name"], {})
            if reference["key"] in secret:
                environment[entry["name"]] = secret[reference["key"]]
            else:
                assert reference.get("optional"), f"{entry['name']}: missing {reference}"
    return environment


def coordinator_settings(environment: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Any:
    from coordinator.settings import Settings

    for name in [n for n in os.environ if n.startswith("KEYRANGE_")]:
        monkeypatch.delenv(name)
    for name, value in environment.items():
        monkeypatch.setenv(name, value)
    return Settings()


def test_the_coordinator_accepts_the_environment_the_chart_gives_it(
    chart: helm.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = with_values(
        auth={"clientTokens": [{"token": "client-token-orders-0001", "groupPrefixes": ["o-"]}]},
        config={"logLevel": "WARNING", "logFormat": "text", "sessionTimeoutMaxMs": 60000},
    )
    objects = render(chart, values)
    secrets = {FULLNAME: decoded_secret(objects)}
    settings = coordinator_settings(
        container_environment(objects, "Deployment", secrets), monkeypatch
    )
    settings.check_bind_address()
    assert (settings.host, settings.port) == ("0.0.0.0", 8080)
    assert settings.database_url.get_secret_value() == values["database"]["url"]
    assert settings.kafka_bootstrap == "kafka:9092"
    assert settings.migrate_on_start is False
    assert [t.get_secret_value() for t in settings.admin_tokens] == ["admin-token-0123456789"]
    (client_token,) = settings.client_tokens
    assert client_token.allows_group("o-1") and not client_token.allows_group("x-1")
    assert (settings.log_level, settings.log_format) == ("WARNING", "text")
    assert settings.session_timeout_max_ms == 60000

    job_settings = coordinator_settings(container_environment(objects, "Job", secrets), monkeypatch)
    assert job_settings.database_url.get_secret_value() == values["database"]["url"]


def test_secret_parts_expand_to_a_url_the_coordinator_can_use(
    chart: helm.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    values = yaml.safe_load((CHART_DIR / "ci" / "cloudnativepg-values.yaml").read_text())
    objects = render(chart, values)
    generated_by_the_operator = {
        "host": "keyrange-pg-rw",
        "port": "5432",
        "username": "keyrange",
        "password": "Zx81kq0Lw2",
        "dbname": "keyrange",
    }
    secrets = {
        "keyrange-pg-app": generated_by_the_operator,
        "keyrange-tokens": {"admin-tokens": '["admin-token-0123456789"]'},
    }
    settings = coordinator_settings(
        container_environment(objects, "Deployment", secrets), monkeypatch
    )
    settings.check_bind_address()
    url = make_url(settings.database_url.get_secret_value())
    assert url.drivername == "postgresql+asyncpg"
    assert (url.username, url.password, url.host, url.port, url.database) == (
        "keyrange",
        "Zx81kq0Lw2",
        "keyrange-pg-rw",
        5432,
        "keyrange",
    )
    assert settings.client_tokens == []


# --- optional objects -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("patch", "kind", "present"),
    [
        ({}, "PodDisruptionBudget", True),
        ({"pdb": {"enabled": False}}, "PodDisruptionBudget", False),
        ({}, "HorizontalPodAutoscaler", False),
        ({"autoscaling": {"enabled": True}}, "HorizontalPodAutoscaler", True),
        ({}, "NetworkPolicy", True),
        ({"networkPolicy": {"enabled": False}}, "NetworkPolicy", False),
        ({}, "ServiceMonitor", False),
        ({"serviceMonitor": {"enabled": True}}, "ServiceMonitor", True),
        ({}, "PrometheusRule", False),
        ({"prometheusRule": {"enabled": True}}, "PrometheusRule", True),
        ({}, "ConfigMap", True),
        ({"serviceMonitor": {"enabled": True}}, "PodMonitor", False),
        ({"serviceMonitor": {"enabled": True}, "worker": WORKER_ON_KEDA}, "PodMonitor", True),
        ({}, "ServiceAccount", True),
        ({"serviceAccount": {"create": False}}, "ServiceAccount", False),
        ({}, "Pod", True),
        ({"tests": {"enabled": False}}, "Pod", False),
        ({}, "Job", True),
        ({"migrations": {"enabled": False}}, "Job", False),
    ],
)
def test_toggles_add_and_remove_objects(
    chart: helm.Chart, patch: dict[str, Any], kind: str, present: bool
) -> None:
    assert (kind in kinds(render(chart, with_values(**patch)))) is present


def test_pods_use_the_default_service_account_when_none_is_created(chart: helm.Chart) -> None:
    objects = render(chart, with_values(serviceAccount={"create": False}))
    for kind in ("Deployment", "Job", "Pod"):
        assert pod_spec(one(objects, kind))["serviceAccountName"] == "default"
    named = render(chart, with_values(serviceAccount={"create": True, "name": "keyrange-sa"}))
    assert one(named, "ServiceAccount")["metadata"]["name"] == "keyrange-sa"
    assert pod_spec(one(named, "Deployment"))["serviceAccountName"] == "keyrange-sa"


def test_pdb_takes_min_available_or_max_unavailable(chart: helm.Chart) -> None:
    default = one(render(chart, minimal_values()), "PodDisruptionBudget")["spec"]
    assert default["maxUnavailable"] == 1 and "minAvailable" not in default
    values = with_values(pdb={"maxUnavailable": "", "minAvailable": "50%"})
    percent = one(render(chart, values), "PodDisruptionBudget")["spec"]
    assert percent["minAvailable"] == "50%" and "maxUnavailable" not in percent


def test_network_policy_admits_only_labelled_clients_when_not_external(
    chart: helm.Chart,
) -> None:
    open_policy = one(render(chart, minimal_values()), "NetworkPolicy")["spec"]
    assert open_policy["ingress"] == [{"ports": [{"port": "http", "protocol": "TCP"}]}]
    assert open_policy["policyTypes"] == ["Ingress"]

    objects = render(chart, with_values(networkPolicy={"allowExternal": False}))
    ingress = one(objects, "NetworkPolicy")["spec"]["ingress"]
    client_label = {f"{FULLNAME}-client": "true"}
    assert ingress[0]["from"] == [{"podSelector": {"matchLabels": client_label}}]
    assert client_label.items() <= one(objects, "Pod")["metadata"]["labels"].items()


def test_network_policy_limits_egress_to_dns_and_the_listed_rules(chart: helm.Chart) -> None:
    database_rule = {"to": [{"ipBlock": {"cidr": "10.1.0.0/16"}}], "ports": [{"port": 5432}]}
    values = with_values(
        networkPolicy={"allowExternalEgress": False, "extraEgress": [database_rule]}
    )
    spec = one(render(chart, values), "NetworkPolicy")["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    dns, extra = spec["egress"]
    assert {port["port"] for port in dns["ports"]} == {53}
    assert extra == database_rule


def test_helm_test_pod_asks_readyz_through_the_service(chart: helm.Chart) -> None:
    pod = one(render(chart, minimal_values()), "Pod")
    assert pod["metadata"]["annotations"]["helm.sh/hook"] == "test"
    command = " ".join(container(pod)["command"])
    assert command.startswith("python -c")
    assert f"http://{FULLNAME}:8080/readyz" in command


# --- bad values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        (with_values(replicaCount=-1), "/replicaCount': minimum: got -1, want 0"),
        (with_values(replicas=2), "additional properties 'replicas' not allowed"),
        (with_values(config={"logLevel": "LOUD"}), "/config/logLevel"),
        (with_values(auth={"adminTokens": ["short"]}), "/auth/adminTokens/0"),
        (with_values(service={"port": 0}), "/service/port"),
        (
            with_values(database={"url": "postgres://keyrange@db/keyrange"}),
            "database.url: must start with postgresql+asyncpg://",
        ),
        (
            with_values(database={"existingSecret": {"name": "pg", "key": "uri"}}),
            "database: set only one of",
        ),
        (with_values(kafka={"bootstrapServers": ""}), "kafka.bootstrapServers: required"),
        (
            with_values(auth={"existingSecret": {"name": "tokens"}}),
            "auth: set either auth.existingSecret.name",
        ),
        (with_values(pdb={"minAvailable": 1}), "pdb: set only one of"),
        (with_values(pdb={"maxUnavailable": ""}), "pdb: set pdb.minAvailable or"),
        (
            with_values(autoscaling={"enabled": True, "minReplicas": 5, "maxReplicas": 2}),
            "autoscaling.minReplicas: must not exceed",
        ),
        (
            with_values(config={"sessionTimeoutMinMs": 50000, "sessionTimeoutMaxMs": 2000}),
            "config.sessionTimeoutMinMs: must not exceed",
        ),
        (
            with_values(networkPolicy={"allowExternalEgress": False}),
            "networkPolicy.extraEgress: with allowExternalEgress false",
        ),
        (
            with_values(preStopSleepSeconds=30, terminationGracePeriodSeconds=30),
            "terminationGracePeriodSeconds: must exceed preStopSleepSeconds",
        ),
    ],
    ids=lambda v: v if isinstance(v, str) else "",
)
def test_bad_values_fail_with_a_message_naming_the_key(
    chart: helm.Chart, values: dict[str, Any], expected: str
) -> None:
    assert expected in render_error(chart, values)


def test_defaults_alone_fail_asking_only_for_the_kafka_address(chart: helm.Chart) -> None:
    """The database and the tokens have defaults (a bundled Postgres, generated tokens); the
    Kafka cluster cannot be guessed."""
    message = render_error(chart, {})
    assert message.count("VALUES VALIDATION") == 1
    assert "kafka.bootstrapServers: required" in message
    assert "database" not in message and "auth" not in message


def test_bad_values_are_all_reported_at_once(chart: helm.Chart) -> None:
    values = with_values(
        kafka={"bootstrapServers": ""},
        database={"existingSecret": {"name": "pg", "key": "uri"}},
        pdb={"minAvailable": 1},
    )
    message = render_error(chart, values)
    assert message.count("VALUES VALIDATION") == 1
    for expected in ("kafka.bootstrapServers", "database: set only one of", "pdb: set only one"):
        assert expected in message


def test_schema_rejects_what_validate_values_would_miss(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError, match="/containerPort"):
        chart.validate_schema(with_values(containerPort="8080"))
    with pytest.raises(helm.HelmValuesError, match="/image/digest"):
        chart.validate_schema(with_values(image={"digest": "latest"}))


# --- Kafka TLS and SASL (docs/kafka-security.md) ----------------------------------------------


def kafka_values(**kafka: Any) -> dict[str, Any]:
    return with_values(kafka={"bootstrapServers": "kafka:9093", **kafka})


def test_kafka_sasl_ssl_takes_the_password_from_a_secret_and_mounts_the_ca(
    chart: helm.Chart,
) -> None:
    objects = render(chart, kafka_values(**SASL_SSL))
    config = one(objects, "ConfigMap")["data"]
    assert {k: v for k, v in config.items() if k.startswith("KEYRANGE_KAFKA_")} == {
        "KEYRANGE_KAFKA_BOOTSTRAP": "kafka:9093",
        "KEYRANGE_KAFKA_SECURITY_PROTOCOL": "SASL_SSL",
        "KEYRANGE_KAFKA_SSL_CAFILE": "/etc/keyrange/kafka-tls/ca.crt",
        "KEYRANGE_KAFKA_SSL_CHECK_HOSTNAME": "true",
        "KEYRANGE_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "KEYRANGE_KAFKA_SASL_USERNAME": "keyrange",
    }
    deployment = one(objects, "Deployment")
    assert env_of(deployment)["KEYRANGE_KAFKA_SASL_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "kafka-user", "key": "password"}
    }
    mounts = {m["name"]: m for m in container(deployment)["volumeMounts"]}
    assert mounts["kafka-tls"] == {
        "name": "kafka-tls",
        "mountPath": "/etc/keyrange/kafka-tls",
        "readOnly": True,
    }
    volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
    assert volumes["kafka-tls"]["secret"]["secretName"] == "kafka-ca"
    for obj in objects:
        kubernetes_validate.validate(obj, KUBE_VERSIONS[-1], strict=True)


def test_kafka_mutual_tls_mounts_the_client_certificate_and_key(chart: helm.Chart) -> None:
    tls = {"existingSecret": "kafka-client", "caKey": "ca.crt", "certKey": "tls.crt"}
    config = one(
        render(chart, kafka_values(securityProtocol="SSL", tls={**tls, "keyKey": "tls.key"})),
        "ConfigMap",
    )["data"]
    assert config["KEYRANGE_KAFKA_SSL_CERTFILE"] == "/etc/keyrange/kafka-tls/tls.crt"
    assert config["KEYRANGE_KAFKA_SSL_KEYFILE"] == "/etc/keyrange/kafka-tls/tls.key"
    assert "KEYRANGE_KAFKA_SASL_MECHANISM" not in config


def test_kafka_chart_variables_are_coordinator_settings(chart: helm.Chart) -> None:
    objects = render(chart, kafka_values(**SASL_SSL))
    variables = set(one(objects, "ConfigMap")["data"]) | set(env_of(one(objects, "Deployment")))
    known = {f"KEYRANGE_{name.upper()}" for name in Settings.model_fields}
    assert {v for v in variables if v.startswith("KEYRANGE_KAFKA_")} <= known


@pytest.mark.parametrize(
    ("kafka", "expected"),
    [
        ({"securityProtocol": "SASL_SSL"}, "kafka.sasl: SASL_SSL needs kafka.sasl.mechanism"),
        (
            {"tls": {"existingSecret": "kafka-ca"}},
            "kafka.tls.existingSecret: set, but kafka.securityProtocol does not use TLS",
        ),
        (
            {"securityProtocol": "SSL", "tls": {"existingSecret": "ca", "certKey": "tls.crt"}},
            "kafka.tls.certKey and kafka.tls.keyKey: set both",
        ),
        (
            {"sasl": {"mechanism": "PLAIN", "username": "u"}},
            "kafka.sasl: set, but kafka.securityProtocol does not use SASL",
        ),
    ],
    ids=["sasl-without-mechanism", "tls-on-plaintext", "cert-without-key", "sasl-on-plaintext"],
)
def test_bad_kafka_security_values_name_the_key(
    chart: helm.Chart, kafka: dict[str, Any], expected: str
) -> None:
    assert expected in render_error(chart, kafka_values(**kafka))


def test_schema_rejects_unknown_kafka_security_values(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError, match="securityProtocol"):
        chart.validate_schema(kafka_values(securityProtocol="KERBEROS"))
    with pytest.raises(helm.HelmValuesError, match="mechanism"):
        chart.validate_schema(kafka_values(sasl={"mechanism": "GSSAPI"}))


# --- metrics without tenant data (docs/quotas.md) ---------------------------------------------


def test_a_metrics_token_secret_reaches_the_coordinator_and_the_service_monitor(
    chart: helm.Chart,
) -> None:
    values = with_values(
        serviceMonitor={"enabled": True},
        metrics={"tokenSecret": {"name": "keyrange-metrics", "key": "token"}},
    )
    objects = render(chart, values)
    env = container(one(objects, "Deployment"))["env"]
    names = [entry["name"] for entry in env]
    plain = env[names.index("KEYRANGE_METRICS_TOKEN_PLAIN")]
    assert plain["valueFrom"]["secretKeyRef"] == {"name": "keyrange-metrics", "key": "token"}
    # Kubernetes expands $(VAR) only from variables defined before it.
    assert names.index("KEYRANGE_METRICS_TOKEN_PLAIN") < names.index("KEYRANGE_METRICS_TOKENS")
    assert env[names.index("KEYRANGE_METRICS_TOKENS")]["value"] == (
        '["$(KEYRANGE_METRICS_TOKEN_PLAIN)"]'
    )
    (endpoint,) = one(objects, "ServiceMonitor")["spec"]["endpoints"]
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": "keyrange-metrics", "key": "token"},
    }
    assert "KEYRANGE_METRICS_GROUP_LABELS" not in one(objects, "ConfigMap")["data"]


def test_per_group_metrics_for_everyone_is_an_explicit_choice(chart: helm.Chart) -> None:
    config = one(render(chart, with_values(metrics={"groupLabels": True})), "ConfigMap")["data"]
    assert config["KEYRANGE_METRICS_GROUP_LABELS"] == "true"


# --- one value: a bundled Postgres and generated tokens (issue 18 item 5) ---------------------

POSTGRES = f"{FULLNAME}-postgresql"


def decoded(secret: Manifest) -> dict[str, str]:
    return {key: base64.b64decode(value).decode() for key, value in secret["data"].items()}


def rendered_secrets(objects: list[Manifest]) -> dict[str, dict[str, str]]:
    return {o["metadata"]["name"]: decoded(o) for o in objects if o["kind"] == "Secret"}


def test_one_value_runs_a_single_postgres_with_a_volume_beside_the_coordinator(
    chart: helm.Chart,
) -> None:
    objects = render(chart, ONE_VALUE)
    statefulset = named(objects, "StatefulSet", POSTGRES)
    assert statefulset["spec"]["replicas"] == 1
    assert statefulset["spec"]["serviceName"] == POSTGRES
    postgres = container(statefulset)
    assert postgres["image"] == "postgres:17"
    (claim,) = statefulset["spec"]["volumeClaimTemplates"]
    assert claim["spec"]["resources"]["requests"]["storage"] == "8Gi"
    mounts = {m["mountPath"]: m["name"] for m in postgres["volumeMounts"]}
    assert mounts["/var/lib/postgresql/data"] == claim["metadata"]["name"]
    env = {entry["name"]: entry for entry in postgres["env"]}
    assert env["PGDATA"]["value"].startswith("/var/lib/postgresql/data/")
    assert env["POSTGRES_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": POSTGRES,
        "key": "password",
    }
    service = named(objects, "Service", POSTGRES)
    assert service["spec"]["selector"].items() <= (
        statefulset["spec"]["template"]["metadata"]["labels"].items()
    )
    # The coordinator's Service and PDB never select the database pod.
    coordinator_selector = named(objects, "Service", FULLNAME)["spec"]["selector"]
    assert not coordinator_selector.items() <= (
        statefulset["spec"]["template"]["metadata"]["labels"].items()
    )


def test_the_bundled_postgres_runs_non_root_with_a_read_only_root_filesystem(
    chart: helm.Chart,
) -> None:
    statefulset = named(render(chart, ONE_VALUE), "StatefulSet", POSTGRES)
    pod_security = pod_spec(statefulset)["securityContext"]
    assert pod_security["runAsNonRoot"] is True and pod_security["fsGroup"] == 999
    security = container(statefulset)["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    writable = {m["mountPath"] for m in container(statefulset)["volumeMounts"]}
    assert {"/var/run/postgresql", "/tmp"} <= writable


def test_the_coordinator_and_the_job_connect_to_the_bundled_postgres(
    chart: helm.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    objects = render(chart, ONE_VALUE)
    secrets = rendered_secrets(objects)
    password = secrets[POSTGRES]["password"]
    assert len(password) == 32 and password.isalnum()
    for kind in ("Deployment", "Job"):
        settings = coordinator_settings(container_environment(objects, kind, secrets), monkeypatch)
        url = make_url(settings.database_url.get_secret_value())
        assert url.drivername == "postgresql+asyncpg"
        assert (url.username, url.password, url.host, url.port, url.database) == (
            "keyrange",
            password,
            POSTGRES,
            5432,
            "keyrange",
        )
    settings = coordinator_settings(
        container_environment(objects, "Deployment", secrets), monkeypatch
    )
    settings.check_bind_address()
    admin_token = secrets[FULLNAME]["admin-token"]
    assert [t.get_secret_value() for t in settings.admin_tokens] == [admin_token]
    (worker_token,) = settings.client_tokens
    assert worker_token.token.get_secret_value() == secrets[FULLNAME]["worker-token"]
    assert worker_token.allows_group("any-group")


def test_generated_secrets_are_random_and_consistent_within_a_release(chart: helm.Chart) -> None:
    first, second = render(chart, ONE_VALUE), render(chart, ONE_VALUE)
    tokens = rendered_secrets(first)[FULLNAME]
    assert len(tokens["admin-token"]) == 40 and tokens["admin-token"].isalnum()
    assert json.loads(tokens["admin-tokens"]) == [tokens["admin-token"]]
    assert tokens["worker-token"] != tokens["admin-token"]
    # Never a value baked into the chart: another install gets other secrets.
    again = rendered_secrets(second)
    assert again[FULLNAME]["admin-token"] != tokens["admin-token"]
    assert again[POSTGRES]["password"] != rendered_secrets(first)[POSTGRES]["password"]


def test_the_pods_checksum_is_of_the_secret_actually_rendered(chart: helm.Chart) -> None:
    """Generated values are drawn once per render: were the checksum annotation computed over
    other random values than the Secret's, the first upgrade would roll every pod for nothing."""
    manifests = chart.render(ONE_VALUE, name=RELEASE, namespace=NAMESPACE, is_install=True)
    secret_text = manifests["keyrange/templates/secret.yaml"]
    deployment = next(
        doc for doc in yaml.safe_load_all(manifests["keyrange/templates/deployment.yaml"]) if doc
    )
    annotations = deployment["spec"]["template"]["metadata"]["annotations"]
    assert annotations["checksum/secret"] == hashlib.sha256(secret_text.encode()).hexdigest()


def test_generated_secrets_are_looked_up_before_being_generated(chart: helm.Chart) -> None:
    """`lookup` needs a cluster, so offline rendering cannot show a value surviving an
    upgrade; what can be checked is that every generated value is read back from the very
    Secret and key it is written to, and that the database password outlives an uninstall
    (its volume does)."""
    helpers = (CHART_DIR / "templates" / "_helpers.tpl").read_text()
    assert 'lookup "v1" "Secret"' in helpers
    calls = re.findall(
        r'persistentRandom" \(list \. (\$name|\(include "keyrange\.secretName" \.\)) "([a-z-]+)"',
        helpers + (CHART_DIR / "templates" / "postgresql.yaml").read_text(),
    )
    written = {(POSTGRES if source == "$name" else FULLNAME, key) for source, key in calls}
    assert written == {
        (FULLNAME, "admin-token"),
        (FULLNAME, "worker-token"),
        (POSTGRES, "password"),
    }
    secrets = rendered_secrets(render(chart, ONE_VALUE))
    for name, key in written:
        assert key in secrets[name]
    annotations = named(render(chart, ONE_VALUE), "Secret", POSTGRES)["metadata"]["annotations"]
    assert annotations["helm.sh/resource-policy"] == "keep"


def test_notes_flag_the_bundled_database_and_show_the_token_and_the_console(
    chart: helm.Chart,
) -> None:
    notes = render_notes(chart, ONE_VALUE)
    assert "FOR TRYING IT OUT ONLY" in notes
    assert (
        f"kubectl --namespace {NAMESPACE} get secret {FULLNAME} "
        "-o jsonpath='{.data.admin-token}' | base64 -d" in notes
    )
    assert f"port-forward svc/{FULLNAME} 8080:8080" in notes
    assert "http://127.0.0.1:8080/ui" in notes
    assert "generated an admin token" in notes


def test_the_one_value_install_is_a_chart_testing_case() -> None:
    assert yaml.safe_load((CHART_DIR / "ci" / "one-value-values.yaml").read_text()) == ONE_VALUE


@pytest.mark.parametrize("values_file", PRODUCTION_VALUES_FILES, ids=lambda p: p.stem)
def test_production_values_bring_no_bundled_database_and_no_generated_token(
    chart: helm.Chart, values_file: Path
) -> None:
    values = yaml.safe_load(values_file.read_text())
    objects = render(chart, values)
    assert "StatefulSet" not in kinds(objects)
    secrets = rendered_secrets(objects)
    assert POSTGRES not in secrets
    assert "worker-token" not in secrets.get(FULLNAME, {})
    notes = render_notes(chart, values)
    assert "FOR TRYING IT OUT" not in notes and "generated" not in notes


def test_listed_admin_tokens_are_not_replaced_and_the_first_is_readable_alone(
    chart: helm.Chart,
) -> None:
    values = with_values(auth={"adminTokens": ["admin-token-aaaaaaaaaa", "admin-token-bbbbbbbbbb"]})
    secret = rendered_secrets(render(chart, values))[FULLNAME]
    assert json.loads(secret["admin-tokens"]) == [
        "admin-token-aaaaaaaaaa",
        "admin-token-bbbbbbbbbb",
    ]
    assert secret["admin-token"] == "admin-token-aaaaaaaaaa"
    assert "worker-token" not in secret


def test_only_the_coordinator_and_the_migrations_reach_the_bundled_postgres(
    chart: helm.Chart,
) -> None:
    values = {
        **ONE_VALUE,
        "networkPolicy": {
            "allowExternalEgress": False,
            "extraEgress": [{"to": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}],
        },
    }
    objects = render(chart, values)
    policy = named(objects, "NetworkPolicy", POSTGRES)["spec"]
    (rule,) = policy["ingress"]
    (peer,) = rule["from"]

    def admitted(labels: dict[str, str]) -> bool:
        selector = peer["podSelector"]
        (expression,) = selector["matchExpressions"]
        return selector["matchLabels"].items() <= labels.items() and (
            labels.get(expression["key"]) in expression["values"]
        )

    def labels_of(owner: Manifest) -> dict[str, str]:
        return owner["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]

    assert admitted(labels_of(named(objects, "Deployment", FULLNAME)))
    assert admitted(labels_of(one(objects, "Job")))
    assert not admitted(one(objects, "Pod")["metadata"]["labels"])
    egress = named(objects, "NetworkPolicy", FULLNAME)["spec"]["egress"]
    statefulset_labels = labels_of(named(objects, "StatefulSet", POSTGRES))
    assert any(
        peer_rule.get("podSelector", {}).get("matchLabels", {}).items()
        <= statefulset_labels.items()
        and {"port": 5432, "protocol": "TCP"} in rule_["ports"]
        for rule_ in egress
        for peer_rule in rule_.get("to", [])
        if "podSelector" in peer_rule
    )


# --- workers and KEDA (issue 18 item 6) -------------------------------------------------------

WORKER = f"{FULLNAME}-worker"


def test_the_worker_runs_keyrange_worker_against_this_release(
    chart: helm.Chart, monkeypatch: pytest.MonkeyPatch
) -> None:
    from client.worker.command import add_parser, settings

    worker_values = {**WORKER_ON_KEDA, "args": ["--failure-policy", "retry"]}
    worker_values["autoscaling"] = {"enabled": False}
    objects = render(chart, with_values(worker=worker_values))
    deployment = named(objects, "Deployment", WORKER)
    assert deployment["spec"]["replicas"] == 1
    spec = container(deployment)
    assert spec["command"] == ["keyrange"]
    assert spec["args"] == ["worker", "billing:Billing", "--failure-policy", "retry"]
    environment = owner_environment(
        objects, deployment, {"billing-token": {"token": "client-token-billing-0001"}}
    )
    # The variables are the ones `keyrange worker` reads, and they make a complete config.
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(spec["args"])
    chosen = settings(args, environment)
    assert chosen["topics"] == ["orders", "refunds"]
    assert chosen["group_id"] == "billing"
    assert chosen["bootstrap_servers"] == "kafka:9092"
    assert chosen["coordinator_url"] == f"http://{FULLNAME}.{NAMESPACE}.svc:8080"
    assert chosen["token"] == "client-token-billing-0001"
    assert chosen["failure_policy"] == "retry"
    # The PodMonitor scrapes the pod's address, not the worker's loopback default.
    assert (chosen["metrics_port"], chosen["metrics_host"]) == (9400, "0.0.0.0")
    # The worker passes a NetworkPolicy that admits only labelled clients.
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels[f"{FULLNAME}-client"] == "true"
    selector = named(objects, "Service", FULLNAME)["spec"]["selector"]
    assert not selector.items() <= labels.items()


def test_the_worker_uses_the_generated_client_token_on_a_one_value_install(
    chart: helm.Chart,
) -> None:
    worker_values = {key: WORKER_ON_KEDA[key] for key in ("enabled", "target", "topics", "group")}
    objects = render(chart, {**ONE_VALUE, "worker": worker_values})
    token = env_of(named(objects, "Deployment", WORKER))["KEYRANGE_WORKER_TOKEN"]
    assert token["valueFrom"]["secretKeyRef"] == {"name": FULLNAME, "key": "worker-token"}
    assert "ScaledObject" not in kinds(objects)


def test_keda_scales_the_worker_on_the_coordinator_figure(chart: helm.Chart) -> None:
    from coordinator.admin.scaling import router
    from coordinator.admin.schemas import ScalingReply

    objects = render(chart, with_values(worker=WORKER_ON_KEDA))
    scaled = named(objects, "ScaledObject", WORKER)["spec"]
    assert "replicas" not in named(objects, "Deployment", WORKER)["spec"]
    assert scaled["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": WORKER,
    }
    assert (scaled["minReplicaCount"], scaled["maxReplicaCount"]) == (0, 40)
    (trigger,) = scaled["triggers"]
    assert trigger["type"] == "metrics-api"
    # AverageValue with a target of 1: the HPA asks for ceil(figure / 1) replicas.
    assert trigger["metricType"] == "AverageValue"
    metadata = trigger["metadata"]
    assert metadata["targetValue"] == "1"
    assert metadata["valueLocation"] in ScalingReply.model_fields
    assert metadata["authMode"] == "bearer"

    url = urllib.parse.urlsplit(metadata["url"])
    assert f"{url.scheme}://{url.netloc}" == f"http://{FULLNAME}.{NAMESPACE}.svc:8080"
    (route,) = [r for r in router.routes if getattr(r, "path", "").endswith("/scaling")]
    assert re.fullmatch(route.path.replace("{group_id}", "[^/]+"), url.path)  # type: ignore[attr-defined]
    assert url.path == "/v1/admin/groups/billing/scaling"
    query = dict(urllib.parse.parse_qsl(url.query))
    route_parameters = {p.name for p in route.dependant.query_params}  # type: ignore[attr-defined]
    assert set(query) <= route_parameters
    assert query == {"catch_up_seconds": "60", "min_members": "0", "max_members": "40"}

    authentication = named(objects, "TriggerAuthentication", WORKER)["spec"]
    assert trigger["authenticationRef"] == {"name": WORKER}
    # The listed admin token, as plain text in the chart's Secret.
    assert authentication["secretTargetRef"] == [
        {"parameter": "token", "name": FULLNAME, "key": "admin-token"}
    ]
    assert rendered_secrets(objects)[FULLNAME]["admin-token"] == "admin-token-0123456789"


# No KEDA CRD schema ships in a package the suite can load offline (cloudcoil-models-keda has
# one, but registers a pytest plugin that breaks collection), so the KEDA objects are checked
# by their fields: the ScaledObject and TriggerAuthentication fields of keda.sh/v1alpha1 (KEDA
# 2.x) and the metadata the metrics-api scaler reads, with their types. Unknown fields fail,
# as with the API server's strict field validation.
_STRING_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_OBJECT_META = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$", "maxLength": 63},
        "namespace": {"type": "string"},
        "labels": _STRING_MAP,
        "annotations": _STRING_MAP,
    },
    "required": ["name"],
    "additionalProperties": False,
}
_METRICS_API_METADATA = {
    "type": "object",
    "properties": {
        key: {"type": "string"}
        for key in (
            "url",
            "valueLocation",
            "targetValue",
            "activationTargetValue",
            "format",
            "authMode",
            "method",
            "unsafeSsl",
            "aggregateFromKubeServiceEndpoints",
            "aggregationType",
        )
    },
    "required": ["url", "valueLocation", "targetValue"],
    "additionalProperties": False,
}
KEDA_SCHEMAS: dict[str, dict[str, Any]] = {
    "ScaledObject": {
        "type": "object",
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "kind": {"const": "ScaledObject"},
            "metadata": _OBJECT_META,
            "spec": {
                "type": "object",
                "properties": {
                    "scaleTargetRef": {
                        "type": "object",
                        "properties": {
                            "apiVersion": {"type": "string"},
                            "kind": {"type": "string"},
                            "name": {"type": "string"},
                            "envSourceContainerName": {"type": "string"},
                        },
                        "required": ["name"],
                        "additionalProperties": False,
                    },
                    **{
                        field: {"type": "integer", "minimum": 0}
                        for field in (
                            "pollingInterval",
                            "cooldownPeriod",
                            "initialCooldownPeriod",
                            "idleReplicaCount",
                            "minReplicaCount",
                            "maxReplicaCount",
                        )
                    },
                    "advanced": {"type": "object"},
                    "fallback": {"type": "object"},
                    "triggers": {
                        "type": "array",
                        "minItems": 1,
                        "items": {
                            "type": "object",
                            "properties": {
                                "type": {"const": "metrics-api"},
                                "name": {"type": "string"},
                                "metricType": {"enum": ["AverageValue", "Value", "Utilization"]},
                                "useCachedMetrics": {"type": "boolean"},
                                "metadata": _METRICS_API_METADATA,
                                "authenticationRef": {
                                    "type": "object",
                                    "properties": {
                                        "name": {"type": "string"},
                                        "kind": {
                                            "enum": [
                                                "TriggerAuthentication",
                                                "ClusterTriggerAuthentication",
                                            ]
                                        },
                                    },
                                    "required": ["name"],
                                    "additionalProperties": False,
                                },
                            },
                            "required": ["type", "metadata"],
                            "additionalProperties": False,
                        },
                    },
                },
                "required": ["scaleTargetRef", "triggers"],
                "additionalProperties": False,
            },
        },
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
    },
    "TriggerAuthentication": {
        "type": "object",
        "properties": {
            "apiVersion": {"const": "keda.sh/v1alpha1"},
            "kind": {"const": "TriggerAuthentication"},
            "metadata": _OBJECT_META,
            "spec": {
                "type": "object",
                "properties": {
                    "secretTargetRef": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "parameter": {"type": "string"},
                                "name": {"type": "string"},
                                "key": {"type": "string"},
                            },
                            "required": ["parameter", "name", "key"],
                            "additionalProperties": False,
                        },
                    }
                },
                "additionalProperties": False,
            },
        },
        "required": ["apiVersion", "kind", "metadata", "spec"],
        "additionalProperties": False,
    },
}


def test_keda_objects_have_only_keda_fields_of_the_right_types(chart: helm.Chart) -> None:
    values_sets = (with_values(worker=WORKER_ON_KEDA), {**ONE_VALUE, "worker": WORKER_ON_KEDA})
    for values in values_sets:
        custom = [o for o in render(chart, values) if o["apiVersion"] == "keda.sh/v1alpha1"]
        assert sorted(o["kind"] for o in custom) == ["ScaledObject", "TriggerAuthentication"]
        for obj in custom:
            jsonschema.validate(obj, KEDA_SCHEMAS[obj["kind"]])
    # The check has teeth: a number where KEDA's metadata map wants a string fails.
    scaled = named(render(chart, values_sets[0]), "ScaledObject", WORKER)
    scaled["spec"]["triggers"][0]["metadata"]["targetValue"] = 1
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(scaled, KEDA_SCHEMAS["ScaledObject"])


def test_keda_presents_the_generated_admin_token_on_a_one_value_install(
    chart: helm.Chart,
) -> None:
    worker_values = {**WORKER_ON_KEDA, "tokenSecret": {"name": "", "key": "token"}}
    objects = render(chart, {**ONE_VALUE, "worker": worker_values})
    authentication = named(objects, "TriggerAuthentication", WORKER)["spec"]
    assert authentication["secretTargetRef"] == [
        {"parameter": "token", "name": FULLNAME, "key": "admin-token"}
    ]
    notes = render_notes(chart, {**ONE_VALUE, "worker": worker_values})
    assert "not capped at the partition count" in notes


def test_keda_with_tokens_in_your_own_secret_reads_the_token_you_name(chart: helm.Chart) -> None:
    values = yaml.safe_load((CHART_DIR / "ci" / "existing-secrets-values.yaml").read_text())
    autoscaling = {
        **WORKER_ON_KEDA["autoscaling"],
        "tokenSecret": {"name": "keda-admin", "key": "token"},
    }
    values["worker"] = {**WORKER_ON_KEDA, "autoscaling": autoscaling}
    authentication = named(render(chart, values), "TriggerAuthentication", WORKER)["spec"]
    assert authentication["secretTargetRef"] == [
        {"parameter": "token", "name": "keda-admin", "key": "token"}
    ]


@pytest.mark.parametrize(
    ("worker", "expected"),
    [
        ({"enabled": True}, "worker.target: required"),
        ({"enabled": True}, "worker.topics: required"),
        ({"enabled": True}, "worker.group: required"),
        (
            {"enabled": True, "target": "a:B", "topics": ["t"], "group": "g"},
            "worker.tokenSecret.name: required when tokens are given",
        ),
        (
            {
                **WORKER_ON_KEDA,
                "autoscaling": {"enabled": True, "minReplicas": 5, "maxReplicas": 2},
            },
            "worker.autoscaling.minReplicas: must not exceed",
        ),
    ],
    ids=["target", "topics", "group", "token", "bounds"],
)
def test_bad_worker_values_name_the_key(
    chart: helm.Chart, worker: dict[str, Any], expected: str
) -> None:
    assert expected in render_error(chart, with_values(worker=worker))


def test_keda_without_a_plain_admin_token_is_refused(chart: helm.Chart) -> None:
    values = yaml.safe_load((CHART_DIR / "ci" / "existing-secrets-values.yaml").read_text())
    values["worker"] = WORKER_ON_KEDA
    assert "worker.autoscaling.tokenSecret.name: required" in render_error(chart, values)


def test_schema_rejects_worker_values_the_command_would_refuse(chart: helm.Chart) -> None:
    with pytest.raises(helm.HelmValuesError, match="/worker/group"):
        chart.validate_schema(with_values(worker={"enabled": True, "group": "a/b"}))
    with pytest.raises(helm.HelmValuesError, match="/worker/target"):
        chart.validate_schema(with_values(worker={"enabled": True, "target": "no-colon"}))
    with pytest.raises(helm.HelmValuesError, match="/worker/autoscaling/catchUpSeconds"):
        chart.validate_schema(
            with_values(
                worker={"enabled": True, "autoscaling": {"enabled": True, "catchUpSeconds": 0}}
            )
        )


# --- Kafka TLS and SASL for the workers (issue 18 item 7) -------------------------------------


def test_the_worker_gets_the_same_kafka_security_as_the_coordinator(chart: helm.Chart) -> None:
    objects = render(
        chart,
        {
            **with_values(worker=WORKER_ON_KEDA),
            "kafka": {**SASL_SSL, "bootstrapServers": "kafka:9093"},
        },
    )
    coordinator_config = one(objects, "ConfigMap")["data"]
    worker = named(objects, "Deployment", WORKER)
    worker_env = env_of(worker)
    for name, value in coordinator_config.items():
        if name.startswith("KEYRANGE_KAFKA_") and name != "KEYRANGE_KAFKA_BOOTSTRAP":
            worker_name = name.replace("KEYRANGE_KAFKA_", "KEYRANGE_WORKER_KAFKA_")
            assert worker_env[worker_name]["value"] == value
    assert worker_env["KEYRANGE_WORKER_KAFKA_SECURITY_PROTOCOL"]["value"] == "SASL_SSL"
    assert worker_env["KEYRANGE_WORKER_KAFKA_SASL_PASSWORD"]["valueFrom"] == {
        "secretKeyRef": {"name": "kafka-user", "key": "password"}
    }
    assert worker_env["KEYRANGE_WORKER_BOOTSTRAP"]["value"] == "kafka:9093"
    mounts = {m["name"]: m for m in container(worker)["volumeMounts"]}
    assert mounts["kafka-tls"]["mountPath"] == "/etc/keyrange/kafka-tls"
    volumes = {v["name"]: v for v in pod_spec(worker)["volumes"]}
    assert volumes["kafka-tls"]["secret"]["secretName"] == "kafka-ca"
    # `keyrange worker` reads those variables into the same security the coordinator uses.
    from client.kafka_security import KafkaSecurity
    from client.worker.command import add_parser, settings

    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    environment = owner_environment(
        objects,
        worker,
        {"kafka-user": {"password": "s3cret"}, "billing-token": {"token": "t" * 32}},
    )
    chosen = settings(parser.parse_args(container(worker)["args"]), environment)
    assert chosen["kafka_security"] == KafkaSecurity(
        protocol="SASL_SSL",
        ssl_cafile="/etc/keyrange/kafka-tls/ca.crt",
        ssl_check_hostname=True,
        sasl_mechanism="SCRAM-SHA-512",
        sasl_username="keyrange",
        sasl_password="s3cret",
    )


def test_plaintext_workers_carry_no_kafka_security_variables(chart: helm.Chart) -> None:
    worker = named(render(chart, with_values(worker=WORKER_ON_KEDA)), "Deployment", WORKER)
    assert not [name for name in env_of(worker) if name.startswith("KEYRANGE_WORKER_KAFKA_")]
    assert "kafka-tls" not in {v["name"] for v in pod_spec(worker)["volumes"]}
