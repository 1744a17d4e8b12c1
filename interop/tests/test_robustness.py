"""Robustness: each listener gets random garbage, a half-open connection
and a slowloris (byte-at-a-time) client, while a well-behaved MQTT -> STOMP
-> AMQP exchange keeps running. The abusive connections must be closed
(garbage at once or at the latest when the handshake deadline passes,
stalled ones by the handshake deadline) and the exchange must lose
nothing.

Handshake deadlines: MQTT and STOMP use [broker] connect_timeout_ms (3 s in
the test config, the default being 10 s). AMQP ignores that key
and uses its adapter's own 30 s handshake timeout (a reported gap), so the
AMQP cases allow 30 s."""

import os
import random
import socket
import threading
import time

import pytest

from clients import Amqp, Mqtt, Stomp, amqp_message

from conftest import CONNECT_TIMEOUT_MS

LISTENERS = ["mqtt", "stomp", "amqp"]
# Seconds within which each listener must close a connection that has not
# finished its handshake: [broker] connect_timeout_ms for every protocol.
DEADLINE_S = {name: CONNECT_TIMEOUT_MS / 1000 for name in ("mqtt", "stomp", "amqp")}
SLACK_S = 4.0

# Valid first bytes of each protocol, for half-open and slowloris clients.
MQTT_CONNECT = bytes([0x10, 0x10, 0x00, 0x04]) + b"MQTT" + bytes([0x04, 0x02, 0x00, 0x3C, 0x00, 0x04]) + b"slow"
STOMP_CONNECT_PREFIX = b"CONNECT\naccept-version:1.2\nhost:x\nx-pad:"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"


class Exchange(threading.Thread):
    """MQTT publishes to a topic; STOMP and AMQP subscribers both get every
    message, in order, for as long as the test runs."""

    def __init__(self, b, name):
        super().__init__(daemon=True)
        self.b = b
        self.stomp = Stomp(b)
        self.stomp.subscribe(f"/topic/rob/{name}", ack="auto")
        self.amqp = Amqp(b)
        self.rcv = self.amqp.receiver(f"/topic/rob/{name}", credit=100)
        self.pub = Mqtt(b)
        self.topic = f"rob/{name}"
        self.stop = threading.Event()
        self.sent = 0
        self.errors = []
        self.max_latency = 0.0

    def run(self):
        try:
            while not self.stop.is_set():
                body = f"m{self.sent}".encode()
                t0 = time.monotonic()
                self.pub.publish(self.topic, body, qos=1)
                s = self.stomp.get(timeout=10)
                a = self.rcv.get(timeout=10)
                self.max_latency = max(self.max_latency, time.monotonic() - t0)
                assert s.body == body and a.body == body, (s.body, a.body, body)
                self.sent += 1
                time.sleep(0.02)
        except Exception as e:  # reported by finish()
            self.errors.append(repr(e))

    def assert_progress(self, n=10, timeout=15):
        """The exchange keeps going: ``n`` more round trips after the abuse."""
        start = self.sent
        deadline = time.monotonic() + timeout
        while self.sent < start + n and time.monotonic() < deadline and not self.errors:
            time.sleep(0.05)
        assert not self.errors, self.errors
        assert self.sent >= start + n, f"only {self.sent - start} round trips in {timeout}s"

    def finish(self):
        self.stop.set()
        self.join(20)
        for c in (self.pub, self.stomp, self.amqp):
            c.close()
        assert not self.errors, self.errors
        assert self.max_latency < 5, f"round trip took {self.max_latency:.1f}s"


@pytest.fixture
def exchange(fresh_broker, request):
    ex = Exchange(fresh_broker, request.node.name.replace("[", "-").replace("]", ""))
    ex.start()
    yield ex
    ex.assert_progress()
    ex.finish()
    assert fresh_broker.alive(), fresh_broker.log_tail()


def port(b, listener):
    return b.ports()[listener]


def closed_within(sock, seconds):
    """True if the peer closes (EOF or reset) within ``seconds``; reads and
    discards whatever the broker answers first (an error frame, say)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        sock.settimeout(max(0.05, deadline - time.monotonic()))
        try:
            if sock.recv(65536) == b"":
                return True
        except socket.timeout:
            return False
        except (ConnectionResetError, BrokenPipeError):
            return True
    return False


def all_closed_within(socks, seconds):
    """Waits until the broker closed every socket; returns those still open."""
    import select
    open_ = set(socks)
    deadline = time.monotonic() + seconds
    while open_ and time.monotonic() < deadline:
        readable, _, _ = select.select(list(open_), [], [], max(0.01, min(0.5, deadline - time.monotonic())))
        for s in readable:
            try:
                if s.recv(65536) == b"":
                    open_.discard(s)
            except (ConnectionResetError, BrokenPipeError):
                open_.discard(s)
    return open_


@pytest.mark.timeout(120)
@pytest.mark.parametrize("listener", LISTENERS)
def test_random_garbage(fresh_broker, exchange, listener):
    """20 connections each send random bytes (1 byte to 64 KiB, fixed
    seed); every one is closed, at the latest by the handshake deadline."""
    rng = random.Random(f"garbage-{listener}")
    socks = []
    try:
        for i in range(20):
            s = socket.create_connection((fresh_broker.host, port(fresh_broker, listener)))
            socks.append(s)
            data = bytes(rng.getrandbits(8) for _ in range(rng.choice([1, 7, 64, 4096, 65536])))
            try:
                s.sendall(data)
            except (ConnectionResetError, BrokenPipeError):
                pass
        still_open = all_closed_within(socks, DEADLINE_S[listener] + SLACK_S)
        assert not still_open, f"{len(still_open)} garbage connections kept open"
    finally:
        for s in socks:
            s.close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("listener", LISTENERS)
def test_half_open_connection(fresh_broker, exchange, listener):
    """A client that connects and sends half a handshake, then nothing; and
    one that sends nothing at all. Both are closed by the connect timeout."""
    partial = {"mqtt": MQTT_CONNECT[:7], "stomp": STOMP_CONNECT_PREFIX[:10], "amqp": AMQP_HEADER[:5]}[listener]
    socks = []
    for data in (partial, b""):
        s = socket.create_connection((fresh_broker.host, port(fresh_broker, listener)))
        if data:
            s.sendall(data)
        socks.append(s)
    try:
        t0 = time.monotonic()
        for s in socks:
            assert closed_within(s, DEADLINE_S[listener] + SLACK_S), "half-open connection never closed"
        assert time.monotonic() - t0 >= DEADLINE_S[listener] - 1.0, "closed before the handshake deadline"
    finally:
        for s in socks:
            s.close()


def slow_bytes(listener):
    if listener == "mqtt":
        # A CONNECT announcing 1000 bytes; it never gets there.
        return bytes([0x10, 0xE8, 0x07, 0x00, 0x04]) + b"MQTT" + bytes([0x05, 0x02, 0x00, 0x3C]) + b"\x00" * 1000
    if listener == "stomp":
        return STOMP_CONNECT_PREFIX + b"a" * 100000
    return AMQP_HEADER + b"\x00\x00\x10\x00\x02\x00\x00\x00" + b"\x00" * 4000


@pytest.mark.timeout(120)
@pytest.mark.parametrize("listener", LISTENERS)
def test_slowloris(fresh_broker, exchange, listener):
    """Bytes of a valid handshake, one every 100 ms, 3 such clients: each is
    closed by the connect timeout although it never stops sending."""
    socks = [socket.create_connection((fresh_broker.host, port(fresh_broker, listener))) for _ in range(3)]
    data = slow_bytes(listener)
    t0 = time.monotonic()
    closed = [False] * len(socks)
    i = 0
    try:
        while not all(closed) and time.monotonic() - t0 < DEADLINE_S[listener] + SLACK_S:
            for k, s in enumerate(socks):
                if closed[k]:
                    continue
                try:
                    s.send(data[i:i + 1])
                    s.setblocking(False)
                    try:
                        if s.recv(4096) == b"":
                            closed[k] = True
                    except BlockingIOError:
                        pass
                    finally:
                        s.setblocking(True)
                except (ConnectionResetError, BrokenPipeError):
                    closed[k] = True
            i += 1
            time.sleep(0.1)
        elapsed = time.monotonic() - t0
        assert all(closed), f"slowloris connections still open after {elapsed:.1f}s"
    finally:
        for s in socks:
            s.close()


@pytest.mark.timeout(120)
def test_subscriber_that_stops_reading(fresh_broker, exchange):
    """A STOMP subscriber (client acks, 4 KiB receive buffer) that never
    reads while 32 MiB are published to its topic: publishers keep getting
    their PUBACKs, the exchange keeps going, the broker stays up."""
    b = fresh_broker
    s = socket.create_connection((b.host, b.stomp_port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.sendall(b"CONNECT\naccept-version:1.2\nhost:x\n\n\x00"
              b"SUBSCRIBE\ndestination:/topic/rob-slow\nid:1\nack:client-individual\n\n\x00")
    p = Mqtt(b)
    try:
        payload = os.urandom(64 * 1024)
        t0 = time.monotonic()
        for i in range(512):
            p.publish("rob-slow", payload, qos=1, wait=(i % 64 == 63))
        assert time.monotonic() - t0 < 60
        exchange.assert_progress()
        assert b.alive()
    finally:
        p.close()
        s.close()
