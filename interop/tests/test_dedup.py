"""Duplicate detection (issue 16) with the reference clients over real
sockets, on a broker whose ``[[queues]]`` give the queue ``dd`` a dedup
window:

- python-qpid-proton sends each message twice with the same
  ``message-id`` (string, ulong, uuid): both sends are ``accepted``
  (``BlockingSender.send`` raises otherwise), one copy is delivered;
- stomp.py sends with the header ``dedup-id``: both sends get their
  RECEIPT, one copy is delivered;
- paho-mqtt (MQTT 5) publishes to ``$queue/dd`` with the user property
  ``dedup-id``: both PUBACKs are reason 0 (Success), one copy is delivered;
- the window holds across a ``kill -9`` of the broker: every id sent
  again after the crash is acknowledged and not delivered;
- ``/metrics`` counts the duplicates in ``rosetta_queue_duplicates_total``;
- a ``[[topics]]`` window drops a retried paho publish to a topic before it
  fans out: the retry's PUBACK is a success, each subscriber gets one copy,
  and the window holds across a ``kill -9`` for a subscriber that joined
  after it.
"""

import queue
import uuid

import pytest
from proton import Message, Timeout

from clients import Amqp, Mqtt, Stomp
from conftest import Broker

QUEUE = "dd"
TOPIC_FILTER = "dd-topic/#"
WINDOW_CONFIG = f"""
[store]
sync = "every-commit"

[[queues]]
name = "{QUEUE}"
dedup_window_s = 300

[[topics]]
filter = "{TOPIC_FILTER}"
dedup_window_s = 300
"""
QUIET_S = 0.7


@pytest.fixture(scope="module")
def dedup_broker():
    b = Broker("dedup", extra_config=WINDOW_CONFIG, websocket=True)
    b.start()
    yield b
    b.cleanup()


def amqp_send_twice(broker, ids):
    c = Amqp(broker)
    try:
        for i, mid in enumerate(ids):
            for attempt in ("first", "retry"):
                c.send(f"/queue/{QUEUE}", Message(body=f"amqp-{i}-{attempt}", id=mid, durable=True))
    finally:
        c.close()


def stomp_send_twice(broker, ids):
    s = Stomp(broker)
    try:
        for i, did in enumerate(ids):
            for attempt in ("first", "retry"):
                # `send` waits for the RECEIPT and raises on an ERROR.
                s.send(f"/queue/{QUEUE}", f"stomp-{i}-{attempt}".encode(),
                       headers={"persistent": "true", "dedup-id": did})
    finally:
        s.close()


def mqtt_send_twice(broker, ids):
    m = Mqtt(broker, version=5)
    reasons = queue.Queue()
    m.c.on_publish = lambda c, u, mid, rc, props: reasons.put(rc)
    try:
        for i, did in enumerate(ids):
            for attempt in ("first", "retry"):
                m.publish(f"$queue/{QUEUE}", f"mqtt-{i}-{attempt}".encode(), qos=1,
                          props=[("dedup-id", did)])
                rc = reasons.get(timeout=10)
                assert not rc.is_failure and rc.value == 0, f"PUBACK {rc}"
    finally:
        m.close()


def drain(broker):
    """Every body waiting in the queue (AMQP receiver, each accepted)."""
    c = Amqp(broker)
    bodies = []
    try:
        r = c.receiver(f"/queue/{QUEUE}", credit=1000)
        while True:
            try:
                bodies.append(r.get(timeout=QUIET_S).body.decode())
            except Timeout:
                return bodies
    finally:
        c.close()


def duplicates(broker):
    return broker.metrics().get(f'rosetta_queue_duplicates_total{{queue="{QUEUE}"}}', 0)


def test_retried_sends_are_acknowledged_and_delivered_once_across_kill_9(dedup_broker):
    amqp_ids = ["jms-id-1", 42, uuid.UUID(int=7)]
    stomp_ids = ["order-1", "order-2"]
    mqtt_ids = ["reading-1", "reading-2"]
    amqp_send_twice(dedup_broker, amqp_ids)
    stomp_send_twice(dedup_broker, stomp_ids)
    mqtt_send_twice(dedup_broker, mqtt_ids)
    firsts = ([f"amqp-{i}-first" for i in range(len(amqp_ids))]
              + [f"stomp-{i}-first" for i in range(len(stomp_ids))]
              + [f"mqtt-{i}-first" for i in range(len(mqtt_ids))])
    assert drain(dedup_broker) == firsts
    assert duplicates(dedup_broker) == len(firsts)

    # The first copies were consumed and acknowledged; the window still
    # holds them after a crash.
    dedup_broker.restart(hard=True)
    amqp_send_twice(dedup_broker, amqp_ids)
    stomp_send_twice(dedup_broker, stomp_ids)
    mqtt_send_twice(dedup_broker, mqtt_ids)
    stomp_send_twice(dedup_broker, ["fresh"])
    assert drain(dedup_broker) == ["stomp-0-first"]
    assert duplicates(dedup_broker) == 2 * len(firsts) + 1


def mqtt_publish_reason(m, reasons, topic, body, dedup_id):
    m.publish(topic, body.encode(), qos=1, props=[("dedup-id", dedup_id)])
    rc = reasons.get(timeout=10)
    return rc.value


def test_a_topic_window_drops_a_retry_for_every_subscriber_across_kill_9(dedup_broker):
    subscribers = [Mqtt(dedup_broker, version=5) for _ in range(2)]
    subscribers[0].subscribe("dd-topic/#")
    subscribers[1].subscribe("dd-topic/a")
    p = Mqtt(dedup_broker, version=5)
    reasons = queue.Queue()
    p.c.on_publish = lambda c, u, mid, rc, props: reasons.put(rc)
    try:
        # Both PUBACKs are reason 0 (Success): the retry is not an error.
        assert mqtt_publish_reason(p, reasons, "dd-topic/a", "first", "t-1") == 0
        assert mqtt_publish_reason(p, reasons, "dd-topic/a", "retry", "t-1") == 0
        for s in subscribers:
            assert s.get().body == b"first"
            with pytest.raises(queue.Empty):
                s.get(timeout=QUIET_S)
    finally:
        p.close()
        for s in subscribers:
            s.close()
    assert dedup_broker.metrics().get(
        f'rosetta_topic_duplicates_total{{filter="{TOPIC_FILTER}"}}', 0) == 1

    dedup_broker.restart(hard=True)
    late = Mqtt(dedup_broker, version=5)
    late.subscribe("dd-topic/a")
    p = Mqtt(dedup_broker, version=5)
    reasons = queue.Queue()
    p.c.on_publish = lambda c, u, mid, rc, props: reasons.put(rc)
    try:
        assert mqtt_publish_reason(p, reasons, "dd-topic/a", "retry after crash", "t-1") == 0
        assert mqtt_publish_reason(p, reasons, "dd-topic/a", "fresh", "t-2") == 0
        assert late.get().body == b"fresh"
        with pytest.raises(queue.Empty):
            late.get(timeout=QUIET_S)
    finally:
        p.close()
        late.close()
