"""docker/compose.yaml against the Compose Specification, and the order its services start in.

No container registry is reachable where the tests run, so the stack itself is never started
here: the file is checked as `docker compose` would read it (the Compose Specification's own
JSON schema, vendored in tests/schemas/), and for what makes it start in the right order.
"""

from __future__ import annotations

import json
import re
from graphlib import TopologicalSorter
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

ROOT = Path(__file__).resolve().parents[2]
DOCKER = ROOT / "docker"
SCHEMA = ROOT / "tests" / "schemas" / "compose-spec.json"
COMPOSE_FILES = sorted(DOCKER.glob("compose*.y*ml")) + sorted(DOCKER.glob("docker-compose*.y*ml"))
COMPOSE = DOCKER / "compose.yaml"
APP = ("gateway", "worker")  # the long-running Parley services


def _load(path: Path) -> dict[str, Any]:
    document: dict[str, Any] = yaml.safe_load(path.read_text(encoding="utf-8"))
    return document


@pytest.fixture(scope="module")
def validator() -> Draft202012Validator:
    schema = json.loads(SCHEMA.read_text(encoding="utf-8"))
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


@pytest.fixture(scope="module")
def services() -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = _load(COMPOSE)["services"]
    return found


def test_there_is_a_compose_file() -> None:
    assert COMPOSE in COMPOSE_FILES


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=lambda p: p.name)
def test_the_file_follows_the_compose_specification(
    path: Path, validator: Draft202012Validator
) -> None:
    errors = sorted(validator.iter_errors(_load(path)), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(
        f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors
    )


def test_the_schema_refuses_what_compose_refuses(validator: Draft202012Validator) -> None:
    """The check has teeth: an unknown key, a bare `no` and an unknown condition fail it."""
    document = _load(COMPOSE)
    assert validator.is_valid(document)
    for service, key, value in [
        ("gateway", "depends_on", {"postgres": {"condition": "service_ready"}}),
        ("migrate", "restart", False),  # `restart: no` unquoted is YAML's false
        ("worker", "healthcheck", {"test": ["CMD", "true"], "interval": 5}),
        ("gateway", "commands", ["parley", "serve"]),
    ]:
        broken = json.loads(json.dumps(document))
        broken["services"][service][key] = value
        assert not validator.is_valid(broken), (service, key, value)


def test_every_dependency_waits_for_health_or_completion(
    services: dict[str, dict[str, Any]],
) -> None:
    for name, service in services.items():
        for needed, how in (service.get("depends_on") or {}).items():
            assert needed in services, (name, needed)
            condition = how["condition"]
            if condition == "service_healthy":
                check = services[needed].get("healthcheck") or {}
                assert check.get("test"), (name, needed)
                assert not check.get("disable"), (name, needed)
            else:
                assert condition == "service_completed_successfully", (name, needed, condition)
                assert services[needed].get("restart") == "no", needed  # a one-shot step


def test_the_migrations_run_once_as_their_own_step_before_the_app(
    services: dict[str, dict[str, Any]],
) -> None:
    migrate = services["migrate"]
    assert migrate["command"] == ["parley", "migrate"]
    assert migrate["restart"] == "no"
    assert migrate["depends_on"] == {"postgres": {"condition": "service_healthy"}}
    assert "ports" not in migrate
    for name in APP:
        depends = services[name]["depends_on"]
        assert depends["migrate"] == {"condition": "service_completed_successfully"}, name
        assert depends["postgres"] == {"condition": "service_healthy"}, name
        assert depends["redis"] == {"condition": "service_healthy"}, name
        assert services[name]["image"] == migrate["image"], name  # the same build


def test_the_start_order(services: dict[str, dict[str, Any]]) -> None:
    graph = {name: set(s.get("depends_on") or {}) for name, s in services.items()}
    sorter = TopologicalSorter(graph)
    sorter.prepare()  # raises on a cycle
    waves = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        waves.append(ready)
        sorter.done(*ready)
    assert waves == [["postgres", "redis"], ["migrate"], ["gateway", "worker"], ["proxy"]]


def test_health_checks(services: dict[str, dict[str, Any]]) -> None:
    assert services["postgres"]["healthcheck"]["test"][:2] == ["CMD", "pg_isready"]
    assert services["redis"]["healthcheck"]["test"] == ["CMD", "redis-cli", "ping"]
    probe = " ".join(services["gateway"]["healthcheck"]["test"])
    (port,) = services["gateway"]["expose"]
    assert f"http://127.0.0.1:{port}/readyz" in probe
    # Gateways publish no port (so `--scale gateway=N` can start several): the proxy does,
    # and passes every request to one of them, streams unbuffered.
    assert "ports" not in services["gateway"]
    assert services["proxy"]["ports"] == [f"{port}:8080"]
    assert services["proxy"]["depends_on"] == {"gateway": {"condition": "service_healthy"}}
    mounted, target = services["proxy"]["volumes"][0].split(":")[:2]
    assert target == "/etc/nginx/nginx.conf"
    proxy = (DOCKER / mounted).read_text(encoding="utf-8")
    assert f"set $gateways gateway:{port};" in proxy
    assert "resolver 127.0.0.11" in proxy  # Docker's DNS, asked again as gateways come and go
    assert "proxy_buffering off;" in proxy
    assert services["gateway"]["command"] == ["parley", "serve", "--no-workers"]
    assert services["worker"]["command"] == ["parley", "worker"]
    # The image's own check probes the gateway's port, which the others do not open.
    dockerfile = (DOCKER / "Dockerfile").read_text(encoding="utf-8")
    assert re.search(r"^HEALTHCHECK .*\n.*127\.0\.0\.1:8080/healthz", dockerfile, re.M)
    for name in ("migrate", "worker"):
        assert services[name]["healthcheck"] == {"disable": True}, name


def test_the_build_and_the_images(services: dict[str, dict[str, Any]]) -> None:
    build = services["gateway"]["build"]
    context = (DOCKER / build["context"]).resolve()
    assert context == ROOT
    assert (context / build["dockerfile"]).is_file()
    # pgvector 0.8 or newer (core/store/migrate.py refuses older), PostgreSQL 18 as embedded
    assert services["postgres"]["image"] == "pgvector/pgvector:pg18"
    assert services["postgres"]["volumes"] == ["postgres18:/var/lib/postgresql"]
    assert services["redis"]["image"].startswith("redis:")
    for name in APP:
        environment = services[name]["environment"]
        assert environment["PARLEY_DATABASE_URL"].startswith("postgresql://parley:parley@postgres:")
        assert environment["PARLEY_REDIS_URL"].startswith("redis://redis:6379/")
