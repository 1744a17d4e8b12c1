"""Thin, uniform wrappers over the Python reference clients: paho-mqtt
(3.1.1 and 5.0), stomp.py (1.0, 1.1, 1.2) and python-qpid-proton (blocking
API). Each wrapper collects what arrives in a thread-safe queue, so tests
can say ``get(timeout)`` whatever the library's threading model."""

import itertools
import queue
import threading
import time
import uuid
from dataclasses import dataclass, field

import paho.mqtt.client as paho
import stomp
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties as MqttProperties
from proton import Message as AmqpMessage
from proton.utils import BlockingConnection

from conftest import PASSWORD, USER

TIMEOUT_S = 10.0
_ids = itertools.count()


def new_id(prefix):
    return f"{prefix}-{next(_ids)}-{uuid.uuid4().hex[:8]}"


@dataclass
class Received:
    """One delivered message as a consumer saw it, whatever the protocol."""

    body: bytes
    # "text" when the protocol said so (MQTT payload format 1, AMQP string),
    # "binary" otherwise; "stomp" for STOMP (no body kind on the wire).
    kind: str
    # User properties / application properties / extra headers.
    props: dict = field(default_factory=dict)
    # Standard fields, named as in the protocol.
    fields: dict = field(default_factory=dict)
    raw: object = None


class ClientError(Exception):
    pass


# --------------------------------------------------------------------- MQTT
class Mqtt:
    """paho-mqtt 2.x client, loop in a background thread."""

    def __init__(self, broker, version=5, client_id=None, clean=True, username=None,
                 password=None, session_expiry_s=None, connect=True, websocket=False):
        """``websocket``: over the broker's WebSocket port, path ``/mqtt``."""
        self.version = version
        self.websocket = websocket
        self.client_id = client_id or new_id("paho")
        proto = paho.MQTTv5 if version == 5 else paho.MQTTv311
        kwargs = {"clean_session": clean} if version != 5 else {}
        if websocket:
            kwargs["transport"] = "websockets"
        self.c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=self.client_id,
                             protocol=proto, **kwargs)
        if websocket:
            self.c.ws_set_options(path="/mqtt")
        self.c.max_inflight_messages_set(1000)
        self.c.max_queued_messages_set(0)
        if username is not None:
            self.c.username_pw_set(username, password)
        self.messages = queue.Queue()
        self.connack = queue.Queue()
        self.subacks = queue.Queue()
        self.disconnects = queue.Queue()
        self.c.on_connect = lambda c, u, flags, rc, props: self.connack.put((flags, rc, props))
        self.c.on_subscribe = lambda c, u, mid, rcs, props: self.subacks.put((mid, rcs))
        self.c.on_message = lambda c, u, msg: self.messages.put(msg)
        self.c.on_disconnect = lambda c, u, flags, rc, props: self.disconnects.put(rc)
        self.broker = broker
        self.clean = clean
        self.session_expiry_s = session_expiry_s
        self.session_present = None
        if connect:
            self.connect()

    def connect(self, timeout=TIMEOUT_S):
        kwargs = {}
        if self.version == 5:
            props = MqttProperties(PacketTypes.CONNECT)
            if self.session_expiry_s is not None:
                props.SessionExpiryInterval = self.session_expiry_s
            kwargs = {"clean_start": self.clean, "properties": props}
        port = self.broker.http_port if self.websocket else self.broker.mqtt_port
        self.c.connect(self.broker.host, port, keepalive=60, **kwargs)
        self.c.loop_start()
        try:
            flags, rc, _ = self.connack.get(timeout=timeout)
        except queue.Empty:
            self.c.loop_stop()
            raise ClientError("no CONNACK")
        if rc.is_failure:
            self.c.loop_stop()
            raise ClientError(f"CONNACK refused: {rc}")
        self.session_present = flags.session_present
        return self

    def subscribe(self, topic, qos=1, timeout=TIMEOUT_S):
        rc, mid = self.c.subscribe(topic, qos=qos)
        assert rc == paho.MQTT_ERR_SUCCESS
        got_mid, rcs = self.subacks.get(timeout=timeout)
        assert got_mid == mid
        for r in rcs:
            if r.is_failure:
                raise ClientError(f"SUBACK refused: {r}")
        return rcs

    def publish(self, topic, payload, qos=1, retain=False, text=False, props=None, wait=True,
                **fields):
        p = None
        if self.version == 5 and (text or props or fields):
            p = MqttProperties(PacketTypes.PUBLISH)
            if text:
                p.PayloadFormatIndicator = 1
            if props:
                p.UserProperty = list(props.items()) if isinstance(props, dict) else list(props)
            for k, v in fields.items():
                setattr(p, k, v)
        info = self.c.publish(topic, payload, qos=qos, retain=retain, properties=p)
        if wait and qos > 0:
            info.wait_for_publish(timeout=60)
            assert info.is_published(), "PUBACK not received"
        return info

    def get(self, timeout=TIMEOUT_S) -> Received:
        msg = self.messages.get(timeout=timeout)
        props, fields = {}, {"topic": msg.topic, "qos": msg.qos, "retain": msg.retain, "dup": msg.dup}
        kind = "binary"
        mp = getattr(msg, "properties", None)
        if mp is not None:
            for name, value in getattr(mp, "UserProperty", []) or []:
                props.setdefault(name, value)
            fields["user_properties"] = list(getattr(mp, "UserProperty", []) or [])
            if getattr(mp, "PayloadFormatIndicator", 0) == 1:
                kind = "text"
            for attr in ("ContentType", "ResponseTopic", "CorrelationData", "MessageExpiryInterval"):
                if hasattr(mp, attr):
                    fields[attr] = getattr(mp, attr)
        return Received(bytes(msg.payload), kind, props, fields, msg)

    def get_n(self, n, timeout=TIMEOUT_S):
        return [self.get(timeout) for _ in range(n)]

    def close(self):
        try:
            self.c.disconnect()
        finally:
            self.c.loop_stop()


# -------------------------------------------------------------------- STOMP
class _StompListener(stomp.ConnectionListener):
    def __init__(self):
        self.messages = queue.Queue()
        self.receipts = queue.Queue()
        self.errors = queue.Queue()
        self.disconnected = threading.Event()

    def on_message(self, frame):
        self.messages.put(frame)

    def on_receipt(self, frame):
        self.receipts.put(frame.headers.get("receipt-id"))

    def on_error(self, frame):
        self.errors.put(frame)

    def on_disconnected(self):
        self.disconnected.set()


STOMP_CLASSES = {"1.0": stomp.Connection10, "1.1": stomp.Connection11, "1.2": stomp.Connection12}


class Stomp:
    """stomp.py client of one protocol version; bodies stay bytes."""

    def __init__(self, broker, version="1.2", login=None, passcode=None, client_id=None, connect=True):
        self.version = version
        cls = STOMP_CLASSES[version]
        kwargs = {"auto_decode": False}
        if version != "1.0":
            kwargs["heartbeats"] = (0, 0)
        self.conn = cls([(broker.host, broker.stomp_port)], **kwargs)
        self.l = _StompListener()
        self.conn.set_listener("l", self.l)
        self.login, self.passcode, self.client_id = login, passcode, client_id
        self._receipts = itertools.count()
        if connect:
            self.connect()

    def connect(self):
        headers = {}
        if self.client_id:
            headers["client-id"] = self.client_id
        try:
            self.conn.connect(self.login, self.passcode, wait=True, headers=headers)
        except stomp.exception.ConnectFailedException as e:
            err = None
            try:
                err = self.l.errors.get(timeout=1)
            except queue.Empty:
                pass
            raise ClientError(f"STOMP CONNECT refused: {err.headers if err else e}") from e
        if not self.conn.is_connected():
            raise ClientError("STOMP not connected")
        return self

    def _wait_receipt(self, rid, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                got = self.l.receipts.get(timeout=0.1)
            except queue.Empty:
                if not self.l.errors.empty():
                    raise ClientError(f"ERROR frame: {self.l.errors.get().headers}")
                continue
            if got == rid:
                return
        raise ClientError(f"no RECEIPT {rid}")

    def subscribe(self, destination, sub_id=None, ack="client-individual", headers=None, timeout=TIMEOUT_S):
        sub_id = sub_id or new_id("sub")
        rid = f"sub-{next(self._receipts)}"
        h = dict(headers or {})
        h["receipt"] = rid
        if self.version == "1.0" and ack == "client-individual":
            ack = "client"
        self.conn.subscribe(destination, id=sub_id, ack=ack, headers=h)
        self._wait_receipt(rid, timeout)
        return sub_id

    def unsubscribe(self, sub_id, headers=None):
        self.conn.unsubscribe(sub_id, headers=headers or {})

    def send(self, destination, body, headers=None, content_type=None, receipt=True, timeout=60):
        h = dict(headers or {})
        rid = None
        if receipt:
            rid = f"send-{next(self._receipts)}"
            h["receipt"] = rid
        self.conn.send(destination, body, content_type=content_type, headers=h)
        if rid:
            self._wait_receipt(rid, timeout)

    def get(self, timeout=TIMEOUT_S) -> Received:
        f = self.l.messages.get(timeout=timeout)
        std = {"subscription", "message-id", "destination", "ack", "content-length"}
        props = {k: v for k, v in f.headers.items() if k not in std}
        body = f.body if isinstance(f.body, bytes) else f.body.encode()
        return Received(body, "stomp", props, dict(f.headers), f)

    def get_n(self, n, timeout=TIMEOUT_S):
        return [self.get(timeout) for _ in range(n)]

    def ack(self, r: Received):
        h = r.fields
        if self.version == "1.2":
            self.conn.ack(h["ack"])
        elif self.version == "1.1":
            self.conn.ack(h["message-id"], h["subscription"])
        else:
            self.conn.ack(h["message-id"])

    def nack(self, r: Received):
        h = r.fields
        if self.version == "1.2":
            self.conn.nack(h["ack"])
        else:
            self.conn.nack(h["message-id"], h["subscription"])

    def close(self):
        try:
            if self.conn.is_connected():
                self.conn.disconnect()
        except Exception:
            pass


# --------------------------------------------------------------------- AMQP
class Amqp:
    """python-qpid-proton's blocking client."""

    def __init__(self, broker, user=None, password=None, container_id=None, timeout=TIMEOUT_S):
        kwargs = {}
        if user is not None:
            kwargs.update(user=user, password=password, allowed_mechs="PLAIN")
        else:
            kwargs.update(allowed_mechs="ANONYMOUS")
        self.container_id = container_id
        container = None
        if container_id:
            from proton.reactor import Container
            container = Container()
            container.container_id = container_id
        self.conn = BlockingConnection(f"amqp://{broker.host}:{broker.amqp_port}", timeout=timeout,
                                       container=container, **kwargs)
        self.senders = {}

    def sender(self, address):
        if address not in self.senders:
            self.senders[address] = self.conn.create_sender(address)
        return self.senders[address]

    def send(self, address, msg: AmqpMessage, timeout=60):
        self.sender(address).send(msg, timeout=timeout)

    def receiver(self, address, credit=100, name=None, durable=False):
        options = None
        if durable:
            from proton.reactor import DurableSubscription
            options = DurableSubscription()
        return AmqpReceiver(self.conn.create_receiver(address, credit=credit, name=name, options=options))

    def close(self):
        try:
            self.conn.close()
        except Exception:
            pass


def amqp_received(m: AmqpMessage) -> Received:
    body = m.body
    if isinstance(body, str):
        kind, data = "text", body.encode("utf-8")
    elif isinstance(body, (bytes, bytearray, memoryview)):
        kind, data = ("binary" if m.inferred else "amqp-value-binary"), bytes(body)
    elif body is None:
        kind, data = "none", b""
    else:
        kind, data = f"amqp:{type(body).__name__}", body
    fields = {
        "id": m.id, "correlation_id": m.correlation_id, "reply_to": m.reply_to,
        "content_type": m.content_type, "content_encoding": m.content_encoding,
        "subject": m.subject, "durable": m.durable, "priority": m.priority, "ttl": m.ttl,
        "expiry_time": m.expiry_time, "creation_time": m.creation_time, "group_id": m.group_id,
        "group_sequence": m.group_sequence, "address": m.address, "user_id": m.user_id,
        "delivery_count": m.delivery_count, "first_acquirer": m.first_acquirer,
    }
    # proton hands out memoryviews into buffers it reuses: copy them now.
    fields = {k: _own(v) for k, v in fields.items()}
    props = {k: _own(v) for k, v in (m.properties or {}).items()}
    return Received(data, kind, props, fields, m)


def _own(v):
    return bytes(v) if isinstance(v, memoryview) else v


class AmqpReceiver:
    def __init__(self, rcv):
        self.rcv = rcv

    def get(self, timeout=TIMEOUT_S, accept=True) -> Received:
        m = self.rcv.receive(timeout=timeout)
        if accept:
            self.rcv.accept()
        return amqp_received(m)

    def get_n(self, n, timeout=TIMEOUT_S):
        return [self.get(timeout) for _ in range(n)]

    def close(self):
        self.rcv.close()


def amqp_message(body: bytes, text=False, durable=True, **fields):
    if text:
        m = AmqpMessage(body=body.decode("utf-8"))
    else:
        m = AmqpMessage(body=body, inferred=True)
    m.durable = durable
    for k, v in fields.items():
        setattr(m, k, v)
    return m


# ------------------------------------------------------------ generic pairs
PROTOCOLS = ["mqtt", "stomp", "amqp"]


def address(proto, kind, name):
    """The address a client of ``proto`` uses for the topic/queue ``name``."""
    if proto == "mqtt":
        return name  # for a queue, ``name`` is the binding's topic
    return f"/{kind}/{name}"


class Consumer:
    """A consumer of any protocol on a topic or queue; ``get`` acks."""

    def __init__(self, broker, proto, kind, name, credit=1000, version=None):
        self.proto = proto
        if proto == "mqtt":
            # A queue is consumed through the reserved `$queue/<name>` filter.
            self.client = Mqtt(broker, version=version or 5)
            self.client.subscribe(name if kind == "topic" else f"$queue/{name}", qos=1)
            self.recv = self.client
        elif proto == "stomp":
            self.client = Stomp(broker, version=version or "1.2")
            self.client.subscribe(address(proto, kind, name), headers={"activemq.prefetchSize": str(credit)})
            self.recv = self.client
        else:
            self.client = Amqp(broker)
            self.recv = self.client.receiver(address(proto, kind, name), credit=credit)

    def get(self, timeout=TIMEOUT_S) -> Received:
        r = self.recv.get(timeout)
        if self.proto == "stomp":
            self.client.ack(r)
        return r

    def get_n(self, n, timeout=TIMEOUT_S):
        return [self.get(timeout) for _ in range(n)]

    def assert_empty(self, wait_s=0.5):
        try:
            r = self.recv.get(wait_s) if self.proto != "amqp" else self.recv.get(wait_s)
        except (queue.Empty, Exception) as e:  # proton raises Timeout
            if isinstance(e, AssertionError):
                raise
            return
        raise AssertionError(f"unexpected extra message: {r.body[:60]!r}")

    def close(self):
        self.client.close()


class Publisher:
    """A publisher of any protocol; every publish is confirmed (PUBACK,
    RECEIPT, accepted disposition) unless ``confirm`` is false."""

    def __init__(self, broker, proto, version=None):
        self.proto = proto
        if proto == "mqtt":
            self.client = Mqtt(broker, version=version or 5)
        elif proto == "stomp":
            self.client = Stomp(broker, version=version or "1.2")
        else:
            self.client = Amqp(broker)

    def publish(self, kind, name, body: bytes, text=False, confirm=True, persistent=True):
        addr = address(self.proto, kind, name)
        if self.proto == "mqtt":
            self.client.publish(addr, body, qos=1 if persistent else 0, text=text, wait=confirm)
        elif self.proto == "stomp":
            headers = {"persistent": "true"} if persistent else {}
            self.client.send(addr, body, headers=headers,
                             content_type="text/plain; charset=utf-8" if text else "application/octet-stream",
                             receipt=confirm)
        else:
            self.client.send(addr, amqp_message(body, text=text, durable=persistent))

    def close(self):
        self.client.close()


def publish_many(pub: Publisher, kind, name, bodies, timeout=120):
    """Publishes ``bodies`` pipelined (not one round trip each) and returns
    once the broker confirmed all of them: every PUBACK, the RECEIPT of the
    last SEND (receipts come in order), every AMQP disposition accepted."""
    addr = address(pub.proto, kind, name)
    if pub.proto == "mqtt":
        infos = [pub.client.publish(addr, b, qos=1, wait=False) for b in bodies]
        deadline = time.monotonic() + timeout
        for info in infos:
            info.wait_for_publish(timeout=max(0.1, deadline - time.monotonic()))
            assert info.is_published(), "PUBACK missing"
    elif pub.proto == "stomp":
        last = len(bodies) - 1
        for i, b in enumerate(bodies):
            pub.client.send(addr, b, headers={"persistent": "true"},
                            content_type="application/octet-stream", receipt=(i == last), timeout=timeout)
    else:
        from proton import Delivery
        snd = pub.client.sender(addr)
        dlvs = []
        conn = pub.client.conn
        for b in bodies:
            dlvs.append(snd.link.send(amqp_message(b)))
            if len(dlvs) % 500 == 0:
                conn.wait(lambda: snd.link.queued < 200, timeout=timeout, msg="AMQP send window")
        conn.wait(lambda: all(d.settled for d in dlvs), timeout=timeout, msg="AMQP settlements")
        bad = [d.remote_state for d in dlvs if d.remote_state != Delivery.ACCEPTED]
        assert not bad, f"{len(bad)} deliveries not accepted: {bad[:3]}"
