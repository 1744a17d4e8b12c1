#!/usr/bin/env python3
"""Writes the small, hand-encoded seed inputs under corpus/<target>/seed-*.

Seeds are valid MQTT 3.1.1 and 5.0 packet sequences laid out the way each
harness reads its input (see fuzz_targets/common.rs), so libFuzzer starts
past the fixed header and the CONNECT handshake. The fuzzer's own
discoveries in corpus/ are not committed (see .gitignore).
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))


def s(t):
    b = t.encode()
    return len(b).to_bytes(2, "big") + b


def pkt(first, body):
    assert len(body) < 128
    return bytes([first, len(body)]) + body


PID = b"\x00\x01"
# 3.1.1 packets (after the harness's CONNECT_V4 prefix, mode % 3 == 1).
V4 = [
    pkt(0x30, s("a/b") + b"hi"),
    pkt(0x32, s("a/b") + PID + b"hi"),
    pkt(0x34, s("a/b") + b"\x00\x02" + b"hi"),
    pkt(0x62, b"\x00\x02"),
    pkt(0x82, PID + s("a/#") + b"\x01" + s("+/x") + b"\x02"),
    pkt(0x40, PID),
    pkt(0x50, PID),
    pkt(0x70, PID),
    pkt(0xA2, PID + s("a/#")),
    pkt(0xC0, b""),
    pkt(0xE0, b""),
]
# 5.0 packets (after CONNECT_V5, mode % 3 == 2): property lengths, a topic
# alias (0x23), user property (0x26), subscription id (0x0B).
V5 = [
    pkt(0x30, s("a/b") + b"\x03\x23\x00\x01" + b"hi"),
    pkt(0x30, s("") + b"\x03\x23\x00\x01" + b"again"),
    pkt(0x32, s("a/b") + PID + b"\x07\x26" + s("k") + s("v") + b"hi"),
    pkt(0x82, PID + b"\x02\x0b\x05" + s("a/#") + b"\x2d"),
    pkt(0x40, PID + b"\x00\x00"),
    pkt(0xA2, PID + b"\x00" + s("a/#")),
    pkt(0xE0, b"\x00\x00"),
]
# A full CONNECT with will, user name and password (mode % 3 == 0: no prefix).
CONNECT_FULL_V4 = pkt(
    0x10,
    s("MQTT") + b"\x04\xee\x00\x3c" + s("c") + s("w/t") + s("bye") + s("u") + s("p"),
)
CONNECT_FULL_V5 = pkt(
    0x10,
    s("MQTT") + b"\x05\xce\x00\x3c" + b"\x05\x11\x00\x00\x00\x0a" + s("c")
    + b"\x00" + s("w/t") + s("bye") + s("u") + s("p"),
)


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"seed-{name}"), "wb") as f:
        f.write(data)


# decode: byte 0 = mode (prefix = mode % 3, split point = mode >> 2).
write("decode", "v4", bytes([1 | (5 << 2)]) + b"".join(V4))
write("decode", "v5", bytes([2 | (9 << 2)]) + b"".join(V5))
write("decode", "connect-v4", bytes([0]) + CONNECT_FULL_V4 + V4[1])
write("decode", "connect-v5", bytes([3 << 2]) + CONNECT_FULL_V5 + V5[2])


# connection: byte 0 = mode; then control bytes. ctl >> 5 >= 3 feeds the next
# (ctl & 0x1f) + 1 bytes as input, 0 advances time, 1 delivers, 2 commits.
def inputs(packets):
    out = b""
    for p in packets:
        for i in range(0, len(p), 32):
            c = p[i : i + 32]
            out += bytes([0x60 | (len(c) - 1)]) + c
    return out


DELIVER = bytes([0x20 | 3]) + b"\x01abc"  # delivery, QoS 1
COMMIT = bytes([0x40 | 1])
TICK = bytes([0x00 | 4])
write("connection", "v4", bytes([1]) + inputs(V4[:-1]) + DELIVER + COMMIT + TICK + inputs(V4[-1:]))
write("connection", "v5", bytes([2]) + inputs(V5[:-1]) + DELIVER + COMMIT + TICK + inputs(V5[-1:]))
write("connection", "v4-pending", bytes([1 | 0x04 | 0x10]) + inputs(V4[1:3]) + COMMIT + DELIVER)
write("connection", "connect-will-v4", bytes([0]) + inputs([CONNECT_FULL_V4]) + TICK * 4)
write("connection", "connect-will-v5", bytes([3]) + inputs([CONNECT_FULL_V5] + V5[:2]))
