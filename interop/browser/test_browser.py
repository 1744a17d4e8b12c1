"""The browser test of issue 6: Debian's headless Chromium, driven by
playwright-core (driver.mjs), loads page.html from 127.0.0.1; the page uses
the stock browser bundles of mqtt.js and @stomp/stompjs against a release
broker's WebSocket port, and Python clients (python-qpid-proton, paho-mqtt)
talk to the same broker over plain TCP.

Run through run.sh, which installs what is needed and builds the broker.
"""

import functools
import http.server
import json
import os
import queue
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import paho.mqtt.client as paho
import pytest
from proton import Message
from proton.utils import BlockingConnection

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
TIMEOUT_S = 10


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What the broker logs once it is recovered, listening and its admin API
# answers (`rosetta::READY_LOG_LINE` in src/lib.rs).
READY_LOG_LINE = "ready: journal recovered, listeners bound"


def uniq():
    return uuid.uuid4().hex[:10]


class Broker:
    def __init__(self, extra_ports=(), extra_config="", prepare=None):
        self.dir = Path(tempfile.mkdtemp(prefix="rosetta-browser-"))
        self.ports = {k: free_port() for k in ("mqtt", "stomp", "amqp", "websocket")}
        listeners = dict(self.ports)
        self.ports.update({k: free_port() for k in extra_ports})
        config = self.dir / "rosetta.toml"
        config.write_text(
            f'data_dir = "{self.dir / "data"}"\n\n[listeners]\n'
            + "".join(f'{k} = "127.0.0.1:{p}"\n' for k, p in listeners.items())
            + 'mqtts = ""\nstomps = ""\namqps = ""\nwss = ""\nany = ""\n\n'
            + "[security]\nanonymous = true\n"
            + extra_config.format(dir=self.dir, **self.ports)
        )
        binary = os.environ.get("ROSETTA_BIN") or str(ROOT / "target" / "release" / "rosetta")
        if prepare:
            prepare(binary, config)
        self.log = open(self.dir / "broker.log", "wb")
        self.proc = subprocess.Popen([binary, "--config", str(config)], stdout=self.log,
                                     stderr=subprocess.STDOUT,
                                     env=dict(os.environ, RUST_LOG=os.environ.get("RUST_LOG", "info")))
        deadline = time.monotonic() + 20
        for port in self.ports.values():
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"broker exited: {self.log_tail()}")
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"broker not listening on {port}: {self.log_tail()}")
                    time.sleep(0.05)
        # The admin listener answers 503 until the broker is ready: wait for
        # the line that says so (`rosetta::READY_LOG_LINE` in src/lib.rs).
        while READY_LOG_LINE not in self.log_text():
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited: {self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker not ready: {self.log_tail()}")
            time.sleep(0.05)

    def log_text(self):
        self.log.flush()
        return (self.dir / "broker.log").read_text(errors="replace")

    def log_tail(self):
        return self.log_text()[-3000:]

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


class Browser:
    """driver.mjs in a subprocess; eval() runs an expression in the page."""

    def __init__(self, url, ready=None):
        args = ["node", str(HERE / "driver.mjs"), url] + ([ready] if ready else [])
        self.proc = subprocess.Popen(args, cwd=HERE,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.answers = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()
        self.next_id = 1
        first = self.answers.get(timeout=60)
        if not first.get("ok"):
            raise RuntimeError(f"browser did not start: {first.get('error')}")
        self.user_agent = first["value"]

    def _read(self):
        for line in self.proc.stdout:
            try:
                self.answers.put(json.loads(line))
            except ValueError:
                pass

    def eval(self, expr, timeout=TIMEOUT_S + 5):
        return self._ask({"expr": expr}, timeout)

    def screenshot(self, path):
        """Saves a PNG of the whole page at `path`."""
        return self._ask({"screenshot": str(path)}, TIMEOUT_S + 5)

    def _ask(self, request, timeout):
        i = self.next_id
        self.next_id += 1
        self.proc.stdin.write(json.dumps(dict(request, id=i)) + "\n")
        self.proc.stdin.flush()
        answer = self.answers.get(timeout=timeout)
        assert answer["id"] == i, answer
        if not answer["ok"]:
            raise AssertionError(f"in the browser: {answer['error']}")
        return answer["value"]

    def close(self):
        try:
            self.proc.stdin.close()
            self.proc.wait(15)
        except Exception:
            self.proc.kill()


@pytest.fixture(scope="module")
def broker():
    b = Broker()
    yield b
    b.stop()


@pytest.fixture(scope="module")
def page_url():
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(HERE))
    handler.log_message = lambda *a: None
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/page.html"
    server.shutdown()


@pytest.fixture()
def browser(page_url):
    b = Browser(page_url)
    yield b
    b.close()


def js(value):
    return json.dumps(value)


def amqp(broker):
    return BlockingConnection(f"amqp://127.0.0.1:{broker.ports['amqp']}", timeout=TIMEOUT_S)


def ws_url(broker, path):
    return f"ws://127.0.0.1:{broker.ports['websocket']}{path}"


def test_browser_mqtt5_publish_reaches_amqp_receiver(broker, browser):
    """(1) The browser publishes over MQTT 5 over WebSocket with user
    properties; a proton AMQP 1.0 receiver gets the exact payload and the
    properties as application-properties."""
    topic = f"browser/to-amqp/{uniq()}"
    conn = amqp(broker)
    try:
        rcv = conn.create_receiver(f"/topic/{topic}", credit=10)
        browser.eval(f"T.mqttConnect({js(ws_url(broker, '/mqtt'))}, {js('browser-' + uniq())})")
        payload = "héllo from Chromium ✓ " + uniq()
        props = {"origin": "browser", "colon:key": "a:b", "empty": ""}
        assert browser.eval(f"T.mqttPublish({js(topic)}, {js(payload)}, {js(props)})") is True
        m = rcv.receive(timeout=TIMEOUT_S)
        rcv.accept()
        body = m.body if isinstance(m.body, str) else bytes(m.body).decode("utf-8")
        assert body == payload
        assert dict(m.properties or {}) == props
    finally:
        conn.close()


def test_amqp_sender_reaches_browser_mqtt_subscription(broker, browser):
    """(2) A proton AMQP 1.0 sender publishes; the browser's MQTT
    subscription over WebSocket receives it with its application-properties
    as MQTT 5 user properties."""
    topic = f"browser/from-amqp/{uniq()}"
    browser.eval(f"T.mqttConnect({js(ws_url(broker, '/'))}, {js('browser-' + uniq())})")
    assert browser.eval(f"T.mqttSubscribe({js(topic)})") == [1]
    conn = amqp(broker)
    try:
        snd = conn.create_sender(f"/topic/{topic}")
        body = "from proton " + uniq()
        snd.send(Message(body=body, durable=True, properties={"sender": "proton"}))
    finally:
        conn.close()
    got = browser.eval("T.waitFor('mqttInbox', 1)")
    assert got[0]["topic"] == topic
    assert got[0]["payload"] == body
    assert got[0]["userProperties"].get("sender") == "proton"


def test_browser_stomp_exchanges_with_mqtt_tcp_client(broker, browser):
    """(3) Browser STOMP over WebSocket and a paho MQTT 5 client over plain
    TCP exchange messages both ways."""
    name = uniq()
    to_mqtt, to_browser = f"browser/s2m/{name}", f"browser/m2s/{name}"
    inbox = queue.Queue()
    subacked = threading.Event()
    c = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=f"paho-{name}",
                    protocol=paho.MQTTv5)
    c.on_message = lambda cl, u, msg: inbox.put(msg)
    c.on_subscribe = lambda cl, u, mid, rcs, props: subacked.set()
    c.connect("127.0.0.1", broker.ports["mqtt"], keepalive=30)
    c.loop_start()
    try:
        c.subscribe(to_mqtt, qos=1)
        assert subacked.wait(TIMEOUT_S), "no SUBACK"
        version = browser.eval(f"T.stompConnect({js(ws_url(broker, '/stomp'))})")
        assert version in ("1.1", "1.2")
        assert browser.eval(f"T.stompSubscribe({js('/topic/' + to_browser)})") is True

        body = "STOMP from Chromium " + name
        assert browser.eval(
            f"T.stompSend({js('/topic/' + to_mqtt)}, {js(body)}, {js({'x-from': 'browser'})})") is True
        msg = inbox.get(timeout=TIMEOUT_S)
        assert msg.topic == to_mqtt
        assert msg.payload.decode("utf-8") == body
        assert ("x-from", "browser") in (getattr(msg.properties, "UserProperty", None) or [])

        reply = "MQTT over TCP to the browser " + name
        info = c.publish(to_browser, reply.encode(), qos=1)
        info.wait_for_publish(TIMEOUT_S)
        got = browser.eval("T.waitFor('stompInbox', 1)")
        assert got[0]["body"] == reply
        assert got[0]["destination"] == "/topic/" + to_browser
    finally:
        c.loop_stop()
        c.disconnect()
