#!/usr/bin/env python3
"""Writes the hand-made seed inputs of the targets under
corpus/<target>/seed-*.

proxy_header: headers for both families and LOCAL, each with client bytes
after it, and near misses (a cut signature, a bad command, family or
length).

etcd_http: the etcd JSON gateway's answers as etcd 3.5 sends them (grant,
keep-alive, txn, range, errors, a watch stream), raw (first byte even bit
1 clear) and as bodies the target frames itself (bit 1 set: length,
chunked, until close; bit 0 set: read as a watch; bit 7: over the limit).

The fuzzer's own discoveries in corpus/ are not committed (see .gitignore).
"""
import base64
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
SIGNATURE = b"\r\n\r\n\x00\r\nQUIT\n"


def write(name, data, target="proxy_header"):
    d = os.path.join(HERE, "corpus", target)
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

    etcd_seeds()


def b64(text):
    return base64.b64encode(text).decode()


def etcd_seeds():
    header = {"cluster_id": "14841639068965178418", "member_id": "10276657743932975437",
              "revision": "42", "raft_term": "3"}
    kv = {"key": b64(b"/rosetta/nodes/a"), "create_revision": "40", "mod_revision": "41",
          "version": "2", "value": b64(b'{"id":"a","mqtt":"10.0.0.1:1883"}'), "lease": "7587"}
    answers = {
        "grant": {"header": header, "ID": "7587862072013411111", "TTL": "10"},
        "keepalive": {"result": {"header": header, "ID": "7587862072013411111", "TTL": "10"}},
        "expired": {"result": {"header": header, "ID": "7587862072013411111"}},
        "txn-won": {"header": header, "succeeded": True, "responses": [{"response_put": {"header": header}}]},
        "txn-lost": {"header": header, "responses": [{"response_range": {"header": header, "kvs": [kv], "count": "1"}}]},
        "range": {"header": header, "kvs": [kv, dict(kv, key=b64(b"/rosetta/nodes/b"))], "count": "2"},
        "range-empty": {"header": header},
        "error": {"error": "etcdserver: requested lease not found", "code": 5,
                  "message": "etcdserver: requested lease not found"},
    }
    created = {"result": {"header": header, "created": True}}
    events = {"result": {"header": header, "events": [{"kv": kv}, {"type": "DELETE", "kv": {"key": kv["key"]}}]}}
    canceled = {"result": {"header": header, "canceled": True}}
    watch = "\n".join(json.dumps(m) for m in [created, events, canceled]) + "\n"
    for name, answer in answers.items():
        body = json.dumps(answer).encode()
        status = b"404 Not Found" if name == "error" else b"200 OK"
        head = b"HTTP/1.1 " + status + b"\r\nContent-Type: application/json\r\nContent-Length: " + str(len(body)).encode() + b"\r\n\r\n"
        write("raw-" + name, b"\x00\x05" + head + body, "etcd_http")
        write("length-" + name, b"\x02\x05" + body, "etcd_http")
        write("chunked-" + name, b"\x12\x05" + body + b"\xfe\xfe\x03\x10\x00\x40", "etcd_http")
    chunked = b"".join(b"%x\r\n%s\r\n" % (len(line) + 1, line.encode() + b"\n") for line in watch.splitlines())
    write("raw-watch", b"\x01\x05HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunked + b"0\r\n\r\n", "etcd_http")
    write("chunked-watch", b"\x13\x05" + watch.encode() + b"\xfe\xfe\x05\x20\xff", "etcd_http")
    write("close-watch", b"\x23\x05" + watch.encode(), "etcd_http")
    write("raw-close", b"\x00\x05HTTP/1.1 200 OK\r\n\r\n" + json.dumps(answers["range"]).encode(), "etcd_http")
    write("over-length", b"\x82\x05{}", "etcd_http")
    write("over-chunked", b"\x92\x05{}", "etcd_http")
    write("over-close-watch", b"\xa3\x05{}", "etcd_http")
    write("bad-chunk", b"\x00\x05HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n{}\r\n0\r\n\r\n", "etcd_http")


if __name__ == "__main__":
    main()
