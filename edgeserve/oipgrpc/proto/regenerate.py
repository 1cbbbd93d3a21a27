"""Rebuild the .proto files and the generated *_pb2.py here (build time only; see README.md).

    .venv/bin/pip install grpcio-tools        # protoc for Python; not a runtime dependency
    .venv/bin/python -m edgeserve.oipgrpc.proto.regenerate

The .proto text is Triton's grpc_service.proto and model_config.proto (github.com/
triton-inference-server/common, protobuf/) as the installed tritonclient's generated code carries
them (its serialized FileDescriptorProto: every message, field number and type, without the
comments), written back as .proto source with the package renamed `inference` -> PACKAGE and the
files placed under edgeserve/oipgrpc/proto/. The renaming changes nothing on the wire (a message's
bytes hold field numbers, never type names; the service is registered under Triton's name,
`inference.GRPCInferenceService`, by the front itself), and it lets tritonclient and edgeserve be
imported in one process: two files defining `inference.ModelInferRequest` differently (another
tritonclient version) cannot both enter protobuf's default descriptor pool.

Then `python -m grpc_tools.protoc -I . --python_out=. --pyi_out=. <the two .proto files>` from the
repository root generates the modules (only messages: the front registers its handlers itself).
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from google.protobuf import descriptor_pb2

PACKAGE = "edgeserve.inference"
HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]  # the repository root: protoc's include path
PREFIX = "edgeserve/oipgrpc/proto/"

_TYPES = {
    value: name.removeprefix("TYPE_").lower()
    for name, value in descriptor_pb2.FieldDescriptorProto.Type.items()
    if name not in ("TYPE_MESSAGE", "TYPE_ENUM", "TYPE_GROUP")
}
_HEADER = """\
// Triton Inference Server's {name} (github.com/triton-inference-server/common, protobuf/{name}),
// Copyright (c) NVIDIA CORPORATION, BSD-3-Clause: the KServe v2 / Open Inference Protocol over gRPC.
// Written back from tritonclient {version}'s descriptor by regenerate.py (comments not kept), with
// the package renamed to {package}; the wire format is unchanged. Do not edit: run regenerate.py.
"""


def _type_name(name: str) -> str:
    return "." + PACKAGE + name.removeprefix(".inference")


def _field_type(field: descriptor_pb2.FieldDescriptorProto) -> str:
    if field.type_name:
        return _type_name(field.type_name)
    return _TYPES[field.type]


def _field(
    field: descriptor_pb2.FieldDescriptorProto, maps: dict[str, descriptor_pb2.DescriptorProto]
) -> str:
    entry = maps.get(field.type_name)
    if entry is not None:
        key, value = entry.field
        return f"map<{_field_type(key)}, {_field_type(value)}> {field.name} = {field.number};"
    label = "repeated " if field.label == field.LABEL_REPEATED else ""
    label = "optional " if field.proto3_optional else label
    return f"{label}{_field_type(field)} {field.name} = {field.number};"


def _enum(enum: descriptor_pb2.EnumDescriptorProto, indent: str) -> list[str]:
    lines = [f"{indent}enum {enum.name} {{"]
    lines += [f"{indent}  {v.name} = {v.number};" for v in enum.value]
    return [*lines, f"{indent}}}"]


def _message(message: descriptor_pb2.DescriptorProto, scope: str, indent: str) -> list[str]:
    full = f"{scope}.{message.name}"
    maps = {f"{full}.{n.name}": n for n in message.nested_type if n.options.map_entry}
    lines = [f"{indent}message {message.name} {{"]
    for nested in message.nested_type:
        if not nested.options.map_entry:
            lines += _message(nested, full, indent + "  ")
    for enum in message.enum_type:
        lines += _enum(enum, indent + "  ")
    oneofs: dict[int, list[str]] = {}
    for field in message.field:
        text = _field(field, maps)
        if field.HasField("oneof_index") and not field.proto3_optional:
            oneofs.setdefault(field.oneof_index, []).append(text)
            if len(oneofs[field.oneof_index]) == 1:
                lines.append(f"{indent}  oneof {message.oneof_decl[field.oneof_index].name} {{")
                lines.append(f"__ONEOF_{field.oneof_index}__")
        else:
            lines.append(f"{indent}  {text}")
    for index, texts in oneofs.items():
        at = lines.index(f"__ONEOF_{index}__")
        lines[at : at + 1] = [*(f"{indent}    {t}" for t in texts), f"{indent}  }}"]
    return [*lines, f"{indent}}}"]


def proto_source(file: descriptor_pb2.FileDescriptorProto, version: str) -> str:
    lines = [_HEADER.format(name=file.name, version=version, package=PACKAGE), 'syntax = "proto3";', ""]
    lines += [f"package {PACKAGE};", ""]
    lines += [f'import "{PREFIX}{d}";' for d in file.dependency]
    for enum in file.enum_type:
        lines += ["", *_enum(enum, "")]
    for message in file.message_type:
        lines += ["", *_message(message, ".inference", "")]
    for service in file.service:
        lines += ["", f"service {service.name} {{"]
        for method in service.method:
            client = "stream " if method.client_streaming else ""
            server = "stream " if method.server_streaming else ""
            lines.append(
                f"  rpc {method.name}({client}{_type_name(method.input_type)}) "
                f"returns ({server}{_type_name(method.output_type)});"
            )
        lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    import importlib.metadata

    from tritonclient.grpc import model_config_pb2, service_pb2

    version = importlib.metadata.version("tritonclient")
    names = []
    for module in (model_config_pb2, service_pb2):
        file = descriptor_pb2.FileDescriptorProto.FromString(module.DESCRIPTOR.serialized_pb)
        (HERE / file.name).write_text(proto_source(file, version))
        names.append(PREFIX + file.name)
    command = [sys.executable, "-m", "grpc_tools.protoc", "-I", ".", "--python_out=.", "--pyi_out=.", *names]
    return subprocess.call(command, cwd=ROOT)


if __name__ == "__main__":
    raise SystemExit(main())
