"""Properties and standard fields across protocols, as docs/conversion.md
states them. Every test name here is cited by a row of that table."""

import queue
import time
import uuid

import proton
import pytest
from proton import Message as AmqpMessage

from clients import Amqp, AmqpReceiver, Consumer, Mqtt, Stomp, amqp_message, new_id

NOW_MS = lambda: int(time.time() * 1000)  # noqa: E731


def consumers(broker, topic):
    """An MQTT 5, a STOMP 1.2 and an AMQP consumer on one topic."""
    return {p: Consumer(broker, p, "topic", topic) for p in ("mqtt", "stomp", "amqp")}


def close_all(cs):
    for c in cs.values():
        c.close()


# ----------------------------------------------------------- from MQTT 5
def test_from_mqtt5_properties_and_fields(broker, uniq):
    topic = f"cv/m/{uniq}"
    cs = consumers(broker, topic)
    p = Mqtt(broker, version=5)
    try:
        p.publish(topic, "ünïcode".encode(), qos=1, text=True,
                  props=[("k", "v1"), ("colon:key", "a:b\\c"), ("k", "v2"), ("empty", "")],
                  ContentType="text/plain; charset=utf-8", ResponseTopic="replies/x",
                  CorrelationData=b"\x00\x01corr\xff", MessageExpiryInterval=600)
        before = NOW_MS()
        m = cs["mqtt"].get()
        assert m.kind == "text"
        assert m.fields["user_properties"] == [("k", "v1"), ("colon:key", "a:b\\c"), ("k", "v2"), ("empty", "")]
        assert m.fields["ContentType"] == "text/plain; charset=utf-8"
        assert m.fields["ResponseTopic"] == "replies/x"
        assert m.fields["CorrelationData"] == b"\x00\x01corr\xff"
        assert 590 <= m.fields["MessageExpiryInterval"] <= 601  # see test_from_stomp_headers_and_fields

        s = cs["stomp"].get()
        assert s.body == "ünïcode".encode()
        assert s.fields["k"] == "v1"  # first of the duplicates (stomp.py keeps the first)
        assert s.fields["colon:key"] == "a:b\\c"  # STOMP 1.2 escaping round trip
        assert s.fields["empty"] == ""
        assert s.fields["content-type"] == "text/plain; charset=utf-8"
        assert s.fields["reply-to"] == "/topic/replies/x"
        assert s.fields["correlation-id"] == "0001636f7272ff"  # not UTF-8: hex
        assert s.fields["persistent"] == "true"  # QoS 1 is persistent
        assert abs(int(s.fields["expires"]) - (before + 600_000)) < 15_000
        assert s.fields["destination"] == f"/topic/{topic}"

        a = cs["amqp"].get()
        assert a.kind == "text" and a.body == "ünïcode".encode()
        assert a.props == {"k": "v1", "colon:key": "a:b\\c", "empty": ""}  # unique keys: first wins
        assert a.fields["content_type"] == "text/plain; charset=utf-8"
        assert a.fields["reply_to"] == "/topic/replies/x"
        assert bytes(a.fields["correlation_id"]) == b"\x00\x01corr\xff"
        assert a.fields["durable"] is True
        assert 590 <= a.fields["ttl"] <= 600
        assert a.fields["address"] == f"/topic/{topic}"
    finally:
        p.close()
        close_all(cs)


def test_from_mqtt_qos0_is_not_durable_and_binary(broker, uniq):
    topic = f"cv/m0/{uniq}"
    cs = consumers(broker, topic)
    p = Mqtt(broker, version=5)
    try:
        p.publish(topic, b"\x00\x01", qos=0)
        assert cs["mqtt"].get().kind == "binary"
        s = cs["stomp"].get()
        assert "persistent" not in s.fields and "content-type" not in s.fields
        a = cs["amqp"].get()
        assert a.kind == "binary" and a.fields["durable"] is False
    finally:
        p.close()
        close_all(cs)


def test_from_mqtt311_plain(broker, uniq):
    """A 3.1.1 publish has no properties: consumers see none invented."""
    topic = f"cv/m3/{uniq}"
    cs = consumers(broker, topic)
    p = Mqtt(broker, version=4)
    try:
        p.publish(topic, b"plain", qos=1)
        m = cs["mqtt"].get()
        assert m.fields.get("user_properties", []) == [] and "ContentType" not in m.fields
        s = cs["stomp"].get()
        assert set(s.props) <= {"persistent", "destination"}, s.props
        a = cs["amqp"].get()
        assert a.props == {} and a.fields["correlation_id"] is None and a.fields["reply_to"] is None
        assert a.fields["ttl"] == 0 or a.fields["ttl"] is None
    finally:
        p.close()
        close_all(cs)


# ----------------------------------------------------------- from STOMP
def test_from_stomp_headers_and_fields(broker, uniq):
    topic = f"cv/s/{uniq}"
    cs = consumers(broker, topic)
    p = Stomp(broker, version="1.2")
    try:
        expires = NOW_MS() + 600_000
        p.send(f"/topic/{topic}", "tëxt body".encode(), content_type="text/plain",
               headers={"persistent": "true", "reply-to": "/queue/replies", "correlation-id": "corr-1",
                        "expires": str(expires), "priority": "7", "x-app": "line1\nline2:colon",
                        "x-dup": "first"})
        m = cs["mqtt"].get()
        assert m.kind == "text" and m.body == "tëxt body".encode()
        assert ("x-app", "line1\nline2:colon") in m.fields["user_properties"]
        assert m.fields["ContentType"] == "text/plain"
        assert m.fields["ResponseTopic"] == "$queue/replies"  # a queue: the reserved $queue/ prefix
        assert m.fields["CorrelationData"] == b"corr-1"
        # 601 seen: the MQTT adapter's clock reading can be a little stale
        # when it computes the time left (reported).
        assert 590 <= m.fields["MessageExpiryInterval"] <= 601

        s = cs["stomp"].get()
        assert s.fields["x-app"] == "line1\nline2:colon"
        assert s.fields["content-type"] == "text/plain"
        assert s.fields["reply-to"] == "/queue/replies"
        assert s.fields["correlation-id"] == "corr-1"
        assert s.fields["expires"] == str(expires)
        assert s.fields["priority"] == "7"
        assert s.fields["persistent"] == "true"

        a = cs["amqp"].get()
        assert a.kind == "text"
        assert a.props["x-app"] == "line1\nline2:colon" and a.props["x-dup"] == "first"
        assert a.fields["content_type"] == "text/plain"
        assert a.fields["reply_to"] == "/queue/replies"
        assert a.fields["correlation_id"] == "corr-1"
        assert a.fields["priority"] == 7
        assert a.fields["durable"] is True
        assert abs(a.fields["expiry_time"] * 1000 - expires) < 2 or 590_000 <= a.fields["ttl"] <= 600_000
    finally:
        p.close()
        close_all(cs)


def test_stomp_body_kind_rules(broker, uniq):
    """stomp.py always sends content-length: a UTF-8 body is text only with
    a text/* content type; without one it is binary."""
    topic = f"cv/sk/{uniq}"
    cs = consumers(broker, topic)
    p = Stomp(broker)
    try:
        p.send(f"/topic/{topic}", b"no content type")
        p.send(f"/topic/{topic}", b"\xff\xfe not utf-8", content_type="text/plain")
        p.send(f"/topic/{topic}", b"json", content_type="application/json")
        for expect in ["binary", "binary", "binary"]:
            assert cs["amqp"].get().kind == expect
            assert cs["mqtt"].get().kind == expect
        assert [cs["stomp"].get().body for _ in range(3)] == [b"no content type", b"\xff\xfe not utf-8", b"json"]
    finally:
        p.close()
        close_all(cs)


# ----------------------------------------------------------- from AMQP
def test_from_amqp_typed_properties_and_fields(broker, uniq):
    topic = f"cv/a/{uniq}"
    cs = consumers(broker, topic)
    a = Amqp(broker)
    u = uuid.UUID("12345678-1234-5678-9abc-def012345678")
    try:
        m = AmqpMessage(body="amqp text")
        m.id = "msg-1"
        m.correlation_id = "corr-a"
        m.reply_to = "/topic/replies/a"
        m.content_type = "text/plain"
        m.priority = 8
        m.durable = True
        m.ttl = 600.0
        m.subject = "subj"
        m.group_id = "grp"
        m.group_sequence = 3
        m.content_encoding = "identity"
        m.creation_time = 1700000000.5
        m.properties = {
            "str": "s", "long": 42, "int": proton.int32(-7), "bool": True, "double": 1.5,
            "ts": proton.timestamp(1700000000123), "uuid": u, "bin": b"\x01\xab", "sym": proton.symbol("sy"),
            "null": None,
        }
        a.send(f"/topic/{topic}", m)
        q = cs["mqtt"].get()
        assert q.kind == "text" and q.body == b"amqp text"
        up = dict(q.fields["user_properties"])
        # Application properties, then the standard fields MQTT has no place for.
        assert up == {"str": "s", "long": "42", "int": "-7", "bool": "true", "double": "1.5",
                      "ts": "1700000000123", "uuid": str(u), "bin": "01ab", "sym": "sy", "null": "",
                      "amqp-message-id": "msg-1", "type": "subj", "JMSXGroupID": "grp",
                      "JMSXGroupSeq": "3", "content-encoding": "identity",
                      "timestamp": "1700000000500", "priority": "8"}
        assert q.fields["ContentType"] == "text/plain"
        assert q.fields["ResponseTopic"] == "replies/a"
        assert q.fields["CorrelationData"] == b"corr-a"
        assert 590 <= q.fields["MessageExpiryInterval"] <= 601  # see test_from_stomp_headers_and_fields

        s = cs["stomp"].get()
        for k, v in up.items():
            assert s.fields[k] == v, k
        assert s.fields["reply-to"] == "/topic/replies/a"
        assert s.fields["correlation-id"] == "corr-a"
        assert s.fields["priority"] == "8"
        assert s.fields["persistent"] == "true"
        assert s.fields["content-type"] == "text/plain"
        assert abs(int(s.fields["expires"]) - (NOW_MS() + 600_000)) < 15_000

        r = cs["amqp"].get()
        assert r.kind == "text"
        assert r.props["long"] == 42 and isinstance(r.props["int"], proton.int32) and r.props["int"] == -7
        assert r.props["bool"] is True and r.props["double"] == 1.5
        assert isinstance(r.props["ts"], proton.timestamp) and r.props["ts"] == 1700000000123
        assert r.props["uuid"] == u and bytes(r.props["bin"]) == b"\x01\xab"
        assert isinstance(r.props["sym"], proton.symbol) and r.props["null"] is None
        assert r.fields["id"] == "msg-1"
        assert r.fields["correlation_id"] == "corr-a"
        assert r.fields["reply_to"] == "/topic/replies/a"
        assert r.fields["priority"] == 8 and r.fields["durable"] is True
        assert 590 <= r.fields["ttl"] <= 600
        assert r.fields["subject"] == "subj" and r.fields["group_id"] == "grp"
        assert r.fields["group_sequence"] == 3 and r.fields["content_encoding"] == "identity"
        assert r.fields["creation_time"] == 1700000000.5
        assert r.fields["address"] == f"/topic/{topic}"
    finally:
        a.close()
        close_all(cs)


@pytest.mark.parametrize("body", [42, [1, "two", 3.0], {"k": "v", "n": 1}, None],
                         ids=["amqp-value-long", "amqp-sequence", "amqp-value-map", "no-body"])
def test_amqp_structured_bodies_amqp_to_amqp(broker, uniq, body):
    """Structured AMQP bodies reach an AMQP consumer as sent (their
    sections are carried in their original encoding)."""
    q = f"/queue/cv-sb-{uniq}"
    a = Amqp(broker)
    try:
        m = AmqpMessage(body=body)
        if isinstance(body, list):
            m.inferred = True  # a list body as an amqp-sequence section
        a.send(q, m)
        r = a.receiver(q).get()
        got = r.raw.body
        if body is None:
            assert r.body == b"" and got in (None, b"")
        else:
            assert got == body
    finally:
        a.close()


def test_amqp_id_types_to_text(broker, uniq):
    """AMQP ulong / uuid / binary correlation ids as string-only protocols
    see them."""
    topic = f"cv/ai/{uniq}"
    cs = consumers(broker, topic)
    a = Amqp(broker)
    u = uuid.UUID("00112233-4455-6677-8899-aabbccddeeff")
    ids = [(proton.ulong(12345), "12345"), (u, str(u)), (b"\x00\xfe", "00fe"), (b"utf8-bin", "utf8-bin")]
    try:
        for cid, _ in ids:
            m = amqp_message(b"x")
            m.correlation_id = cid
            a.send(f"/topic/{topic}", m)
        for cid, text in ids:
            assert cs["stomp"].get().fields["correlation-id"] == text
            assert cs["mqtt"].get().fields["CorrelationData"] == (bytes(cid) if isinstance(cid, bytes) else text.encode())
            got = cs["amqp"].get().fields["correlation_id"]
            assert (bytes(got) if isinstance(cid, bytes) else got) == (bytes(cid) if isinstance(cid, bytes) else cid)
    finally:
        a.close()
        close_all(cs)


def test_amqp_non_durable_and_default_priority(broker, uniq):
    topic = f"cv/an/{uniq}"
    cs = consumers(broker, topic)
    a = Amqp(broker)
    try:
        a.send(f"/topic/{topic}", amqp_message(b"np", durable=False))
        s = cs["stomp"].get()
        assert "persistent" not in s.fields and "priority" not in s.fields
        r = cs["amqp"].get()
        assert r.fields["durable"] is False and r.fields["priority"] == 4
        assert cs["mqtt"].get().body == b"np"
    finally:
        a.close()
        close_all(cs)


# ---------------------------------------------------------- redelivery
def test_redelivery_fields(broker, uniq):
    """A STOMP NACK makes the broker redeliver: STOMP sees redelivered:true
    and delivery-count, AMQP sees delivery-count and first-acquirer false."""
    qname = f"/queue/cv-rd-{uniq}"
    p = Stomp(broker)
    p.send(qname, b"again", headers={"persistent": "true"})
    c = Stomp(broker)
    try:
        c.subscribe(qname, ack="client-individual")
        first = c.get()
        assert "redelivered" not in first.fields
        c.nack(first)
        second = c.get()
        assert second.body == b"again"
        assert second.fields["redelivered"] == "true" and second.fields["delivery-count"] == "1"
        c.close()
        a = Amqp(broker)
        try:
            rcv = a.receiver(qname)
            m = rcv.rcv.receive(timeout=10)
            rcv.rcv.release(delivered=True)
            r = rcv.get()
            assert r.body == b"again"
            assert r.fields["delivery_count"] >= 2 and r.fields["first_acquirer"] is False
        finally:
            a.close()
    finally:
        p.close()
        c.close()


# --------------------------------------------------------- addresses
def test_wildcards_across_protocols(broker, uniq):
    """MQTT wildcard syntax everywhere: a STOMP `+` and an AMQP `#`
    subscription both match an MQTT publish; a non-matching topic reaches
    neither."""
    s = Stomp(broker)
    a = Amqp(broker)
    p = Mqtt(broker)
    try:
        s.subscribe(f"/topic/wc/{uniq}/+/x", ack="auto")
        rcv = a.receiver(f"/topic/wc/{uniq}/#")
        p.publish(f"wc/{uniq}/a/y", b"no-match-for-stomp", qos=1)
        p.publish(f"wc/{uniq}/a/x", b"both", qos=1)
        got_s = s.get()
        assert got_s.body == b"both" and got_s.fields["destination"] == f"/topic/wc/{uniq}/a/x"
        assert [rcv.get().body for _ in range(2)] == [b"no-match-for-stomp", b"both"]
    finally:
        for c in (s, a, p):
            c.close()


def test_request_reply_through_stomp_temp_queue(broker, uniq):
    """A STOMP requester names `/temp-queue/r` as reply-to; an AMQP
    responder sees the generated `/queue/$temp/...` name and sends the
    answer there; the requester gets it."""
    req = Stomp(broker)
    a = Amqp(broker)
    try:
        req.subscribe("/temp-queue/r", ack="auto")
        rcv = a.receiver(f"/queue/svc-{uniq}")
        req.send(f"/queue/svc-{uniq}", b"ping", headers={"reply-to": "/temp-queue/r", "correlation-id": "c9"})
        q = rcv.get()
        reply_to = q.fields["reply_to"]
        assert reply_to.startswith("/queue/$temp/"), reply_to
        answer = amqp_message(b"pong")
        answer.correlation_id = q.fields["correlation_id"]
        a.send(reply_to, answer)
        r = req.get()
        assert r.body == b"pong" and r.fields["correlation-id"] == "c9"
    finally:
        req.close()
        a.close()


def test_mqtt_dup_on_redelivery(broker, uniq):
    """An unacknowledged QoS 1 delivery comes back with DUP set when the
    persistent session reconnects."""
    cid = f"dup-{uniq}"
    c = Mqtt(broker, version=5, client_id=cid, clean=False, session_expiry_s=300)
    c.c.manual_ack_set(True)
    c.subscribe(f"dup/{uniq}", qos=1)
    p = Mqtt(broker)
    try:
        p.publish(f"dup/{uniq}", b"once", qos=1)
        first = c.get()
        assert first.body == b"once" and not first.fields["dup"]
        c.close()  # no PUBACK sent
        c2 = Mqtt(broker, version=5, client_id=cid, clean=False, session_expiry_s=300)
        try:
            again = c2.get()
            assert again.body == b"once" and again.fields["dup"]
        finally:
            c2.close()
    finally:
        p.close()


@pytest.mark.parametrize("version", ["1.0", "1.1", "1.2"])
def test_stomp_header_escaping_per_version(broker, uniq, version):
    """Property names and values with newline, colon and backslash cannot
    break a STOMP frame: 1.1 and 1.2 escape them (the client unescapes back
    to the original), 1.0 has no escaping, so the broker writes a newline
    as a space and a colon in a name as `_`."""
    topic = f"cv/esc/{uniq}"
    c = Stomp(broker, version=version)
    p = Mqtt(broker, version=5)
    try:
        c.subscribe(f"/topic/{topic}", ack="auto")
        p.publish(topic, b"body", qos=1,
                  props=[("evil", "x\ndestination:/queue/hijack\ncontent-length:2"), ("k:colon", "v\\back")])
        r = c.get()
        assert r.body == b"body"
        assert r.fields["destination"] == f"/topic/{topic}"
        if version == "1.0":
            assert r.fields["evil"] == "x destination:/queue/hijack content-length:2"
            assert r.fields["k_colon"] == "v\\back"
        else:
            assert r.fields["evil"] == "x\ndestination:/queue/hijack\ncontent-length:2"
            assert r.fields["k:colon"] == "v\\back"
    finally:
        c.close()
        p.close()


def test_expired_messages_are_not_delivered(broker, uniq):
    """An MQTT expiry interval, a STOMP `expires` and an AMQP ttl of 1 s
    each drop the message from a queue nobody consumed in time; an
    unexpiring message behind them is delivered."""
    topic, q = broker.bound.take()
    m, s, a = Mqtt(broker), Stomp(broker), Amqp(broker)
    try:
        m.publish(topic, b"mqtt-exp", qos=1, MessageExpiryInterval=1)
        s.send(f"/queue/{q}", b"stomp-exp", headers={"persistent": "true", "expires": str(NOW_MS() + 1000)})
        am = amqp_message(b"amqp-exp")
        am.ttl = 1.0
        a.send(f"/queue/{q}", am)
        s.send(f"/queue/{q}", b"keeper", headers={"persistent": "true"})
        time.sleep(2.0)
        c = Consumer(broker, "amqp", "queue", q)
        assert c.get().body == b"keeper"
        c.assert_empty()
        c.close()
    finally:
        for x in (m, s, a):
            x.close()


def test_mqtt311_consumer_gets_payload_only(broker, uniq):
    """An MQTT 3.1.1 subscriber gets the exact payload of STOMP and AMQP
    messages that carry properties and standard fields (3.1.1 has no place
    for them, so they are left out)."""
    topic = f"cv/m311/{uniq}"
    c = Mqtt(broker, version=4)
    s, a = Stomp(broker), Amqp(broker)
    try:
        c.subscribe(topic, qos=1)
        s.send(f"/topic/{topic}", "stömp".encode(), content_type="text/plain",
               headers={"x-a": "1", "correlation-id": "c", "reply-to": "/queue/r", "persistent": "true"})
        m = amqp_message(b"\x00amqp")
        m.properties = {"n": 1}
        m.correlation_id = "c2"
        a.send(f"/topic/{topic}", m)
        got = c.get_n(2)
        assert [g.body for g in got] == ["stömp".encode(), b"\x00amqp"]
        assert all(g.fields["qos"] == 1 for g in got)
    finally:
        for x in (c, s, a):
            x.close()


def test_mqtt_shared_subscription_fed_by_stomp(broker, uniq):
    """Two MQTT clients in `$share/g/<filter>` split what a STOMP producer
    sends to the topic: each message goes to exactly one of them."""
    m1, m2, s = Mqtt(broker), Mqtt(broker), Stomp(broker)
    try:
        m1.subscribe(f"$share/g/sh/{uniq}", qos=1)
        m2.subscribe(f"$share/g/sh/{uniq}", qos=1)
        for i in range(10):
            s.send(f"/topic/sh/{uniq}", f"s{i}".encode(), headers={"persistent": "true"})
        got = {1: [], 2: []}
        for k, c in ((1, m1), (2, m2)):
            try:
                while True:
                    got[k].append(c.get(timeout=1).body)
            except queue.Empty:
                pass
        assert sorted(got[1] + got[2]) == sorted(f"s{i}".encode() for i in range(10))
        assert got[1] and got[2], "one member got nothing"
    finally:
        for c in (m1, m2, s):
            c.close()


def test_amqp_anonymous_relay_to_stomp(broker, uniq):
    """An AMQP sender with a null target routes by each message's `to`."""
    a, st = Amqp(broker), Stomp(broker)
    try:
        st.subscribe(f"/topic/relay/{uniq}", ack="auto")
        snd = a.conn.create_sender(None)
        m = amqp_message(b"relayed")
        m.address = f"/topic/relay/{uniq}"
        snd.send(m)
        assert st.get().body == b"relayed"
    finally:
        a.close()
        st.close()


def test_stomp_transaction_seen_by_amqp_only_after_commit(broker, uniq):
    q = f"txq-{uniq}"
    s = Stomp(broker)
    c = Consumer(broker, "amqp", "queue", q)
    try:
        s.conn.begin("tx1")
        s.conn.send(f"/queue/{q}", b"in-tx", transaction="tx1", headers={"persistent": "true"})
        c.assert_empty(wait_s=1.0)
        s.conn.commit("tx1")
        assert c.get().body == b"in-tx"
        s.conn.begin("tx2")
        s.conn.send(f"/queue/{q}", b"aborted", transaction="tx2")
        s.conn.abort("tx2")
        c.assert_empty(wait_s=1.0)
    finally:
        s.close()
        c.close()


def test_amqp_dynamic_reply_queue_answered_by_stomp(broker, uniq):
    """An AMQP requester's dynamic receiver gets a generated
    `/queue/$temp/...` address; a STOMP responder reads it from reply-to
    and sends the answer there."""
    a, st = Amqp(broker), Stomp(broker)
    try:
        st.subscribe(f"/queue/svc2-{uniq}")
        reply = a.conn.create_receiver(None, dynamic=True, credit=10)
        reply_addr = reply.link.remote_source.address
        assert reply_addr.startswith("/queue/$temp/"), reply_addr
        m = amqp_message(b"ping")
        m.reply_to = reply_addr
        m.correlation_id = "k1"
        a.send(f"/queue/svc2-{uniq}", m)
        req = st.get()
        st.ack(req)
        assert req.fields["reply-to"] == reply_addr
        st.send(req.fields["reply-to"], b"pong", headers={"correlation-id": req.fields["correlation-id"]})
        ans = reply.receive(timeout=10)
        reply.accept()
        assert bytes(ans.body) == b"pong" and ans.correlation_id == "k1"
    finally:
        a.close()
        st.close()


# ------------------------------------------------ AMQP standard fields
FIELD_HEADERS = ("amqp-message-id", "type", "user-id", "JMSXGroupID", "JMSXGroupSeq",
                 "content-encoding", "timestamp", "priority")


def test_amqp_standard_fields_reach_stomp_and_mqtt_and_come_back(broker, uniq):
    """AMQP message-id, subject, user-id, group-id, group-sequence,
    content-encoding, creation-time and priority reach STOMP as headers and
    MQTT 5 as user properties (names in docs/conversion.md); a STOMP and an
    MQTT client that republish those headers/properties to a queue give an
    AMQP consumer the fields back (the message id as a string)."""
    topic = f"cv/sf/{uniq}"
    back_q = f"cv-sf-back-{uniq}"
    cs = consumers(broker, topic)
    a = Amqp(broker)
    s_pub, m_pub = Stomp(broker), Mqtt(broker, version=5)
    back = Consumer(broker, "amqp", "queue", back_q)
    try:
        m = amqp_message(b"fields")
        m.id = proton.ulong(12345)  # a typed id: text on the way out
        m.subject = "order.created"
        m.user_id = b"alice"
        m.group_id = "grp-1"
        m.group_sequence = 7
        m.content_encoding = "gzip"
        m.creation_time = 1700000000.5
        m.priority = 9
        m.properties = {"app": "x"}
        a.send(f"/topic/{topic}", m)
        want = {"amqp-message-id": "12345", "type": "order.created", "user-id": "alice",
                "JMSXGroupID": "grp-1", "JMSXGroupSeq": "7", "content-encoding": "gzip",
                "timestamp": "1700000000500", "priority": "9"}

        s = cs["stomp"].get()
        assert {k: s.fields.get(k) for k in want} == want
        assert s.fields["message-id"] != "12345"  # STOMP's own id is the ack id
        assert s.fields["app"] == "x"

        q = cs["mqtt"].get()
        up = q.fields["user_properties"]
        assert up[0] == ("app", "x")  # application properties first
        assert dict(up[1:]) == want and len(up) == 1 + len(want)

        r = cs["amqp"].get()  # AMQP -> AMQP: typed and untouched
        assert r.fields["id"] == 12345 and r.fields["subject"] == "order.created"
        assert bytes(r.fields["user_id"]) == b"alice" and r.props == {"app": "x"}

        # Republished by STOMP (its headers) and MQTT (its user properties).
        s_pub.send(f"/queue/{back_q}", b"from-stomp", headers={k: s.fields[k] for k in want})
        m_pub.publish(f"$queue/{back_q}", b"from-mqtt", qos=1, props=up)
        for origin in (b"from-stomp", b"from-mqtt"):
            r = back.get()
            assert r.body == origin
            assert r.fields["id"] == "12345"  # a string now: typed ids come back as text
            assert r.fields["subject"] == "order.created"
            assert bytes(r.fields["user_id"]) == b"alice"
            assert r.fields["group_id"] == "grp-1" and r.fields["group_sequence"] == 7
            assert r.fields["content_encoding"] == "gzip"
            assert r.fields["creation_time"] == 1700000000.5
            assert r.fields["priority"] == 9
            assert not set(FIELD_HEADERS) & set(r.props), r.props  # fields, not properties
    finally:
        for c in (a, s_pub, m_pub, back):
            c.close()
        close_all(cs)


def test_mqtt_text_without_content_type_is_text_plain_for_stomp(broker, uniq):
    """A text body without a content type (MQTT payload-format-indicator 1,
    an AMQP string) reaches STOMP as content-type text/plain;charset=utf-8;
    a binary body gets none, and a publisher's own type is kept."""
    topic = f"cv/tp/{uniq}"
    st = Stomp(broker)
    m, a = Mqtt(broker, version=5), Amqp(broker)
    try:
        st.subscribe(f"/topic/{topic}", ack="auto")
        m.publish(topic, "hällo".encode(), qos=1, text=True)
        m.publish(topic, b"\x00bin", qos=1)
        m.publish(topic, b"{}", qos=1, text=True, ContentType="application/json")
        a.send(f"/topic/{topic}", amqp_message("amqp-text".encode(), text=True))
        got = st.get_n(4)
        assert got[0].body == "hällo".encode()
        assert got[0].fields["content-type"] == "text/plain;charset=utf-8"
        assert "content-type" not in got[1].fields
        assert got[2].fields["content-type"] == "application/json"
        assert got[3].body == b"amqp-text"
        assert got[3].fields["content-type"] == "text/plain;charset=utf-8"
    finally:
        for c in (st, m, a):
            c.close()


# ------------------------------------- MQTT responder, queue reply-to
def _mqtt_responder(broker, topic):
    """A paho MQTT 5 client answering each request on ``topic`` at its
    ResponseTopic with the request's CorrelationData."""
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties as MqttProperties
    r = Mqtt(broker, version=5)
    r.subscribe(topic, qos=1)

    def answer_one():
        req = r.get()
        rt = req.fields["ResponseTopic"]
        props = MqttProperties(PacketTypes.PUBLISH)
        props.CorrelationData = req.fields["CorrelationData"]
        info = r.c.publish(rt, b"pong:" + req.body, qos=1, properties=props)
        info.wait_for_publish(timeout=10)
        assert info.is_published()
        return rt

    return r, answer_one


def test_mqtt_responder_answers_stomp_temp_queue(broker, uniq):
    """A STOMP requester's `/temp-queue/r` reaches an MQTT 5 responder as
    ResponseTopic `$queue/$temp/...`; the responder's PUBLISH there lands
    in the temporary queue and the requester gets the answer."""
    r, answer_one = _mqtt_responder(broker, f"svc/m/{uniq}")
    req = Stomp(broker)
    try:
        req.subscribe("/temp-queue/r", ack="auto")
        req.send(f"/topic/svc/m/{uniq}", b"ping",
                 headers={"reply-to": "/temp-queue/r", "correlation-id": "c-stomp"})
        rt = answer_one()
        assert rt.startswith("$queue/$temp/"), rt
        got = req.get()
        assert got.body == b"pong:ping" and got.fields["correlation-id"] == "c-stomp"
        assert got.fields["destination"] == "/queue/" + rt[len("$queue/"):]
    finally:
        r.close()
        req.close()


def test_mqtt_responder_answers_amqp_dynamic_queue(broker, uniq):
    """An AMQP requester's dynamic receiver address reaches an MQTT 5
    responder as `$queue/$temp/...`; the answer arrives on the dynamic
    receiver with the correlation id."""
    r, answer_one = _mqtt_responder(broker, f"svc/a/{uniq}")
    a = Amqp(broker)
    try:
        reply = a.conn.create_receiver(None, dynamic=True, credit=10)
        reply_addr = reply.link.remote_source.address
        m = amqp_message(b"ping")
        m.reply_to = reply_addr
        m.correlation_id = "c-amqp"
        a.send(f"/topic/svc/a/{uniq}", m)
        rt = answer_one()
        assert "/queue/" + rt[len("$queue/"):] == reply_addr, (rt, reply_addr)
        ans = reply.receive(timeout=10)
        reply.accept()
        assert bytes(ans.body) == b"pong:ping"
        assert bytes(ans.correlation_id) == b"c-amqp"  # MQTT correlation data is binary
    finally:
        r.close()
        a.close()


def test_mqtt_queue_publish_checks_queue_permission(broker, uniq):
    """`$queue/q` is a queue publish: a user allowed only /topic/ok/# is
    refused (PUBACK 0x87), while an allowed user's message reaches q."""
    from conftest import LIMITED_PASSWORD, LIMITED_USER
    q = f"cv-perm-{uniq}"
    c = Consumer(broker, "amqp", "queue", q)
    bob = Mqtt(broker, version=5, username=LIMITED_USER, password=LIMITED_PASSWORD)
    alice = Mqtt(broker, version=5)
    acks = queue.Queue()
    bob.c.on_publish = lambda cl, u, mid, rc, props: acks.put(rc)
    try:
        info = bob.c.publish(f"$queue/{q}", b"denied", qos=1)
        info.wait_for_publish(timeout=10)
        rc = acks.get(timeout=10)
        assert rc.value == 0x87, rc
        alice.publish(f"$queue/{q}", b"allowed", qos=1)
        assert c.get().body == b"allowed"
        c.assert_empty()
    finally:
        for x in (c, bob, alice):
            x.close()


# ------------------------------------------ retained for STOMP and AMQP
def _retained_receiver(a, address):
    from proton import Described, symbol
    from proton.reactor import Filter
    f = Filter({symbol("rosetta:retained"): Described(symbol("rosetta:retained"), True)})
    return AmqpReceiver(a.conn.create_receiver(address, credit=10, name=new_id("retained"), options=f))


def test_retained_messages_for_stomp_subscribers_who_ask(broker, uniq):
    """MQTT retained messages reach a STOMP subscription with
    `activemq.retroactive:true`, marked `retained:true`; a subscription
    without it gets none, and a live message after them is not marked."""
    base = f"rts/{uniq}"
    m = Mqtt(broker, version=5)
    st_yes, st_no = Stomp(broker), Stomp(broker)
    try:
        # QoS 0 first: the QoS 1 PUBACK after it proves both were routed.
        m.publish(f"{base}/b", b"ret-b", qos=0, retain=True)
        m.publish(f"{base}/a", b"ret-a", qos=1, retain=True)
        st_yes.subscribe(f"/topic/{base}/+", ack="auto", headers={"activemq.retroactive": "true"})
        st_no.subscribe(f"/topic/{base}/+", ack="auto")
        got = st_yes.get_n(2)
        assert sorted(g.body for g in got) == [b"ret-a", b"ret-b"]
        assert all(g.fields.get("retained") == "true" for g in got), [g.fields for g in got]
        m.publish(f"{base}/a", b"live", qos=1)
        for c in (st_yes, st_no):
            live = c.get()
            assert live.body == b"live" and "retained" not in live.fields
        for c in (st_yes, st_no):
            try:
                extra = c.get(timeout=0.5)
            except queue.Empty:
                continue
            raise AssertionError(f"unexpected {extra.body!r}")
    finally:
        m.publish(f"{base}/a", b"", qos=1, retain=True)  # clear
        m.publish(f"{base}/b", b"", qos=1, retain=True)
        for c in (m, st_yes, st_no):
            c.close()


def test_retained_messages_for_amqp_receivers_who_ask(broker, uniq):
    """MQTT retained messages reach an AMQP topic receiver with the
    `rosetta:retained` source filter (echoed in the attach, marked with the
    annotation x-opt-retain); a receiver without it gets none, and a live
    message after them is not marked."""
    base = f"rta/{uniq}"
    m = Mqtt(broker, version=5)
    a = Amqp(broker)
    try:
        m.publish(f"{base}/b", b"ret-b", qos=0, retain=True)
        m.publish(f"{base}/a", b"ret-a", qos=1, retain=True)
        yes = _retained_receiver(a, f"/topic/{base}/#")
        echo = yes.rcv.link.remote_source.filter
        echo.rewind()
        echo.next()
        echoed = echo.get_object()
        assert "rosetta:retained" in {str(k) for k in echoed}, echoed
        no = a.receiver(f"/topic/{base}/#", name=new_id("plain"))
        ag = [yes.get(), yes.get()]
        assert sorted(g.body for g in ag) == [b"ret-a", b"ret-b"]
        assert all(g.raw.annotations.get("x-opt-retain") is True for g in ag), [g.raw.annotations for g in ag]
        m.publish(f"{base}/a", b"live", qos=1)
        for rcv in (yes, no):
            live = rcv.get()
            assert live.body == b"live" and not (live.raw.annotations or {}).get("x-opt-retain")
        for rcv in (yes, no):
            with pytest.raises(Exception) as e:  # proton's Timeout: nothing more
                rcv.get(timeout=0.5)
            assert "Timeout" in type(e.value).__name__, e.value
    finally:
        m.publish(f"{base}/a", b"", qos=1, retain=True)  # clear
        m.publish(f"{base}/b", b"", qos=1, retain=True)
        for c in (m, a):
            c.close()
