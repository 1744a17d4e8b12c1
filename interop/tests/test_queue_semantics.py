"""Queue semantics (issue 15) with the reference clients over real sockets:

- python-qpid-proton: the ``selected_recv.py`` example's selector (the 50
  green of 100 coloured messages, the selector echoed in the attach reply)
  and the ``queue_browser.py`` example's browser (``Copy()``: it sees all
  10, ends by itself when the broker drains its credit, and leaves the 10
  queued for a normal receiver); a malformed selector refuses the link
  with ``amqp:invalid-field``;
- stomp.py: ``selector``, ``activemq.exclusive`` (a standby taking over in
  order), ``activemq.priority``, ``browser:true`` with ActiveMQ's
  end-of-browse MESSAGE, a malformed selector as an ERROR frame;
- AMQP link properties ``exclusive`` and ``priority`` (Proton);
- paho-mqtt as the producer of a queue that a STOMP and an AMQP selector
  consumer share, each getting exactly its matches, and of message groups
  (user property ``JMSXGroupID``) that two AMQP consumers honour;
- message priority set by each protocol (MQTT 5 user property
  ``priority``, STOMP ``priority``, AMQP header priority);
- ``kill -9`` of a separate consumer process (``queue_worker.py``)
  mid-stream: its message groups move to another consumer with nothing
  lost or reordered within a group, and a standby exclusive consumer takes
  over from the first unacknowledged message.
"""

import json
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from proton import Message, Timeout, symbol
from proton.reactor import Copy, ReceiverOption, Selector

from clients import PROTOCOLS, Amqp, AmqpReceiver, Mqtt, Stomp, amqp_message
from test_proton import Scenario, drain, run, url

WORKER = Path(__file__).with_name("queue_worker.py")
# How long a test watches for a message that must not come.
QUIET_S = 0.7


def colour_of(i):
    return "green" if i % 2 else "red"


def send_coloured(broker, address, n):
    """AMQP messages ``<colour>-<i>`` with application property ``colour``."""
    c = Amqp(broker)
    try:
        for i in range(n):
            m = Message(body=f"{colour_of(i)}-{i}", properties={"colour": colour_of(i)}, durable=True)
            c.send(address, m)
    finally:
        c.close()


def expected(colour, n):
    return [f"{colour}-{i}" for i in range(n) if colour_of(i) == colour]


def stomp_send(broker, dest, bodies, headers=None):
    """Persistent STOMP SENDs of ``bodies`` (str), each confirmed."""
    p = Stomp(broker)
    try:
        for body in bodies:
            p.send(dest, body.encode(), headers={"persistent": "true", **(headers or {})})
    finally:
        p.close()


def numbered(n, first=0):
    return [f"m{i}" for i in range(first, n)]


def take(c, n, timeout=10):
    """The next ``n`` bodies on stomp.py client ``c``, each ACKed."""
    bodies = []
    for _ in range(n):
        r = c.get(timeout)
        c.ack(r)
        bodies.append(r.body.decode())
    return bodies


def assert_nothing_more(recv):
    """No further message on a stomp.py or blocking proton receiver."""
    try:
        r = recv.get(QUIET_S)
    except (queue.Empty, Timeout):
        return
    raise AssertionError(f"unexpected message {r.body!r}")


def selector_receiver(amqp, address, selector, credit=100):
    return AmqpReceiver(amqp.conn.create_receiver(address, credit=credit, options=Selector(selector)))


# ------------------------------------------------------------ proton examples


class SelectedRecv(Scenario):
    """``selected_recv.py``: a receiver with ``Selector("colour = 'green'")``
    that closes after ``count`` messages."""

    def __init__(self, url, address, selector, count):
        super().__init__(url)
        self.address, self.selector, self.count = address, selector, count
        self.bodies = []
        self.echoed = None
        self.refused = None

    def on_start(self, event):
        self.start(event.container)
        event.container.create_receiver(self.conn, self.address, options=Selector(self.selector))

    def on_link_opened(self, event):
        # The reply's source filter, as a {symbol: Described} dict.
        f = event.link.remote_source.filter
        f.rewind()
        self.echoed = f.get_object() if f.next() else None

    def on_link_error(self, event):
        cond = event.link.remote_condition
        self.refused = cond.name if cond else "no condition"
        self.finish()

    def on_message(self, event):
        self.bodies.append(event.message.body)
        if len(self.bodies) == self.count:
            event.receiver.close()
            self.finish()


def test_proton_selected_recv_gets_exactly_the_green(broker, uniq):
    address = f"/queue/{uniq}"
    send_coloured(broker, address, 100)
    s = run(SelectedRecv(url(broker), address, "colour = 'green'", 50))
    assert s.bodies == expected("green", 100)
    assert s.echoed is not None and "selector" in {str(k) for k in s.echoed}, \
        f"the applied selector is echoed in the reply: {s.echoed}"
    # The reds were never taken: a plain receiver gets all 50, in order.
    assert drain(broker, address) == expected("red", 100)


def test_proton_malformed_selector_refuses_the_link(broker, uniq):
    address = f"/queue/{uniq}"
    send_coloured(broker, address, 2)
    s = SelectedRecv(url(broker), address, "colour = = 'green'", 1)
    run_refused(s)
    assert s.refused == "amqp:invalid-field"
    assert s.bodies == []
    assert drain(broker, address) == ["red-0", "green-1"]


def run_refused(scenario):
    """Runs a scenario whose link the broker is expected to refuse (its
    ``on_link_error`` records the condition instead of failing)."""
    from proton.reactor import Container
    Container(scenario).run()
    assert not scenario.timed_out, "the refusal never came"


class Browser(Scenario):
    """``queue_browser.py``: a ``Copy()`` receiver. It grants ``credit``
    itself (more than the queue holds) and stops when the broker drains
    it, which proton reports as ``receiver.drained()``."""

    def __init__(self, url, address, credit):
        super().__init__(url, prefetch=0)
        self.address, self.credit = address, credit
        self.bodies = []
        self.settled = []
        self.drained = 0
        self.mode = None

    def on_start(self, event):
        self.start(event.container)
        event.container.create_receiver(self.conn, self.address, options=Copy())

    def on_link_opened(self, event):
        self.mode = event.link.remote_source.distribution_mode
        event.receiver.flow(self.credit)

    def on_message(self, event):
        self.bodies.append(event.message.body)
        # Settled by the broker on the transfer itself.
        self.settled.append(event.delivery.settled)

    def on_link_flow(self, event):
        if event.link.is_receiver:
            self.drained += event.receiver.drained()
            if self.drained:
                self.finish()


def test_proton_queue_browser_ends_by_drain_and_leaves_everything_queued(broker, uniq):
    from proton import Terminus
    address = f"/queue/{uniq}"
    sent = [f"browse-{i}" for i in range(10)]
    c = Amqp(broker)
    for body in sent:
        c.send(address, Message(body=body, durable=True))
    c.close()
    s = run(Browser(url(broker), address, credit=25))
    assert s.mode == Terminus.DIST_MODE_COPY
    assert s.bodies == sent, "every message once, in queue order"
    assert all(s.settled), "browsed copies come pre-settled"
    assert s.drained == 15, "the unused credit is drained: that is the end of the browse"
    # Still all there, and a consumer gets them.
    assert drain(broker, address) == sent


# ------------------------------------------------------------------ stomp.py


def test_stomp_selector(broker, uniq):
    dest = f"/queue/{uniq}"
    send_coloured(broker, dest, 20)
    c = Stomp(broker)
    try:
        c.subscribe(dest, headers={"selector": "colour = 'green'"})
        assert take(c, 10) == expected("green", 20)
        assert_nothing_more(c)
    finally:
        c.close()
    assert drain(broker, dest) == expected("red", 20)


def test_stomp_malformed_selector_is_an_error_frame(broker, uniq):
    c = Stomp(broker)
    try:
        c.conn.subscribe(f"/queue/{uniq}", id="s", ack="auto", headers={"selector": "a = 1 OR ("})
        err = c.l.errors.get(timeout=10)
        assert err.headers.get("message") == "invalid selector", err.headers
        assert c.l.disconnected.wait(10), "the connection is closed after the ERROR"
    finally:
        c.close()


def test_stomp_exclusive_standby_takes_over_in_order(broker, uniq):
    dest = f"/queue/{uniq}"
    first, standby = Stomp(broker), Stomp(broker)
    try:
        first.subscribe(dest, headers={"activemq.exclusive": "true", "activemq.prefetchSize": "4"})
        standby.subscribe(dest, headers={"activemq.exclusive": "true"})
        stomp_send(broker, dest, numbered(10))
        assert take(first, 3) == numbered(3)
        assert_nothing_more(standby)
        first.close()  # m3.. unacknowledged: they go to the standby
        assert take(standby, 7) == numbered(10, first=3)
        assert_nothing_more(standby)
    finally:
        first.close()
        standby.close()


def test_stomp_consumer_priority(broker, uniq):
    dest = f"/queue/{uniq}"
    low, high = Stomp(broker), Stomp(broker)
    try:
        low.subscribe(dest, headers={"activemq.priority": "1", "activemq.prefetchSize": "100"})
        high.subscribe(dest, headers={"activemq.priority": "9", "activemq.prefetchSize": "100"})
        stomp_send(broker, dest, numbered(20))
        assert take(high, 20) == numbered(20)
        assert_nothing_more(low)
    finally:
        low.close()
        high.close()


def test_stomp_browser_ends_with_the_end_of_browse_message(broker, uniq):
    dest = f"/queue/{uniq}"
    sent = numbered(5)
    stomp_send(broker, dest, sent)
    b = Stomp(broker)
    try:
        b.subscribe(dest, ack="auto", headers={"browser": "true"})
        got = [b.get() for _ in range(5)]
        assert [r.body.decode() for r in got] == sent
        end = b.get()
        assert end.fields.get("browser") == "end", end.fields
        assert end.body == b""
        assert_nothing_more(b)
    finally:
        b.close()
    assert drain(broker, dest) == sent


# ------------------------------------------- AMQP exclusive / priority links


class LinkProperties(ReceiverOption):
    """Link properties on a receiver's attach (Artemis's `exclusive` and
    `priority`)."""

    def __init__(self, **props):
        self.props = {symbol(k): v for k, v in props.items()}

    def apply(self, receiver):
        receiver.properties = self.props


def amqp_receiver(amqp, address, credit=100, **props):
    return AmqpReceiver(amqp.conn.create_receiver(address, credit=credit,
                                                  options=LinkProperties(**props)))


def amqp_send(broker, address, bodies):
    a = Amqp(broker)
    try:
        for body in bodies:
            a.send(address, Message(body=body, durable=True))
    finally:
        a.close()


def test_amqp_exclusive_link_property_and_standby(broker, uniq):
    address = f"/queue/{uniq}"
    first, standby = Amqp(broker), Amqp(broker)
    try:
        r1 = amqp_receiver(first, address, exclusive=True)
        r2 = amqp_receiver(standby, address, exclusive=True)
        amqp_send(broker, address, numbered(10))
        assert [r.body.decode() for r in r1.get_n(10)] == numbered(10)
        assert_nothing_more(r2)
        first.close()
        amqp_send(broker, address, numbered(15, first=10))
        assert [r.body.decode() for r in r2.get_n(5)] == numbered(15, first=10)
    finally:
        first.close()
        standby.close()


def test_amqp_priority_link_property(broker, uniq):
    address = f"/queue/{uniq}"
    low, high = Amqp(broker), Amqp(broker)
    try:
        r_low = amqp_receiver(low, address, priority=1)
        r_high = amqp_receiver(high, address, priority=9)
        amqp_send(broker, address, numbered(20))
        assert [r.body.decode() for r in r_high.get_n(20)] == numbered(20)
        assert_nothing_more(r_low)
    finally:
        low.close()
        high.close()


def test_an_mqtt_publishers_groups_are_honoured_for_amqp_consumers(broker):
    """MQTT 5 user property ``JMSXGroupID``: every message of a group goes
    to one of the two AMQP consumers, in order, and it arrives as the AMQP
    ``group-id``."""
    topic, queue_name = broker.bound.take()
    dest = f"/queue/{queue_name}"
    # Three groups (an odd number) sent in turn, so that plain round-robin
    # over two consumers cannot keep a group together by chance.
    groups, per_group = [f"g{k}" for k in range(3)], 5
    a, b = Amqp(broker), Amqp(broker)
    try:
        receivers = [a.receiver(dest), b.receiver(dest)]
        m = Mqtt(broker, version=5)
        for i in range(per_group):
            for g in groups:
                m.publish(topic, f"{g}:{i}".encode(), qos=1, props={"JMSXGroupID": g})
        m.close()
        by_receiver = [[], []]
        total = len(groups) * per_group
        deadline = time.monotonic() + 15
        while sum(map(len, by_receiver)) < total and time.monotonic() < deadline:
            for k, r in enumerate(receivers):
                try:
                    by_receiver[k].append(r.get(timeout=0.2))
                except Timeout:
                    pass
        assert sum(map(len, by_receiver)) == total
        for got in by_receiver:
            for r in got:
                assert r.fields["group_id"] == r.body.decode().split(":")[0], r.fields
        owner = {}
        for k, got in enumerate(by_receiver):
            for r in got:
                assert owner.setdefault(r.fields["group_id"], k) == k, "a group went to both"
        for g in groups:
            got = [r.body.decode() for r in by_receiver[owner[g]] if r.fields["group_id"] == g]
            assert got == [f"{g}:{i}" for i in range(per_group)], g
        assert set(owner.values()) == {0, 1}, "groups are spread over both consumers"
    finally:
        a.close()
        b.close()


# ------------------------------------------------- MQTT producer, two readers


def test_mqtt_producer_feeds_stomp_and_amqp_selectors(broker):
    topic, queue_name = broker.bound.take()
    dest = f"/queue/{queue_name}"
    reds = Stomp(broker)
    greens = Amqp(broker)
    try:
        reds.subscribe(dest, headers={"selector": "colour = 'red'"})
        green_rcv = selector_receiver(greens, dest, "colour = 'green'")
        m = Mqtt(broker, version=5)
        for i in range(20):
            m.publish(topic, f"{colour_of(i)}-{i}".encode(), qos=1, props={"colour": colour_of(i)})
        m.close()
        got_red = take(reds, 10)
        got_green = [r.body.decode() for r in green_rcv.get_n(10)]
        assert got_red == expected("red", 20)
        assert got_green == expected("green", 20)
        assert_nothing_more(reds)
        assert_nothing_more(green_rcv)
    finally:
        reds.close()
        greens.close()


# ------------------------------------------------------------ message priority


@pytest.mark.parametrize("proto", PROTOCOLS)
def test_message_priority_from_each_protocol(broker, proto):
    """Low (1) and high (8) priority messages, interleaved, wait on a queue
    with no consumer; a consumer gets the high ones first, each priority
    in the order sent."""
    topic, queue_name = broker.bound.take()
    dest = f"/queue/{queue_name}"
    plan = [(f"{'h' if i % 2 else 'l'}{i // 2}", 8 if i % 2 else 1) for i in range(8)]
    if proto == "mqtt":
        m = Mqtt(broker, version=5)
        for body, prio in plan:
            m.publish(topic, body.encode(), qos=1, props={"priority": str(prio)})
        m.close()
    elif proto == "stomp":
        s = Stomp(broker)
        for body, prio in plan:
            s.send(dest, body.encode(), headers={"priority": str(prio), "persistent": "true"})
        s.close()
    else:
        a = Amqp(broker)
        for body, prio in plan:
            a.send(dest, amqp_message(body.encode(), text=True, priority=prio))
        a.close()
    highs = [b for b, p in plan if p == 8]
    lows = [b for b, p in plan if p == 1]
    assert drain(broker, dest) == highs + lows


# ---------------------------------------------------- kill -9 of a consumer


class Worker:
    """``queue_worker.py`` in a process of its own; ``kill9`` is SIGKILL."""

    def __init__(self, broker, dest, ack, headers):
        self.p = subprocess.Popen(
            [sys.executable, str(WORKER), broker.host, str(broker.stomp_port), dest, str(ack),
             json.dumps(headers)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.events = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.acked, self.held = [], []
        self.expect("subscribed")

    def _read(self):
        for line in self.p.stdout:
            self.events.put(json.loads(line))

    def expect(self, kind, timeout=10):
        e = self.events.get(timeout=timeout)
        assert e["event"] == kind, e
        return e

    def collect(self, until, timeout=10):
        """Reads reports until ``until(self)`` holds."""
        deadline = time.monotonic() + timeout
        while not until(self):
            e = self.events.get(timeout=max(0.1, deadline - time.monotonic()))
            (self.acked if e["event"] == "acked" else self.held).append(e)

    def kill9(self):
        self.p.kill()
        self.p.wait(timeout=10)
        # What it printed before it died.
        while not self.events.empty():
            e = self.events.get()
            (self.acked if e["event"] == "acked" else self.held).append(e)

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait(timeout=10)


def test_a_group_moves_when_its_consumer_is_killed(broker, uniq):
    dest = f"/queue/{uniq}"
    groups = [f"g{k}" for k in range(3)]  # odd: round-robin cannot keep them by chance
    per_group = 10
    w = Worker(broker, dest, ack=4, headers={"activemq.prefetchSize": "5"})
    other = Stomp(broker)
    try:
        other.subscribe(dest, headers={"activemq.prefetchSize": "100"})
        p = Stomp(broker)
        for i in range(per_group):
            for g in groups:
                p.send(dest, f"{g}:{i}".encode(), headers={"JMSXGroupID": g, "persistent": "true"})
        p.close()
        # The worker took its groups, acknowledged 4 and holds the rest.
        w.collect(lambda w: len(w.acked) == 4 and w.held)
        w.kill9()
        acked = [e["body"] for e in w.acked]
        held_groups = {e["headers"]["JMSXGroupID"] for e in w.held}
        assert held_groups, "the worker held messages when it died"
        got = {g: [] for g in groups}
        for _ in range(len(groups) * per_group - len(acked)):
            r = other.get(timeout=15)
            other.ack(r)
            got[r.fields["JMSXGroupID"]].append(r.body.decode())
        assert_nothing_more(other)
        for g in groups:
            before = [b for b in acked if b.startswith(f"{g}:")]
            assert before + got[g] == [f"{g}:{i}" for i in range(per_group)], \
                f"group {g}: nothing lost, nothing twice, in order"
    finally:
        w.close()
        other.close()


def test_a_standby_exclusive_consumer_takes_over_after_kill_9(broker, uniq):
    dest = f"/queue/{uniq}"
    w = Worker(broker, dest, ack=3, headers={"activemq.exclusive": "true", "activemq.prefetchSize": "4"})
    standby = Stomp(broker)
    try:
        standby.subscribe(dest, headers={"activemq.exclusive": "true"})
        stomp_send(broker, dest, numbered(10))
        w.collect(lambda w: len(w.acked) == 3 and w.held)
        assert_nothing_more(standby)
        w.kill9()
        assert [e["body"] for e in w.acked] == numbered(3)
        assert take(standby, 7, timeout=15) == numbered(10, first=3)
        assert_nothing_more(standby)
    finally:
        w.close()
        standby.close()


# ------------------------------------------------ MQTT on an exclusive queue

# A queue the configuration makes exclusive (`[[queues]]`, the h/qconf
# keys): MQTT has no per-subscription option, so this is how an MQTT
# `$queue/` subscriber gets a single active consumer.
EXCLUSIVE_QUEUE = "mqtt-exclusive"


@pytest.fixture(scope="module")
def exclusive_queue_broker():
    from conftest import Broker
    b = Broker("exclusive-queue", extra_config=f"""
[[queues]]
name = "{EXCLUSIVE_QUEUE}"
exclusive = true
""")
    b.start()
    yield b
    b.cleanup()


def test_mqtt_queue_subscribers_of_an_exclusive_queue(exclusive_queue_broker):
    b = exclusive_queue_broker
    topic = f"$queue/{EXCLUSIVE_QUEUE}"
    first, standby = Mqtt(b, version=5), Mqtt(b, version=5)
    try:
        first.subscribe(topic, qos=1)
        standby.subscribe(topic, qos=1)
        p = Mqtt(b, version=5)
        for body in numbered(10):
            p.publish(topic, body.encode(), qos=1)
        assert [first.get().body.decode() for _ in range(10)] == numbered(10)
        assert_nothing_more(standby)
        first.close()
        for body in numbered(15, first=10):
            p.publish(topic, body.encode(), qos=1)
        p.close()
        assert [standby.get().body.decode() for _ in range(5)] == numbered(15, first=10)
    finally:
        first.close()
        standby.close()
