"""AMQP 1.0 receiver-settle-mode ``second`` with python-qpid-proton's
event-driven API, both ways:

- a proton sender asking for mode second gets it (the broker's attach says
  second) and sees each ``accepted`` outcome arrive unsettled; it settles;
- a proton receiver in mode second states ``accepted`` without settling and
  sees the broker settle (``on_settled``), and the queue is drained.
"""

import pytest
from proton import Delivery, Link, Message
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption

from clients import Amqp

N = 20
# Longest a scenario may take; past it the connection is closed and the
# test fails on its counts instead of hanging.
DEADLINE_S = 20


class Deadline:
    """Closes the connection when the scenario overruns."""

    def __init__(self, handler):
        self.handler = handler

    def on_timer_task(self, event):
        self.handler.timed_out = True
        if self.handler.conn is not None:
            self.handler.conn.close()


class SecondMode(LinkOption):
    def apply(self, link):
        link.rcv_settle_mode = Link.RCV_SECOND


class SecondModeSender(MessagingHandler):
    def __init__(self, url, address):
        super().__init__(auto_settle=True)
        self.url, self.address = url, address
        self.sent = 0
        self.accepted_unsettled = 0
        self.accepted_settled = 0
        self.remote_mode = None
        self.error = None
        self.conn = None
        self.timed_out = False

    def on_start(self, event):
        self.conn = conn = event.container.connect(self.url)
        self.timer = event.container.schedule(DEADLINE_S, Deadline(self))
        event.container.create_sender(conn, self.address, options=SecondMode())

    def on_link_opened(self, event):
        self.remote_mode = event.link.remote_rcv_settle_mode

    def on_sendable(self, event):
        while event.sender.credit and self.sent < N:
            event.sender.send(Message(body=f"s{self.sent}", durable=True))
            self.sent += 1

    def on_accepted(self, event):
        if event.delivery.settled:
            self.accepted_settled += 1
        else:
            self.accepted_unsettled += 1
            # Mode second: the sender settles first.
            event.delivery.settle()
        if self.accepted_settled + self.accepted_unsettled == N:
            self.timer.cancel()
            event.connection.close()

    def on_rejected(self, event):
        self.error = f"rejected: {event.delivery.remote_state}"
        event.connection.close()

    def on_transport_error(self, event):
        self.error = str(event.transport.condition)


class SecondModeReceiver(MessagingHandler):
    def __init__(self, url, address):
        super().__init__(prefetch=N, auto_accept=False)
        self.url, self.address = url, address
        self.received = []
        self.settled_by_broker = 0
        self.remote_mode = None
        self.conn = None
        self.timed_out = False

    def on_start(self, event):
        self.conn = conn = event.container.connect(self.url)
        self.timer = event.container.schedule(DEADLINE_S, Deadline(self))
        event.container.create_receiver(conn, self.address, options=SecondMode())

    def on_link_opened(self, event):
        self.remote_mode = event.link.remote_rcv_settle_mode

    def on_message(self, event):
        self.received.append(event.message.body)
        # State the outcome, leave settling to the broker.
        event.delivery.update(Delivery.ACCEPTED)

    def on_settled(self, event):
        self.settled_by_broker += 1
        event.delivery.settle()
        if self.settled_by_broker == N:
            self.timer.cancel()
            event.connection.close()


@pytest.fixture
def url(broker):
    return f"amqp://{broker.host}:{broker.amqp_port}"


def test_proton_sender_in_mode_second(broker, url, uniq):
    address = f"/queue/second-{uniq}"
    h = SecondModeSender(url, address)
    Container(h).run()
    assert not h.timed_out
    assert h.error is None
    assert h.remote_mode == Link.RCV_SECOND
    assert (h.accepted_unsettled, h.accepted_settled) == (N, 0)
    # All of them are there, committed.
    c = Amqp(broker)
    r = c.receiver(address)
    got = sorted(r.get().body.decode() for _ in range(N))
    assert got == sorted(f"s{i}" for i in range(N))
    c.close()


def test_proton_receiver_in_mode_second(broker, url, uniq):
    address = f"/queue/second-rx-{uniq}"
    c = Amqp(broker)
    for i in range(N):
        c.send(address, Message(body=f"r{i}", durable=True))
    c.close()
    h = SecondModeReceiver(url, address)
    Container(h).run()
    assert not h.timed_out, f"broker settled {h.settled_by_broker} of {N}"
    assert h.remote_mode == Link.RCV_SECOND
    assert sorted(h.received) == sorted(f"r{i}" for i in range(N))
    assert h.settled_by_broker == N
    # Settled as accepted: nothing comes again.
    c = Amqp(broker)
    r = c.receiver(address)
    with pytest.raises(Exception):
        r.get(timeout=1)
    c.close()
