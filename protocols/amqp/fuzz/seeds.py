#!/usr/bin/env python3
"""Writes the small, hand-encoded seed inputs under corpus/<target>/seed-*.

Seeds are valid AMQP 1.0 conversations, so libFuzzer starts from inputs that
get past the protocol header and the performative decoder instead of having
to discover the type codes byte by byte. Rerun after changing a seed; the
fuzzer's own discoveries in corpus/ are not committed (see .gitignore).
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def s(t):  # str8
    b = t.encode()
    return b"\xa1" + bytes([len(b)]) + b


def sym(t):  # sym8
    b = t.encode()
    return b"\xa3" + bytes([len(b)]) + b


def vbin(b):
    return b"\xa0" + bytes([len(b)]) + b


def uint(n):
    return b"\x52" + bytes([n]) if n < 256 else b"\x70" + struct.pack(">I", n)


NULL, TRUE, FALSE = b"\x40", b"\x41", b"\x42"


def lst(*items):
    body = b"".join(items)
    return b"\xc0" + bytes([len(body) + 1, len(items)]) + body


def described(code, *fields):
    return b"\x00\x53" + bytes([code]) + lst(*fields)


def frame(body, channel=0, ftype=0):
    return struct.pack(">IBBH", 8 + len(body), 2, ftype, channel) + body


AMQP_HDR = b"AMQP\x00\x01\x00\x00"
SASL_HDR = b"AMQP\x03\x01\x00\x00"
OPEN = frame(described(0x10, s("fuzz"), NULL, uint(4096), b"\x60\x00\x07", uint(60000)))
BEGIN = frame(described(0x11, NULL, uint(0), uint(100), uint(100)))
SOURCE = described(0x28, s("q"))
TARGET = described(0x29, s("q"))
ATTACH_SENDER = frame(described(0x12, s("s"), uint(0), FALSE, NULL, NULL, SOURCE, TARGET))
ATTACH_RECEIVER = frame(described(0x12, s("r"), uint(1), TRUE, NULL, NULL, SOURCE, TARGET))
FLOW = frame(described(0x13, uint(0), uint(100), uint(0), uint(100), uint(0), uint(0), uint(10)))
DATA = b"\x00\x53\x75" + vbin(b"hello")
TRANSFER = frame(described(0x14, uint(0), uint(0), vbin(b"t1"), uint(0), FALSE) + DATA)
TRANSFER_SETTLED = frame(described(0x14, uint(0), uint(1), vbin(b"t2"), uint(0), TRUE) + DATA)
DISPOSITION = frame(described(0x15, TRUE, uint(0), NULL, TRUE, b"\x00\x53\x24\x45"))
DETACH = frame(described(0x16, uint(0), TRUE))
END = frame(described(0x17))
CLOSE = frame(described(0x18))
SASL_INIT = frame(described(0x41, sym("ANONYMOUS")), ftype=1)
SASL_PLAIN = frame(described(0x41, sym("PLAIN"), vbin(b"\x00u\x00p")), ftype=1)
EMPTY = struct.pack(">IBBH", 8, 2, 0, 0)  # heartbeat

SESSION = OPEN + BEGIN
SEEDS = {
    "open-close": AMQP_HDR + OPEN + CLOSE,
    "send": AMQP_HDR + SESSION + ATTACH_SENDER + TRANSFER + TRANSFER_SETTLED + DETACH + END + CLOSE,
    "receive": AMQP_HDR + SESSION + ATTACH_RECEIVER + FLOW + DISPOSITION + EMPTY + DETACH + END + CLOSE,
    "sasl-anon": SASL_HDR + SASL_INIT + AMQP_HDR + OPEN + BEGIN + END + CLOSE,
    "sasl-plain": SASL_HDR + SASL_PLAIN + AMQP_HDR + OPEN + CLOSE,
}

for target in ("frame_decoder", "connection"):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in SEEDS.items():
        if target == "frame_decoder":
            # First byte: the chunk size the harness splits the rest into.
            for chunk in (1, 7, 255):
                with open(os.path.join(d, f"seed-{name}-{chunk}"), "wb") as f:
                    f.write(bytes([chunk]) + data)
        else:
            # The harness feeds the whole input; an even first byte also makes
            # it send a valid AMQP header first, so the "no header" variant
            # (starting at the frame's size byte 0x00) reaches the
            # performatives too.
            with open(os.path.join(d, f"seed-{name}"), "wb") as f:
                f.write(data)
            if data.startswith(AMQP_HDR):
                with open(os.path.join(d, f"seed-{name}-nohdr"), "wb") as f:
                    f.write(data[len(AMQP_HDR):])
