"""How AMQP 0-9-1 methods are declared and (de)coded.

A method is a frozen dataclass whose fields are annotated with a wire kind
(:data:`Octet`, :data:`Short`, :data:`Long`, :data:`LongLong`, :data:`Bit`,
:data:`ShortStr`, :data:`LongStr`, :data:`LongBytes`, :data:`Table`) and registered
with :func:`method`, which compiles a codec from the fields: runs of fixed-width
integers become one ``struct``, consecutive bits pack into octets (first bit in
the lowest bit, as the spec says). The method payload is ``class-id``,
``method-id``, then the fields in order.
"""

from __future__ import annotations

import dataclasses
import struct
import typing
from collections.abc import Callable
from enum import Enum
from typing import Annotated, Any, ClassVar, TypeVar

from ..errors import ReplyCode
from .errors import AmqpError, AmqpLocalError, syntax_error
from .values import (
    FieldTable,
    decode_longbytes,
    decode_longstr,
    decode_shortstr,
    decode_table,
    encode_longstr,
    encode_shortstr,
    encode_table,
)

Octet = Annotated[int, "octet"]
Short = Annotated[int, "short"]
Long = Annotated[int, "long"]
LongLong = Annotated[int, "longlong"]
Bit = Annotated[bool, "bit"]
ShortStr = Annotated[str, "shortstr"]
LongStr = Annotated[str, "longstr"]
LongBytes = Annotated[bytes, "longbytes"]
Table = Annotated[FieldTable, "table"]

_STRUCT_CODES = {"octet": "B", "short": "H", "long": "I", "longlong": "Q"}
_IDS = struct.Struct(">HH")


class Sender(Enum):
    """Who may send a method: the client, the server, or either."""

    CLIENT = "client"
    SERVER = "server"
    BOTH = "both"


class Method:
    """Base of every AMQP 0-9-1 method. Values: never mutate one."""

    __slots__ = ()
    CLASS_ID: ClassVar[int] = 0
    METHOD_ID: ClassVar[int] = 0
    NAME: ClassVar[str] = ""
    SENDER: ClassVar[Sender] = Sender.BOTH
    #: True when the sender waits for a reply (the ``-ok`` method).
    SYNCHRONOUS: ClassVar[bool] = False
    #: True when a content header and body frames follow the method.
    CONTENT: ClassVar[bool] = False

    def encode(self) -> bytes:
        """The method frame payload: class id, method id, arguments."""
        return _CODECS[type(self)].encode(self)


M = TypeVar("M", bound=Method)

#: Every method by (class id, method id).
METHODS: dict[tuple[int, int], type[Method]] = {}


class _Codec:
    """Encoder and decoder compiled from one method's fields."""

    __slots__ = ("cls", "decode_args", "encode_args", "prefix")

    def __init__(self, cls: type[Method]) -> None:
        self.cls = cls
        self.prefix = _IDS.pack(cls.CLASS_ID, cls.METHOD_ID)
        hints = typing.get_type_hints(cls, include_extras=True)
        kinds = [(f.name, hints[f.name].__metadata__[0]) for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        self.encode_args, self.decode_args = _compile(kinds)

    def encode(self, obj: Method) -> bytes:
        try:
            return self.prefix + self.encode_args(obj)
        except (struct.error, TypeError, AttributeError) as exc:
            raise AmqpLocalError(f"{self.cls.NAME}: {exc}") from None


def _compile(
    kinds: list[tuple[str, str]],
) -> tuple[Callable[[Any], bytes], Callable[[bytes, int], list[Any]]]:
    """Group the fields into steps: ("struct", Struct, names), ("bits", names) or
    (kind, name) for a variable-length field."""
    steps: list[tuple[Any, ...]] = []
    for name, kind in kinds:
        last = steps[-1] if steps else None
        if kind in _STRUCT_CODES:
            if last is not None and last[0] == "struct":
                steps[-1] = ("struct", last[1] + _STRUCT_CODES[kind], [*last[2], name])
            else:
                steps.append(("struct", ">" + _STRUCT_CODES[kind], [name]))
        elif kind == "bit":
            if last is not None and last[0] == "bits" and len(last[1]) < 8:
                last[1].append(name)
            else:
                steps.append(("bits", [name]))
        else:
            steps.append((kind, name))
    compiled = [
        ("struct", struct.Struct(step[1]), tuple(step[2])) if step[0] == "struct" else step
        for step in steps
    ]

    def encode_args(obj: Any) -> bytes:
        out = []
        for step in compiled:
            kind = step[0]
            if kind == "struct":
                out.append(step[1].pack(*[getattr(obj, n) for n in step[2]]))
            elif kind == "bits":
                octet = 0
                for i, n in enumerate(step[1]):
                    if getattr(obj, n):
                        octet |= 1 << i
                out.append(bytes((octet,)))
            elif kind == "shortstr":
                out.append(encode_shortstr(getattr(obj, step[1])))
            elif kind in ("longstr", "longbytes"):
                out.append(encode_longstr(getattr(obj, step[1])))
            else:
                out.append(encode_table(getattr(obj, step[1])))
        return b"".join(out)

    def decode_args(data: bytes, offset: int) -> list[Any]:
        values: list[Any] = []
        for step in compiled:
            kind = step[0]
            if kind == "struct":
                st = step[1]
                if offset + st.size > len(data):
                    raise syntax_error("method arguments run past the end of the frame")
                values.extend(st.unpack_from(data, offset))
                offset += st.size
            elif kind == "bits":
                if offset >= len(data):
                    raise syntax_error("method arguments run past the end of the frame")
                octet = data[offset]
                offset += 1
                values.extend(bool(octet & (1 << i)) for i in range(len(step[1])))
            else:
                value: Any
                if kind == "shortstr":
                    value, offset = decode_shortstr(data, offset)
                elif kind == "longstr":
                    value, offset = decode_longstr(data, offset)
                elif kind == "longbytes":
                    value, offset = decode_longbytes(data, offset)
                else:
                    value, offset = decode_table(data, offset)
                values.append(value)
        if offset != len(data):
            raise syntax_error(f"{len(data) - offset} bytes left over after the arguments")
        return values

    return encode_args, decode_args


_CODECS: dict[type[Method], _Codec] = {}


def add_fast_path(
    cls: type[Method],
    *,
    encode_args: Callable[[Any], bytes | None] | None = None,
    decode_args: Callable[[bytes, int], list[Any] | None] | None = None,
) -> None:
    """Put a hand-written codec for ``cls``'s arguments in front of the compiled one.

    For the few methods sent or received once per message (the compiled codec
    walks its steps for every field). Each returns None for anything it does not
    take (text over 255 bytes, a value of the wrong type, a frame that does not
    parse), and the compiled codec then does the work, errors and all; so
    ``tests/amqp/test_fast_paths.py`` checks both give the same bytes, values and
    errors."""
    codec = _CODECS[cls]
    if encode_args is not None:
        general_encode, fast_encode = codec.encode_args, encode_args

        def encode_either(obj: Any) -> bytes:
            out = fast_encode(obj)
            return general_encode(obj) if out is None else out

        codec.encode_args = encode_either
    if decode_args is not None:
        general_decode, fast_decode = codec.decode_args, decode_args

        def decode_either(data: bytes, offset: int) -> list[Any]:
            values = fast_decode(data, offset)
            return general_decode(data, offset) if values is None else values

        codec.decode_args = decode_either


def general_codec(
    cls: type[Method],
) -> tuple[Callable[[Any], bytes], Callable[[bytes, int], list[Any]]]:
    """``cls``'s compiled (encode_args, decode_args), without any fast path (tests)."""
    codec = _Codec(cls)
    return codec.encode_args, codec.decode_args


def method(
    class_id: int,
    method_id: int,
    name: str,
    sender: Sender,
    *,
    synchronous: bool = False,
    content: bool = False,
) -> Callable[[type[M]], type[M]]:
    """Register a method dataclass under its ids and compile its codec."""

    def register(cls: type[M]) -> type[M]:
        cls.CLASS_ID, cls.METHOD_ID, cls.NAME = class_id, method_id, name
        cls.SENDER, cls.SYNCHRONOUS, cls.CONTENT = sender, synchronous, content
        assert (class_id, method_id) not in METHODS, name
        METHODS[(class_id, method_id)] = cls
        _CODECS[cls] = _Codec(cls)
        return cls

    return register


def decode_method(payload: bytes) -> Method:
    """A method frame's payload -> the method; raises :class:`AmqpError` (502 for
    bad arguments, 540 for an unknown class or method)."""
    if len(payload) < 4:
        raise syntax_error("method frame shorter than its class and method ids")
    class_id, method_id = _IDS.unpack_from(payload, 0)
    cls = METHODS.get((class_id, method_id))
    if cls is None:
        raise AmqpError(
            f"unknown method {class_id}.{method_id}",
            ReplyCode.NOT_IMPLEMENTED,
            class_id=class_id,
            method_id=method_id,
        )
    try:
        return cls(*_CODECS[cls].decode_args(payload, 4))
    except AmqpError as exc:
        exc.class_id, exc.method_id = class_id, method_id
        exc.text = f"{cls.NAME}: {exc.text}"
        exc.args = (exc.text,)
        raise
