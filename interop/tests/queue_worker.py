"""A STOMP consumer in a process of its own, for tests that kill it with
SIGKILL mid-stream (test_queue_semantics.py): it subscribes with the
given headers, ACKs (with a receipt) the first ``--ack`` messages it gets
and holds every later one unacknowledged. It reports on stdout, one JSON
object a line, flushed at once:

    {"event": "subscribed"}
    {"event": "acked", "body": ..., "headers": {...}}   after the RECEIPT
    {"event": "held", "body": ..., "headers": {...}}    never acknowledged

so the test knows exactly what the broker has taken (acked) and what it
must hand to another consumer once this process is gone (held).

usage: queue_worker.py HOST PORT DESTINATION ACK_COUNT [HEADERS_JSON]
"""

import json
import queue
import sys
import time

import stomp


class Listener(stomp.ConnectionListener):
    def __init__(self):
        self.messages = queue.Queue()
        self.receipts = queue.Queue()

    def on_message(self, frame):
        self.messages.put(frame)

    def on_receipt(self, frame):
        self.receipts.put(frame.headers.get("receipt-id"))


def report(event, frame=None):
    out = {"event": event}
    if frame is not None:
        body = frame.body if isinstance(frame.body, str) else frame.body.decode()
        out["body"] = body
        out["headers"] = dict(frame.headers)
    print(json.dumps(out), flush=True)


def wait_receipt(listener, rid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if listener.receipts.get(timeout=0.1) == rid:
                return
        except queue.Empty:
            pass
    raise SystemExit(f"no RECEIPT {rid}")


def main():
    host, port, dest, ack_count = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    headers = json.loads(sys.argv[5]) if len(sys.argv) > 5 else {}
    conn = stomp.Connection12([(host, port)], heartbeats=(0, 0), auto_decode=True)
    listener = Listener()
    conn.set_listener("l", listener)
    conn.connect(wait=True)
    headers["receipt"] = "sub"
    conn.subscribe(dest, id="worker", ack="client-individual", headers=headers)
    wait_receipt(listener, "sub")
    report("subscribed")
    acked = 0
    while True:
        frame = listener.messages.get()
        if acked < ack_count:
            acked += 1
            rid = f"ack-{acked}"
            conn.ack(frame.headers["ack"], receipt=rid)
            wait_receipt(listener, rid)
            report("acked", frame)
        else:
            report("held", frame)


if __name__ == "__main__":
    main()
