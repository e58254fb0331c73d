"""agent.nri.framing: byte vectors written from the Go sources (not from our encoder), round trips, fuzzing.

Layouts: nri v0.12.3 pkg/net/multiplex/mux.go (8-byte header: u32 connection id, u32 length, big-endian;
payload cap 10 + 4 MiB), multiplex/ttrpc.go (connection 1 the Plugin service, 2 the Runtime service);
ttrpc v1.2.9 channel.go and PROTOCOL.md (10-byte header: u32 length, u32 stream id, u8 type, u8 flags;
data cap 4 MiB; types request 1, response 2, data 3).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from agent.nri import ttrpc_pb2
from agent.nri.framing import (
    MUX_PAYLOAD_MAX,
    MUX_WRITE_CHUNK,
    TTRPC_MESSAGE_MAX,
    Conn,
    Demultiplexer,
    Message,
    MessageType,
    NRIProtocolError,
    encode_message,
)
from tests.conftest import examples

# Conn 2, 8 + 13 bytes: ttrpc header (length 3, stream 1, request, no flags) then "abc".
REQUEST_ON_RUNTIME_CONN = bytes.fromhex("00000002" "0000000d" "00000003" "00000001" "01" "00") + b"abc"
# Conn 1, a response with no data on stream 7 (length 0).
EMPTY_RESPONSE_ON_PLUGIN_CONN = bytes.fromhex("00000001" "0000000a" "00000000" "00000007" "02" "00")


@pytest.mark.parametrize(("conn", "stream", "type_", "flags", "payload", "expected"), [
    (Conn.RUNTIME_SERVICE, 1, MessageType.REQUEST, 0, b"abc", REQUEST_ON_RUNTIME_CONN),
    (Conn.PLUGIN_SERVICE, 7, MessageType.RESPONSE, 0, b"", EMPTY_RESPONSE_ON_PLUGIN_CONN),
    # Data with remote-closed and no-data flags (0x1 | 0x4), stream 0xfffffffd.
    (Conn.PLUGIN_SERVICE, 0xFFFFFFFD, MessageType.DATA, 0x5, b"",
     bytes.fromhex("00000001" "0000000a" "00000000" "fffffffd" "03" "05")),
    # Connection ids are u32: 0x01020304 stays big-endian on the wire.
    (0x01020304, 0x0A0B0C0D, MessageType.REQUEST, 0x2, b"\x00",
     bytes.fromhex("01020304" "0000000b" "00000001" "0a0b0c0d" "01" "02" "00")),
])
def test_encode_matches_the_go_layout(conn: int, stream: int, type_: int, flags: int, payload: bytes,
                                      expected: bytes) -> None:
    assert encode_message(conn, stream, type_, flags, payload) == expected


@pytest.mark.parametrize(("data", "expected"), [
    (REQUEST_ON_RUNTIME_CONN, [Message(2, 1, 1, 0, b"abc")]),
    (EMPTY_RESPONSE_ON_PLUGIN_CONN, [Message(1, 7, 2, 0, b"")]),
    # Two ttrpc messages in one multiplexer frame.
    (bytes.fromhex("00000001" "00000015") + bytes.fromhex("00000001" "00000003" "01" "00") + b"x"
     + bytes.fromhex("00000000" "00000005" "01" "00"),
     [Message(1, 3, 1, 0, b"x"), Message(1, 5, 1, 0, b"")]),
    # One ttrpc message across two frames (header split 4 + 6), with a frame of the other
    # connection in between: reassembled per connection, in arrival order of completion.
    (bytes.fromhex("00000001" "00000004" "00000002")
     + REQUEST_ON_RUNTIME_CONN
     + bytes.fromhex("00000001" "00000008" "00000009" "01" "00") + b"hi",
     [Message(2, 1, 1, 0, b"abc"), Message(1, 9, 1, 0, b"hi")]),
    # Frames for connections nobody opened (0 is reserved, 3 unknown) are dropped, as mux.go does.
    (bytes.fromhex("00000000" "00000002" "ffff") + bytes.fromhex("00000003" "00000000")
     + EMPTY_RESPONSE_ON_PLUGIN_CONN, [Message(1, 7, 2, 0, b"")]),
    # An unknown message type is delivered as is (ttrpc ignores it above the framing).
    (bytes.fromhex("00000001" "0000000a" "00000000" "00000001" "09" "00"), [Message(1, 1, 9, 0, b"")]),
])
def test_decode_go_layout(data: bytes, expected: list[Message]) -> None:
    assert Demultiplexer().feed(data) == expected
    # Byte by byte gives the same messages: nothing depends on how reads split the stream.
    demux = Demultiplexer()
    got: list[Message] = []
    for i in range(len(data)):
        got += demux.feed(data[i:i + 1])
    assert got == expected
    assert demux.idle and demux.buffered == 0


def test_a_big_message_is_cut_into_frames_go_reads() -> None:
    payload = bytes(range(256)) * 40  # 10240 bytes; 10250 with the ttrpc header
    wire = encode_message(Conn.PLUGIN_SERVICE, 3, MessageType.RESPONSE, 0, payload)
    frames = []
    pos = 0
    while pos < len(wire):
        conn, length = int.from_bytes(wire[pos:pos + 4], "big"), int.from_bytes(wire[pos + 4:pos + 8], "big")
        frames.append((conn, length))
        pos += 8 + length
    assert frames == [(1, 4096), (1, 4096), (1, 2058)]
    assert all(length <= MUX_WRITE_CHUNK for _, length in frames)
    assert wire[8:18] == bytes.fromhex("00002800" "00000003" "02" "00")  # 10240 = 0x2800
    assert Demultiplexer().feed(wire) == [Message(1, 3, 2, 0, payload)]


def test_ttrpc_request_and_response_bytes() -> None:
    # protobuf wire format, fields 1 service, 2 method, 3 payload, 4 timeout_nano (varint).
    request = ttrpc_pb2.Request(service="nri.pkg.api.v1alpha1.Runtime", method="RegisterPlugin",
                                payload=b"\x0a\x01t", timeout_nano=300)
    service = b"nri.pkg.api.v1alpha1.Runtime"
    assert request.SerializeToString() == (
        b"\x0a" + bytes([len(service)]) + service + b"\x12\x0eRegisterPlugin" + b"\x1a\x03\x0a\x01t"
        + b"\x20\xac\x02")
    # What Go's ttrpc server sends for success: an OK status present but empty (0a 00), then payload.
    response = ttrpc_pb2.Response()
    response.ParseFromString(b"\x0a\x00\x12\x02\x08\x01")
    assert response.HasField("status") and response.status.code == 0 and response.payload == b"\x08\x01"
    # An error: status {code 12 UNIMPLEMENTED, message "method X"}.
    response.ParseFromString(b"\x0a\x0c\x08\x0c\x12\x08method X")
    assert (response.status.code, response.status.message) == (12, "method X")


@pytest.mark.parametrize("chunks", [
    # Multiplexer length one over 10 + 4 MiB: refused on its 8 header bytes alone.
    [(1).to_bytes(4, "big") + (MUX_PAYLOAD_MAX + 1).to_bytes(4, "big")],
    [(7).to_bytes(4, "big") + (0xFFFFFFFF).to_bytes(4, "big")],  # even for a connection that is dropped
    # ttrpc length one over 4 MiB: refused once its 10 header bytes are in, before any data.
    [bytes.fromhex("00000001" "0000000a") + (TTRPC_MESSAGE_MAX + 1).to_bytes(4, "big") + bytes(6)],
    # ... also when that header arrives split over two frames.
    [bytes.fromhex("00000002" "00000004" "ffffffff"), bytes.fromhex("00000002" "00000006") + bytes(6)],
])
def test_oversized_lengths_are_refused_at_the_header(chunks: list[bytes]) -> None:
    demux = Demultiplexer()
    with pytest.raises(NRIProtocolError, match="exceeds"):
        for chunk in chunks:
            demux.feed(chunk)


def test_the_largest_lengths_are_accepted() -> None:
    demux = Demultiplexer()
    assert demux.feed((1).to_bytes(4, "big") + MUX_PAYLOAD_MAX.to_bytes(4, "big")) == []
    assert not demux.idle
    assert demux.feed(TTRPC_MESSAGE_MAX.to_bytes(4, "big") + bytes(6)) == []
    with pytest.raises(NRIProtocolError):
        encode_message(1, 1, 1, 0, bytes(TTRPC_MESSAGE_MAX + 1))
    assert len(encode_message(1, 1, 1, 0, bytes(TTRPC_MESSAGE_MAX))) > TTRPC_MESSAGE_MAX


@pytest.mark.parametrize(("conn", "stream"), [(0, 1), (1 << 32, 1), (1, -1), (1, 1 << 32)])
def test_encode_refuses_ids_out_of_range(conn: int, stream: int) -> None:
    with pytest.raises(NRIProtocolError):
        encode_message(conn, stream, 1, 0, b"")


messages = st.builds(
    Message,
    conn=st.sampled_from([int(Conn.PLUGIN_SERVICE), int(Conn.RUNTIME_SERVICE)]),
    stream_id=st.integers(0, (1 << 32) - 1),
    type=st.integers(0, 255),
    flags=st.integers(0, 255),
    payload=st.binary(max_size=9000),
)


@settings(max_examples=examples(200), deadline=None)
@given(st.lists(messages, max_size=6), st.lists(st.integers(1, 5000), max_size=20))
def test_round_trip_under_any_read_split(sent: list[Message], cuts: list[int]) -> None:
    wire = b"".join(encode_message(m.conn, m.stream_id, m.type, m.flags, m.payload) for m in sent)
    demux = Demultiplexer()
    got: list[Message] = []
    pos = 0
    for cut in cuts:
        got += demux.feed(wire[pos:pos + cut])
        pos += cut
    got += demux.feed(wire[pos:])
    assert got == sent
    assert demux.idle


def _check_bounded(demux: Demultiplexer) -> None:
    # Between calls at most one partial frame per layer: the trunk's and one per connection.
    assert demux.buffered < (8 + MUX_PAYLOAD_MAX) + 2 * (10 + TTRPC_MESSAGE_MAX)


@settings(max_examples=examples(500), deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8))
def test_arbitrary_bytes_give_messages_or_the_protocol_error(chunks: list[bytes]) -> None:
    demux = Demultiplexer()
    try:
        for chunk in chunks:
            out = demux.feed(chunk)
            assert all(isinstance(m, Message) for m in out)
            _check_bounded(demux)
    except NRIProtocolError:
        pass


# Frames that look plausible (small lengths, the real connection ids) around garbage inside, so the
# decoder gets past the headers and into the ttrpc layer.
plausible_frames = st.lists(
    st.tuples(st.sampled_from([0, 1, 2, 3]), st.binary(max_size=64), st.booleans()),
    max_size=12,
)


@settings(max_examples=examples(500), deadline=None)
@given(plausible_frames, st.integers(1, 64))
def test_plausible_garbage_gives_messages_or_the_protocol_error(frames: list[tuple[int, bytes, bool]],
                                                                 step: int) -> None:
    wire = b""
    for conn, body, lie in frames:
        length = len(body) + (17 if lie else 0)  # sometimes a length past the end of the input
        wire += conn.to_bytes(4, "big") + length.to_bytes(4, "big") + body
    demux = Demultiplexer()
    try:
        for pos in range(0, len(wire), step):
            for message in demux.feed(wire[pos:pos + step]):
                assert message.conn in (1, 2) and len(message.payload) <= TTRPC_MESSAGE_MAX
            _check_bounded(demux)
    except NRIProtocolError:
        pass
