"""The web console (issue 18) in Debian's headless Chromium, driven by
playwright-core (driver.mjs): the broker binary serves the console from its
admin listener; the test logs in as an administrator, sees a queue that a
real STOMP client (stomp.py) filled, purges it, and closes the STOMP
client's connection with a reason, then checks what the admin API (and the
closed client) report. The broker is started and stopped by the test.

Run through run.sh (or its pytest with ROSETTA_BIN pointing at a build).
"""

import base64
import json
import queue
import subprocess
import time
import urllib.error
import urllib.request

import pytest
import stomp

from test_browser import TIMEOUT_S, Broker, Browser, js, uniq

ADMIN_USER, ADMIN_PASSWORD = "admin", "console-pw"


def add_admin(binary, config):
    users = config.parent / "users.toml"
    subprocess.run([binary, "--config", str(config), "user", "add", ADMIN_USER,
                    "--password", ADMIN_PASSWORD, "--role", "administrator",
                    "--users-file", str(users)], check=True, capture_output=True)


@pytest.fixture(scope="module")
def broker():
    b = Broker(extra_ports=("admin",),
               extra_config='users_file = "{dir}/users.toml"\n\n[admin]\nlisten = "127.0.0.1:{admin}"\n',
               prepare=add_admin)
    yield b
    b.stop()


def api(broker, path, method="GET"):
    """The admin API, as the test's own witness of what the console did."""
    req = urllib.request.Request(f"http://127.0.0.1:{broker.ports['admin']}{path}", method=method)
    pair = base64.b64encode(f"{ADMIN_USER}:{ADMIN_PASSWORD}".encode()).decode()
    req.add_header("Authorization", f"Basic {pair}")
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as r:
        body = r.read()
        return json.loads(body) if body else None


def until(condition):
    """A page expression that waits for `condition` (a JS expression) to be
    truthy, and yields its value."""
    return (f"(async () => {{ const end = Date.now() + {TIMEOUT_S * 1000};"
            f" while (Date.now() < end) {{ const v = ({condition}); if (v) return v;"
            f" await new Promise(r => setTimeout(r, 100)); }}"
            f" throw new Error('timed out waiting for: ' + {js(condition)}); }})()")


class Listener(stomp.ConnectionListener):
    def __init__(self):
        self.errors = queue.Queue()

    def on_error(self, frame):
        self.errors.put(frame)


def test_console_logs_in_sees_a_filled_queue_purges_it_and_closes_a_connection(broker):
    name = f"console-{uniq()}"
    client_id = f"stomp-{uniq()}"
    conn = stomp.Connection12([("127.0.0.1", broker.ports["stomp"])], heartbeats=(0, 0), auto_decode=False)
    listener = Listener()
    conn.set_listener("l", listener)
    conn.connect(wait=True, headers={"client-id": client_id})
    for i in range(3):
        conn.send(f"/queue/{name}", f"m{i}", headers={"persistent": "true", "receipt": f"r{i}"})
    # The depth the console must show, seen by the API first (the sends
    # are asynchronous).
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            if api(broker, f"/api/v1/queues/{name}")["depth"] == 3:
                break
        except urllib.error.HTTPError:
            pass
        time.sleep(0.1)
    assert api(broker, f"/api/v1/queues/{name}")["depth"] == 3

    url = f"http://127.0.0.1:{broker.ports['admin']}/"
    browser = Browser(url, ready="document.body && document.body.dataset.ready === '1'")
    try:
        # Wrong password: refused, still on the login form, no browser dialog.
        browser.eval(f"document.getElementById('login-user').value = {js(ADMIN_USER)};"
                     "document.getElementById('login-password').value = 'wrong';"
                     "document.getElementById('login-submit').click(); true")
        status = browser.eval(until("document.getElementById('status').textContent"))
        assert "401" in status
        browser.eval(f"document.getElementById('login-password').value = {js(ADMIN_PASSWORD)};"
                     "document.getElementById('login-submit').click(); true")
        browser.eval(until("!document.getElementById('nav').hidden"))

        # Queues: the row of the filled queue shows its depth.
        browser.eval("document.querySelector('[data-view=queues]').click(); true")
        row = f"document.querySelector('tr[data-queue={js(name)}]')"
        depth = browser.eval(until(f"{row} && {row}.querySelector('[data-field=depth]').textContent"))
        assert depth == "3"
        browser.eval(f"{row}.querySelector('[data-action=peek]').click(); true")
        peeked = browser.eval(until("document.getElementById('peek').textContent"))
        assert "m0" in peeked and "m2" in peeked
        browser.eval(f"{row}.querySelector('[data-action=purge]').click(); true")
        browser.eval(until(f"{row} && {row}.querySelector('[data-field=depth]').textContent === '0'"))
        assert api(broker, f"/api/v1/queues/{name}")["depth"] == 0

        # Connections: close the STOMP client with a reason.
        reason = f"console test {uniq()}"
        browser.eval("document.querySelector('[data-view=connections]').click(); true")
        conn_row = f"document.querySelector('tr[data-client-id={js(client_id)}]')"
        browser.eval(until(conn_row))
        browser.eval(f"document.getElementById('close-reason').value = {js(reason)};"
                     f"{conn_row}.querySelector('[data-action=close]').click(); true")
        browser.eval(until(f"!{conn_row}"))
        error = listener.errors.get(timeout=TIMEOUT_S)
        assert error.headers.get("message") == reason
        listed = api(broker, "/api/v1/connections")["items"]
        assert all(c["client_id"] != client_id for c in listed), listed
    finally:
        browser.close()
        try:
            conn.disconnect()
        except Exception:
            pass
