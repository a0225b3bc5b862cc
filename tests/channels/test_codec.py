"""The frame codec, sans-I/O: fed bytes in any split, it gives whole messages or "need more"."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from channels import (
    CLOSE_MARK,
    FrameDecoder,
    FrameEncoder,
    Gather,
    ProtocolError,
    RingBuffer,
    close_frame,
    gather,
)
from channels._messages import GATHER_MIN
from pump import RdvpumpError


def frame(body: bytes) -> bytes:
    return len(body).to_bytes(4, "big") + body


def drain(decoder: FrameDecoder) -> list[bytes]:
    out: list[bytes] = []
    while (frames := decoder.next_frames()) is not None:
        bodies, lengths = frames
        assert [len(b) for b in bodies] == lengths
        out.extend(bodies)
    return out


@given(messages=st.lists(st.binary(max_size=300), max_size=25),
       cuts=st.lists(st.integers(1, 64), min_size=1, max_size=20),
       capacity=st.sampled_from([1, 2, 4, 16, 256, 4096]))
def test_any_split_of_the_stream_gives_the_messages_back_in_order(
        messages: list[bytes], cuts: list[int], capacity: int) -> None:
    decoder = FrameDecoder(RingBuffer(capacity), max_message_size=1 << 20)
    stream = b"".join(frame(m) for m in messages)
    got: list[bytes] = []
    pos = i = 0
    while pos < len(stream):
        piece = stream[pos:pos + cuts[i % len(cuts)]]
        i += 1
        pos += decoder.receive_data(piece)  # a bounded ring takes what fits
        got += drain(decoder)
    got += drain(decoder)
    assert got == messages
    decoder.end_of_stream()  # a clean end: nothing cut


def test_need_more_data_is_a_value_not_an_exception() -> None:
    decoder = FrameDecoder(RingBuffer(64), max_message_size=100)
    assert decoder.next_frames() is None
    decoder.receive_data(frame(b"hello")[:6])
    assert decoder.next_frames() is None and not decoder.in_frame
    decoder.receive_data(frame(b"hello")[6:])
    assert decoder.next_frames() == ([b"hello"], [5])


@pytest.mark.parametrize(("stream", "error"), [
    (frame(b"x" * 101), "frame of 101 bytes exceeds max_message_size 100"),
    ((CLOSE_MARK - 1).to_bytes(4, "big"), "exceeds max_message_size"),
    ((CLOSE_MARK + 5000).to_bytes(4, "big"), "close frame of 5000 bytes exceeds 1000"),
])
def test_a_length_above_the_limit_is_the_peers_protocol_error(stream: bytes, error: str) -> None:
    decoder = FrameDecoder(RingBuffer(4096), max_message_size=100)
    decoder.receive_data(stream)
    with pytest.raises(ProtocolError, match=error) as info:
        decoder.next_frames()
    assert isinstance(info.value, RdvpumpError)


@pytest.mark.parametrize(("capacity", "stream", "error"), [
    (64, frame(b"abcdef")[:7], "7 bytes of an incomplete frame"),
    (64, frame(b"abc")[:2], "2 bytes of an incomplete frame"),
    (8, frame(b"a" * 20)[:15], "11 of 20 body bytes arrived"),  # bigger than the ring
])
def test_a_stream_cut_mid_frame_is_detected(capacity: int, stream: bytes, error: str) -> None:
    decoder = FrameDecoder(RingBuffer(capacity), max_message_size=100)
    pos = 0
    while pos < len(stream):
        pos += decoder.receive_data(stream[pos:])
        assert drain(decoder) == []
    with pytest.raises(ProtocolError, match=error):
        decoder.end_of_stream()


@given(messages=st.lists(st.binary(max_size=20_000), max_size=12),
       capacity=st.sampled_from([1, 16, 1024, 65536]))
def test_the_encoder_and_decoder_agree_through_one_ring(messages: list[bytes],
                                                         capacity: int) -> None:
    ring = RingBuffer(capacity)
    encoder = FrameEncoder(ring)
    decoder = FrameDecoder(ring, max_message_size=1 << 20)
    got: list[bytes] = []
    index = 0
    for _ in range(10 * sum(len(m) + 4 for m in messages) + 10):
        if index == len(messages) and not encoder.streaming:
            break
        index, _, _ = encoder.write(messages, index)
        got += drain(decoder)
    got += drain(decoder)
    assert got == messages


@given(capacity=st.sampled_from([1, 16, 1024, 65536, 1 << 18]),
       lag=st.randoms(use_true_random=True), data=st.data())
def test_messages_of_pieces_arrive_whole_among_the_others(
        capacity: int, lag: random.Random, data: st.DataObject) -> None:
    """A Gather moves its pieces back to back, unjoined, in order with the bytes messages
    around it, through any ring and any interleaving of writes and reads."""
    tiny = capacity < 1024  # a byte or a few per write: fewer and smaller messages
    plan = data.draw(st.lists(st.one_of(
        st.binary(max_size=900 if tiny else 9_000),  # small (batched) and large (one by one)
        st.lists(st.binary(max_size=2_000 if tiny else 30_000), min_size=1, max_size=6)),
        max_size=3 if tiny else 10))
    messages: list[bytes | Gather] = []
    for item in plan:
        if isinstance(item, list):
            item = [*item, b"z" * (GATHER_MIN - sum(map(len, item)))]  # a Gather's least
            messages.append(Gather([memoryview(p) if i % 2 else p for i, p in enumerate(item)]))
        else:
            messages.append(item)
    ring = RingBuffer(capacity)
    encoder = FrameEncoder(ring)
    decoder = FrameDecoder(ring, max_message_size=1 << 20)
    got: list[bytes] = []
    index = 0
    while index < len(messages) or encoder.streaming:
        index, _, moved = encoder.write(messages, index)
        # the reader may lag behind the writer (a seeded coin: one draw per write would
        # make hypothesis record hundreds of thousands of them with a 1-byte ring)
        if not moved or lag.random() < 0.5:
            got += drain(decoder)
    got += drain(decoder)
    assert got == [bytes(m) for m in messages]


def test_a_gather_keeps_large_pieces_and_joins_the_rest() -> None:
    assert gather([b"a" * 10, memoryview(b"b" * 10)]) == b"a" * 10 + b"b" * 10
    body = memoryview(b"x" * GATHER_MIN)
    big = gather([b"head", b"\0", body, b"c" * 100, b"d" * 100])
    assert isinstance(big, Gather) and len(big) == GATHER_MIN + 205
    assert big.pieces[0] == b"head\0" and big.pieces[1] is body
    assert big.pieces[2] == b"c" * 100 + b"d" * 100
    many_small = gather([b"y" * 64] * (GATHER_MIN // 64 + 1))  # no piece worth keeping
    assert type(many_small) is bytes and len(many_small) == GATHER_MIN + 63
    with pytest.raises(ValueError, match="at least"):
        Gather([b"small"])


def test_encoder_reports_whole_messages_and_bytes() -> None:
    ring = RingBuffer(64)
    encoder = FrameEncoder(ring)
    index, done, moved = encoder.write([b"a" * 20, b"b" * 20, b"c" * 20], 0)
    assert (index, done, moved) == (2, 40, True)  # the third does not fit whole yet
    assert ring.used == 48
    assert encoder.write([b"a" * 20, b"b" * 20, b"c" * 20], 2) == (2, 0, False)


@given(messages=st.lists(st.binary(max_size=100), max_size=10),
       reason=st.text(max_size=1200), cut=st.integers(1, 64),
       capacity=st.sampled_from([1, 2, 4, 16, 4096]))
def test_the_close_frame_comes_after_the_messages_in_any_split(
        messages: list[bytes], reason: str, cut: int, capacity: int) -> None:
    decoder = FrameDecoder(RingBuffer(capacity), max_message_size=1 << 20)
    stream = b"".join(frame(m) for m in messages) + close_frame(reason, "aborted")
    got: list[bytes] = []
    pos = 0
    while pos < len(stream):
        pos += decoder.receive_data(stream[pos:pos + cut])
        got += drain(decoder)
    assert got == messages
    assert decoder.peer_close is not None and decoder.peer_close[0] == "aborted"
    said = f"aborted:{reason}".encode()[:1000].decode(errors="replace")
    assert decoder.peer_close[1] == said.partition(":")[2]
    decoder.end_of_stream()


def test_bytes_after_the_close_frame_are_the_peers_protocol_error() -> None:
    decoder = FrameDecoder(RingBuffer(64), max_message_size=100)
    decoder.receive_data(close_frame("bye", "clean") + frame(b"late"))
    with pytest.raises(ProtocolError, match="8 bytes after the close frame"):
        drain(decoder)
    assert decoder.peer_close == ("clean", "bye")


@given(bodies=st.lists(st.binary(max_size=40), min_size=1, max_size=50),
       same=st.sampled_from([None, 0, 1, 1000]))
def test_split_bodies_gives_back_each_body_whatever_their_sizes(
        bodies: list[bytes], same: int | None) -> None:
    from channels._ring import split_bodies

    if same is not None:  # one size: the struct path
        bodies = [bytes([i % 256]) * same for i in range(len(bodies))]
    out = split_bodies(b"".join(bodies), [len(b) for b in bodies])
    assert list(out) == bodies
    assert all(type(b) is bytes for b in out)


def test_split_bodies_keeps_a_bounded_cache_of_unpackers() -> None:
    from channels import _ring

    for count in range(1, 2 * _ring._MAX_SPLITTERS + 1):
        assert list(_ring.split_bodies(b"ab" * count, [2] * count)) == [b"ab"] * count
        assert len(_ring._SPLITTERS) <= _ring._MAX_SPLITTERS


def test_a_whole_frame_round_the_rings_end_comes_out_as_sent() -> None:
    """Complete in the ring but across its end: taken at once (nothing held for it)."""
    ring = RingBuffer(64)
    decoder = FrameDecoder(ring, max_message_size=100)
    ring.write(b"x" * 40)
    ring.skip(40)  # 24 bytes to the end: a frame of 4 + 30 bytes wraps
    body = bytes(range(30))
    assert ring.put_batch([body], 0, 1 << 16, 64) == (1, 30)
    assert decoder.next_frames() == ([body], [30])
    assert not decoder.in_frame and decoder.progress == 0 and ring.used == 0
    assert decoder.next_frames() is None


@given(sizes=st.lists(st.integers(0, 300), min_size=1, max_size=5), data=st.data(),
       capacity=st.sampled_from([16, 4096]), as_bytes=st.booleans())
def test_a_frame_resumed_where_another_sender_stopped_reads_back_whole(
        sizes: list[int], data: st.DataObject, capacity: int, as_bytes: bool) -> None:
    """A frame whose first ``sent`` bytes left another way (straight to a socket) goes on
    in the ring from the next byte, at any cut: within the header, within a piece, or
    at a piece's edge."""
    pieces = [bytes([65 + i]) * n for i, n in enumerate(sizes)]
    pieces.append(b"z" * max(0, GATHER_MIN - sum(sizes)))
    message: bytes | Gather = b"".join(pieces) if as_bytes else Gather(pieces)
    whole = frame(bytes(message))
    sent = data.draw(st.integers(0, len(whole) - 1))
    ring = RingBuffer(capacity)
    encoder = FrameEncoder(ring)
    encoder.resume(message, sent)
    out = bytearray(whole[:sent])
    while encoder.streaming:
        encoder.write([message], 0)
        out += ring.take_exact(ring.used)
    assert bytes(out) == whole
