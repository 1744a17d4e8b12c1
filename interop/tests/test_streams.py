"""Streams (issue 17, ``docs/streams.md``) with the off-the-shelf clients
over real sockets, in the spellings RabbitMQ's stream clients use:

- paho-mqtt appends with PUBLISH to ``$stream/<name>`` (declared at first
  use);
- stomp.py reads ``/queue/<name>`` with ``x-queue-type:stream``,
  ``x-stream-offset`` (``first``, ``offset=N``, ``timestamp=T`` in POSIX
  seconds), ``prefetch-count`` and ``ack:client``, and sees the MESSAGE
  header ``x-stream-offset``;
- rhea (node) reads ``/queues/<name>`` with the offset filter;
- python-qpid-proton reads ``/amq/queue/<name>`` and ``/queues/<name>``
  with the source filter ``rabbitmq:stream-offset-spec`` (an offset,
  ``"first"``, an AMQP timestamp in ms) and sees the message annotations
  ``x-stream-offset`` and ``x-stream-timestamp``;
- a stomp.py consumer group (``x-stream-group``) resumes at its first
  unacknowledged offset after a reconnect and after a ``kill -9``;
- a partitioned stream (``partitions = 3``) written by paho (user
  property ``customer``) and proton (``group-id``), read by a group of
  two stomp.py members on disjoint partitions (``x-stream-partition``);
  when one disconnects, the other takes its partitions at the committed
  offsets.

Reading never consumes: every test reads the same stream more than once.
"""

import queue
import time

import pytest
from proton import Described, Timeout, symbol, timestamp
from proton.reactor import Filter

from proton import Message as AmqpMessage

import nodeclient
from clients import AmqpReceiver, Amqp, Mqtt, Stomp, new_id
from conftest import Broker, rosetta_bin  # noqa: F401  (rosetta_bin checks the binary)

OFFSET_FILTER = "rabbitmq:stream-offset-spec"
QUIET_S = 0.7


def stream_headers(**extra):
    """RabbitMQ's STOMP headers for a stream subscription."""
    return {"x-queue-type": "stream", "prefetch-count": "100", **extra}


def mqtt_append(broker, name, bodies):
    """``bodies`` appended over MQTT 5 at QoS 1, each PUBACKed (durable)."""
    m = Mqtt(broker, version=5)
    try:
        for b in bodies:
            m.publish(f"$stream/{name}", b, qos=1)
    finally:
        m.close()


def stomp_read(broker, name, n, offset, ack="client"):
    """The first ``n`` messages of a stomp.py stream subscription starting
    at ``offset``, as (offset, body); the connection is closed after."""
    s = Stomp(broker)
    try:
        s.subscribe(f"/queue/{name}", ack=ack, headers=stream_headers(**{"x-stream-offset": offset}))
        got = [s.get() for _ in range(n)]
        nothing_more(s)
        return [(int(g.props["x-stream-offset"]), g.body) for g in got]
    finally:
        s.close()


def offset_receiver(a: Amqp, address, spec, credit=100):
    """A proton receiver with RabbitMQ's stream offset filter."""
    f = Filter({symbol(OFFSET_FILTER): Described(symbol(OFFSET_FILTER), spec)})
    return AmqpReceiver(a.conn.create_receiver(address, credit=credit, name=new_id("stream"), options=f))


def amqp_offset(r):
    ann = {str(k): v for k, v in (r.raw.annotations or {}).items()}
    return ann.get("x-stream-offset")


def nothing_more(recv):
    try:
        r = recv.get(QUIET_S)
    except (queue.Empty, Timeout):
        return
    raise AssertionError(f"unexpected message {r.body!r} {r.props}")


def test_paho_writes_a_stream_stomp_reads_it_from_first_and_from_an_offset(broker, uniq):
    bodies = [f"m{i}".encode() for i in range(5)]
    mqtt_append(broker, uniq, bodies)
    assert stomp_read(broker, uniq, 5, "first") == list(enumerate(bodies))
    # Reading deleted nothing: a second reader starts mid-stream.
    assert stomp_read(broker, uniq, 2, "offset=3") == [(3, b"m3"), (4, b"m4")]
    # ack:auto reads the same again.
    assert stomp_read(broker, uniq, 5, "first", ack="auto") == list(enumerate(bodies))


def test_proton_reads_from_offset_0_with_the_rabbitmq_filter_and_sees_the_annotation(broker, uniq):
    bodies = [f"a{i}".encode() for i in range(4)]
    before_ms = int(time.time() * 1000)
    mqtt_append(broker, uniq, bodies)
    after_ms = int(time.time() * 1000)
    a = Amqp(broker)
    try:
        r = offset_receiver(a, f"/amq/queue/{uniq}", 0)
        got = r.get_n(4)
        nothing_more(r)
        assert [(amqp_offset(g), g.body) for g in got] == list(enumerate(bodies))
        # The append time: an AMQP timestamp (ms), in order.
        times = [{str(k): v for k, v in g.raw.annotations.items()}["x-stream-timestamp"] for g in got]
        assert all(isinstance(t, timestamp) for t in times), times
        assert times == sorted(times) and before_ms <= times[0] and times[-1] <= after_ms, times
        # `/queue/<name>` and RabbitMQ 4's `/queues/<name>` are the same
        # stream, and "first" the same start.
        for address in (f"/queue/{uniq}", f"/queues/{uniq}"):
            r2 = offset_receiver(a, address, "first")
            assert [amqp_offset(g) for g in r2.get_n(4)] == [0, 1, 2, 3]
    finally:
        a.close()


def test_replay_by_timestamp_over_stomp_seconds_and_amqp_milliseconds(broker, uniq):
    before = [f"old{i}".encode() for i in range(3)]
    after = [f"new{i}".encode() for i in range(2)]
    mqtt_append(broker, uniq, before)
    # STOMP's timestamps are whole seconds: start the second batch in a
    # second of its own, so `timestamp=T` falls between the two.
    t_s = int(time.time()) + 1
    time.sleep(t_s - time.time() + 0.05)
    mqtt_append(broker, uniq, after)
    assert stomp_read(broker, uniq, 2, f"timestamp={t_s}") == [(3, b"new0"), (4, b"new1")]
    assert stomp_read(broker, uniq, 5, f"timestamp={t_s - 3600}") == list(enumerate(before + after))
    a = Amqp(broker)
    try:
        r = offset_receiver(a, f"/amq/queue/{uniq}", timestamp(t_s * 1000))
        got = r.get_n(2)
        nothing_more(r)
        assert [(amqp_offset(g), g.body) for g in got] == [(3, b"new0"), (4, b"new1")]
    finally:
        a.close()


def group_read(broker, name, group, n, offset=None):
    """A stomp.py ``ack:client`` reader of ``group``: the first ``n``
    messages as (offset, frame) and the connection, left open."""
    s = Stomp(broker)
    headers = stream_headers(**{"x-stream-group": group})
    if offset:
        headers["x-stream-offset"] = offset
    s.subscribe(f"/queue/{name}", ack="client", headers=headers)
    got = [s.get() for _ in range(n)]
    return s, [(int(g.props["x-stream-offset"]), g) for g in got]


def ack_durably(s: Stomp, r):
    """ACKs ``r`` with a receipt: the broker answers once the group's new
    offset is in the journal, so a ``kill -9`` right after keeps it."""
    rid = new_id("ack")
    s.conn.ack(r.fields["ack"], receipt=rid)
    s._wait_receipt(rid, 10)


def test_a_stomp_consumer_group_resumes_after_a_reconnect_and_a_kill_9(fresh_broker, uniq):
    b = fresh_broker
    mqtt_append(b, uniq, [f"g{i}".encode() for i in range(8)])
    group = new_id("billing")
    s, got = group_read(b, uniq, group, 8, offset="first")
    assert [o for o, _ in got] == list(range(8))
    # ack:client is cumulative: acknowledging offset 2 settles 0, 1, 2.
    ack_durably(s, got[2][1])
    s.close()

    s, got = group_read(b, uniq, group, 5)
    assert [o for o, _ in got] == [3, 4, 5, 6, 7], "resumes at the first unacknowledged"
    ack_durably(s, got[1][1])  # commits up to 4
    s.close()

    b.restart(hard=True)
    s, got = group_read(b, uniq, group, 3)
    try:
        assert [o for o, _ in got] == [5, 6, 7], "the committed offset survived a kill -9"
        nothing_more(s)
    finally:
        s.close()


def test_paho_mqtt5_reads_from_the_subscription_user_property_and_sees_the_offset(broker, uniq):
    from paho.mqtt.packettypes import PacketTypes
    from paho.mqtt.properties import Properties

    bodies = [f"p{i}".encode() for i in range(4)]
    mqtt_append(broker, uniq, bodies)
    m = Mqtt(broker, version=5)
    try:
        props = Properties(PacketTypes.SUBSCRIBE)
        props.UserProperty = ("x-stream-offset", "offset=1")
        rc, mid = m.c.subscribe(f"$stream/{uniq}", qos=1, properties=props)
        assert rc == 0
        _, rcs = m.subacks.get(timeout=10)
        assert not rcs[0].is_failure, rcs
        got = m.get_n(3)
        nothing_more(m)
        assert [(int(g.props["x-stream-offset"]), g.body) for g in got] == list(enumerate(bodies))[1:]
    finally:
        m.close()


PARTITIONED = "orders"
# Two keys in each of the 3 partitions (murmur3, RabbitMQ's seed, mod 3).
KEYS = ["alice", "bob", "mallory", "niaj", "olivia", "carol"]


@pytest.fixture(scope="module")
def partitioned_broker():
    b = Broker(
        "partitions",
        extra_config=f"""
[[streams]]
name = "{PARTITIONED}"
partitions = 3
partition_key = "customer"
""",
    )
    b.start()
    yield b
    b.cleanup()


def write_keyed(broker, per_key, start=0):
    """``per_key`` messages ``<key>:<i>`` of each key, key after key: paho
    keys by the configured user property, proton by ``group-id``."""
    m, a = Mqtt(broker, version=5), Amqp(broker)
    try:
        for k, key in enumerate(KEYS):
            for i in range(start, start + per_key):
                body = f"{key}:{i}".encode()
                if k % 2 == 0:
                    m.publish(f"$stream/{PARTITIONED}", body, qos=1, props={"customer": key})
                else:
                    # A string body: an amqp-value string reaches STOMP as its text.
                    a.send(f"/queue/{PARTITIONED}", AmqpMessage(body=body.decode(), group_id=key))
    finally:
        m.close()
        a.close()


def drain(recv):
    out = []
    while True:
        try:
            out.append(recv.get(QUIET_S * 2))
        except (queue.Empty, Timeout):
            return out


def by_key(got):
    keys = {}
    for g in got:
        body = g.body.decode()
        keys.setdefault(body.split(":")[0], []).append(body)
    return keys


def partitions(got):
    return {int(g.props["x-stream-partition"]) for g in got}


def test_a_partitioned_streams_group_rebalances_when_a_stomp_member_leaves(partitioned_broker):
    b = partitioned_broker
    group = {"x-stream-group": new_id("g"), "prefetch-count": "100"}
    first, second = Stomp(b), Stomp(b)
    first.subscribe(f"/queue/{PARTITIONED}", ack="client-individual", headers=group)
    second.subscribe(f"/queue/{PARTITIONED}", ack="client-individual", headers=group)
    write_keyed(b, 3)
    got1, got2 = drain(first), drain(second)
    assert len(got1) + len(got2) == 18
    p1, p2 = partitions(got1), partitions(got2)
    assert not (p1 & p2) and p1 | p2 == {0, 1, 2}, (p1, p2)
    # Each key wholly at one member, in order.
    for keys in (by_key(got1), by_key(got2)):
        for key, bodies in keys.items():
            assert bodies == [f"{key}:{i}" for i in range(3)]
    # The first member acknowledges all but its last of each partition
    # (receipted: durable), then disconnects.
    last = {}
    for g in got1:
        last[int(g.props["x-stream-partition"])] = g
    unacked = {g.body for g in last.values()}
    for g in got1:
        if g.body not in unacked:
            ack_durably(first, g)
    first.close()
    again = drain(second)
    try:
        assert {g.body for g in again} == unacked, "exactly what was never acknowledged"
        assert partitions(again) == p1
        write_keyed(b, 1, start=3)
        rest = drain(second)
        assert len(rest) == 6 and partitions(rest) == {0, 1, 2}
    finally:
        second.close()


def test_a_paho_shared_subscription_is_a_member_of_the_stomp_group_of_its_share_name(
    partitioned_broker,
):
    """``$share/<group>/$stream/<name>`` over paho is a member of the group
    stomp.py names with ``x-stream-group:<group>``: the two read disjoint
    partitions, and when paho leaves, stomp.py takes its partition past
    everything paho acknowledged."""
    b = partitioned_broker
    group = new_id("shared")
    s = Stomp(b)
    s.subscribe(
        f"/queue/{PARTITIONED}",
        ack="client-individual",
        headers={"x-stream-group": group, "x-stream-offset": "next", "prefetch-count": "100"},
    )
    m = Mqtt(b, version=5)
    try:
        m.subscribe(f"$share/{group}/$stream/{PARTITIONED}", qos=1)
        write_keyed(b, 2, start=100)
        got_s, got_m = drain(s), drain(m)
        assert len(got_s) + len(got_m) == 12
        ps, pm = partitions(got_s), partitions(got_m)
        assert not (ps & pm) and ps | pm == {0, 1, 2}, (ps, pm)
        assert len(pm) == 1, "the later member takes one of three"
    finally:
        # paho acknowledged each delivery as it came (PUBACK).
        m.close()
    try:
        write_keyed(b, 1, start=102)
        rest = drain(s)
        assert len(rest) == 6 and partitions(rest) == {0, 1, 2}
        assert sorted(g.body.decode() for g in rest) == sorted(f"{k}:102" for k in KEYS)
    finally:
        s.close()


def test_rhea_reads_a_stream_through_rabbitmq_4s_address_and_sees_offset_and_time(broker, uniq):
    """rhea (node) with RabbitMQ 4's address ``/queues/<name>`` and the
    offset filter as a plain value under its key, as RabbitMQ's JavaScript
    examples give it: offsets and append times on every delivery."""
    bodies = [f"r{i}".encode() for i in range(3)]
    before_ms = int(time.time() * 1000)
    mqtt_append(broker, uniq, bodies)
    after_ms = int(time.time() * 1000)
    res = nodeclient.run(broker, "rhea", mode="sub", address=f"/queues/{uniq}", count=3,
                         filter={OFFSET_FILTER: "first"})
    assert res["ok"], res
    got = res["received"]
    assert [g["body"] for g in got] == bodies
    annotations = [g["fields"]["annotations"] for g in got]
    assert [a["x-stream-offset"] for a in annotations] == [0, 1, 2]
    times = [a["x-stream-timestamp"]["timestamp_ms"] for a in annotations]
    assert times == sorted(times) and before_ms <= times[0] and times[-1] <= after_ms, times
