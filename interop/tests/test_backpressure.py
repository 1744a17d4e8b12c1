"""Delivery back-pressure with off-the-shelf clients (issue 13, items 1-2).

1. A python-qpid-proton receiver (prefetch 200) on a queue of 3,000 durable
   64 KiB messages: the broker never hands the AMQP adapter more than the
   link's credit, so nothing is released and redelivered, every first
   delivery says ``first-acquirer = true``, and memory stays within the
   budget. (Before: tens of thousands of redeliveries, 93 % of the messages
   with ``first-acquirer = false``, RSS 20x over the budget.)
2. An auto-acknowledging stomp.py subscriber that stops reading: the broker
   stops handing it messages once its connection's delivery buffer is
   full, keeps serving everybody else at their pace, and closes the
   stalled one after the slow-consumer limit with an ERROR frame.
"""

import socket
import threading
import time

import pytest
from proton import Message as AmqpMessage
from proton.handlers import MessagingHandler
from proton.reactor import Container
from proton.utils import BlockingConnection

from conftest import Broker, rosetta_bin  # noqa: F401  (rosetta_bin checks the binary)

MIB = 1024 * 1024
BUDGET_BYTES = 16 * MIB
SLOW_CONSUMER_TIMEOUT_MS = 3_000


@pytest.fixture(scope="module")
def small_budget_broker():
    b = Broker(
        "backpressure",
        websocket=True,
        extra_config=f"""
[store]
memory_budget_bytes = {BUDGET_BYTES}
""",
    )
    # `[broker]` is in the template: set the slow-consumer limit there.
    text = b.config.read_text().replace(
        "[broker]\n", f"[broker]\nslow_consumer_timeout_ms = {SLOW_CONSUMER_TIMEOUT_MS}\n", 1
    )
    b.config.write_text(text)
    b.start()
    yield b
    b.cleanup()


class Drain(MessagingHandler):
    """Receives `expected` messages with proton's own credit window
    (`prefetch`), accepting each as it arrives, as the Qpid examples do."""

    def __init__(self, url, address, expected, prefetch, on_progress):
        super().__init__(prefetch=prefetch, auto_accept=True)
        self.url, self.address, self.expected = url, address, expected
        self.on_progress = on_progress
        self.received = 0
        self.not_first = 0
        self.sizes_ok = True

    def on_start(self, event):
        conn = event.container.connect(self.url)
        event.container.create_receiver(conn, self.address)

    def on_message(self, event):
        self.received += 1
        if not event.message.first_acquirer:
            self.not_first += 1
        if len(event.message.body) != 64 * 1024:
            self.sizes_ok = False
        if self.received % 100 == 0:
            self.on_progress()
        if self.received >= self.expected:
            event.connection.close()


def queue_metric(b, name, queue):
    return b.metrics().get(f'{name}{{queue="{queue}"}}')


def test_proton_receiver_of_large_messages_gets_no_redeliveries(small_budget_broker, uniq):
    b = small_budget_broker
    queue = f"big{uniq}"
    count, size = 3_000, 64 * 1024
    conn = BlockingConnection(f"amqp://127.0.0.1:{b.amqp_port}", timeout=60)
    sender = conn.create_sender(queue)
    body = bytes(range(256)) * (size // 256)
    for i in range(count):
        sender.send(AmqpMessage(body=body, durable=True, id=i))
    conn.close()
    assert queue_metric(b, "rosetta_queue_depth", queue) == count

    peak_rss = [b.rss_bytes()]
    peak_memory = [0.0]
    baseline = peak_rss[0]

    def sample():
        peak_rss[0] = max(peak_rss[0], b.rss_bytes())
        peak_memory[0] = max(peak_memory[0], b.metrics().get("rosetta_memory_used_bytes", 0))

    handler = Drain(f"amqp://127.0.0.1:{b.amqp_port}", queue, count, 200, sample)
    runner = threading.Thread(target=Container(handler).run, daemon=True)
    started = time.monotonic()
    runner.start()
    runner.join(timeout=120)
    assert not runner.is_alive(), f"received {handler.received} of {count} in 120 s"
    elapsed = time.monotonic() - started

    # The figures for the record (pytest -s shows them).
    print(
        f"\n{count} x {size // 1024} KiB, prefetch 200: {elapsed:.1f} s, "
        f"redeliveries {queue_metric(b, 'rosetta_queue_redeliveries_total', queue):.0f}, "
        f"first-acquirer false {handler.not_first}, "
        f"queue memory peak {peak_memory[0] / MIB:.1f} MiB (budget {BUDGET_BYTES / MIB:.0f}), "
        f"RSS growth {(peak_rss[0] - baseline) / MIB:.0f} MiB"
    )
    assert handler.received == count
    assert handler.sizes_ok
    assert handler.not_first == 0, f"{handler.not_first} of {count} came with first-acquirer false"
    assert queue_metric(b, "rosetta_queue_redeliveries_total", queue) == 0
    assert queue_metric(b, "rosetta_queue_deliveries_total", queue) == count
    assert queue_metric(b, "rosetta_queue_depth", queue) == 0
    # In flight at once: 200 x 64 KiB = 12.5 MiB, inside the 16 MiB budget.
    assert peak_memory[0] <= BUDGET_BYTES, f"queue memory peaked at {peak_memory[0] / MIB:.1f} MiB"
    # The process as a whole: the budget plus the journal's buffers and
    # the allocator's slack (glibc's per-thread arenas keep freed 64 KiB
    # bodies), nowhere near the 450 MB this scenario reached. Four runs of
    # the release broker on 2026-12-04 grew by 34, 61, 68 and 74 MiB with
    # the queue's own memory within its 16 MiB each time, so the bound is
    # 8x the budget rather than the 4x that those runs straddled.
    assert peak_rss[0] - baseline < 8 * BUDGET_BYTES, (
        f"RSS grew by {(peak_rss[0] - baseline) / MIB:.0f} MiB in {elapsed:.1f} s"
    )


def stomp_frame(command, headers, body=b""):
    head = "".join(f"{k}:{v}\n" for k, v in headers.items())
    return f"{command}\n{head}\n".encode() + body + b"\x00"


def read_frame(sock, timeout=10):
    sock.settimeout(timeout)
    data = b""
    while b"\x00" not in data:
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


def test_auto_ack_subscriber_that_stops_reading_is_bounded_then_closed(small_budget_broker, uniq):
    b = small_budget_broker
    topic = f"/topic/stall{uniq}"
    # A subscriber that never reads after subscribing, with a small socket
    # receive buffer so the kernel holds little for it.
    stalled = socket.socket()
    stalled.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    stalled.connect(("127.0.0.1", b.stomp_port))
    stalled.sendall(stomp_frame("CONNECT", {"accept-version": "1.2", "host": "/"}))
    assert read_frame(stalled).startswith(b"CONNECTED")
    stalled.sendall(stomp_frame("SUBSCRIBE", {"id": "0", "destination": topic, "ack": "auto"}))
    time.sleep(0.3)

    # A healthy subscriber and a producer on another topic keep going.
    import stomp as stomppy

    healthy_topic = f"/topic/healthy{uniq}"
    got = []
    done = threading.Event()

    class Listener(stomppy.ConnectionListener):
        def on_message(self, frame):
            got.append(frame)
            if len(got) >= 200:
                done.set()

    healthy = stomppy.Connection([("127.0.0.1", b.stomp_port)], heartbeats=(0, 0))
    healthy.set_listener("l", Listener())
    healthy.connect(wait=True)
    healthy.subscribe(healthy_topic, id="h", ack="auto")

    producer = stomppy.Connection([("127.0.0.1", b.stomp_port)], heartbeats=(0, 0))
    producer.connect(wait=True)
    body = b"x" * (256 * 1024)
    baseline = b.rss_bytes()
    # 256 MiB for the subscriber that does not read: 16x the memory budget.
    for _ in range(1024):
        producer.send(topic, body)
    peak = b.rss_bytes()
    for i in range(200):
        producer.send(healthy_topic, f"h{i}")
    assert done.wait(30), f"the healthy subscriber got {len(got)} of 200"

    # Non-persistent topic messages past the budget are paged: RSS stays
    # bounded although 256 MiB went to a connection that reads nothing.
    assert peak - baseline < 6 * BUDGET_BYTES, f"RSS grew by {(peak - baseline) / MIB:.0f} MiB"

    # After the slow-consumer limit the stalled one is closed (its ERROR
    # frame goes out behind what it did not read: best effort, a client
    # that reads nothing cannot see it). The broker counts it gone while
    # the healthy connections stay.
    connections = b.metrics()["rosetta_connections"]
    deadline = time.monotonic() + SLOW_CONSUMER_TIMEOUT_MS / 1000 + 20
    while b.metrics()["rosetta_connections"] >= connections:
        assert time.monotonic() < deadline, "the stalled subscriber was never closed"
        time.sleep(0.2)
    stalled.settimeout(10)
    closed = False
    try:
        while stalled.recv(1 << 20):
            pass
        closed = True
    except ConnectionResetError:
        closed = True
    assert closed
    assert healthy.is_connected() and producer.is_connected()
    healthy.disconnect()
    producer.disconnect()
