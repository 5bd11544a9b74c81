"""A stand-in protoc plugin: records the request buf sends it (the parameter, the files to
generate and the options managed mode set on them) as a JSON file, and generates nothing
else. tests/clients/buf/test_buf_templates.py runs the buf.gen.yaml templates with it in place of
their remote plugins, which would need the network.

    python tests/clients/buf/buf_recorder.py TAG   (a CodeGeneratorRequest on stdin)
"""

from __future__ import annotations

import json
import sys

from google.protobuf.compiler import plugin_pb2


def main() -> None:
    request = plugin_pb2.CodeGeneratorRequest.FromString(sys.stdin.buffer.read())
    files = {file.name: file for file in request.proto_file}
    record = {
        "parameter": request.parameter,
        "files": {
            name: {
                "go_package": files[name].options.go_package,
                "java_package": files[name].options.java_package,
                "java_multiple_files": files[name].options.java_multiple_files,
            }
            for name in request.file_to_generate
        },
    }
    response = plugin_pb2.CodeGeneratorResponse(
        supported_features=plugin_pb2.CodeGeneratorResponse.FEATURE_PROTO3_OPTIONAL
    )
    # buf calls a plugin once per directory: one record per call, named after it.
    first = request.file_to_generate[0].replace("/", "_")
    response.file.add(name=f"{sys.argv[1]}-{first}.json", content=json.dumps(record))
    sys.stdout.buffer.write(response.SerializeToString())


if __name__ == "__main__":
    main()
