"""Records <-> Avro bytes: single-object encoding by default, Confluent framing with a registry.

Public API: `RecordCodec`, `SingleObjectCodec`, `ConfluentCodec`, `codec_for(settings)`,
`DecodeError`, `load_schemas()`, `to_avro(record)`, `from_avro(cls, datum)`.
"""

from tailguard.codec.confluent import ConfluentCodec
from tailguard.codec.convert import from_avro, to_avro
from tailguard.codec.errors import DecodeError
from tailguard.codec.factory import codec_for, registry_client
from tailguard.codec.protocol import RecordCodec
from tailguard.codec.schemas import (
    RecordSchema,
    current_schemas,
    load_schemas,
    released_schemas,
)
from tailguard.codec.single_object import SingleObjectCodec

__all__ = [
    "ConfluentCodec",
    "DecodeError",
    "RecordCodec",
    "RecordSchema",
    "SingleObjectCodec",
    "codec_for",
    "current_schemas",
    "from_avro",
    "load_schemas",
    "registry_client",
    "released_schemas",
    "to_avro",
]
