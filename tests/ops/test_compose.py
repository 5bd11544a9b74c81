"""docker-compose.yml: validated by the real Compose binary, then checked for its wiring.

No Docker engine runs here, so nothing is started: `config` parses,
interpolates and validates the file against the Compose schema, as
`docker compose up` would before creating anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml

from tests.ops.grpc_names import GRPC_NAMES
from tests.support.tools import ROOT, compose_binary, promtool, run

COMPOSE = ROOT / "docker-compose.yml"
PEERS = {
    "transcript": {},
    "summary": {"TRANSCRIPT_SERVICE_ADDR": "transcript:50051"},
    "memory": {"TRANSCRIPT_SERVICE_ADDR": "transcript:50051"},
    "agent": {
        "TRANSCRIPT_SERVICE_ADDR": "transcript:50051",
        "SUMMARY_SERVICE_ADDR": "summary:50051",
        "MEMORY_SERVICE_ADDR": "memory:50051",
    },
}


def config() -> dict[str, Any]:
    result = run(compose_binary(), "-f", str(COMPOSE), "config", "--format", "json")
    assert result.returncode == 0, result.stderr
    document: dict[str, Any] = json.loads(result.stdout)
    return document


def test_compose_config_is_valid() -> None:
    checked = run(compose_binary(), "-f", str(COMPOSE), "config", "-q")
    assert checked.returncode == 0, checked.stderr


def test_the_compose_binary_rejects_a_broken_file(tmp_path: Path) -> None:
    broken = yaml.safe_load(COMPOSE.read_text())
    broken["services"]["agent"]["depends_on"]["ledger"] = {"condition": "service_healthy"}
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    assert run(compose_binary(), "-f", str(path), "config", "-q", cwd=ROOT).returncode != 0


def test_services_are_wired_and_probed_with_grpc_health() -> None:
    services = config()["services"]
    assert services["postgres"]["image"].startswith("pgvector/pgvector:pg16")
    assert services["qdrant"]["image"].startswith("qdrant/qdrant")
    migrate = services["migrate"]
    assert migrate["command"] == ["python", "-m", "services.migrate"]
    assert migrate["environment"]["RUNIFOLD_MIGRATE"] == "auto"
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    images = {migrate["image"]}
    for name, peers in PEERS.items():
        service = services[name]
        images.add(service["image"])
        assert service["command"] == ["python", "-m", f"services.{name}"]
        environment = service["environment"]
        assert environment["RUNIFOLD_MIGRATE"] == "check"
        assert environment["DATABASE_URL"].startswith("postgresql://")
        for variable, address in peers.items():
            assert environment[variable] == address
        # Started only once the migrations ran, directly or through a peer.
        depends = service["depends_on"]
        if "migrate" in depends:
            assert depends["migrate"]["condition"] == "service_completed_successfully"
        for peer in {a.split(":")[0] for a in peers.values()}:
            assert depends[peer]["condition"] == "service_healthy"
        assert service["healthcheck"]["test"] == [
            "CMD",
            "python",
            "-m",
            "services.healthcheck",
            "--service",
            GRPC_NAMES[name],
        ]
        assert service["read_only"] is True and service["cap_drop"] == ["ALL"]
    assert services["transcript"]["depends_on"]["migrate"]
    assert services["memory"]["environment"]["QDRANT_URL"] == "http://qdrant:6333"
    assert len(images) == 1, "one image for every service"


def test_prometheus_loads_the_rules_and_scrapes_every_service() -> None:
    prometheus = config()["services"]["prometheus"]
    mounts = {Path(v["source"]).relative_to(ROOT): v["target"] for v in prometheus["volumes"]
              if v["type"] == "bind"}  # fmt: skip
    assert mounts[Path("deploy/prometheus/rules")] == "/etc/prometheus/rules"
    assert mounts[Path("deploy/prometheus/prometheus.yml")] == "/etc/prometheus/prometheus.yml"
    settings = ROOT / "deploy/prometheus/prometheus.yml"
    checked = run(promtool(), "check", "config", "--syntax-only", str(settings))
    assert checked.returncode == 0, checked.stdout + checked.stderr
    scrape = yaml.safe_load(settings.read_text())
    assert scrape["rule_files"] == ["/etc/prometheus/rules/*.yml"]
    (job,) = scrape["scrape_configs"]
    assert job["job_name"] == "runifold"
    targets = {t["labels"]["service"]: t["targets"] for t in job["static_configs"]}
    assert targets == {name: [f"{name}:9464"] for name in PEERS}
