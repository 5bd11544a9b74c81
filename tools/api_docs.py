"""Generate docs/api.md from the protos' comments (`make gen`; checked by `make gen-check`).

Hand-written: protoc-gen-doc is a Go binary that no registry reachable here
ships; this walks protoc's own descriptor set (with source info) instead.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

from google.protobuf import descriptor_pb2

ROOT = Path(__file__).resolve().parent.parent
PROTO = ROOT / "proto"

_TYPES = {
    descriptor_pb2.FieldDescriptorProto.TYPE_DOUBLE: "double",
    descriptor_pb2.FieldDescriptorProto.TYPE_FLOAT: "float",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT64: "int64",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT64: "uint64",
    descriptor_pb2.FieldDescriptorProto.TYPE_INT32: "int32",
    descriptor_pb2.FieldDescriptorProto.TYPE_BOOL: "bool",
    descriptor_pb2.FieldDescriptorProto.TYPE_STRING: "string",
    descriptor_pb2.FieldDescriptorProto.TYPE_BYTES: "bytes",
    descriptor_pb2.FieldDescriptorProto.TYPE_UINT32: "uint32",
}


def descriptor_set() -> descriptor_pb2.FileDescriptorSet:
    """Compile every proto with source info."""
    files = sorted(str(p.relative_to(PROTO)) for p in PROTO.rglob("*.proto"))
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder) / "set.pb"
        subprocess.run(
            [
                sys.executable,
                "-m",
                "grpc_tools.protoc",
                f"-I{PROTO}",
                "--include_source_info",
                f"--descriptor_set_out={out}",
                *files,
            ],
            check=True,
        )
        parsed = descriptor_pb2.FileDescriptorSet()
        parsed.ParseFromString(out.read_bytes())
        return parsed


def _comments(file: descriptor_pb2.FileDescriptorProto) -> dict[tuple[int, ...], str]:
    found = {}
    for location in file.source_code_info.location:
        text = location.leading_comments.strip()
        if text:
            found[tuple(location.path)] = " ".join(
                line.strip() for line in text.splitlines()
            ).replace("|", "\\|")
    return found


def _type(field: descriptor_pb2.FieldDescriptorProto, maps: set[str]) -> str:
    if field.type_name:
        name = field.type_name.lstrip(".")
        if name in maps:
            return "map<string, string>"
        kind = f"`{name}`"
    else:
        kind = _TYPES.get(field.type, "?")
    if field.label == field.LABEL_REPEATED and field.type_name.lstrip(".") not in maps:
        return f"repeated {kind}"
    if field.proto3_optional:
        return f"optional {kind}"
    return kind


def _message(
    name: str,
    message: descriptor_pb2.DescriptorProto,
    path: tuple[int, ...],
    comments: dict[tuple[int, ...], str],
) -> Iterator[str]:
    maps = {f"{name}.{n.name}" for n in message.nested_type if n.options.map_entry}
    yield f"#### `{name}`\n"
    if comments.get(path):
        yield comments[path] + "\n"
    if message.field:
        yield "| field | type | description |"
        yield "|---|---|---|"
        for index, field in enumerate(message.field):
            described = comments.get((*path, 2, index), "")
            yield f"| `{field.name}` | {_type(field, maps)} | {described} |"
        yield ""
    for index, nested in enumerate(message.nested_type):
        if not nested.options.map_entry:
            yield from _message(f"{name}.{nested.name}", nested, (*path, 3, index), comments)


def _enum(
    name: str,
    enum: descriptor_pb2.EnumDescriptorProto,
    path: tuple[int, ...],
    comments: dict[tuple[int, ...], str],
) -> Iterator[str]:
    yield f"#### `{name}`\n"
    if comments.get(path):
        yield comments[path] + "\n"
    yield "| value | number | description |"
    yield "|---|---|---|"
    for index, value in enumerate(enum.value):
        yield f"| `{value.name}` | {value.number} | {comments.get((*path, 2, index), '')} |"
    yield ""


def render() -> str:
    """docs/api.md."""
    lines = [
        "# API reference",
        "",
        "Generated from the comments of `proto/` by `make gen` (tools/api_docs.py); do not",
        "edit by hand. Every error carries `google.rpc.ErrorInfo` (domain `runifold.io`)",
        "with a stable reason: see [errors.md](errors.md).",
        "",
    ]
    for file in descriptor_set().file:
        if not file.package.startswith("runifold."):
            continue
        comments = _comments(file)
        lines += [f"## `{file.package}` ({file.name})", ""]
        for s_index, service in enumerate(file.service):
            lines += [f"### service `{file.package}.{service.name}`", ""]
            if comments.get((6, s_index)):
                lines += [comments[(6, s_index)], ""]
            lines += ["| RPC | request | response | description |", "|---|---|---|---|"]
            for m_index, method in enumerate(service.method):
                response = method.output_type.lstrip(".").rsplit(".", 1)[-1]
                if method.server_streaming:
                    response = f"stream {response}"
                lines.append(
                    f"| `{method.name}` | `{method.input_type.lstrip('.').rsplit('.', 1)[-1]}` "
                    f"| `{response}` | {comments.get((6, s_index, 2, m_index), '')} |"
                )
            lines.append("")
        if file.message_type or file.enum_type:
            lines += ["### Messages and enums", ""]
        for index, enum in enumerate(file.enum_type):
            lines += list(_enum(f"{file.package}.{enum.name}", enum, (5, index), comments))
        for index, message in enumerate(file.message_type):
            lines += list(_message(f"{file.package}.{message.name}", message, (4, index), comments))
    return "\n".join(lines).rstrip() + "\n"


def main() -> None:
    target = ROOT / "docs" / "api.md"
    if sys.argv[1:] == ["--check"]:
        if not target.exists() or target.read_text() != render():
            print("docs/api.md is stale: run make gen")
            raise SystemExit(1)
        print("docs/api.md is up to date")
        return
    target.write_text(render())


if __name__ == "__main__":
    main()
