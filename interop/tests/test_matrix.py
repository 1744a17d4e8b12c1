"""The 9-pair matrix: every {MQTT, STOMP, AMQP} publisher -> consumer pair,
on a topic and on a queue, with the payloads that break naive bridges.

Queues with an MQTT publisher use a ``[[bindings]]`` entry (the topic
``bq/<i>`` feeds the queue ``bq<i>``). MQTT cannot consume a queue: the
protocol only subscribes to topic filters, so those three cells are N/A.
"""

import os

import pytest

from clients import PROTOCOLS, Consumer, Publisher

PAIRS = [(p, c) for p in PROTOCOLS for c in PROTOCOLS]
KINDS = ["topic", "queue"]

PAYLOADS = {
    "empty": b"",
    "one-byte": b"\x7f",
    "nul-binary": bytes(range(256)) * 4 + b"\x00\x00end\x00",
    "64KiB": os.urandom(64 * 1024),
    "1MiB": os.urandom(1024 * 1024),
}
UTF8_TEXT = "Grüße, Ἀθήνα, 東京, emoji \U0001f600, zero-width \u200b, \u00e9".encode("utf-8")


def target(broker, publisher, kind, uniq):
    """(name for publishers, name for consumers) of a fresh destination."""
    if kind == "topic":
        return f"mx/{uniq}", f"mx/{uniq}"
    topic, queue = broker.bound.take()
    return (topic if publisher == "mqtt" else queue), queue


def pair_id(p):
    return f"{p[0]}->{p[1]}"


def expected_kind(pub_proto, payload, text):
    """The publisher's text flag decides. stomp.py leaves content-length off
    an empty body, but the binary payloads are sent with content-type
    application/octet-stream, which keeps them binary (see
    docs/conversion.md, "STOMP body kind")."""
    return "text" if text else "binary"


def check_body(pub_proto, consumer_proto, r, payload, text):
    assert r.body == payload, f"payload differs: {len(r.body)} bytes received, {len(payload)} sent"
    kind = expected_kind(pub_proto, payload, text)
    if consumer_proto == "amqp":
        assert r.kind == kind, r.kind
    if consumer_proto == "mqtt" and r.raw.properties is not None:
        assert r.kind == kind


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_payloads_identical(broker, uniq, pair, kind):
    """Empty, 1 byte, binary with NULs, 64 KiB, 1 MiB and non-ASCII UTF-8
    text arrive byte for byte, in order, with the body kind kept."""
    pub_proto, con_proto = pair
    pub_name, con_name = target(broker, pub_proto, kind, uniq)
    consumer = Consumer(broker, con_proto, kind, con_name)
    publisher = Publisher(broker, pub_proto)
    try:
        sent = [(name, body, False) for name, body in PAYLOADS.items()]
        sent.append(("utf8-text", UTF8_TEXT, True))
        for _, body, text in sent:
            publisher.publish(kind, pub_name, body, text=text)
        for name, body, text in sent:
            r = consumer.get(timeout=20)
            check_body(pub_proto, con_proto, r, body, text)
        consumer.assert_empty()
    finally:
        publisher.close()
        consumer.close()


BIG_CASES = [
    pytest.param("mqtt", "amqp", "topic", 10, id="mqtt->amqp-topic-10MiB"),
    pytest.param("amqp", "stomp", "queue", 10, id="amqp->stomp-queue-10MiB"),
    pytest.param("amqp", "mqtt", "topic", 10, id="amqp->mqtt-topic-10MiB"),
    pytest.param("stomp", "mqtt", "topic", 10, id="stomp->mqtt-topic-10MiB"),
    pytest.param("stomp", "amqp", "queue", 10, id="stomp->amqp-queue-10MiB"),
    pytest.param("mqtt", "stomp", "topic", 10, id="mqtt->stomp-topic-10MiB"),
]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("pub_proto,con_proto,kind,mib", BIG_CASES)
def test_payload_big(broker, uniq, pub_proto, con_proto, kind, mib):
    """A 10 MiB binary payload (limits raised to 16 MiB in the test config);
    each protocol publishes and consumes one."""
    payload = os.urandom(mib * 1024 * 1024)
    pub_name, con_name = target(broker, pub_proto, kind, uniq)
    consumer = Consumer(broker, con_proto, kind, con_name)
    publisher = Publisher(broker, pub_proto)
    try:
        publisher.publish(kind, pub_name, payload)
        r = consumer.get(timeout=60)
        check_body(pub_proto, con_proto, r, payload, False)
    finally:
        publisher.close()
        consumer.close()


MANY = 10_000


@pytest.mark.timeout(240)
@pytest.mark.parametrize("pair", PAIRS, ids=pair_id)
def test_many_messages_no_loss_no_dup_in_order(broker, uniq, pair):
    """10,000 messages per ordered pair at QoS 1 /
    unsettled AMQP / client-individual STOMP acks: none lost, none
    duplicated, in publish order. On a queue, except where MQTT consumes
    (a topic)."""
    pub_proto, con_proto = pair
    n = MANY
    kind = "topic" if con_proto == "mqtt" else "queue"
    pub_name, con_name = target(broker, pub_proto, kind, uniq)
    consumer = Consumer(broker, con_proto, kind, con_name, credit=1000)
    publisher = Publisher(broker, pub_proto)
    bodies = [f"{i:06d}".encode() for i in range(n)]
    try:
        from clients import publish_many
        publish_many(publisher, kind, pub_name, bodies)
        got = []
        for _ in range(n):
            got.append(consumer.get(timeout=30).body)
        dups = len(got) - len(set(got))
        assert dups == 0, f"{dups} duplicates"
        assert got == bodies, "out of order or lost"
        consumer.assert_empty(wait_s=1.0)
    finally:
        publisher.close()
        consumer.close()


@pytest.mark.timeout(180)
def test_competing_consumers_of_both_queue_protocols(broker, uniq):
    """Three producers (MQTT through a binding, STOMP, AMQP) send 500
    messages each at once to one queue; two STOMP and two AMQP consumers
    compete for them. Every message is consumed exactly once overall, and
    each consumer sees each producer's messages in publish order."""
    import threading

    topic, q = broker.bound.take()
    n = 500
    consumers = [Consumer(broker, p, "queue", q, credit=50) for p in ("stomp", "stomp", "amqp", "amqp")]
    received = [[] for _ in consumers]
    stop = threading.Event()
    errors = []

    def drain(i, c):
        try:
            while not stop.is_set():
                try:
                    received[i].append(c.get(timeout=0.5).body)
                except Exception as e:  # queue.Empty / proton Timeout
                    if type(e).__name__ not in ("Empty", "Timeout"):
                        raise
        except Exception as e:
            errors.append(repr(e))

    def produce(proto):
        p = Publisher(broker, proto)
        try:
            from clients import publish_many
            publish_many(p, "queue", topic if proto == "mqtt" else q,
                         [f"{proto}:{i:04d}".encode() for i in range(n)])
        except Exception as e:
            errors.append(repr(e))
        finally:
            p.close()

    drains = [threading.Thread(target=drain, args=(i, c), daemon=True) for i, c in enumerate(consumers)]
    producers = [threading.Thread(target=produce, args=(p,), daemon=True) for p in PROTOCOLS]
    for t in drains + producers:
        t.start()
    for t in producers:
        t.join(120)
    deadline = __import__("time").monotonic() + 60
    while sum(map(len, received)) < 3 * n and __import__("time").monotonic() < deadline and not errors:
        __import__("time").sleep(0.1)
    stop.set()
    for t in drains:
        t.join(10)
    for c in consumers:
        c.close()
    assert not errors, errors
    everything = [b for r in received for b in r]
    expected = {f"{p}:{i:04d}".encode() for p in PROTOCOLS for i in range(n)}
    assert len(everything) == len(set(everything)), "duplicates"
    assert set(everything) == expected, f"{len(expected - set(everything))} lost"
    for r in received:
        for p in PROTOCOLS:
            mine = [b for b in r if b.startswith(p.encode())]
            assert mine == sorted(mine), f"{p} messages out of order at one consumer"
    assert sum(1 for r in received if r) >= 2, "no competition: one consumer took everything"
