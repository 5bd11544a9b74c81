"""Kubernetes manifests: rendered by kustomize, validated, and checked against the policy.

`kubectl kustomize` (kustomize v5, built into kubectl, which this kind of
machine carries) renders the base and the production overlay. Built-in kinds
are validated with `kubernetes-validate --strict`; the prometheus-operator
resources (ServiceMonitor, PrometheusRule) against the models generated from
their CRD schemas (cloudcoil-models-prometheus-operator), with unknown fields
rejected as `--strict` does.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import shutil
from pathlib import Path
from typing import Any

import pydantic
import pytest
import yaml

from tests.ops.grpc_names import GRPC_NAMES
from tests.ops.sync import PROMETHEUS_RULE, RULES, render
from tests.support.tools import ROOT, kubernetes_validate, run

OVERLAYS = {"base": ROOT / "k8s/base", "production": ROOT / "k8s/overlays/production"}
# Who may open a connection to whom (from the *_SERVICE_ADDR each service needs).
CALLERS = {"transcript": {"agent", "summary", "memory"}, "summary": {"agent"}, "memory": {"agent"}}
CUSTOM_GROUP = "monitoring.coreos.com/"


@functools.cache
def rendered(overlay: str) -> tuple[dict[str, Any], ...]:
    kubectl = shutil.which("kubectl")
    assert kubectl, "kubectl (kustomize) is missing; this kind of machine ships it"
    result = run(kubectl, "kustomize", str(OVERLAYS[overlay]))
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def of_kind(docs: tuple[dict[str, Any], ...], kind: str) -> dict[str, dict[str, Any]]:
    return {d["metadata"]["name"]: d for d in docs if d["kind"] == kind}


@functools.cache
def strict_models() -> dict[str, type[pydantic.BaseModel]]:
    """The prometheus-operator models, made to reject unknown fields."""
    modules = [
        importlib.import_module("cloudcoil.models.prometheus_operator.v1"),
        importlib.import_module("cloudcoil.apimachinery"),
    ]
    classes = [
        cls
        for module in modules
        for cls in vars(module).values()
        if inspect.isclass(cls)
        and issubclass(cls, pydantic.BaseModel)
        and not cls.__name__.endswith("Builder")
    ]
    for cls in classes:
        cls.model_config["extra"] = "forbid"
    for cls in classes:
        cls.model_rebuild(force=True)
    v1 = modules[0]
    return {"ServiceMonitor": v1.ServiceMonitor, "PrometheusRule": v1.PrometheusRule}


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_rendered_manifests_validate(overlay: str, tmp_path: Path) -> None:
    docs = rendered(overlay)
    builtin = [d for d in docs if not d["apiVersion"].startswith(CUSTOM_GROUP)]
    custom = [d for d in docs if d["apiVersion"].startswith(CUSTOM_GROUP)]
    path = tmp_path / "builtin.yaml"
    path.write_text(yaml.safe_dump_all(builtin))
    checked = run(kubernetes_validate(), "--strict", "--quiet", str(path))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert sorted(d["kind"] for d in custom) == ["PrometheusRule", "ServiceMonitor"]
    for doc in custom:
        strict_models()[doc["kind"]].model_validate(doc)


def test_the_validators_reject_unknown_fields(tmp_path: Path) -> None:
    deployment = dict(of_kind(rendered("base"), "Deployment")["transcript"])
    deployment["spec"] = {**deployment["spec"], "replica": 2}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(deployment))
    assert run(kubernetes_validate(), "--strict", "--quiet", str(path)).returncode != 0
    monitor = of_kind(rendered("base"), "ServiceMonitor")["runifold"]
    bad = {**monitor, "spec": {**monitor["spec"], "endpoint": []}}
    with pytest.raises(pydantic.ValidationError):
        strict_models()["ServiceMonitor"].model_validate(bad)


def test_prometheusrule_is_the_rules_file() -> None:
    assert PROMETHEUS_RULE.read_text() == render(), "run `make deploy-sync`"
    rule = of_kind(rendered("production"), "PrometheusRule")["runifold"]
    assert rule["spec"] == yaml.safe_load(RULES.read_text())


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_each_service_deployment_follows_the_policy(overlay: str) -> None:
    docs = rendered(overlay)
    deployments = of_kind(docs, "Deployment")
    services = of_kind(docs, "Service")
    budgets = of_kind(docs, "PodDisruptionBudget")
    autoscalers = of_kind(docs, "HorizontalPodAutoscaler")
    assert set(deployments) == set(GRPC_NAMES)
    for name, deployment in deployments.items():
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        assert container["command"] == ["python", "-m", f"services.{name}"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["automountServiceAccountToken"] is False
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        assert {"/tmp", "/data"} <= mounts.keys()
        assert all("emptyDir" in volumes[mounts[path]] for path in ("/tmp", "/data"))
        for probe in ("startupProbe", "readinessProbe"):
            assert container[probe]["grpc"] == {"port": 50051, "service": GRPC_NAMES[name]}
        # Liveness must not follow the database (a restart would not bring it back).
        assert container["livenessProbe"]["grpc"] == {"port": 50051, "service": "runifold.liveness"}
        assert {"cpu", "memory"} <= container["resources"]["requests"].keys()
        assert "memory" in container["resources"]["limits"]
        ports = {p["name"]: p["containerPort"] for p in container["ports"]}
        assert ports == {"grpc": 50051, "metrics": 9464}
        secrets = {
            e["name"]: e["valueFrom"]["secretKeyRef"]
            for e in container["env"]
            if "secretKeyRef" in e.get("valueFrom", {})
        }
        assert "RUNIFOLD_PAGE_TOKEN_SECRET" in secrets
        assert ("DATABASE_URL" in secrets) == (name != "agent")
        assert container["envFrom"] == [{"configMapRef": {"name": "runifold-config"}}]

        service = services[name]
        assert service["spec"]["selector"].items() <= pod_labels(deployment).items()
        by_name = {p["name"]: p for p in service["spec"]["ports"]}
        assert by_name["grpc"]["appProtocol"] == "grpc" and by_name["grpc"]["port"] == 50051
        assert by_name["metrics"]["port"] == 9464
        selector = budgets[name]["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels(deployment).items()
        target = autoscalers[name]["spec"]["scaleTargetRef"]
        assert (target["kind"], target["name"]) == ("Deployment", name)
        assert autoscalers[name]["spec"]["minReplicas"] >= 2


def pod_labels(deployment: dict[str, Any]) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def test_production_pins_the_image_and_a_namespace() -> None:
    docs = rendered("production")
    for doc in docs:
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == "runifold", doc["metadata"]["name"]
    for doc in [*of_kind(docs, "Deployment").values(), *of_kind(docs, "Job").values()]:
        (container,) = doc["spec"]["template"]["spec"]["containers"]
        assert container["image"] == "registry.example.com/runifold:0.1.0"
    namespace = of_kind(docs, "Namespace")["runifold"]
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_network_policies_let_only_callers_in() -> None:
    docs = rendered("base")
    policies = of_kind(docs, "NetworkPolicy")
    deny = policies["runifold-default-deny-ingress"]["spec"]
    assert deny["policyTypes"] == ["Ingress"] and "ingress" not in deny
    for name, callers in CALLERS.items():
        (rule,) = policies[f"{name}-allow-callers"]["spec"]["ingress"]
        (peer,) = rule["from"]
        (expression,) = peer["podSelector"]["matchExpressions"]
        assert expression["key"] == "app.kubernetes.io/component"
        assert set(expression["values"]) == callers
        assert rule["ports"] == [{"port": "grpc", "protocol": "TCP"}]
    (scrape,) = policies["runifold-allow-prometheus"]["spec"]["ingress"]
    assert scrape["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    config = of_kind(docs, "ConfigMap")["runifold-config"]["data"]
    for name in ("transcript", "summary", "memory"):
        assert config[f"{name.upper()}_SERVICE_ADDR"] == f"{name}:50051"


def test_monitoring_and_migration() -> None:
    docs = rendered("base")
    monitor = of_kind(docs, "ServiceMonitor")["runifold"]["spec"]
    # job="runifold" and service=<component>, as the rules and the dashboard expect.
    for service in of_kind(docs, "Service").values():
        labels = service["metadata"]["labels"]
        assert labels[monitor["jobLabel"]] == "runifold"
        assert monitor["selector"]["matchLabels"].items() <= labels.items()
    (endpoint,) = monitor["endpoints"]
    assert endpoint["port"] == "metrics"
    assert endpoint["relabelings"][0]["targetLabel"] == "service"
    job = of_kind(docs, "Job")["runifold-migrate"]["spec"]["template"]["spec"]
    (container,) = job["containers"]
    assert container["command"] == ["python", "-m", "services.migrate"]
    assert {"name": "RUNIFOLD_MIGRATE", "value": "auto"} in container["env"]
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    config = of_kind(docs, "ConfigMap")["runifold-config"]["data"]
    assert config["RUNIFOLD_MIGRATE"] == "check"  # the services only check


def _mebibytes(quantity: str) -> float:
    units = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0}
    return float(quantity[:-2]) * units[quantity[-2:]]


@pytest.mark.parametrize("overlay", sorted(OVERLAYS))
def test_the_transcript_memory_limit_covers_the_watch_formula(overlay: str) -> None:
    """docs/operations.md, "Memory of a TranscriptService": the pod's limit holds the
    baseline, twice the watch byte budget, the streams and the pool, with the defaults
    and the overlay's pool, and leaves room for the other calls."""
    from services.transcript.config import WatchLimits

    docs = rendered(overlay)
    config = of_kind(docs, "ConfigMap")["runifold-config"]["data"]
    (container,) = of_kind(docs, "Deployment")["transcript"]["spec"]["template"]["spec"][
        "containers"
    ]
    limits = WatchLimits()
    assert not any(name.startswith("RUNIFOLD_WATCH_") for name in config)  # the defaults
    formula = (
        100
        + 2 * limits.max_buffered_bytes / 2**20
        + limits.max_watchers * 64 / 1024
        + int(config["RUNIFOLD_DB_POOL_MAX"])
    )
    limit = _mebibytes(container["resources"]["limits"]["memory"])
    # At least 128 MiB for the other calls (requests read whole, ListEntries pages).
    assert formula + 128 <= limit, (formula, limit)
