"""Last-value queues (issue 16, "last value") with the reference clients
over real sockets. The queue ``prices`` is configured with
``last_value_key = "symbol"``: of the waiting messages with one value of
the property ``symbol``, only the newest is kept, whichever protocol set
it (a paho-mqtt MQTT 5 user property, a stomp.py header, a
python-qpid-proton application property), and after a ``kill -9`` and a
restart still only the newest comes back.
"""

import queue

import pytest
from proton import Message, Timeout

from clients import Amqp, Mqtt, Stomp

QUIET_S = 0.7


@pytest.fixture(scope="module")
def lvq_broker():
    from conftest import Broker
    entries = "".join(
        f'\n[[queues]]\nname = "{q}"\nlast_value_key = "symbol"\n'
        for q in ("prices.mqtt", "prices.stomp", "prices.amqp", "prices.restart")
    )
    b = Broker("last-value", extra_config=entries, websocket=True)
    b.start()
    yield b
    b.cleanup()


def nothing_more(recv):
    try:
        r = recv.get(QUIET_S)
    except (queue.Empty, Timeout):
        return
    raise AssertionError(f"unexpected message {r.body!r}")


UPDATES = [("ACME", "acme 1"), ("INIT", "init 1"), ("ACME", "acme 2"), (None, "news"), ("ACME", "acme 3")]
NEWEST = ["init 1", "news", "acme 3"]


def stomp_updates(broker, dest):
    """``UPDATES`` as persistent stomp.py SENDs, ``symbol`` as a header."""
    p = Stomp(broker)
    try:
        for symbol, body in UPDATES:
            headers = {"persistent": "true", **({"symbol": symbol} if symbol else {})}
            p.send(dest, body.encode(), headers=headers)
    finally:
        p.close()


def take(c, n):
    """The next ``n`` bodies on stomp.py client ``c``, each ACKed."""
    bodies = []
    for _ in range(n):
        r = c.get()
        c.ack(r)
        bodies.append(r.body.decode())
    return bodies


def replaced(broker, q):
    return broker.metrics().get(f'rosetta_queue_last_value_replaced_total{{queue="{q}"}}')


def test_paho_publishes_user_properties_stomp_consumes_the_newest(lvq_broker):
    p = Mqtt(lvq_broker, version=5)
    try:
        for symbol, body in UPDATES:
            props = {"symbol": symbol} if symbol else None
            p.publish("$queue/prices.mqtt", body.encode(), qos=1, props=props)
    finally:
        p.close()
    assert replaced(lvq_broker, "prices.mqtt") == 2
    c = Stomp(lvq_broker)
    try:
        c.subscribe("/queue/prices.mqtt")
        assert take(c, len(NEWEST)) == NEWEST
        nothing_more(c)
    finally:
        c.close()


def test_stomp_sends_headers_proton_consumes_the_newest(lvq_broker):
    stomp_updates(lvq_broker, "/queue/prices.stomp")
    a = Amqp(lvq_broker)
    try:
        r = a.receiver("/queue/prices.stomp")
        got = [bytes(x.body).decode() for x in r.get_n(len(NEWEST))]
        assert got == NEWEST
        nothing_more(r)
    finally:
        a.close()


def test_proton_sends_application_properties_paho_consumes_the_newest(lvq_broker):
    a = Amqp(lvq_broker)
    try:
        for symbol, body in UPDATES:
            props = {"symbol": symbol} if symbol else None
            a.send("/queue/prices.amqp", Message(body=body, durable=True, properties=props))
    finally:
        a.close()
    m = Mqtt(lvq_broker, version=5)
    try:
        m.subscribe("$queue/prices.amqp", qos=1)
        got = [x.body.decode() for x in m.get_n(len(NEWEST))]
        assert got == NEWEST
        nothing_more(m)
    finally:
        m.close()


def test_only_the_newest_per_value_survives_kill_9(lvq_broker):
    stomp_updates(lvq_broker, "/queue/prices.restart")
    lvq_broker.restart(hard=True)
    c = Stomp(lvq_broker)
    try:
        c.subscribe("/queue/prices.restart")
        assert take(c, len(NEWEST)) == NEWEST
        nothing_more(c)
    finally:
        c.close()
