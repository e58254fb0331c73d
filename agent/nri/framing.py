"""NRI's wire framing: ttrpc messages carried in the connection multiplexer's frames over one socket.

Two big-endian layers, as NRI v0.12.3 and ttrpc v1.2.9 define them: the multiplexer's 8-byte frame
header (connection id, length) and ttrpc's 10-byte message header (length, stream id, type, flags),
at most 4 MiB of data.  Decoding is strict and bounded: a length over its layer's cap raises
`NRIProtocolError` as soon as its header is read.
The layouts and their upstream sources: agent/nri/README.md.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

from agent.errors import TopoletError


class NRIProtocolError(TopoletError):
    """The runtime's side of an NRI connection broke the protocol, refused a call, or went away mid-call."""


MUX_HEADER = struct.Struct(">II")  # connection id, payload length
TTRPC_HEADER = struct.Struct(">IIBB")  # data length, stream id, message type, flags
TTRPC_MESSAGE_MAX = 4 << 20  # ttrpc's messageLengthMax
MUX_PAYLOAD_MAX = TTRPC_HEADER.size + TTRPC_MESSAGE_MAX  # mux.go's maxPayloadSize
# Go's ttrpc reads each multiplexed connection through a bufio.Reader of the default 4096 bytes, and
# the multiplexed connection hands over one whole frame per Read or fails it with ENOMEM when the
# reader's buffer is smaller.  Go's own writer never sends a frame the reader cannot take; frames of at
# most 4096 bytes are always taken, so a message is cut into such frames.
MUX_WRITE_CHUNK = 4096


class Conn(IntEnum):
    """The logical connections NRI opens on its socket (multiplex/ttrpc.go)."""

    PLUGIN_SERVICE = 1  # the runtime is the ttrpc client, the plugin serves
    RUNTIME_SERVICE = 2  # the plugin is the ttrpc client, the runtime serves


class MessageType(IntEnum):
    """ttrpc's message types (channel.go)."""

    REQUEST = 0x1
    RESPONSE = 0x2
    DATA = 0x3


FLAG_REMOTE_CLOSED = 0x1
FLAG_REMOTE_OPEN = 0x2
FLAG_NO_DATA = 0x4

_U32 = 1 << 32


@dataclass(frozen=True, slots=True)
class Message:
    """One whole ttrpc message as it arrived on a logical connection."""

    conn: int
    stream_id: int
    type: int  # a MessageType value, or an unknown one ttrpc ignores for future use
    flags: int
    payload: bytes


def encode_message(conn: int, stream_id: int, type: int, flags: int, payload: bytes) -> bytes:
    """The trunk bytes that carry one ttrpc message on logical connection `conn`."""
    if not 0 < conn < _U32:
        raise NRIProtocolError(f"connection id {conn} out of range")
    if not 0 <= stream_id < _U32:
        raise NRIProtocolError(f"stream id {stream_id} out of range")
    if len(payload) > TTRPC_MESSAGE_MAX:
        raise NRIProtocolError(f"message of {len(payload)} bytes exceeds ttrpc's {TTRPC_MESSAGE_MAX}")
    stream = TTRPC_HEADER.pack(len(payload), stream_id, type, flags) + payload
    if len(stream) <= MUX_WRITE_CHUNK:
        return MUX_HEADER.pack(conn, len(stream)) + stream
    out = bytearray()
    for start in range(0, len(stream), MUX_WRITE_CHUNK):
        chunk = stream[start:start + MUX_WRITE_CHUNK]
        out += MUX_HEADER.pack(conn, len(chunk))
        out += chunk
    return bytes(out)


class Demultiplexer:
    """Trunk bytes in, whole ttrpc messages out, for the NRI logical connections; drops the rest."""

    __slots__ = ("_trunk", "_streams")

    def __init__(self) -> None:
        self._trunk = bytearray()
        self._streams: dict[int, bytearray] = {int(c): bytearray() for c in Conn}

    @property
    def idle(self) -> bool:
        """True when no frame or message is partly received (the peer may close here cleanly)."""
        return not self._trunk and not any(self._streams.values())

    @property
    def buffered(self) -> int:
        """Bytes held between calls: at most one partial frame of each layer."""
        return len(self._trunk) + sum(len(s) for s in self._streams.values())

    def feed(self, data: bytes) -> list[Message]:
        """The messages that `data` completes, in arrival order; raises NRIProtocolError on a bad length."""
        trunk = self._trunk
        trunk += data
        out: list[Message] = []
        pos = 0
        end = len(trunk)
        while end - pos >= MUX_HEADER.size:
            conn, length = MUX_HEADER.unpack_from(trunk, pos)
            if length > MUX_PAYLOAD_MAX:
                raise NRIProtocolError(
                    f"multiplexer frame of {length} bytes on connection {conn} exceeds {MUX_PAYLOAD_MAX}")
            if end - pos - MUX_HEADER.size < length:
                break
            start = pos + MUX_HEADER.size
            pos = start + length
            stream = self._streams.get(conn)
            if stream is not None:
                stream += trunk[start:pos]
                _take_messages(conn, stream, out)
        del trunk[:pos]
        return out


def _take_messages(conn: int, stream: bytearray, out: list[Message]) -> None:
    pos = 0
    end = len(stream)
    while end - pos >= TTRPC_HEADER.size:
        length, stream_id, type_, flags = TTRPC_HEADER.unpack_from(stream, pos)
        if length > TTRPC_MESSAGE_MAX:
            raise NRIProtocolError(
                f"ttrpc message of {length} bytes on connection {conn} exceeds {TTRPC_MESSAGE_MAX}")
        start = pos + TTRPC_HEADER.size
        if end - start < length:
            break
        pos = start + length
        out.append(Message(conn, stream_id, type_, flags, bytes(stream[start:pos])))
    del stream[:pos]
