#!/usr/bin/env python3
"""Writes the small seed inputs under corpus/<target>/seed-*.

Seeds are valid STOMP conversations laid out the way each harness reads its
input, so libFuzzer starts from frames that get past the command and header
parser. The fuzzer's own discoveries in corpus/ are not committed (see
.gitignore).
"""
import os

HERE = os.path.dirname(os.path.abspath(__file__))

FRAMES = (
    b"SEND\ndestination:/queue/a\ncontent-type:text/plain\nreceipt:r1\n\nhello\0\n"
    b"SEND\ndestination:/topic/b\ncontent-length:5\n\nhe\0lo\0"
    b"SUBSCRIBE\nid:0\ndestination:/queue/a\nack:client-individual\n\n\0"
    b"ACK\nid:m1\n\n\0NACK\nid:m2\n\n\0"
    b"BEGIN\ntransaction:t\n\n\0SEND\ndestination:/queue/a\ntransaction:t\n\nx\0"
    b"COMMIT\ntransaction:t\n\n\0ABORT\ntransaction:u\n\n\0"
    b"\n\r\n"  # heart-beats
    b"SEND\ndestination:/queue/a\nk\\cey:v\\\\a\\nl\\r\n\n\0"  # 1.2 escapes
    b"UNSUBSCRIBE\nid:0\n\n\0DISCONNECT\nreceipt:bye\n\n\0"
)
CONNECT_12 = b"CONNECT\naccept-version:1.0,1.1,1.2\nhost:h\nlogin:u\npasscode:p\nheart-beat:100,100\n\n\0"
STOMP_11 = b"STOMP\naccept-version:1.1\nhost:h\n\n\0"
CONNECT_10 = b"CONNECT\nlogin:u\npasscode:p\n\n\0"


def write(target, name, data):
    d = os.path.join(HERE, "corpus", target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, f"seed-{name}"), "wb") as f:
        f.write(data)


# decoder: byte 0 picks the version (% 3: 1.0, 1.1, 1.2) and the split point.
for sel, ver in ((0, "10"), (1, "11"), (2, "12"), (41, "12-split")):
    write("decoder", f"frames-{ver}", bytes([sel]) + CONNECT_12 + FRAMES)

# connection: the whole input is fed; an even byte 0 makes the harness send
# a 1.2 CONNECT first ("\n" = 0x0a is even and a valid heart-beat), an odd
# one does not ("\r\n", 0x0d, is also a heart-beat).
write("connection", "connected", b"\n" + FRAMES)
write("connection", "connect-12", b"\r\n" + CONNECT_12 + FRAMES)
write("connection", "stomp-11", b"\r\n" + STOMP_11 + FRAMES)
write("connection", "connect-10", b"\r\n" + CONNECT_10 + FRAMES)

# swar: byte 0 picks the mode (% 4: search, head, decoder, decoder), byte 1
# its knob. Search: bit 7 clear picks one of the parser's needle sets,
# set takes 1-4 needles from the input's first bytes. Head: bit 7 puts a
# command first, % 3 is the version. Decoder: % 3 is the version, and the
# next byte the frame and header line limits.
HIGH = bytes(range(0x80, 0x100))
write("swar", "search-lines", bytes([0, 0]) + b"abcdefg\n" + HIGH[:9] + b"\0xyz\n" + HIGH)
write("swar", "search-escapes", bytes([0, 3]) + HIGH[:15] + b"\\" + HIGH[15:23] + b":\r")
write("swar", "search-any", bytes([0, 0x83]) + b"\x8a\x0a\x00\x80" + HIGH + b"\n\x0a" * 5)
write("swar", "head-12", bytes([1, 2]) + b"SEND\ndestination:/queue/a\nk\\cey:v\\\\\xc3\xa9\\n\n\n")
write("swar", "head-11-command", bytes([1, 0x81]) + b"a:b\r\nc:d:e\n:x\n\n")
write("swar", "head-bad-escape", bytes([1, 0x82]) + b"k:\\t\n\n")
for ver in (0, 1, 2):
    write("swar", f"decoder-{ver}", bytes([2, ver | 0x10, 0xFF]) + CONNECT_12 + FRAMES)
write("swar", "decoder-small-limits", bytes([3, 0x26, 0x21]) + FRAMES)
