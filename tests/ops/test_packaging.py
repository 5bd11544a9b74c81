"""The three distributions of the checkout and what each depends on, read from their
pyproject.toml files: the services (the root) and the client (clients/python) each name
the generated code (runifold-proto, gen/python) by a direct reference into the checkout,
and neither names the other. tests/clients/test_clients_e2e.py installs the client into a
fresh virtual environment; the image's test (test_image.py) holds the services' build.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path
from typing import Any

from tests.support.tools import ROOT

SERVICES = ROOT
CLIENT = ROOT / "clients" / "python"
GENERATED = ROOT / "gen" / "python"
# What only the server needs: never in the client's environment.
SERVER_ONLY = {"psycopg", "pgserver", "onnxruntime", "onnx", "qdrant-client", "starlette"}
# What only the client needs: never in the server's environment.
CLIENT_ONLY = {"runifold-client", "rich"}


def project(folder: Path) -> dict[str, Any]:
    config: dict[str, Any] = tomllib.loads((folder / "pyproject.toml").read_text())
    return config


def names(requirements: list[str]) -> set[str]:
    """The distribution names of requirements (extras, versions and URLs dropped)."""
    return {re.split(r"[\s\[=<>!~;@]", r, maxsplit=1)[0].lower() for r in requirements}


def direct_reference(folder: Path, name: str) -> Path:
    """Where `folder`'s requirement on `name` points, its hatchling context fields resolved
    as they are at build time ({root:uri}, with :parent modifiers)."""
    (requirement,) = [r for r in project(folder)["project"]["dependencies"] if names([r]) == {name}]
    match = re.fullmatch(rf"{name} @ \{{root((?::parent)*):uri\}}(/\S+)", requirement)
    assert match, f"{requirement!r}: not a direct reference relative to the project's root"
    root = folder
    for _ in range(match[1].count(":parent")):
        root = root.parent
    return Path(str(root) + match[2])


def test_services_and_client_each_name_the_generated_code_in_the_checkout() -> None:
    assert project(GENERATED)["project"]["name"] == "runifold-proto"
    for folder in (SERVICES, CLIENT):
        assert direct_reference(folder, "runifold-proto").resolve() == GENERATED.resolve()
        config = project(folder)
        assert config["tool"]["hatch"]["metadata"]["allow-direct-references"] is True
        assert config["build-system"]["build-backend"] == "hatchling.build"


def test_neither_depends_on_the_other() -> None:
    services = names(project(SERVICES)["project"]["dependencies"])
    client = names(project(CLIENT)["project"]["dependencies"])
    assert not services & CLIENT_ONLY, services & CLIENT_ONLY
    assert not client & SERVER_ONLY, client & SERVER_ONLY
    assert "runifold-services" not in client


def test_the_generated_code_ships_typed() -> None:
    """runifold-proto's wheel is the runifold namespace package (no __init__.py), marked
    typed; the build backends are pinned, like every other dependency."""
    config = project(GENERATED)
    assert config["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"] == ["runifold"]
    package = GENERATED / "runifold"
    assert (package / "py.typed").is_file() and not (package / "__init__.py").exists()
    for folder in (SERVICES, CLIENT, GENERATED):
        (backend,) = project(folder)["build-system"]["requires"]
        assert re.fullmatch(r"hatchling==[0-9.]+", backend), backend
