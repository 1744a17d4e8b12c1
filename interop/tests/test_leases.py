"""Lease delivery (visibility timeout, issue 16) with the reference clients
over real sockets:

- stomp.py: SUBSCRIBE ``visibility-timeout``; a delivery left unacknowledged
  comes again on the same connection with ``delivery-count`` raised; the late
  ACK of the first delivery gets a RECEIPT with ``lease-expired:true`` (no
  ERROR, the connection stays up) and does not acknowledge the copy; the
  ``RENEW`` extension frame (sent with ``send_frame``) keeps a delivery past
  its first deadline;
- python-qpid-proton (blocking API): receiver link property
  ``visibility-timeout``; an unaccepted delivery comes again with its
  delivery count raised, and the link stays up. Proton's blocking receiver
  cannot send a ``received`` disposition, so AMQP renewal is tested from
  Rust's harness only (see docs/semantics.md).
"""

import queue
import time

import stomp
from proton import Message, uint

from clients import Amqp, Stomp
from test_queue_semantics import LinkProperties

LEASE_MS = 400


class Receipts(stomp.ConnectionListener):
    """Every RECEIPT frame with its headers."""

    def __init__(self):
        self.frames = queue.Queue()

    def on_receipt(self, frame):
        self.frames.put(frame)


def receipt(c, r, command, headers, rid):
    c.conn.send_frame(command, {**headers, "receipt": rid})
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        f = r.frames.get(timeout=10)
        if f.headers.get("receipt-id") == rid:
            return f
    raise AssertionError(f"no RECEIPT {rid}")


def test_stomp_lease_expires_and_the_late_ack_is_refused(broker, uniq):
    dest = f"/queue/lease-{uniq}"
    c = Stomp(broker)
    r = Receipts()
    c.conn.set_listener("receipts", r)
    try:
        c.subscribe(dest, headers={"visibility-timeout": str(LEASE_MS)})
        c.send(dest, b"job", headers={"persistent": "true"})
        first = c.get()
        again = c.get(timeout=LEASE_MS / 1000 * 10)
        assert again.body == b"job"
        assert again.fields.get("delivery-count") == "1"
        assert again.fields["ack"] != first.fields["ack"]
        late = receipt(c, r, "ACK", {"id": first.fields["ack"]}, "late")
        assert late.headers.get("lease-expired") == "true", late.headers
        ok = receipt(c, r, "ACK", {"id": again.fields["ack"]}, "ok")
        assert "lease-expired" not in ok.headers
        assert c.conn.is_connected()
        assert c.l.errors.empty()
        assert c.l.messages.empty()
    finally:
        c.close()


def test_stomp_renew_keeps_a_delivery_past_its_deadline(broker, uniq):
    dest = f"/queue/renew-{uniq}"
    c = Stomp(broker)
    r = Receipts()
    c.conn.set_listener("receipts", r)
    try:
        c.subscribe(dest, headers={"visibility-timeout": str(LEASE_MS)})
        c.send(dest, b"long job", headers={"persistent": "true"})
        m = c.get()
        for i in range(5):
            time.sleep(LEASE_MS / 1000 / 2)
            f = receipt(c, r, "RENEW", {"id": m.fields["ack"]}, f"renew-{i}")
            assert "lease-expired" not in f.headers
        assert c.l.messages.empty(), "renewed: never redelivered"
        f = receipt(c, r, "ACK", {"id": m.fields["ack"]}, "done")
        assert "lease-expired" not in f.headers
    finally:
        c.close()


def test_proton_lease_expires_while_the_receiver_stays(broker, uniq):
    address = f"lease-amqp-{uniq}"
    c = Amqp(broker)
    try:
        c.send(address, Message(body="job", durable=True))
        rcv = c.conn.create_receiver(
            address, credit=10, options=LinkProperties(**{"visibility-timeout": uint(LEASE_MS)})
        )
        first = rcv.receive(timeout=10)
        assert first.body == "job"
        # Not accepted: the broker releases it and sends it again.
        again = rcv.receive(timeout=10)
        assert again.body == "job"
        assert again.delivery_count == 1
        rcv.accept()
        c.send(address, Message(body="next", durable=True))
        nxt = rcv.receive(timeout=10)
        assert nxt.body == "next"
        rcv.accept()
    finally:
        c.close()
