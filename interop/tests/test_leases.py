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
  delivery count raised, and the link stays up;
- python-qpid-proton (event-driven API, whose ``Delivery.update`` can state
  ``received`` without settling): an unsettled ``received`` disposition
  renews the lease, so a delivery renewed for three leases is never sent
  again, and is accepted at the end.
"""

import queue
import time

import stomp
from proton import Delivery, Message, uint
from proton.handlers import MessagingHandler
from proton.reactor import Container

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


class Renewer(MessagingHandler):
    """Receives one delivery, renews its lease with ``received``
    dispositions every third of a lease for three leases, then accepts it,
    and watches two more leases for a redelivery."""

    RENEWALS = 9

    def __init__(self, url, address):
        super().__init__(prefetch=10, auto_accept=False)
        self.url, self.address = url, address
        self.received = []
        self.renewed = 0
        self.delivery = None
        self.timed_out = False
        self.conn = None

    def on_start(self, event):
        self.container = event.container
        self.conn = event.container.connect(self.url)
        event.container.create_receiver(
            self.conn,
            self.address,
            options=LinkProperties(**{"visibility-timeout": uint(LEASE_MS)}),
        )
        self.deadline = event.container.schedule(30, self)

    def on_message(self, event):
        self.received.append((event.message.body, event.message.delivery_count))
        if self.delivery is None:
            self.delivery = event.delivery
            self.container.schedule(LEASE_MS / 3000, self)

    def on_timer_task(self, event):
        if self.conn is None:
            return
        if self.delivery is None or self.renewed > self.RENEWALS + 100:
            # The scenario overran (the 30 s deadline).
            self.timed_out = True
            self.conn.close()
            return
        if self.renewed < self.RENEWALS:
            self.delivery.update(Delivery.RECEIVED)
            self.renewed += 1
            self.container.schedule(LEASE_MS / 3000, self)
        elif self.renewed == self.RENEWALS:
            self.accept(self.delivery)
            self.renewed += 1
            self.container.schedule(2 * LEASE_MS / 1000, self)
        else:
            self.deadline.cancel()
            self.conn.close()
            self.conn = None


def test_proton_received_disposition_renews_the_lease(broker, uniq):
    address = f"lease-renew-amqp-{uniq}"
    c = Amqp(broker)
    c.send(address, Message(body="long job", durable=True))
    c.close()
    h = Renewer(f"amqp://{broker.host}:{broker.amqp_port}", address)
    Container(h).run()
    assert not h.timed_out
    assert h.renewed == Renewer.RENEWALS + 1
    # Held for three leases by renewal alone: sent once, never again.
    assert h.received == [("long job", 0)]
    # Accepted at the end: the queue is empty.
    c = Amqp(broker)
    try:
        rcv = c.conn.create_receiver(address, credit=1)
        try:
            rcv.receive(timeout=1)
            raise AssertionError("the accepted delivery is still in the queue")
        except Exception as e:  # proton's Timeout
            assert "Timeout" in type(e).__name__, e
    finally:
        c.close()
