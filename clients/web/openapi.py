"""Writes the HTTP API's OpenAPI document (clients/web/openapi.json) from the .proto, comments included.

The HTTP API (clients/web/http_api.py) speaks the proto3 JSON mapping of the gRPC messages, so its schemas
are read off the proto's descriptors rather than written by hand: lowerCamelCase field names, 64-bit
integers as decimal strings, bytes as base64, enums by name. Every field's description is its comment in
the .proto. The document is committed; tests/test_http_api.py checks it equals what this module builds.

    python -m attnserve.clients.web.openapi          # rewrites clients/web/openapi.json

Generating needs grpcio-tools (the `dev` extra); serving the document needs only the committed file.
"""

from __future__ import annotations

import json
import pathlib
import tempfile

from google.protobuf import descriptor_pb2

DOCUMENT = pathlib.Path(__file__).parent / "openapi.json"
PROTO = pathlib.Path(__file__).resolve().parents[2] / "protos"
PACKAGE = "attnserve.v1"
VERSION = "1.0.0"

_F = descriptor_pb2.FieldDescriptorProto
_SCALARS = {
    _F.TYPE_DOUBLE: {"type": "number"},
    _F.TYPE_FLOAT: {"type": "number"},
    _F.TYPE_INT32: {"type": "integer", "format": "int32"},
    _F.TYPE_UINT32: {"type": "integer", "format": "int32", "minimum": 0},
    _F.TYPE_SINT32: {"type": "integer", "format": "int32"},
    # proto3 JSON writes 64-bit integers as strings (JavaScript numbers hold 53 bits); it reads either.
    _F.TYPE_INT64: {"type": ["string", "integer"], "format": "int64", "pattern": "^-?[0-9]+$"},
    _F.TYPE_UINT64: {"type": ["string", "integer"], "format": "uint64", "pattern": "^[0-9]+$"},
    _F.TYPE_BOOL: {"type": "boolean"},
    _F.TYPE_STRING: {"type": "string"},
    _F.TYPE_BYTES: {"type": "string", "contentEncoding": "base64"},
}
# Messages the server answers with: every field without presence is always written, so it is required.
_RESPONSE_ROOTS = ("GenerateResponse", "GenerateStreamResponse", "ListModelsResponse", "ModelInfo")


def descriptor_set() -> descriptor_pb2.FileDescriptorProto:
    """The attnserve.proto descriptor with its comments (protoc --include_source_info)."""
    from grpc_tools import protoc  # development-time only

    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "set.pb"
        args = ["protoc", f"-I{PROTO}", "--include_source_info", f"--descriptor_set_out={out}",
                "attnserve/v1/attnserve.proto"]
        if protoc.main(args) != 0:
            raise RuntimeError("protoc failed to read attnserve.proto")
        files = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes())
    return files.file[0]


def build(proto: descriptor_pb2.FileDescriptorProto) -> dict:
    """The OpenAPI 3.1 document: the routes of http_api.py over the proto's messages and enums."""
    comments = _comments(proto)
    responses = _reachable(proto, _RESPONSE_ROOTS)
    schemas = {}
    for i, message in enumerate(proto.message_type):
        schemas[message.name] = _message_schema(message, (4, i), comments, message.name in responses)
    for i, enum in enumerate(proto.enum_type):
        schemas[enum.name] = {"type": "string", "enum": [v.name for v in enum.value],
                              "description": comments.get((5, i), "")}
    schemas["Error"] = _error_schema()
    return {
        "openapi": "3.1.0",
        "info": {"title": "attnserve HTTP API", "version": VERSION,
                 "description": "The gRPC service attnserve.v1.AttnServe over HTTP/JSON (proto3 JSON mapping). "
                                "See docs/http-api.md."},
        "paths": _paths(),
        "components": {"schemas": schemas,
                       "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}}},
        "security": [{}, {"bearer": []}],
    }


def _comments(proto) -> dict[tuple[int, ...], str]:
    """Leading comments by descriptor path, e.g. (4, 0, 2, 1) = message 0, field 1."""
    found = {}
    for location in proto.source_code_info.location:
        text = " ".join(line.strip() for line in location.leading_comments.strip().splitlines())
        if text:
            found[tuple(location.path)] = text
    return found


def _reachable(proto, roots) -> set[str]:
    by_name = {m.name: m for m in proto.message_type}
    seen, todo = set(), list(roots)
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo += [f.type_name.rsplit(".", 1)[-1] for f in by_name[name].field if f.type == _F.TYPE_MESSAGE]
    return seen


def _message_schema(message, path, comments, response: bool) -> dict:
    properties, required = {}, []
    maps = {f".{PACKAGE}.{message.name}.{n.name}": n for n in message.nested_type if n.options.map_entry}
    for j, field in enumerate(message.field):
        entry = maps.get(field.type_name)
        if entry is not None:  # a map<K, V>: a JSON object, keys as strings
            schema = {"type": "object", "additionalProperties": _field_type(entry.field[1])}
        elif field.label == _F.LABEL_REPEATED:
            schema = {"type": "array", "items": _field_type(field)}
        else:
            schema = _field_type(field)
        description = comments.get((*path, 2, j), "")
        if "$ref" in schema:  # 3.1 allows siblings of $ref, but keep refs bare for older tools
            schema = {"allOf": [schema]}
        properties[field.json_name] = {**schema, "description": description}
        # Oneof members, `optional` scalars (a synthetic oneof) and single messages are written only when set.
        singular_message = field.type == _F.TYPE_MESSAGE and field.label != _F.LABEL_REPEATED
        if response and not (field.HasField("oneof_index") or singular_message):
            required.append(field.json_name)
    schema = {"type": "object", "description": comments.get(path, ""), "properties": properties}
    if response:
        schema.update(required=required, additionalProperties=False)
    elif message.name == "GenerateRequest":
        schema["required"] = ["model"]
    return schema


def _field_type(field) -> dict:
    if field.type in (_F.TYPE_MESSAGE, _F.TYPE_ENUM):
        return {"$ref": "#/components/schemas/" + field.type_name.rsplit(".", 1)[-1]}
    return dict(_SCALARS[field.type])


def _error_schema() -> dict:
    return {
        "type": "object",
        "description": "A failed call: the gRPC status code's name and the server's message.",
        "required": ["error"],
        "additionalProperties": False,
        "properties": {"error": {
            "type": "object", "required": ["code", "message"], "additionalProperties": False,
            "properties": {"code": {"type": "string", "description": "e.g. INVALID_ARGUMENT"},
                           "message": {"type": "string"}},
        }},
    }


def _ref(name: str) -> dict:
    return {"$ref": "#/components/schemas/" + name}


def _json(name: str, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": _ref(name)}}}


def _errors() -> dict:
    codes = {"400": "INVALID_ARGUMENT or FAILED_PRECONDITION", "401": "UNAUTHENTICATED: no or a wrong bearer token",
             "403": "PERMISSION_DENIED", "404": "NOT_FOUND", "413": "OUT_OF_RANGE: an input over a model's limit",
             "429": "RESOURCE_EXHAUSTED: the model's queue is full; retry later",
             "503": "UNAVAILABLE: no gRPC server answered", "504": "DEADLINE_EXCEEDED", "default": "other errors"}
    return {code: _json("Error", text) for code, text in codes.items()}


def _paths() -> dict:
    generate_body = {"required": True, "content": {"application/json": {"schema": _ref("GenerateRequest")}}}
    stream_content = {
        "text/event-stream": {"schema": {"type": "string",
                                         "description": "One `data:` line per GenerateStreamResponse (JSON); "
                                                        "an error is `event: error` with an Error."}},
        "application/x-ndjson": {"schema": {"description": "One GenerateStreamResponse (or Error) per line.",
                                            "oneOf": [_ref("GenerateStreamResponse"), _ref("Error")]}},
    }
    return {
        "/v1/models": {"get": {"operationId": "listModels", "summary": "Every served model (ListModels).",
                               "responses": {"200": _json("ListModelsResponse", "the models"), **_errors()}}},
        "/v1/models/{name}": {"get": {
            "operationId": "getModel", "summary": "One model (GetModel).",
            "parameters": [{"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}],
            "responses": {"200": _json("ModelInfo", "the model"), **_errors()}}},
        "/v1/generate": {"post": {
            "operationId": "generate", "summary": "Runs one request to completion (Generate).",
            "requestBody": generate_body,
            "responses": {"200": _json("GenerateResponse", "the result"), **_errors()}}},
        "/v1/generate/stream": {"post": {
            "operationId": "generateStream",
            "summary": "Streams one message per generated token, then the final response (GenerateStream). "
                       "Accept: application/x-ndjson for JSON lines; otherwise Server-Sent Events.",
            "requestBody": generate_body,
            "responses": {"200": {"description": "the stream", "content": stream_content}, **_errors()}}},
        "/v1/openapi.json": {"get": {"operationId": "openapi", "summary": "This document.", "security": [{}],
                                     "responses": {"200": {"description": "OpenAPI 3.1",
                                                           "content": {"application/json": {}}}}}},
    }


def write(path: pathlib.Path = DOCUMENT) -> dict:
    document = build(descriptor_set())
    path.write_text(json.dumps(document, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return document


if __name__ == "__main__":
    print(f"wrote {DOCUMENT} ({len(write()['components']['schemas'])} schemas)")
