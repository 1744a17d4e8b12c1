"""Durability across a restart: persistent messages sent by each protocol
survive a broker restart (graceful, then a kill -9) and are consumed by each
other protocol. MQTT consumes through a persistent session (its queue is
``$mqtt/<client-id>``), STOMP and AMQP from a queue (MQTT publishers reach
it through a [[bindings]] entry)."""

import pytest

from clients import PROTOCOLS, Amqp, Mqtt, Publisher, Stomp

PAIRS = [(p, c) for p in PROTOCOLS for c in PROTOCOLS]
N = 20


def bodies(pub, con, phase):
    return [f"{phase}:{pub}->{con}:{i}:\x00\u00e9".encode() for i in range(N)]


def mqtt_client_id(pub, con, phase):
    return f"dur-{phase}-{pub}-{con}"


def prepare(b, phase):
    """Sets up a destination per pair and publishes N persistent messages.
    Returns {pair: (consume_info, expected bodies)}."""
    plan = {}
    for pub, con in PAIRS:
        if con == "mqtt":
            topic = f"dur/{phase}/{pub}"
            c = Mqtt(b, version=5, client_id=mqtt_client_id(pub, con, phase), clean=False,
                     session_expiry_s=3600)
            c.subscribe(topic, qos=1)
            c.close()
            kind, pub_name, info = "topic", topic, topic
        else:
            topic, queue = b.bound.take()
            kind, pub_name, info = "queue", (topic if pub == "mqtt" else queue), queue
        p = Publisher(b, pub)
        expected = bodies(pub, con, phase)
        for body in expected:
            p.publish(kind, pub_name, body, persistent=True)
        p.close()
        plan[(pub, con)] = (info, expected)
    return plan


def consume(b, phase, pair, info, n):
    pub, con = pair
    if con == "mqtt":
        c = Mqtt(b, version=5, client_id=mqtt_client_id(pub, con, phase), clean=False,
                 session_expiry_s=3600)
        try:
            assert c.session_present, "persistent session lost across the restart"
            return [c.get(timeout=15).body for _ in range(n)]
        finally:
            c.close()
    if con == "stomp":
        c = Stomp(b)
        try:
            c.subscribe(f"/queue/{info}")
            out = []
            for _ in range(n):
                r = c.get(timeout=15)
                c.ack(r)
                out.append(r.body)
            return out
        finally:
            c.close()
    a = Amqp(b)
    try:
        return [r.body for r in a.receiver(f"/queue/{info}").get_n(n, timeout=15)]
    finally:
        a.close()


DURABLE_SUBS = ["stomp", "amqp"]


def prepare_durable_subs(b):
    """A STOMP and an AMQP durable topic subscription, left while every
    protocol publishes persistent messages to their topics."""
    for con in DURABLE_SUBS:
        topic = f"dsub/{con}"
        if con == "stomp":
            c = Stomp(b, client_id="dur-stomp-client")
            c.subscribe(f"/topic/{topic}", sub_id="s1", headers={"activemq.subscriptionName": "restart-sub"})
            c.close()
        else:
            a = Amqp(b, container_id="dur-amqp-container")
            a.receiver(f"/topic/{topic}", name="restart-sub", durable=True)
            a.close()
    expected = {}
    for con in DURABLE_SUBS:
        topic = f"dsub/{con}"
        expected[con] = []
        for pub in PROTOCOLS:
            p = Publisher(b, pub)
            for i in range(5):
                body = f"dsub:{pub}->{con}:{i}".encode()
                p.publish("topic", topic, body, persistent=True)
                expected[con].append(body)
            p.close()
    return expected


@pytest.fixture(scope="module")
def restarted(fresh_broker):
    b = fresh_broker
    subs = prepare_durable_subs(b)
    r = Mqtt(b, version=5)
    r.publish("dret/x", b"retained across restarts", qos=1, retain=True)
    r.close()
    graceful = prepare(b, "graceful")
    b.restart(hard=False)
    hard = prepare(b, "hard")
    # kill -9: every acknowledged persistent message must be on disk
    # ([store] sync = every-commit, the default).
    b.restart(hard=True)
    return {"graceful": graceful, "hard": hard, "subs": subs}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("phase", ["graceful", "hard"])
@pytest.mark.parametrize("pair", PAIRS, ids=lambda p: f"{p[0]}->{p[1]}")
def test_persistent_messages_survive_restart(fresh_broker, restarted, phase, pair):
    info, expected = restarted[phase][pair]
    got = consume(fresh_broker, phase, pair, info, len(expected))
    assert got == expected


@pytest.mark.parametrize("con", DURABLE_SUBS)
def test_durable_subscription_survives_restart(fresh_broker, restarted, con):
    """Messages from all three protocols wait in a STOMP / AMQP durable
    subscription across both restarts, in publish order."""
    expected = restarted["subs"][con]
    topic = f"/topic/dsub/{con}"
    if con == "stomp":
        c = Stomp(fresh_broker, client_id="dur-stomp-client")
        try:
            c.subscribe(topic, sub_id="s1", headers={"activemq.subscriptionName": "restart-sub"})
            got = []
            for _ in expected:
                r = c.get(timeout=15)
                c.ack(r)
                got.append(r.body)
        finally:
            c.close()
    else:
        a = Amqp(fresh_broker, container_id="dur-amqp-container")
        try:
            got = [r.body for r in a.receiver(topic, name="restart-sub", durable=True).get_n(len(expected), timeout=15)]
        finally:
            a.close()
    assert got == expected


@pytest.mark.parametrize("version", [4, 5], ids=["mqtt-3.1.1", "mqtt-5.0"])
def test_retained_message_survives_restart(fresh_broker, restarted, version):
    """A retained QoS 1 message is still retained after both restarts
    (retained messages reach MQTT subscribers only; STOMP and AMQP
    subscriptions do not get them)."""
    c = Mqtt(fresh_broker, version=version)
    try:
        c.subscribe("dret/x", qos=1)
        r = c.get(timeout=10)
        assert r.body == b"retained across restarts" and r.fields["retain"]
    finally:
        c.close()
