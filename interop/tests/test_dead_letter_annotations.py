"""Dead-letter annotations (issue 16, "receive attempts") with the
reference clients over real sockets: a message dead-lettered after
``delivery_attempts_max`` failed attempts, or rejected, carries why and how
often under one set of names on every protocol:

- python-qpid-proton reads them from ``message.annotations`` (AMQP message
  annotations ``x-opt-dead-letter-reason`` and ``x-opt-delivery-count``),
  not from the application properties, next to the publisher's own
  annotations;
- stomp.py reads them as headers;
- paho-mqtt (MQTT 5) reads them as user properties.
"""

import pytest
from proton import Message, symbol

from clients import Amqp, Mqtt, Stomp


@pytest.fixture(scope="module")
def dl_broker():
    from conftest import Broker
    entries = "".join(
        f'\n[[queues]]\nname = "jobs.{p}"\ndelivery_attempts_max = 2\ndead_letter_address = "dead.{p}"\n'
        for p in ("amqp", "stomp", "mqtt")
    )
    b = Broker("dead-letter-annotations", extra_config=entries)
    b.start()
    yield b
    b.cleanup()


def nack_twice(broker, queue, body):
    """A persistent STOMP message on ``queue``, NACKed by stomp.py until it
    is dead-lettered (the queue's 2 attempts)."""
    c = Stomp(broker)
    try:
        c.send(f"/queue/{queue}", body, headers={"persistent": "true"})
        c.subscribe(f"/queue/{queue}")
        for _ in range(2):
            c.nack(c.get())
    finally:
        c.close()


def take_dead_letter(a, queue):
    """The next message on ``queue`` with proton, accepted."""
    dead = a.conn.create_receiver(f"/queue/{queue}", credit=1)
    d = dead.receive(timeout=10)
    dead.accept()
    return d


def annotations(m):
    return {str(k): v for k, v in (m.annotations or {}).items()}


def test_proton_reads_reason_and_count_from_message_annotations(dl_broker):
    a = Amqp(dl_broker)
    try:
        m = Message(body="refused", durable=True, properties={"k": "v"},
                    annotations={symbol("x-opt-mine"): 7})
        a.send("/queue/jobs.amqp", m)
        r = a.conn.create_receiver("/queue/jobs.amqp", credit=1)
        got = r.receive(timeout=10)
        assert got.body == "refused"
        r.reject()
        d = take_dead_letter(a, "dead.amqp")
        assert d.body == "refused"
        ann = annotations(d)
        assert ann.get("x-opt-dead-letter-reason") == "rejected", ann
        assert ann.get("x-opt-delivery-count") == 1, ann
        assert ann.get("x-opt-mine") == 7, "the publisher's annotation is kept"
        props = d.properties or {}
        assert props.get("x-original-queue") == "jobs.amqp", props
        assert props.get("k") == "v"
        assert not any(k.startswith("x-opt-") for k in props), props
    finally:
        a.close()


def test_proton_sees_delivery_attempts_as_the_reason(dl_broker):
    nack_twice(dl_broker, "jobs.amqp", b"poison")
    a = Amqp(dl_broker)
    try:
        ann = annotations(take_dead_letter(a, "dead.amqp"))
        assert ann.get("x-opt-dead-letter-reason") == "delivery-attempts", ann
        assert ann.get("x-opt-delivery-count") == 2, ann
    finally:
        a.close()


def test_stomp_reads_reason_and_count_as_headers(dl_broker):
    nack_twice(dl_broker, "jobs.stomp", b"poison")
    c = Stomp(dl_broker)
    try:
        c.subscribe("/queue/dead.stomp")
        r = c.get()
        c.ack(r)
        assert r.body == b"poison"
        h = r.fields
        assert h.get("x-opt-dead-letter-reason") == "delivery-attempts", h
        assert h.get("x-opt-delivery-count") == "2", h
        assert h.get("x-original-queue") == "jobs.stomp", h
    finally:
        c.close()


def test_paho_mqtt5_reads_reason_and_count_as_user_properties(dl_broker):
    nack_twice(dl_broker, "jobs.mqtt", b"poison")
    m = Mqtt(dl_broker, version=5)
    try:
        m.subscribe("$queue/dead.mqtt", qos=1)
        r = m.get()
        assert r.body == b"poison"
        assert r.props.get("x-opt-dead-letter-reason") == "delivery-attempts", r.props
        assert r.props.get("x-opt-delivery-count") == "2", r.props
        assert r.props.get("x-original-queue") == "jobs.mqtt", r.props
    finally:
        m.close()
