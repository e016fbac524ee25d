"""The Kubernetes manifests in docker/k8s: valid against the Kubernetes schemas (strictly: a
misspelt field is an error, not ignored) and wired together the way the gateway runs."""

from __future__ import annotations

import copy
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from core.settings import Settings
from gateway.app import shutdown_grace
from gateway.cli import _parser
from gateway.worker import stop_grace

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = ROOT / "docker" / "k8s"
# The oldest Kubernetes the manifests are written for (preStop `sleep` is 1.30's).
KUBERNETES = "1.30"


def _documents() -> Iterator[tuple[str, dict[str, Any]]]:
    for path in sorted(MANIFESTS.rglob("*.yaml")):
        for document in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if document:
                yield f"{path.relative_to(MANIFESTS)}:{document['kind']}", document


DOCUMENTS = list(_documents())
BY_KIND: dict[str, list[dict[str, Any]]] = {}
for _, _document in DOCUMENTS:
    BY_KIND.setdefault(_document["kind"], []).append(_document)


def _named(kind: str, name: str) -> dict[str, Any]:
    return next(d for d in BY_KIND[kind] if d["metadata"]["name"] == name)


def _pods() -> Iterator[tuple[str, dict[str, Any]]]:
    for kind in ("Deployment", "Job"):
        for document in BY_KIND[kind]:
            yield document["metadata"]["name"], document["spec"]["template"]


@pytest.mark.parametrize(("where", "document"), DOCUMENTS, ids=[w for w, _ in DOCUMENTS])
def test_each_manifest_is_valid_kubernetes(where: str, document: dict[str, Any]) -> None:
    kubernetes_validate.validate(document, KUBERNETES, strict=True)


def test_a_misspelt_field_is_refused() -> None:
    gateway = copy.deepcopy(_named("Deployment", "parley-gateway"))
    container = gateway["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(kubernetes_validate.ValidationError, match="readinesProbe"):
        kubernetes_validate.validate(gateway, KUBERNETES, strict=True)


def test_gateways_and_workers_scale_are_probed_and_stop_gracefully() -> None:
    assert {d["metadata"]["name"] for d in BY_KIND["Deployment"]} == {
        "parley-gateway",
        "parley-worker",
    }
    for deployment in BY_KIND["Deployment"]:
        name = deployment["metadata"]["name"]
        labels = deployment["spec"]["template"]["metadata"]["labels"]
        assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
        # An autoscaler on CPU and a disruption budget for each, aimed at its pods.
        scaler = _named("HorizontalPodAutoscaler", name)
        assert scaler["spec"]["scaleTargetRef"] == {
            "apiVersion": "apps/v1", "kind": "Deployment", "name": name,
        }  # fmt: skip
        assert [m["resource"]["name"] for m in scaler["spec"]["metrics"]] == ["cpu"]
        assert scaler["spec"]["minReplicas"] >= 2
        budget = _named("PodDisruptionBudget", name)
        assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
        assert 1 <= budget["spec"]["minAvailable"] < scaler["spec"]["minReplicas"]

    gateway = _named("Deployment", "parley-gateway")["spec"]["template"]["spec"]
    (container,) = gateway["containers"]
    assert container["command"] == ["parley", "serve", "--no-workers"]
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert [p["name"] for p in container["ports"]] == ["http"]
    pause = container["lifecycle"]["preStop"]["sleep"]["seconds"]
    # Killed only after the pause out of the Service and the gateway's own grace for the
    # requests and streams in flight: the slowest turn the manifests' settings allow.
    settings = _manifest_settings()
    assert settings.llm_configured  # the grace a model's timeouts need, not the extractive one
    assert gateway["terminationGracePeriodSeconds"] > pause + shutdown_grace(settings)
    # A worker lets the turns it holds finish, and their replies go out: killed only after
    # the slowest could.
    worker = _named("Deployment", "parley-worker")["spec"]["template"]["spec"]
    assert worker["terminationGracePeriodSeconds"] > stop_grace(settings)
    service = _named("Service", "parley-gateway")
    assert service["spec"]["selector"].items() <= (
        _named("Deployment", "parley-gateway")["spec"]["template"]["metadata"]["labels"].items()
    )
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["http"]


def _manifest_settings() -> Settings:
    """The settings the manifests give every process, as far as they bear on how long a turn
    may take: the ConfigMap's, and whether the Secret configures a model (its values are
    placeholders)."""
    config = dict(_named("ConfigMap", "parley-config")["data"])
    secrets = _named("Secret", "parley-secrets")["stringData"]
    names = {
        f"PARLEY_{name.upper()}": name for name in Settings.model_fields if name != "llm_api_key"
    }
    values: dict[str, Any] = {names[k]: v for k, v in config.items() if k in names}
    if "PARLEY_LLM_API_KEY" in secrets or "OPENAI_API_KEY" in secrets:
        values["llm_api_key"] = "sk-placeholder"
    return Settings(_env_file=None, **values)


def test_every_process_runs_a_parley_command_with_its_secrets_from_a_secret() -> None:
    names = []
    for name, template in _pods():
        names.append(name)
        for container in template["spec"]["containers"]:
            command = container["command"]
            assert command[0] == "parley"
            _parser().parse_args(command[1:])  # a command and options the CLI has
            sources = container["envFrom"]
            assert {"secretRef": {"name": "parley-secrets"}} in sources
            assert {"configMapRef": {"name": "parley-config"}} in sources
            assert "env" not in container  # no value written into the manifest itself
        assert template["spec"]["securityContext"]["runAsNonRoot"] is True
    assert sorted(names) == ["parley-gateway", "parley-migrate", "parley-worker"]
    assert _named("Job", "parley-migrate")["spec"]["template"]["spec"]["containers"][0][
        "command"
    ] == ["parley", "migrate"]
    # The configuration holds nothing secret; the example Secret only placeholders.
    config = _named("ConfigMap", "parley-config")["data"]
    assert not [k for k in config if any(w in k for w in ("TOKEN", "KEY", "SECRET", "_URL"))
                and k != "PARLEY_PUBLIC_URL"]  # fmt: skip
    example = _named("Secret", "parley-secrets")["stringData"]
    assert all("change-me" in v for k, v in example.items() if "TOKEN" in k or "KEY" in k)
    assert ":change-me@" in example["PARLEY_DATABASE_URL"]
