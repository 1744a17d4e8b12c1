#!/usr/bin/env python3
"""Writes the small, hand-made seed inputs under corpus/<target>/seed-*.

websocket seeds follow the target's layout (fuzz_targets/websocket.rs): a
knobs byte (mode = knobs % 3; bit 7: a small message size limit), a byte
that picks the protocol and the peer's chunk size, then the mode's input.
The configuration parser's target lives with its crate (src/config/fuzz).
The fuzzer's own discoveries in corpus/ are not committed (see
.gitignore).
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))
KEY = "dGhlIHNhbXBsZSBub25jZQ=="


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def upgrade(path="/mqtt", extra=""):
    return (
        f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n"
        f"Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
        f"Sec-WebSocket-Key: {KEY}\r\n{extra}\r\n"
    ).encode()


def frame(opcode, payload, fin=True, mask=b"\x01\x02\x03\x04"):
    head = bytes([(0x80 if fin else 0) | opcode])
    n = len(payload)
    head += bytes([0x80 | n]) if n < 126 else bytes([0x80 | 126]) + n.to_bytes(2, "big")
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def message(kind, payload, fin=True, mask=b"\x05\x06\x07\x08"):
    """One frame of the messages mode: control byte, length, mask, payload."""
    return bytes([(0x80 if fin else 0) | kind, len(payload)]) + mask + payload


def websocket():
    # Mode 0: the whole connection is raw bytes.
    raw = {
        "raw-upgrade-mqtt": upgrade("/mqtt", "Sec-WebSocket-Protocol: mqtt\r\n")
        + frame(0x2, b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00"),
        "raw-upgrade-stomp": upgrade("/ws", "Sec-WebSocket-Protocol: foo, v12.stomp\r\n")
        + frame(0x1, b"CONNECT\naccept-version:1.2\n\n\x00"),
        "raw-get-page": b"GET / HTTP/1.1\r\nHost: x\r\n\r\n",
        "raw-head-metrics": b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n",
        "raw-old-version": upgrade("/amqp").replace(b"Version: 13", b"Version: 8"),
        "raw-post": b"POST /mqtt HTTP/1.1\r\nContent-Length: 0\r\n\r\n",
        "raw-origin": upgrade("/stomp", "Origin: http://a.example\r\n"),
    }
    for name, data in raw.items():
        write("websocket", name, bytes([0, 0x40]) + data)
    # Mode 1: valid upgrade, then raw frame bytes.
    frames = (
        frame(0x2, b"\x10\x0c\x00\x04MQTT")
        + frame(0x0, b"\x04\x02\x00\x3c\x00\x00", fin=True)
        + frame(0x9, b"ping")
        + frame(0x1, "h\u00e9llo".encode())
        + frame(0x8, b"\x03\xe8bye")
    )
    write("websocket", "frames", bytes([1, 0x41]) + frames)
    write("websocket", "frames-fragmented", bytes([1, 0x02])
          + frame(0x1, b"MESS", fin=False) + frame(0xA, b"") + frame(0x0, b"AGE\n\n\x00"))
    # Mode 2: well-formed message descriptions.
    msgs = (
        message(2, b"\x30\x05\x00\x01ab")
        + message(3, "t\u00e9xt".encode(), fin=False)
        + message(4, b"ping")
        + message(0, b" more")
        + message(5, b"pong")
        + message(2, bytes(range(200)))
        + message(7, b"")
    )
    write("websocket", "messages", bytes([2, 0x42]) + msgs)
    write("websocket", "messages-small-limit", bytes([0x82, 0x03]) + msgs)


def described(kind, payload, fault=None, mask=0x5A, length=None):
    """One frame of websocket_frames' described mode: kind byte (bit 7: a
    fault byte follows), length byte, mask byte, payload."""
    n = len(payload) if length is None else length
    head = bytes([kind | (0x80 if fault is not None else 0)])
    if fault is not None:
        head += bytes([fault])
    return head + bytes([n, mask]) + payload


def websocket_frames():
    """Seeds for fuzz_targets/websocket_frames.rs: four knob bytes (mode =
    first % 4: raw, described, described, writes; second: protocol = % 3,
    message limit = (>> 2) * 9 when under 32, else 1 MiB; third and
    fourth: socket and read buffer chunk sizes), then the mode's input."""
    big = 0x80  # second knob: 1 MiB limit, MQTT
    raw = (
        frame(0x2, b"\x10\x0c\x00\x04MQTT")
        + frame(0x9, b"ping")
        + frame(0x1, "h\u00e9llo".encode(), fin=False)
        + frame(0x0, " w\u00f6rld".encode())
        + frame(0x8, b"\x03\xe8bye")
    )
    write("websocket_frames", "raw-messages", bytes([0, big, 0x85, 0x02]) + raw)
    write("websocket_frames", "raw-staged-reads", bytes([0x1C, big + 1, 0x03, 0x10]) + raw)
    write("websocket_frames", "raw-close-1005", bytes([0, big, 0x85, 0x02])
          + frame(0x2, b"x") + frame(0x8, b"\x03\xed"))
    write("websocket_frames", "raw-close-bad-reason", bytes([0, big, 0x85, 0x02])
          + frame(0x8, b"\x03\xe8\xff"))
    write("websocket_frames", "raw-unmasked", bytes([0, big, 0x85, 0x02])
          + b"\x82\x01x")
    write("websocket_frames", "raw-64bit-length", bytes([0, big, 0x85, 0x02])
          + b"\x82\xff" + (1 << 63).to_bytes(8, "big") + b"\x01\x02\x03\x04")
    # Described frames: fragments with control frames between them, each
    # kind of fault once, around the 125-byte control limit.
    frames = (
        described(0x49, "t\u00e9xt ".encode())  # text, not final, made UTF-8
        + described(0x04, b"ping")
        + described(0x40, "m\u00f6re".encode())  # continuation, final
        + described(0x02, bytes(range(200)))
        + described(0x05, b"")
        + described(0x03, b"\x03\xe8", length=2)
    )
    write("websocket_frames", "described", bytes([1, big, 0x85, 0x02]) + frames)
    write("websocket_frames", "described-limit-126", bytes([2, (14 << 2) | 1, 0x07, 0x05])
          + described(0x0A, b"a" * 100) + described(0x00, b"b" * 100))
    faults = {
        "reserved-bits": 0x41,
        "unmasked": 0x02,
        "length-16": 0x04,
        "length-64": 0x08,
        "length-lie": 0x38,
    }
    for name, fault in faults.items():
        write("websocket_frames", "described-" + name, bytes([1, big, 0x85, 0x02])
              + described(0x02, b"abc", fault=fault) + described(0x02, b"defg"))
    write("websocket_frames", "described-ping-126", bytes([1, big, 0x85, 0x02])
          + described(0x04, b"p" * 126))
    write("websocket_frames", "described-reserved-opcode", bytes([1, big, 0x85, 0x02])
          + described(0x06 | (0x3 << 3), b"x"))
    # Writes: short and long writes, flushes, UTF-8 and not, for STOMP.
    writes = (
        bytes([0x00, 5]) + b"hello"
        + bytes([0x05, 0x01]) + b"\x00\x01\x02\x03" * 64  # 1 x 64 KiB + 4
        + bytes([0x03, 16, 0x00]) + b"\xffbinary"  # 16 x 64 KiB: one full message
        + bytes([0x04, 6]) + "\u00e9t\u00e9".encode()
        + bytes([0x06])  # an empty write, then a flush
        + bytes([0x01, 3]) + b"end"
    )
    write("websocket_frames", "writes-stomp", bytes([3, big + 1, 0xFF, 0]) + writes)
    write("websocket_frames", "writes-mqtt-partial", bytes([0x07, big, 0x10, 0]) + writes)


websocket()
websocket_frames()
