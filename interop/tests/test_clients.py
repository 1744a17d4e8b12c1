"""Per-client behaviour: each client library's basic publish / subscribe /
ack, its reconnect to a persistent session or durable subscription, and
its error on a wrong password."""

import queue
import subprocess
import time

import pytest
from proton import ConnectionException
from proton.utils import LinkDetached

import nodeclient
from clients import Amqp, ClientError, Mqtt, Stomp, amqp_message
from conftest import LIMITED_PASSWORD, LIMITED_USER, PASSWORD, USER

WRONG = "not-the-password"


# ---------------------------------------------------------------- paho-mqtt
@pytest.mark.parametrize("version", [4, 5], ids=["paho-3.1.1", "paho-5.0"])
def test_paho_basic(broker, uniq, version):
    sub = Mqtt(broker, version=version, username=USER, password=PASSWORD)
    pub = Mqtt(broker, version=version)
    try:
        sub.subscribe(f"cl/{uniq}/+", qos=1)
        for i in range(5):
            pub.publish(f"cl/{uniq}/x", f"m{i}".encode(), qos=1)
        got = [sub.get().body for _ in range(5)]
        assert got == [f"m{i}".encode() for i in range(5)]
        r = None
        pub.publish(f"cl/{uniq}/y", b"q0", qos=0)
        r = sub.get()
        assert r.body == b"q0" and r.fields["qos"] == 0
    finally:
        sub.close()
        pub.close()


@pytest.mark.parametrize("version", [4, 5], ids=["paho-3.1.1", "paho-5.0"])
def test_paho_qos2(broker, uniq, version):
    """QoS 2 publish (PUBREC/PUBREL/PUBCOMP) and QoS 2 subscription: each
    message arrives once, at QoS 2, and an AMQP consumer gets it too."""
    sub = Mqtt(broker, version=version)
    pub = Mqtt(broker, version=version)
    a = Amqp(broker)
    try:
        sub.subscribe(f"q2/{uniq}", qos=2)
        rcv = a.receiver(f"/topic/q2/{uniq}")
        for i in range(20):
            pub.publish(f"q2/{uniq}", f"e{i}".encode(), qos=2)
        got = [sub.get() for _ in range(20)]
        assert [g.body for g in got] == [f"e{i}".encode() for i in range(20)]
        assert all(g.fields["qos"] == 2 for g in got)
        assert [r.body for r in rcv.get_n(20)] == [f"e{i}".encode() for i in range(20)]
        with pytest.raises(queue.Empty):
            sub.get(timeout=0.5)
    finally:
        sub.close()
        pub.close()
        a.close()


@pytest.mark.parametrize("version", [4, 5], ids=["paho-3.1.1", "paho-5.0"])
def test_paho_persistent_session(broker, uniq, version):
    """Subscribe with a persistent session, go away, miss QoS 1 messages,
    come back: session present and the messages arrive."""
    cid = f"paho-persist-{uniq}"
    kw = dict(version=version, client_id=cid, clean=False, session_expiry_s=300)
    c = Mqtt(broker, **kw)
    c.subscribe(f"ps/{uniq}", qos=1)
    c.close()
    pub = Mqtt(broker, version=version)
    for i in range(3):
        pub.publish(f"ps/{uniq}", f"offline-{i}".encode(), qos=1)
    pub.close()
    c2 = Mqtt(broker, **kw)
    try:
        assert c2.session_present
        assert [c2.get().body for _ in range(3)] == [b"offline-0", b"offline-1", b"offline-2"]
    finally:
        c2.close()


@pytest.mark.parametrize("version", [4, 5], ids=["paho-3.1.1", "paho-5.0"])
def test_paho_wrong_password(broker, version):
    with pytest.raises(ClientError, match="refused"):
        Mqtt(broker, version=version, username=USER, password=WRONG)


# ----------------------------------------------------------------- stomp.py
STOMP_VERSIONS = ["1.0", "1.1", "1.2"]


@pytest.mark.parametrize("version", STOMP_VERSIONS, ids=lambda v: f"stomp.py-{v}")
def test_stomppy_basic_ack(broker, uniq, version):
    """Send to a queue, consume with client acks; an unacked message is
    redelivered to the next consumer, an acked one is not."""
    dest = f"/queue/cl-{uniq}"
    c = Stomp(broker, version=version, login=USER, passcode=PASSWORD)
    try:
        for i in range(3):
            c.send(dest, f"m{i}".encode(), headers={"persistent": "true"})
        c.subscribe(dest, ack="client-individual")
        msgs = c.get_n(3)
        assert [m.body for m in msgs] == [b"m0", b"m1", b"m2"]
        if version == "1.0":
            # 1.0 only has cumulative client acks: ack the first one.
            c.ack(msgs[0])
        else:
            c.ack(msgs[0])
            c.ack(msgs[2])
    finally:
        time.sleep(0.3)
        c.close()
    c2 = Stomp(broker, version=version)
    try:
        c2.subscribe(dest, ack="client-individual")
        redelivered = c2.get()
        assert redelivered.body == b"m1"
        assert redelivered.fields.get("redelivered") == "true"
        c2.ack(redelivered)
        if version == "1.0":
            extra = c2.get()  # cumulative ack of m0 left m2 unacked
            assert extra.body == b"m2"
            c2.ack(extra)
        with pytest.raises(queue.Empty):
            c2.get(timeout=0.7)
    finally:
        c2.close()


@pytest.mark.parametrize("version", STOMP_VERSIONS, ids=lambda v: f"stomp.py-{v}")
def test_stomppy_durable_subscription(broker, uniq, version):
    """activemq.subscriptionName + client-id: messages published while the
    subscriber is away wait in its durable subscription."""
    cid = f"stomp-dur-{uniq}"
    topic = f"/topic/dur/{uniq}"
    hdr = {"activemq.subscriptionName": "sub1"}
    c = Stomp(broker, version=version, client_id=cid)
    c.subscribe(topic, sub_id="s1", headers=hdr)
    c.close()
    p = Stomp(broker, version=version)
    p.send(topic, b"while-away", headers={"persistent": "true"})
    p.close()
    c2 = Stomp(broker, version=version, client_id=cid)
    try:
        c2.subscribe(topic, sub_id="s1", headers=hdr)
        r = c2.get()
        assert r.body == b"while-away"
        c2.ack(r)
    finally:
        c2.close()


@pytest.mark.parametrize("version", STOMP_VERSIONS, ids=lambda v: f"stomp.py-{v}")
def test_stomppy_wrong_password(broker, version):
    with pytest.raises(ClientError):
        Stomp(broker, version=version, login=USER, passcode=WRONG)


# --------------------------------------------------------------- qpid-proton
def test_proton_basic(broker, uniq):
    a = Amqp(broker, user=USER, password=PASSWORD)
    try:
        rcv = a.receiver(f"/queue/cl-{uniq}", credit=10)
        for i in range(3):
            a.send(f"/queue/cl-{uniq}", amqp_message(f"m{i}".encode()))
        assert [rcv.get().body for _ in range(3)] == [b"m0", b"m1", b"m2"]
        # A released message comes back (released is not a failed
        # delivery attempt, so the delivery-count stays 0).
        a.send(f"/queue/cl-{uniq}", amqp_message(b"again"))
        m = rcv.rcv.receive(timeout=10)
        rcv.rcv.release(delivered=False)
        r = rcv.get()
        assert r.body == b"again" and bytes(m.body) == b"again"
        assert r.fields["delivery_count"] == 0
    finally:
        a.close()


def test_proton_durable_subscription(broker, uniq):
    cid = f"proton-dur-{uniq}"
    topic = f"/topic/pdur/{uniq}"
    a = Amqp(broker, container_id=cid)
    r = a.receiver(topic, name="dsub", durable=True)
    r.rcv.detach() if hasattr(r.rcv, "detach") else None
    a.close()
    p = Amqp(broker)
    p.send(topic, amqp_message(b"while-away"))
    p.close()
    a2 = Amqp(broker, container_id=cid)
    try:
        r2 = a2.receiver(topic, name="dsub", durable=True)
        assert r2.get().body == b"while-away"
    finally:
        a2.close()


def test_proton_wrong_password(broker):
    with pytest.raises(ConnectionException):
        Amqp(broker, user=USER, password=WRONG)


# ------------------------------------------------------- JavaScript clients
NODE_LIBS = {"mqtt": "mqtt.js", "stomp": "stompjs", "rhea": "rhea"}


def node_address(lib, kind, name):
    if lib == "mqtt":
        return name
    return f"/{kind}/{name}"


@pytest.mark.parametrize("lib", list(NODE_LIBS), ids=lambda l: NODE_LIBS[l])
def test_js_basic(broker, uniq, lib):
    addr = node_address(lib, "topic", f"js/{uniq}")
    payloads = [b"hello", b"\x00bin\xff", "ünï".encode()]
    sub = nodeclient.Background(broker, lib, address=addr, count=len(payloads), user=USER, password=PASSWORD)
    try:
        sub.wait_ready()
        res = nodeclient.run(broker, lib, mode="pub", address=addr, payloads=payloads)
        assert res["ok"], res
        got = sub.result()
        assert got["ok"], got
        assert [r["body"] for r in got["received"]] == payloads
    finally:
        sub.kill()


@pytest.mark.parametrize("lib", list(NODE_LIBS), ids=lambda l: NODE_LIBS[l])
def test_js_reconnect_durable(broker, uniq, lib):
    """mqtt.js persistent session; stompjs and rhea durable subscriptions."""
    cid = f"js-{lib}-{uniq}"
    addr = node_address(lib, "topic", f"jsd/{uniq}")
    kw = dict(address=addr, clientId=cid, clean=False, sessionExpiry=300, durable="d1")
    first = nodeclient.Background(broker, lib, count=0, disconnectAfterSubscribe=True, **kw)
    first.wait_ready()
    assert first.result()["ok"]
    res = nodeclient.run(broker, lib, mode="pub", address=addr, payloads=[b"missed-1", b"missed-2"])
    assert res["ok"], res
    again = nodeclient.Background(broker, lib, count=2, **kw)
    got = again.result()
    assert got["ok"], got
    assert [r["body"] for r in got["received"]] == [b"missed-1", b"missed-2"]


@pytest.mark.parametrize("lib", list(NODE_LIBS), ids=lambda l: NODE_LIBS[l])
def test_js_wrong_password(broker, lib):
    res = nodeclient.run(broker, lib, mode="connect", user=USER, password=WRONG, timeout_s=15)
    assert not res["ok"], res
    assert res["error"] != "timeout", f"no refusal, just silence: {res}"


# ----------------------------------------------------------- mosquitto CLI
def mosq(broker, tool, *args, timeout=15):
    return subprocess.run([tool, "-h", broker.host, "-p", str(broker.mqtt_port), *args],
                          capture_output=True, timeout=timeout)


@pytest.mark.parametrize("version", ["mqttv311", "mqttv5"])
def test_mosquitto_basic(broker, uniq, version):
    topic = f"mosq/{uniq}"
    sub = subprocess.Popen(["mosquitto_sub", "-h", broker.host, "-p", str(broker.mqtt_port), "-V", version,
                            "-t", topic, "-q", "1", "-C", "2", "-W", "15", "-u", USER, "-P", PASSWORD],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    time.sleep(1.0)  # mosquitto_sub has no "subscribed" signal
    for body in ["one", "twö"]:
        r = mosq(broker, "mosquitto_pub", "-V", version, "-t", topic, "-q", "1", "-m", body)
        assert r.returncode == 0, r.stderr
    out, err = sub.communicate(timeout=20)
    assert sub.returncode == 0, err
    assert out.decode().splitlines() == ["one", "twö"]


def test_mosquitto_persistent_session(broker, uniq):
    topic = f"mosqp/{uniq}"
    cid = f"mosq-{uniq}"
    common = ["-t", topic, "-q", "1", "-c", "-i", cid, "-V", "mqttv311"]
    r = mosq(broker, "mosquitto_sub", *common, "-E")  # subscribe, then exit
    assert r.returncode == 0, r.stderr
    r = mosq(broker, "mosquitto_pub", "-t", topic, "-q", "1", "-m", "while-away")
    assert r.returncode == 0, r.stderr
    r = mosq(broker, "mosquitto_sub", *common, "-C", "1", "-W", "10")
    assert r.returncode == 0, r.stderr
    assert r.stdout.decode().strip() == "while-away"


def test_mosquitto_wrong_password(broker, uniq):
    r = mosq(broker, "mosquitto_pub", "-t", f"x/{uniq}", "-m", "x", "-u", USER, "-P", WRONG)
    assert r.returncode != 0
    assert b"not authori" in r.stderr.lower() or b"bad user" in r.stderr.lower() or b"refused" in r.stderr.lower(), r.stderr


# ------------------------------------------------------------- permissions
def test_permissions_refused_per_protocol(broker, uniq):
    """A publish or subscribe outside the user's patterns is refused the
    way each protocol can say it, and the refused message reaches nobody."""
    user, pw = LIMITED_USER, LIMITED_PASSWORD
    witness = Mqtt(broker)
    witness.subscribe(f"no/{uniq}/#", qos=1)
    try:
        m = Mqtt(broker, version=5, username=user, password=pw)
        reasons = queue.Queue()
        m.c.on_publish = lambda c, u, mid, rc, props: reasons.put(rc)
        m.c.publish(f"no/{uniq}/m5", b"x", qos=1)
        assert reasons.get(timeout=10).value == 0x87  # Not authorized
        with pytest.raises(ClientError, match="Not authorized"):
            m.subscribe(f"no/{uniq}/#")
        m.close()

        s = Stomp(broker, login=user, passcode=pw)
        with pytest.raises(ClientError, match="not authorized"):
            s.send(f"/topic/no/{uniq}/s", b"x")
        s.close()

        a = Amqp(broker, user=user, password=pw)
        with pytest.raises(LinkDetached, match="unauthorized-access"):
            a.send(f"/topic/no/{uniq}/a", amqp_message(b"x"))
        a.close()
        a = Amqp(broker, user=user, password=pw)
        with pytest.raises(LinkDetached, match="unauthorized-access"):
            a.receiver(f"/topic/no/{uniq}/a")
        a.close()

        ok = Mqtt(broker, version=5, username=user, password=pw)
        ok.publish(f"ok/{uniq}", b"allowed", qos=1)
        ok.close()
        with pytest.raises(queue.Empty):
            witness.get(timeout=0.7)
    finally:
        witness.close()
