"""The `buf generate` templates for other languages (clients/buf: Go, Java, TypeScript).

Their remote plugins run on the Buf Schema Registry, out of reach here; each template
runs as written otherwise (its inputs, managed mode, outputs and options), with every
remote plugin replaced by a local stand-in that records what buf asked of it
(tests/clients/buf/buf_recorder.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.tools import BIN, ROOT, run

TEMPLATES = ROOT / "clients" / "buf"
RECORDER = Path(__file__).with_name("buf_recorder.py")
CONTRACT = sorted(str(p.relative_to(ROOT / "proto")) for p in (ROOT / "proto").rglob("*.proto"))


def generate(template: Path, out: Path) -> tuple[dict[str, Any], dict[str, list[dict[str, Any]]]]:
    """Run `buf generate` with the template, remote plugins replaced; the template, and
    the records of each plugin by its `out` and index."""
    config = yaml.safe_load(template.read_text())
    for index, plugin in enumerate(config["plugins"]):
        assert set(plugin) & {"remote", "local", "protoc_builtin"} == {"remote"}, plugin
        del plugin["remote"]
        plugin["local"] = [sys.executable, str(RECORDER), str(index)]
    local = out / "buf.gen.yaml"
    local.write_text(yaml.safe_dump(config))
    done = run(str(BIN / "buf"), "generate", "--template", str(local), "-o", str(out))
    assert done.returncode == 0, done.stderr
    records: dict[str, list[dict[str, Any]]] = {}
    for index, plugin in enumerate(config["plugins"]):
        records[f"{index}"] = [
            json.loads(path.read_text())
            for path in sorted((out / plugin["out"]).glob(f"{index}-*.json"))
        ]
    return config, records


def generated_files(records: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {name: options for record in records for name, options in record["files"].items()}


@pytest.mark.parametrize("name", ["go", "java", "ts"])
def test_each_template_pins_its_remote_plugins(name: str) -> None:
    config = yaml.safe_load((TEMPLATES / f"{name}.buf.gen.yaml").read_text())
    assert config["version"] == "v2"
    assert config["inputs"] == [{"directory": "proto"}]
    for plugin in config["plugins"]:
        reference = plugin["remote"]
        assert reference.startswith("buf.build/") and ":v" in reference, reference
        assert plugin["out"].startswith("gen/"), plugin


def test_go_template_generates_every_file_with_the_go_package(tmp_path: Path) -> None:
    config, records = generate(TEMPLATES / "go.buf.gen.yaml", tmp_path)
    (prefix,) = [o["value"] for o in config["managed"]["override"]]
    for index in ("0", "1"):  # messages, then the gRPC stubs
        files = generated_files(records[index])
        assert sorted(files) == CONTRACT
        for proto, options in files.items():
            folder = proto.rsplit("/", 1)[0]
            assert options["go_package"].startswith(f"{prefix}/{folder};"), options
        assert {r["parameter"] for r in records[index]} == {"paths=source_relative"}


def test_java_template_generates_one_class_per_message_in_com_runifold(
    tmp_path: Path,
) -> None:
    _, records = generate(TEMPLATES / "java.buf.gen.yaml", tmp_path)
    for index in ("0", "1"):
        files = generated_files(records[index])
        assert sorted(files) == CONTRACT
        for proto, options in files.items():
            package = "com." + proto.rsplit("/", 1)[0].replace("/", ".")
            assert options["java_package"] == package and options["java_multiple_files"]


def test_ts_template_generates_es_modules_of_typescript(tmp_path: Path) -> None:
    _, records = generate(TEMPLATES / "ts.buf.gen.yaml", tmp_path)
    assert sorted(generated_files(records["0"])) == CONTRACT
    assert {r["parameter"] for r in records["0"]} == {"target=ts,import_extension=js"}
