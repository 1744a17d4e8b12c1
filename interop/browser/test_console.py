"""The web console (issue 18) in Debian's headless Chromium, driven by
playwright-core (driver.mjs): the broker binary serves the console from its
admin listener; the test logs in as an administrator and, with real clients
beside it (stomp.py, paho-mqtt), watches a queue fill as it publishes,
purges it, creates a queue and moves messages into it, replays a
dead-letter queue to the queue its message came from, closes the STOMP
client's connection with a reason, sees the rates chart move, deletes an
MQTT session, sees a stream's consumer group lag behind, reads the
built-in roles, defines a role, adds a user
holding it (who can then use the API, with its role's permissions),
changes that user's password, roles and permissions, is refused removing
the role while it is held, deletes both, and follows the Demo link to the
broker's own demo client, which round-trips a message. After each step
the page is saved as a PNG in a results directory that the test prints
(ROSETTA_RESULTS_DIR, default interop/results/console-<UTC time>). The
broker is started and stopped by the test.

Run through run.sh (or its pytest with ROSETTA_BIN pointing at a build).
"""

import base64
import json
import os
import queue
import subprocess
import threading
import time
import urllib.error
import urllib.request
from datetime import datetime, timezone
from pathlib import Path

import paho.mqtt.client as paho
import pytest
import stomp

from test_browser import HERE, TIMEOUT_S, Broker, Browser, js, uniq

ADMIN_USER, ADMIN_PASSWORD = "admin", "console-pw"


def add_admin(binary, config):
    users = config.parent / "users.toml"
    subprocess.run([binary, "--config", str(config), "user", "add", ADMIN_USER,
                    "--password", ADMIN_PASSWORD, "--role", "administrator",
                    "--users-file", str(users)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def broker():
    b = Broker(extra_ports=("admin",),
               # One delivery attempt: a NACK dead-letters at once (the replay step).
               extra_config='users_file = "{dir}/users.toml"\n\n[admin]\nlisten = "127.0.0.1:{admin}"\n'
                            '\n[broker]\ndelivery_attempts_max = 1\n',
               prepare=add_admin)
    yield b
    b.stop()


@pytest.fixture(scope="module")
def results():
    """Where the screenshots go; printed so that a reader of the run finds them."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%dT%H%M%SZ")
    default = HERE.parent / "results" / f"console-{stamp}"
    path = Path(os.environ.get("ROSETTA_RESULTS_DIR") or default)
    path.mkdir(parents=True, exist_ok=True)
    print(f"\nconsole screenshots: {path}")
    return path


def api(broker, path, method="GET", user=ADMIN_USER, password=ADMIN_PASSWORD):
    """The admin API, as the test's own witness of what the console did."""
    req = urllib.request.Request(f"http://127.0.0.1:{broker.ports['admin']}{path}", method=method)
    if method in ("POST", "PUT"):
        req.data = b""
    pair = base64.b64encode(f"{user}:{password}".encode()).decode()
    req.add_header("Authorization", f"Basic {pair}")
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        body = r.read()
        return json.loads(body) if body else None


def api_status(broker, path, **kw):
    try:
        api(broker, path, **kw)
        return 200
    except urllib.error.HTTPError as e:
        return e.code


def until(condition):
    """A page expression that waits for `condition` (a JS expression) to be
    truthy, and yields its value."""
    return (f"(async () => {{ const end = Date.now() + {TIMEOUT_S * 1000};"
            f" while (Date.now() < end) {{ const v = ({condition}); if (v) return v;"
            f" await new Promise(r => setTimeout(r, 100)); }}"
            f" throw new Error('timed out waiting for: ' + {js(condition)}); }})()")


def after_navigation(browser, condition):
    """until(condition) on a page that is navigating: an evaluation the
    navigation cuts short is tried again on the new page."""
    end = time.monotonic() + TIMEOUT_S
    while True:
        try:
            return browser.eval(until(condition))
        except AssertionError as e:
            if "context was destroyed" not in str(e) or time.monotonic() > end:
                raise
            time.sleep(0.2)


class Listener(stomp.ConnectionListener):
    def __init__(self):
        self.errors = queue.Queue()
        self.messages = queue.Queue()

    def on_error(self, frame):
        self.errors.put(frame)

    def on_message(self, frame):
        self.messages.put(frame)


def dead_letter(port, source):
    """One message sent to `source` and NACKed by its only consumer: with
    one delivery attempt allowed, it goes to the dead-letter queue `DLQ`
    with `x-original-queue` naming `source`."""
    conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
    listener = Listener()
    conn.set_listener("dl", listener)
    conn.connect(wait=True)
    try:
        conn.subscribe(f"/queue/{source}", id="dl", ack="client-individual")
        conn.send(f"/queue/{source}", "poison", headers={"persistent": "true"})
        frame = listener.messages.get(timeout=TIMEOUT_S)
        # STOMP 1.2: the ack header alone names the message (stomp.py's
        # second positional argument is a transaction, which would be refused).
        conn.nack(frame.headers["ack"])
        conn.unsubscribe("dl")
    finally:
        conn.disconnect()


class Steps:
    """Numbered screenshots of the page, one per step."""

    def __init__(self, browser, directory):
        self.browser, self.directory, self.n = browser, directory, 0

    def shot(self, name):
        self.n += 1
        path = self.directory / f"{self.n:02d}-{name}.png"
        self.browser.screenshot(path)
        assert path.stat().st_size > 0, path


def view(browser, name):
    """Shows view `name` and waits until it has been drawn afresh, so that
    nothing read from it afterwards is left from an earlier visit."""
    before = browser.eval("document.body.dataset.refreshed || ''")
    browser.eval(f"document.querySelector('[data-view={name}]').click(); true")
    browser.eval(until(f"!document.getElementById('view-{name}').hidden"))
    browser.eval(until(f"(document.body.dataset.refreshed || '').startsWith('{name}:')"
                       f" && document.body.dataset.refreshed !== {js(before)}"))


def keep_publishing(port, destination, stop):
    """Persistent STOMP sends, a few a second, until `stop` is set: traffic
    for the rates chart."""
    conn = stomp.Connection12([("127.0.0.1", port)], heartbeats=(0, 0))
    conn.connect(wait=True)
    try:
        while not stop.is_set():
            conn.send(destination, "tick", headers={"persistent": "true"})
            time.sleep(0.05)
    finally:
        conn.disconnect()


def test_console_logs_in_watches_a_queue_fill_purges_it_closes_a_connection_and_manages_users(
        broker, results):
    name = f"console-{uniq()}"
    client_id = f"stomp-{uniq()}"
    session_id = f"mqtt-{uniq()}"
    new_user = f"user-{uniq()}"
    new_role = f"role-{uniq()}"
    conn = stomp.Connection12([("127.0.0.1", broker.ports["stomp"])], heartbeats=(0, 0), auto_decode=False)
    listener = Listener()
    conn.set_listener("l", listener)
    conn.connect(wait=True, headers={"client-id": client_id})

    # A persistent MQTT session with a subscription, its client gone.
    mqtt = paho.Client(paho.CallbackAPIVersion.VERSION2, client_id=session_id, clean_session=False)
    mqtt.connect("127.0.0.1", broker.ports["mqtt"])
    mqtt.loop_start()
    subscribed = threading.Event()
    mqtt.on_subscribe = lambda *a: subscribed.set()
    mqtt.subscribe("console/session/#", qos=1)
    assert subscribed.wait(TIMEOUT_S)
    mqtt.disconnect()
    mqtt.loop_stop()

    url = f"http://127.0.0.1:{broker.ports['admin']}/"
    browser = Browser(url, ready="document.body && document.body.dataset.ready === '1'")
    steps = Steps(browser, results)
    stop = threading.Event()
    try:
        # Wrong password: refused, still on the login form, no browser dialog.
        browser.eval(f"document.getElementById('login-user').value = {js(ADMIN_USER)};"
                     "document.getElementById('login-password').value = 'wrong';"
                     "document.getElementById('login-submit').click(); true")
        status = browser.eval(until("document.getElementById('status').textContent"))
        assert "401" in status
        steps.shot("login-refused")
        browser.eval(f"document.getElementById('login-password').value = {js(ADMIN_PASSWORD)};"
                     "document.getElementById('login-submit').click(); true")
        browser.eval(until("!document.getElementById('nav').hidden"))

        # Overview: the rates chart moves while messages flow.
        publisher = threading.Thread(target=keep_publishing,
                                     args=(broker.ports["stomp"], f"/queue/rates-{name}", stop))
        publisher.start()
        chart = "document.getElementById('rates-chart')"
        # Three readings at least, so that the chart shows a line, not a point.
        browser.eval(until(f"Number({chart}.dataset.max) > 0 && Number({chart}.dataset.samples) >= 3"))
        assert browser.eval(f"{chart}.querySelectorAll('polyline').length") >= 1
        # The broker reports its own rates (overview messages.rates).
        assert browser.eval(f"{chart}.dataset.source") == "server"
        steps.shot("overview-rates")
        stop.set()
        publisher.join(TIMEOUT_S)

        # Queues: the row fills as the test publishes.
        view(browser, "queues")
        row = f"document.querySelector('tr[data-queue={js(name)}]')"
        depth = f"{row} && {row}.querySelector('[data-field=depth]').textContent"
        conn.send(f"/queue/{name}", "m0", headers={"persistent": "true"})
        browser.eval(until(f"{depth} === '1'"))
        steps.shot("queue-filling")
        for i in (1, 2):
            conn.send(f"/queue/{name}", f"m{i}", headers={"persistent": "true"})
        browser.eval(until(f"{depth} === '3'"))
        steps.shot("queue-filled")
        browser.eval(f"{row}.querySelector('[data-action=peek]').click(); true")
        peeked = browser.eval(until("document.getElementById('peek').textContent"))
        assert "m0" in peeked and "m2" in peeked
        # The queue's own rates, from its second look on.
        browser.eval(until(f"{row}.querySelector('[data-field=in_rate]').textContent !== '-'"))
        browser.eval(f"{row}.querySelector('[data-action=purge]').click(); true")
        browser.eval(until(f"{depth} === '0'"))
        assert api(broker, f"/api/v1/queues/{name}")["depth"] == 0
        steps.shot("queue-purged")

        # Create a queue through the form, and move messages into it.
        created = f"created-{uniq()}"
        created_row = f"document.querySelector('tr[data-queue={js(created)}]')"
        browser.eval(f"document.getElementById('queue-name').value = {js(created)};"
                     "document.getElementById('queue-durable').checked = false;"
                     "document.querySelector('#queue-create button[type=submit]').click(); true")
        browser.eval(until(created_row))
        assert api(broker, f"/api/v1/queues/{created}")["durable"] is False
        steps.shot("queue-created")
        for i in (3, 4):
            conn.send(f"/queue/{name}", f"m{i}", headers={"persistent": "true"})
        browser.eval(until(f"{depth} === '2'"))
        browser.eval(f"document.getElementById('move-to').value = {js(created)};"
                     f"{row}.querySelector('[data-action=move]').click(); true")
        browser.eval(until(f"{created_row} && {created_row}.querySelector('[data-field=depth]').textContent === '2'"
                           f" && {depth} === '0'"))
        assert api(broker, f"/api/v1/queues/{created}")["depth"] == 2
        steps.shot("queue-moved")

        # Replay the dead-letter queue: its message goes back to its queue.
        source = f"replayed-{uniq()}"
        dead_letter(broker.ports["stomp"], source)
        dlq_row = "document.querySelector('tr[data-queue=DLQ]')"
        source_depth = (f"document.querySelector('tr[data-queue={js(source)}]') && document.querySelector("
                        f"'tr[data-queue={js(source)}]').querySelector('[data-field=depth]').textContent")
        browser.eval(until(f"{dlq_row} && {dlq_row}.querySelector('[data-field=depth]').textContent === '1'"))
        steps.shot("dead-letter")
        browser.eval(f"{dlq_row}.querySelector('[data-action=replay]').click(); true")
        browser.eval(until(f"{source_depth} === '1'"))
        assert api(broker, "/api/v1/queues/DLQ")["depth"] == 0
        assert api(broker, f"/api/v1/queues/{source}")["depth"] == 1
        steps.shot("dead-letters-replayed")

        # Connections: close the STOMP client with a reason.
        reason = f"console test {uniq()}"
        view(browser, "connections")
        conn_row = f"document.querySelector('tr[data-client-id={js(client_id)}]')"
        browser.eval(until(conn_row))
        steps.shot("connections")
        browser.eval(f"document.getElementById('close-reason').value = {js(reason)};"
                     f"{conn_row}.querySelector('[data-action=close]').click(); true")
        browser.eval(until(f"!{conn_row}"))
        error = listener.errors.get(timeout=TIMEOUT_S)
        assert error.headers.get("message") == reason
        listed = api(broker, "/api/v1/connections")["items"]
        assert all(c["client_id"] != client_id for c in listed), listed
        steps.shot("connection-closed")

        # Sessions: the MQTT client's persistent session, deleted.
        view(browser, "sessions")
        session_row = f"document.querySelector('tr[data-session={js(session_id)}]')"
        browser.eval(until(session_row))
        assert browser.eval(f"{session_row}.querySelector('[data-field=connected]').textContent") == "no"
        steps.shot("sessions")
        browser.eval(f"{session_row}.querySelector('[data-action=delete]').click(); true")
        browser.eval(until(f"!{session_row}"))
        assert api_status(broker, f"/api/v1/sessions/{session_id}") == 404
        steps.shot("session-deleted")

        # Streams: a stream read by a consumer group that acknowledged one
        # of three, so its row shows a lag of two.
        stream, group = f"console-stream-{uniq()}", f"console-group-{uniq()}"
        reader = stomp.Connection12([("127.0.0.1", broker.ports["stomp"])], heartbeats=(0, 0),
                                    auto_decode=False)
        read = Listener()
        reader.set_listener("l", read)
        reader.connect(wait=True)
        try:
            for i in range(3):
                reader.send(f"/queue/{stream}", f"s{i}", headers={"x-queue-type": "stream"})
            reader.subscribe(f"/queue/{stream}", id="g", ack="client-individual",
                             headers={"x-stream-group": group, "x-stream-offset": "first"})
            got = [read.messages.get(timeout=TIMEOUT_S) for _ in range(3)]
            reader.ack(got[0].headers["ack"])
            view(browser, "streams")
            stream_row = f"document.querySelector('tr[data-stream={js(stream)}][data-group={js(group)}]')"
            lag = browser.eval(until(f"{stream_row} && {stream_row}.querySelector('[data-field=lag]')"
                                     ".textContent === '2' && 'two behind'"))
            assert lag == "two behind"
            assert browser.eval(f"{stream_row}.querySelector('[data-field=messages]').textContent") == "3"
            steps.shot("streams")
        finally:
            reader.disconnect()

        # Roles: the three built-in ones, each with the routes it may call.
        view(browser, "roles")
        builtin = browser.eval(until(
            "document.querySelectorAll('tr[data-builtin=true]').length === 3 &&"
            " [...document.querySelectorAll('tr[data-builtin=true]')].map(r => r.dataset.role)"))
        assert sorted(builtin) == ["administrator", "management", "monitoring"]
        steps.shot("roles")

        # Define a role with a deny rule and an admin right through the form.
        role_row = f"document.querySelector('tr[data-role={js(new_role)}]')"
        browser.eval(f"document.getElementById('role-name').value = {js(new_role)};"
                     "document.getElementById('role-admin').value = 'monitoring';"
                     "document.getElementById('role-publish').value = '/topic/console/#';"
                     "document.getElementById('role-deny-subscribe').value = '/topic/console/secret';"
                     "document.querySelector('#role-define button[type=submit]').click(); true")
        admin_cell = browser.eval(until(f"{role_row} && {role_row}.querySelector('[data-field=admin]').textContent"))
        assert admin_cell == "monitoring"
        defined = api(broker, f"/api/v1/roles/{new_role}")
        assert defined["builtin"] is False and defined["admin"] == "monitoring", defined
        assert defined["publish"] == ["/topic/console/#"], defined
        assert defined["subscribe"] is None, defined
        assert defined["deny_subscribe"] == ["/topic/console/secret"], defined
        steps.shot("role-defined")
        # Edit fills the form with the definition; saving replaces it whole.
        browser.eval(f"{role_row}.querySelector('[data-action=edit]').click(); true")
        assert browser.eval("document.getElementById('role-publish').value") == "/topic/console/#"
        browser.eval("document.getElementById('role-admin').value = '';"
                     "document.querySelector('#role-define button[type=submit]').click(); true")
        browser.eval(until(f"{role_row} && {role_row}.querySelector('[data-field=admin]').textContent === '-'"))
        edited = api(broker, f"/api/v1/roles/{new_role}")
        assert edited["admin"] is None and edited["deny_subscribe"] == ["/topic/console/secret"], edited

        # Users: add one holding the defined role and a built-in one; its
        # permissions are its own and its role's; it can then read the API.
        view(browser, "users")
        option = f"document.querySelector('#user-roles input[value={js(new_role)}]')"
        browser.eval(until(option))
        browser.eval(f"document.getElementById('user-name').value = {js(new_user)};"
                     "document.getElementById('user-password').value = 'new-pw';"
                     f"{option}.checked = true;"
                     "document.querySelector('#user-roles input[value=management]').checked = true;"
                     "document.getElementById('user-subscribe').value = '/queue/console-only';"
                     "document.getElementById('user-deny-publish').value = '/topic/console/audit';"
                     "document.querySelector('#user-add button[type=submit]').click(); true")
        user_row = f"document.querySelector('tr[data-user={js(new_user)}]')"
        shown = browser.eval(until(f"{user_row} && {user_row}.querySelector('[data-field=roles]').textContent"))
        assert new_role in shown and "management" in shown, shown
        assert browser.eval(f"{user_row}.querySelector('[data-field=admin]').textContent") == "management"
        stored = api(broker, f"/api/v1/users/{new_user}")
        assert sorted(stored["roles"]) == sorted([new_role, "management"]), stored
        assert stored["subscribe"] == ["/queue/console-only"], stored
        assert stored["publish"] == ["/topic/console/#"], stored
        assert stored["deny_publish"] == ["/topic/console/audit"], stored
        assert stored["deny_subscribe"] == ["/topic/console/secret"], stored
        assert api_status(broker, "/api/v1/overview", user=new_user, password="new-pw") == 200
        steps.shot("user-added")

        # Change it: its password, its roles, its own permissions.
        browser.eval(f"{user_row}.querySelector('[data-action=edit]').click(); true")
        browser.eval(until("!document.getElementById('user-change').hidden"))
        assert browser.eval("document.getElementById('change-subscribe').value") == "/queue/console-only"
        browser.eval("document.getElementById('change-password').value = 'changed-pw';"
                     "document.getElementById('change-password-submit').click(); true")
        browser.eval(until("document.getElementById('status').textContent.includes('password changed')"))
        assert api_status(broker, "/api/v1/overview", user=new_user, password="changed-pw") == 200
        assert api_status(broker, "/api/v1/overview", user=new_user, password="new-pw") == 401
        browser.eval("document.querySelector('#change-roles input[value=management]').checked = false;"
                     "document.querySelector('#change-roles input[value=monitoring]').checked = true;"
                     "document.getElementById('change-roles-submit').click(); true")
        browser.eval(until(f"{user_row}.querySelector('[data-field=admin]').textContent === 'monitoring'"))
        assert sorted(api(broker, f"/api/v1/users/{new_user}")["roles"]) == sorted(["monitoring", new_role])
        browser.eval("document.getElementById('change-deny-subscribe').value = '/topic/console/private';"
                     "document.getElementById('change-permissions-submit').click(); true")
        browser.eval(until(f"{user_row}.querySelector('[data-field=deny_subscribe]').textContent"
                           ".includes('/topic/console/private')"))
        changed = api(broker, f"/api/v1/users/{new_user}")
        assert changed["own"]["deny_subscribe"] == ["/topic/console/private"], changed
        assert changed["own"]["subscribe"] == ["/queue/console-only"], changed
        assert changed["own"]["deny_publish"] == ["/topic/console/audit"], changed
        steps.shot("user-changed")

        # A role its users still hold is not removed: the API's 409 shows.
        view(browser, "roles")
        holders = browser.eval(f"{role_row}.querySelector('[data-field=users]').textContent")
        assert holders == new_user, holders
        browser.eval("document.getElementById('status').textContent = ''; true")
        browser.eval(f"{role_row}.querySelector('[data-action=delete]').click(); true")
        refused = browser.eval(until("document.getElementById('status').textContent"))
        assert "409" in refused and new_user in refused, refused
        assert api_status(broker, f"/api/v1/roles/{new_role}") == 200
        steps.shot("role-in-use")

        view(browser, "users")
        browser.eval(until(user_row))
        browser.eval(f"{user_row}.querySelector('[data-action=delete]').click(); true")
        browser.eval(until(f"!{user_row}"))
        assert api_status(broker, f"/api/v1/users/{new_user}") == 404
        steps.shot("user-deleted")

        view(browser, "roles")
        browser.eval(until(role_row))
        browser.eval(f"{role_row}.querySelector('[data-action=delete]').click(); true")
        browser.eval(until(f"!{role_row}"))
        assert api_status(broker, f"/api/v1/roles/{new_role}") == 404
        steps.shot("role-removed")

        # The demo client: the link goes to the broker's HTTP port, whose
        # page connects over MQTT/WebSocket and round-trips a message.
        demo = f"http://127.0.0.1:{broker.ports['websocket']}/"
        assert browser.eval(until("!document.getElementById('demo').hidden"
                                  " && document.getElementById('demo').href")) == demo
        browser.eval("setTimeout(() => { location.href = document.getElementById('demo').href; }, 0); true")
        after_navigation(browser, "document.title === 'Rosetta broker demo'"
                                  " && document.getElementById('log').textContent.includes('received on')")
        steps.shot("demo")
    finally:
        stop.set()
        browser.close()
        try:
            conn.disconnect()
        except Exception:
            pass
    assert len(list(results.glob("*.png"))) >= steps.n
