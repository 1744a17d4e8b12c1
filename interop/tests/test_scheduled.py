"""Scheduled delivery (issue 16) with the reference clients, one per
spelling, each held until its time and not before:

- python-qpid-proton: message annotation ``x-opt-delivery-delay`` (ms);
- stomp.py: SEND header ``AMQ_SCHEDULED_DELAY`` (ms, as ActiveMQ);
- paho-mqtt: publish to ``$delayed/<seconds>/<topic>`` (as EMQX), received
  on ``<topic>`` by an MQTT subscriber.

Each scheduled message is sent next to one without a delay, which must
arrive first (nothing behind a scheduled message waits for it).
"""

import time

from proton import Message, symbol

from clients import Amqp, Mqtt, Stomp

DELAY_S = 1.0
# Slack for the client libraries' own scheduling on a loaded machine; the
# broker's own bound (100 ms) is tested in tests/scheduled.rs.
LATE_S = 1.0


def check_time(what, sent, got):
    elapsed = got - sent
    assert elapsed >= DELAY_S - 0.01, f"{what}: early, after {elapsed:.3f} s"
    assert elapsed <= DELAY_S + LATE_S, f"{what}: late, after {elapsed:.3f} s"


def test_each_protocol_schedules_with_its_own_spelling(broker, uniq):
    q = f"/queue/sched-{uniq}"
    topic = f"sched/{uniq}"

    # AMQP: x-opt-delivery-delay.
    a = Amqp(broker)
    try:
        r = a.receiver(q)
        sent = time.monotonic()
        a.send(q, Message(body="amqp-later", durable=True,
                          annotations={symbol("x-opt-delivery-delay"): int(DELAY_S * 1000)}))
        a.send(q, Message(body="amqp-now", durable=True))
        assert r.get().body == b"amqp-now"
        assert r.get(timeout=10).body == b"amqp-later"
        check_time("x-opt-delivery-delay", sent, time.monotonic())
    finally:
        a.close()

    # STOMP: AMQ_SCHEDULED_DELAY.
    s = Stomp(broker)
    try:
        s.subscribe(q)
        sent = time.monotonic()
        s.send(q, b"stomp-later", headers={"persistent": "true",
                                           "AMQ_SCHEDULED_DELAY": str(int(DELAY_S * 1000))})
        s.send(q, b"stomp-now", headers={"persistent": "true"})
        now = s.get()
        assert now.body == b"stomp-now"
        s.ack(now)
        later = s.get(timeout=10)
        check_time("AMQ_SCHEDULED_DELAY", sent, time.monotonic())
        assert later.body == b"stomp-later"
        s.ack(later)
    finally:
        s.close()

    # MQTT: $delayed/<seconds>/<topic>.
    sub = Mqtt(broker)
    pub = Mqtt(broker)
    try:
        sub.subscribe(topic)
        sent = time.monotonic()
        pub.publish(f"$delayed/{int(DELAY_S)}/{topic}", b"mqtt-later")
        pub.publish(topic, b"mqtt-now")
        assert sub.get().body == b"mqtt-now"
        later = sub.get(timeout=10)
        check_time("$delayed/", sent, time.monotonic())
        assert later.body == b"mqtt-later"
        assert later.fields.get("topic", topic) == topic
    finally:
        sub.close()
        pub.close()
