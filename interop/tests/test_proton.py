"""python-qpid-proton's event-driven API (the shape of the Qpid Proton
python examples) against Rosetta, over real sockets:

- transactions: proton writes transaction control with symbolic
  descriptors (``amqp:declare:list``, ``amqp:discharge:list``); a
  transactional send committed, one rolled back, and a transactional
  receive (accepted inside a transaction, then committed or rolled back);
- application properties outside the spec (a list value) do not cost the
  message;
- idle timeout: a receiver with nothing to receive stays connected for
  several of the broker's enforced idle periods, kept alive only by the
  empty frames proton sends for the idle-time-out the broker advertises.
"""

import time

import pytest
from proton import Message, Timeout
from proton.handlers import MessagingHandler, TransactionHandler
from proton.reactor import Container

from clients import Amqp, new_id
from conftest import Broker

# Longest a scenario may take; past it the connection is closed and the
# test fails on what it recorded instead of hanging.
DEADLINE_S = 20


class Scenario(MessagingHandler, TransactionHandler):
    """A proton handler that records what happened and closes its
    connection at the deadline. ``self.error`` is set by any connection,
    session, link or transport error, and by a failed transaction."""

    def __init__(self, url, **kwargs):
        MessagingHandler.__init__(self, **kwargs)
        TransactionHandler.__init__(self)
        self.url = url
        self.conn = None
        self.error = None
        self.timed_out = False
        self.deadline = None

    def start(self, container):
        # No reconnect: a dropped connection must show, not be papered over.
        self.conn = container.connect(self.url, reconnect=False)
        self.deadline = container.schedule(DEADLINE_S, self)

    def finish(self):
        if self.deadline is not None:
            self.deadline.cancel()
        if self.conn is not None:
            self.conn.close()

    def on_timer_task(self, event):
        self.timed_out = True
        self.finish()

    def fail(self, what, event):
        if self.error is None:
            self.error = f"{what}: {event}"
        self.finish()

    def on_transport_error(self, event):
        cond = event.transport.condition
        self.fail("transport error", cond.name if cond else "closed")

    def on_connection_error(self, event):
        self.fail("connection error", event.connection.remote_condition)

    def on_session_error(self, event):
        self.fail("session error", event.session.remote_condition)

    def on_link_error(self, event):
        self.fail("link error", event.link.remote_condition)

    def on_transaction_declare_failed(self, event):
        self.fail("declare failed", event.delivery.remote_state)

    def on_transaction_commit_failed(self, event):
        self.fail("commit failed", event.delivery.remote_state)


def run(scenario):
    Container(scenario).run()
    assert not scenario.timed_out, f"scenario overran {DEADLINE_S}s"
    assert scenario.error is None, scenario.error
    return scenario


def url(broker):
    return f"amqp://{broker.host}:{broker.amqp_port}"


def drain(broker, address, wait_s=1.0):
    """Bodies left on a queue, read with the blocking client."""
    c = Amqp(broker)
    try:
        r = c.receiver(address)
        bodies = []
        while True:
            try:
                bodies.append(r.get(timeout=wait_s).body.decode())
            except Timeout:
                return bodies
    finally:
        c.close()


# ------------------------------------------------------------ transactions


class TransactionalSender(Scenario):
    """Sends each (body, commit) of ``plan`` in a transaction of its own,
    committed or aborted, one after the other."""

    def __init__(self, url, address, plan):
        super().__init__(url)
        self.address = address
        self.plan = list(plan)
        self.sender = None
        self.txn = None
        self.sent = False
        self.outcomes = []

    def on_start(self, event):
        self.start(event.container)
        self.sender = event.container.create_sender(self.conn, self.address)
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event):
        self.txn = event.transaction
        self.sent = False
        self.send()

    def on_sendable(self, event):
        self.send()

    def send(self):
        if self.txn is None or self.sent or self.sender.credit <= 0:
            return
        body, commit = self.plan[len(self.outcomes)]
        self.txn.send(self.sender, Message(body=body, durable=True))
        self.sent = True
        if commit:
            self.txn.commit()
        else:
            self.txn.abort()

    def discharged(self, event, outcome):
        self.outcomes.append(outcome)
        self.txn = None
        if len(self.outcomes) == len(self.plan):
            self.finish()
        else:
            event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_committed(self, event):
        self.discharged(event, "committed")

    def on_transaction_aborted(self, event):
        self.discharged(event, "aborted")


class TransactionalReceiver(Scenario):
    """Receives ``expected`` messages, accepts each inside one transaction,
    then commits it (or aborts it)."""

    def __init__(self, url, address, expected, commit):
        super().__init__(url, prefetch=0, auto_accept=False)
        self.address = address
        self.expected = expected
        self.commit = commit
        self.receiver = None
        self.txn = None
        self.bodies = []
        self.outcome = None

    def on_start(self, event):
        self.start(event.container)
        self.receiver = event.container.create_receiver(self.conn, self.address)
        event.container.declare_transaction(self.conn, handler=self)

    def on_transaction_declared(self, event):
        self.txn = event.transaction
        self.receiver.flow(self.expected)

    def on_message(self, event):
        self.bodies.append(event.message.body)
        self.txn.accept(event.delivery)
        if len(self.bodies) == self.expected:
            if self.commit:
                self.txn.commit()
            else:
                self.txn.abort()

    def on_transaction_committed(self, event):
        self.outcome = "committed"
        self.finish()

    def on_transaction_aborted(self, event):
        self.outcome = "aborted"
        self.finish()


def test_transactional_send_committed_and_rolled_back(broker, uniq):
    address = f"/queue/{uniq}"
    s = run(TransactionalSender(url(broker), address,
                                [("kept-1", True), ("dropped", False), ("kept-2", True)]))
    assert s.outcomes == ["committed", "aborted", "committed"]
    assert drain(broker, address) == ["kept-1", "kept-2"]


def test_transactional_receive_rolled_back_then_committed(broker, uniq):
    address = f"/queue/{uniq}"
    c = Amqp(broker)
    try:
        for body in ["r1", "r2"]:
            c.send(address, Message(body=body, durable=True))
    finally:
        c.close()
    # Accepted in a transaction that rolls back: still on the queue.
    r = run(TransactionalReceiver(url(broker), address, expected=2, commit=False))
    assert (r.outcome, r.bodies) == ("aborted", ["r1", "r2"])
    # Accepted in a transaction that commits: consumed.
    r = run(TransactionalReceiver(url(broker), address, expected=2, commit=True))
    assert (r.outcome, r.bodies) == ("committed", ["r1", "r2"])
    assert drain(broker, address) == []


# ------------------------------------------------------ application properties


def test_properties_outside_the_spec_cost_only_themselves(broker, uniq):
    """proton encodes whatever an application puts in ``properties``; the
    spec allows only simple values. The message is delivered, without the
    entries the broker cannot carry (a list, a map)."""
    address = f"/queue/{uniq}"
    c = Amqp(broker)
    try:
        c.send(address, Message(body="m", properties={"ok": 1, "list": [1, 2], "map": {"a": 1}}))
        got = c.receiver(address).get()
    finally:
        c.close()
    assert got.body == b"m"
    assert got.props == {"ok": 1}


# ------------------------------------------------------------ idle timeout

# The broker's enforced idle timeout for this module: its minimum (1 s),
# so that several periods take seconds.
IDLE_TIMEOUT_MS = 1_000
# How many enforced periods the receiver sits idle.
IDLE_PERIODS = 5


@pytest.fixture(scope="module")
def idle_broker():
    # The template writes no [amqp] section, so the setting is a section of
    # its own (a replace on the template silently did nothing once the
    # template lost its [amqp] lines).
    b = Broker("idle", extra_config=f"[amqp]\nidle_timeout_ms = {IDLE_TIMEOUT_MS}\n")
    b.start()
    yield b
    b.cleanup()


class IdleReceiver(Scenario):
    """A receiver that gets nothing for ``idle_s``, then sends itself one
    message on the same connection and must receive it."""

    def __init__(self, url, address, idle_s):
        super().__init__(url)
        self.address = address
        self.idle_s = idle_s
        self.opened = 0
        self.remote_idle_ms = None
        self.received = []
        self.woke = False

    def on_start(self, event):
        self.start(event.container)
        event.container.create_receiver(self.conn, self.address)
        event.container.schedule(self.idle_s, self)

    def on_connection_opened(self, event):
        self.opened += 1
        # What the broker advertised (proton reads it from its Open).
        self.remote_idle_ms = int(event.transport.remote_idle_timeout * 1000)

    def on_timer_task(self, event):
        if self.woke:
            super().on_timer_task(event)
            return
        self.woke = True
        sender = event.container.create_sender(self.conn, self.address)
        sender.send(Message(body="still here"))

    def on_message(self, event):
        self.received.append(event.message.body)
        self.finish()


def test_idle_receiver_stays_connected(idle_broker, uniq):
    idle_s = IDLE_PERIODS * IDLE_TIMEOUT_MS / 1000
    started = time.monotonic()
    r = run(IdleReceiver(url(idle_broker), f"/queue/{uniq}", idle_s))
    assert time.monotonic() - started >= idle_s
    assert r.received == ["still here"]
    assert r.opened == 1
    # Half the enforced timeout is advertised (AMQP 1.0 §2.4.5).
    assert r.remote_idle_ms == IDLE_TIMEOUT_MS // 2
