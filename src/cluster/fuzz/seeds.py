#!/usr/bin/env python3
"""Writes the hand-made seed inputs of the `proxy_header` target under
corpus/proxy_header/seed-*: headers for both families and LOCAL, each with
client bytes after it, and near misses (a cut signature, a bad command,
family or length). The fuzzer's own discoveries in corpus/ are not
committed (see .gitignore).
"""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"


def write(name, data):
    d = os.path.join(HERE, "corpus", "proxy_header")
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, "seed-" + name), "wb") as f:
        f.write(data)


def header(command, family, body):
    return SIGNATURE + bytes([command, family]) + struct.pack(">H", len(body)) + body


def main():
    connect = b"\x10\x0c\x00\x04MQTT\x04\x02\x00\x3c\x00\x00"
    v4 = bytes([10, 1, 2, 3, 127, 0, 0, 1]) + struct.pack(">HH", 4000, 1883)
    v6 = bytes(15) + b"\x01" + bytes(15) + b"\x01" + struct.pack(">HH", 4000, 1883)
    write("tcp4", header(0x21, 0x11, v4) + connect)
    write("tcp6", header(0x21, 0x21, v6) + connect)
    write("tcp4-tlv", header(0x21, 0x11, v4 + b"\x04\x00\x02ab") + b"CONNECT\n\n\x00")
    write("local", header(0x20, 0x00, b""))
    write("cut-signature", SIGNATURE[:7])
    write("bad-command", header(0x31, 0x11, v4))
    write("bad-family", header(0x21, 0x31, v4))
    write("short-body", header(0x21, 0x21, v4))
    write("no-header", connect)
    # The input layout the round-trip check reads: family byte, 2 x 18.
    write("round-trip", b"\x01" + bytes(range(18)) + bytes(range(18, 36)) + connect)


if __name__ == "__main__":
    main()
