"""The gRPC Python generator as a protoc plugin, for `buf generate` (buf.gen.yaml).

grpcio-tools builds its gRPC Python generator into its own protoc and ships no
`protoc-gen-grpc_python` binary, and buf proxies to protoc's built-ins only for
protoc's own languages. This plugin reads buf's CodeGeneratorRequest, hands its
files to grpcio-tools' protoc as a descriptor set (with source info: the stubs'
docstrings are the protos' comments), and answers with what `--grpc_python_out`
wrote. Nothing is fetched: it runs the grpcio-tools installed by `make dev`.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from google.protobuf import descriptor_pb2
from google.protobuf.compiler import plugin_pb2
from grpc_tools import protoc


def generate(request: plugin_pb2.CodeGeneratorRequest) -> plugin_pb2.CodeGeneratorResponse:
    """The files grpcio-tools' `--grpc_python_out` writes for `request.file_to_generate`."""
    response = plugin_pb2.CodeGeneratorResponse()
    # The generator handles proto3 `optional` (the stubs name messages only).
    response.supported_features = plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        descriptors = root / "set.pb"
        out = root / "out"
        out.mkdir()
        # proto_file holds every file of the request and its imports, imports first.
        descriptors.write_bytes(
            descriptor_pb2.FileDescriptorSet(file=request.proto_file).SerializeToString()
        )
        target = f"{request.parameter}:{out}" if request.parameter else str(out)
        code = protoc.main(
            [
                "grpc_tools.protoc",
                f"--descriptor_set_in={descriptors}",
                f"--grpc_python_out={target}",
                *request.file_to_generate,
            ]
        )
        if code != 0:
            response.error = f"grpc_tools.protoc --grpc_python_out exited with {code}"
            return response
        for path in sorted(p for p in out.rglob("*") if p.is_file()):
            response.file.add(
                name=path.relative_to(out).as_posix(), content=path.read_text("utf-8")
            )
    return response


def main() -> None:
    """Read the request from stdin and write the response to stdout (the plugin protocol)."""
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    sys.stdout.buffer.write(generate(request).SerializeToString())


if __name__ == "__main__":
    main()
