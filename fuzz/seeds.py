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


websocket()
