"""Two Rosetta nodes and one etcd (issue 19): python-qpid-proton's
event-driven client sees the AMQP 1.0 redirect (``amqp:connection:redirect``
with ``network-host``, ``port`` and ``hostname`` in the error info,
AMQP 1.0 §2.8.17) and, following it, is served by the node it names.

Node ``a`` takes no clients itself (``local_target_enabled = false``), so
every user it sees is sent to ``b``; ``b`` keeps everyone
(``local_target_filter = ".*"``). proton's Container does not reconnect
to a redirect by itself (only its older Messenger did), so the test
follows it, as an application's reconnect handler would.

Both nodes run the proxy (``proxy = true``): a stomp.py client logging in
to ``a`` is relayed to ``b`` byte for byte and gets a message only ``b``'s
queue holds; so is paho-mqtt speaking MQTT 3.1.1 over WebSocket to ``a``
(the WebSocket ends on ``a``, the MQTT inside it is relayed), and it gets
a retained message only ``b`` holds.

Skipped without etcd (Debian's etcd-server) unless ROSETTA_REQUIRE_ETCD
is set, as scripts/test.sh does.
"""

import os
import shutil
import subprocess
import tempfile
import time
import urllib.request

import pytest
from proton.handlers import MessagingHandler
from proton.reactor import Container

from clients import ClientError, Mqtt, Stomp
from conftest import PASSWORD, USER, Broker, free_port

DEADLINE_S = 20


class Etcd:
    """Debian's etcd on free loopback ports in a temporary directory."""

    def __init__(self):
        self.dir = tempfile.mkdtemp(prefix="rosetta-interop-etcd-")
        client, peer = free_port(), free_port()
        self.endpoint = f"http://127.0.0.1:{client}"
        peer_url = f"http://127.0.0.1:{peer}"
        self.log = open(os.path.join(self.dir, "etcd.log"), "wb")
        self.proc = subprocess.Popen(
            ["etcd", "--data-dir", os.path.join(self.dir, "data"), "--name", "t",
             "--listen-client-urls", self.endpoint, "--advertise-client-urls", self.endpoint,
             "--listen-peer-urls", peer_url, "--initial-advertise-peer-urls", peer_url,
             "--initial-cluster", f"t={peer_url}"],
            stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                req = urllib.request.Request(f"{self.endpoint}/v3/kv/range", data=b'{"key":"AA=="}')
                urllib.request.urlopen(req, timeout=1).read()
                return
            except OSError:
                time.sleep(0.1)
        self.stop()
        raise RuntimeError("etcd did not start")

    def stop(self):
        self.proc.kill()
        self.proc.wait()
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)


@pytest.fixture(scope="module")
def etcd():
    if shutil.which("etcd") is None:
        if os.environ.get("ROSETTA_REQUIRE_ETCD"):
            pytest.fail("etcd not found and ROSETTA_REQUIRE_ETCD is set: apt-get install etcd-server")
        pytest.skip("etcd not found (apt-get install etcd-server)")
    e = Etcd()
    yield e
    e.stop()


def cluster_section(etcd, name, balancer):
    return f"""
[cluster]
etcd = ["{etcd.endpoint}"]
node_name = "{name}"
lease_ttl_s = 2
health_check_interval_ms = 200

[cluster.balancer]
key = "user_name"
policy = "first_element"
proxy = true
{balancer}
"""


@pytest.fixture(scope="module")
def nodes(etcd):
    a = Broker("cluster-a", cluster_section(etcd, "a", "local_target_enabled = false"), websocket=True)
    b = Broker("cluster-b", cluster_section(etcd, "b", 'local_target_filter = ".*"'), websocket=True)
    a.start()
    b.start()
    yield a, b
    for n in (a, b):
        n.stop()
        n.cleanup()


class Open(MessagingHandler):
    """Opens one connection as USER and records how it ended: opened, or
    closed by the server with a condition."""

    def __init__(self, url):
        super().__init__()
        self.url = url
        self.opened = False
        self.condition = None
        self.timed_out = False
        self.closed = False

    def on_start(self, event):
        self.conn = event.container.connect(
            self.url, user=USER, password=PASSWORD, allowed_mechs="PLAIN", reconnect=False)
        self.timer = event.container.schedule(DEADLINE_S, self)

    def on_connection_opened(self, event):
        self.opened = True
        # Give the server a moment to follow its Open with a Close.
        event.container.schedule(0.5, self)

    def on_connection_remote_close(self, event):
        self.condition = event.connection.remote_condition
        self.timer.cancel()
        self.closed = True
        event.connection.close()

    def on_timer_task(self, event):
        if self.closed:
            return
        if self.condition is None and not self.opened:
            self.timed_out = True
        self.timer.cancel()
        self.closed = True
        self.conn.close()

    def on_transport_error(self, event):
        pass


def open_as_user(host, port):
    h = Open(f"amqp://{host}:{port}")
    Container(h).run()
    assert not h.timed_out, "no answer"
    return h


def test_proton_sees_the_redirect_and_the_named_node_serves_it(nodes):
    a, b = nodes
    deadline = time.monotonic() + 15
    while True:
        h = open_as_user(a.host, a.amqp_port)
        if h.condition is not None and h.condition.name == "amqp:connection:redirect":
            break
        # Before the nodes see each other, a has nobody to send the user to.
        assert time.monotonic() < deadline, f"no redirect: {h.condition}"
        time.sleep(0.3)
    info = h.condition.info
    assert info["network-host"] == "127.0.0.1"
    assert int(info["port"]) == b.amqp_port
    assert "hostname" in info
    # Following it: b takes the user and keeps the connection open.
    there = open_as_user(info["network-host"], int(info["port"]))
    assert there.condition is None, there.condition


def test_stomp_py_through_the_proxy_is_served_by_the_node_its_login_belongs_to(nodes):
    a, b = nodes
    queue_name = f"/queue/only-on-b-{int(time.monotonic() * 1000)}"
    on_b = Stomp(b, login=USER, passcode=PASSWORD)
    on_b.send(queue_name, b"held by b")
    on_b.conn.disconnect()
    deadline = time.monotonic() + 15
    while True:
        try:
            via_a = Stomp(a, login=USER, passcode=PASSWORD)
            break
        except ClientError:
            # Before the nodes see each other, a has nobody to relay to
            # (it takes no clients itself) and refuses with an ERROR.
            assert time.monotonic() < deadline, "a never relayed the client"
            time.sleep(0.3)
    via_a.subscribe(queue_name)
    got = via_a.get()
    assert got.body == b"held by b"
    via_a.ack(got)
    via_a.conn.disconnect()


def test_paho_over_websocket_through_the_proxy_is_served_by_the_node_its_login_belongs_to(nodes):
    a, b = nodes
    topic = f"cluster/ws-only-on-b-{int(time.monotonic() * 1000)}"
    on_b = Mqtt(b, version=3, username=USER, password=PASSWORD)
    on_b.publish(topic, b"retained on b", qos=1, retain=True)
    on_b.close()
    deadline = time.monotonic() + 15
    while True:
        try:
            via_a = Mqtt(a, version=3, username=USER, password=PASSWORD, websocket=True)
            break
        except ClientError:
            # Before the nodes see each other a has nobody to relay to and
            # refuses (return code 3, server unavailable).
            assert time.monotonic() < deadline, "a never relayed the client"
            time.sleep(0.3)
    via_a.subscribe(topic)
    got = via_a.get()
    assert got.body == b"retained on b"
    assert got.fields["retain"]
    via_a.close()
