"""Chakra's execution-trace protobuf schema, built in Python (no generated code, no protoc at build time).

The messages, field numbers and enums are those of Chakra's ``schema/protobuf/et_def.proto`` (package
``ChakraProtoMsg``; mlcommons/chakra v0.0.4): ``GlobalMetadata``, ``Node``, ``AttributeProto`` with its ``value``
oneof and the ``*List`` messages, ``IOInfo``, ``Tensor``, and the ``NodeType`` and ``CollectiveCommType`` enums. A
file written with these descriptors is read by Chakra's own ``et_def_pb2`` and by ASTRA-sim's ``ETFeeder``.

A ``.et`` file is a stream of length-delimited messages (Chakra ``third_party/utils/protolib.py``
``encodeMessage``: the serialised size as a base-128 varint, then the message): one ``GlobalMetadata``, then
the ``Node`` messages.
"""
from __future__ import annotations

from google.protobuf import descriptor_pb2, descriptor_pool
from google.protobuf.internal.decoder import _DecodeVarint
from google.protobuf.internal.encoder import _VarintBytes

try:  # protobuf >= 4.21
    from google.protobuf.message_factory import GetMessageClass
except ImportError:  # pragma: no cover - older protobuf
    from google.protobuf.message_factory import MessageFactory

    def GetMessageClass(desc):  # noqa: N802 -- protobuf's name
        return MessageFactory().GetPrototype(desc)

PACKAGE = "ChakraProtoMsg"
NODE_TYPES = ("INVALID_NODE", "METADATA_NODE", "MEM_LOAD_NODE", "MEM_STORE_NODE", "COMP_NODE", "COMM_SEND_NODE",
              "COMM_RECV_NODE", "COMM_COLL_NODE")
"""``NodeType`` values 0..7, et_def.proto."""
COLLECTIVE_TYPES = ("ALL_REDUCE", "REDUCE", "ALL_GATHER", "GATHER", "SCATTER", "BROADCAST", "ALL_TO_ALL",
                    "REDUCE_SCATTER", "REDUCE_SCATTER_BLOCK", "BARRIER")
"""``CollectiveCommType`` values 0..9, et_def.proto."""
_SCALARS = (  # AttributeProto.value oneof: (name, protobuf type), fields 3..32 as scalar, list, scalar, list...
    ("double", "TYPE_DOUBLE"), ("float", "TYPE_FLOAT"), ("int32", "TYPE_INT32"), ("int64", "TYPE_INT64"),
    ("uint32", "TYPE_UINT32"), ("uint64", "TYPE_UINT64"), ("sint32", "TYPE_SINT32"), ("sint64", "TYPE_SINT64"),
    ("fixed32", "TYPE_FIXED32"), ("fixed64", "TYPE_FIXED64"), ("sfixed32", "TYPE_SFIXED32"),
    ("sfixed64", "TYPE_SFIXED64"), ("bool", "TYPE_BOOL"), ("string", "TYPE_STRING"), ("bytes", "TYPE_BYTES"))

_F = descriptor_pb2.FieldDescriptorProto


def _field(msg, name, number, typ, label="LABEL_OPTIONAL", type_name=None, oneof=None):
    f = msg.field.add(name=name, number=number, type=getattr(_F, typ), label=getattr(_F, label))
    if type_name:
        f.type_name = f".{PACKAGE}.{type_name}"
    if oneof is not None:
        f.oneof_index = oneof
    return f


def _file() -> descriptor_pb2.FileDescriptorProto:
    fd = descriptor_pb2.FileDescriptorProto(name="et_def.proto", package=PACKAGE, syntax="proto3")
    attr = fd.message_type.add(name="AttributeProto")
    _field(attr, "name", 1, "TYPE_STRING")
    _field(attr, "doc_string", 2, "TYPE_STRING")
    attr.oneof_decl.add(name="value")
    for i, (name, typ) in enumerate(_SCALARS):
        list_name = name.capitalize() + "List"
        lst = fd.message_type.add(name=list_name)
        _field(lst, "values", 1, typ, "LABEL_REPEATED")
        _field(attr, f"{name}_val", 3 + 2 * i, typ, oneof=0)
        _field(attr, f"{name}_list", 4 + 2 * i, "TYPE_MESSAGE", type_name=list_name, oneof=0)
    meta = fd.message_type.add(name="GlobalMetadata")
    _field(meta, "version", 1, "TYPE_STRING")
    _field(meta, "attr", 2, "TYPE_MESSAGE", "LABEL_REPEATED", "AttributeProto")
    io = fd.message_type.add(name="IOInfo")
    for n, name in enumerate(("values", "shapes", "types"), 1):
        _field(io, name, n, "TYPE_STRING")
    node = fd.message_type.add(name="Node")
    _field(node, "id", 1, "TYPE_UINT64")
    _field(node, "name", 2, "TYPE_STRING")
    _field(node, "type", 3, "TYPE_ENUM", type_name="NodeType")
    _field(node, "ctrl_deps", 4, "TYPE_UINT64", "LABEL_REPEATED")
    _field(node, "data_deps", 5, "TYPE_UINT64", "LABEL_REPEATED")
    _field(node, "start_time_micros", 6, "TYPE_UINT64")
    _field(node, "duration_micros", 7, "TYPE_UINT64")
    _field(node, "inputs", 8, "TYPE_MESSAGE", type_name="IOInfo")
    _field(node, "outputs", 9, "TYPE_MESSAGE", type_name="IOInfo")
    _field(node, "attr", 10, "TYPE_MESSAGE", "LABEL_REPEATED", "AttributeProto")
    tensor = fd.message_type.add(name="Tensor")
    for n, name in enumerate(("tensor_id", "storage_id", "offset", "num_elem", "elem_bytes"), 1):
        _field(tensor, name, n, "TYPE_UINT64")
    _field(tensor, "device", 6, "TYPE_STRING")
    for enum_name, values in (("NodeType", NODE_TYPES), ("CollectiveCommType", COLLECTIVE_TYPES)):
        enum = fd.enum_type.add(name=enum_name)
        for number, value in enumerate(values):
            enum.value.add(name=value, number=number)
    return fd


_POOL = descriptor_pool.DescriptorPool()
_POOL.Add(_file())
GlobalMetadata = GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.GlobalMetadata"))
Node = GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.Node"))
AttributeProto = GetMessageClass(_POOL.FindMessageTypeByName(f"{PACKAGE}.AttributeProto"))
NodeType = {name: i for i, name in enumerate(NODE_TYPES)}
CollectiveCommType = {name: i for i, name in enumerate(COLLECTIVE_TYPES)}


def delimited(message_bytes: bytes) -> bytes:
    """``message_bytes`` with its varint length prefix (one record of a ``.et`` stream)."""
    return _VarintBytes(len(message_bytes)) + message_bytes


def read_et(data: bytes) -> tuple:
    """``(GlobalMetadata, [Node, ...])`` of a ``.et`` stream (Chakra protolib ``decodeMessage`` loop)."""
    pos, messages = 0, []
    while pos < len(data):
        size, pos = _DecodeVarint(data, pos)
        messages.append(data[pos:pos + size])
        pos += size
    if not messages:
        raise ValueError("empty Chakra trace")
    meta = GlobalMetadata.FromString(messages[0])
    return meta, [Node.FromString(m) for m in messages[1:]]
