"""Fixtures of the interop suite: a freshly built Rosetta broker on free
loopback ports with a temporary data directory.

The broker binary is ``$ROSETTA_BIN`` (run.sh sets it after
``cargo build --release --locked``), else ``target/release/rosetta``.

``broker`` is one broker for the whole session (most tests only need one);
``fresh_broker`` is a module-scoped one for tests that restart or abuse it
(durability, robustness), so they cannot disturb the others.
"""

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What the broker logs once it is recovered, listening and its admin API
# answers (`rosetta::READY_LOG_LINE` in src/lib.rs).
READY_LOG_LINE = "ready: journal recovered, listeners bound"
INTEROP = ROOT / "interop"
NODE_DIR = INTEROP / "node"

# Test users (the users file is written with the rosetta CLI).
USER = "alice"
PASSWORD = "s3cret-pw"
# May publish and subscribe under /topic/ok/ only.
LIMITED_USER = "bob"
LIMITED_PASSWORD = "pw-bob"

# [broker] connect_timeout_ms, shorter than the 10 s default so that the
# robustness tests prove the key is honoured (and run faster).
CONNECT_TIMEOUT_MS = 3_000

# Payloads up to 16 MiB pass every protocol with the broker's defaults
# (`[broker] payload_size_max_bytes`): the config below sets no size limit.
SIZE_MAX_BYTES = 16 * 1024 * 1024

# Static bindings (MQTT publishers reach queues only through them): the
# topic ``bq/<i>`` feeds the queue ``bq<i>``. Tests take indexes with
# ``BoundQueues.take``.
BOUND_QUEUES = 64


def rosetta_bin() -> Path:
    env = os.environ.get("ROSETTA_BIN")
    path = Path(env) if env else ROOT / "target" / "release" / "rosetta"
    if not path.exists():
        pytest.exit(f"broker binary {path} missing: run interop/run.sh (it builds it)", returncode=3)
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Broker:
    """One broker process with fixed ports and data directory, so that a
    restart finds its journal again and clients reconnect to the same ports."""

    def __init__(self, name: str, extra_config: str = "", websocket: bool = False, admin: bool = False):
        """``extra_config`` is appended to the configuration file (sections
        the template does not write, e.g. ``[store]``); ``websocket`` opens
        the HTTP/WebSocket listener, which also serves ``/metrics``."""
        self.extra_config = extra_config
        self.dir = Path(tempfile.mkdtemp(prefix=f"rosetta-interop-{name}-"))
        self.data_dir = self.dir / "data"
        self.config = self.dir / "rosetta.toml"
        self.users_file = self.dir / "users.toml"
        self.log_path = self.dir / "broker.log"
        self.host = "127.0.0.1"
        self.mqtt_port = free_port()
        self.stomp_port = free_port()
        self.amqp_port = free_port()
        self.http_port = free_port() if websocket else None
        # The admin API is off unless asked for: brokers run side by side
        # here, and its default port (8161) would be shared.
        self.admin_port = free_port() if admin else None
        self.proc = None
        self._log = None
        self.starts = 0
        self._write_config()
        for name, pw, patterns in [(USER, PASSWORD, []),
                                   (LIMITED_USER, LIMITED_PASSWORD,
                                    ["--publish", "/topic/ok/#", "--subscribe", "/topic/ok/#"])]:
            subprocess.run(
                [str(rosetta_bin()), "--config", str(self.config), "user", "add", name, "--password", pw, *patterns],
                check=True,
                capture_output=True,
            )

    def _write_config(self):
        bindings = "".join(
            f'\n[[bindings]]\nqueue = "bq{i}"\nfilter = "bq/{i}"\n' for i in range(BOUND_QUEUES)
        )
        self.config.write_text(
            f"""# Written by interop/tests/conftest.py
data_dir = "{self.data_dir}"

[listeners]
mqtt = "127.0.0.1:{self.mqtt_port}"
stomp = "127.0.0.1:{self.stomp_port}"
amqp = "127.0.0.1:{self.amqp_port}"
websocket = "{f'127.0.0.1:{self.http_port}' if self.http_port else ''}"
mqtts = ""
stomps = ""
amqps = ""
wss = ""
any = ""

[broker]
connect_timeout_ms = {CONNECT_TIMEOUT_MS}
shutdown_grace_ms = 1000

[security]
anonymous = true
users_file = "{self.users_file}"

[mqtt]
receive_maximum = 1024

[stomp]
heartbeat_send_ms = 0
heartbeat_receive_ms = 0

[admin]
listen = "{f'127.0.0.1:{self.admin_port}' if self.admin_port else ''}"
{bindings}
{self.extra_config}"""
        )

    def ports(self):
        ports = {"mqtt": self.mqtt_port, "stomp": self.stomp_port, "amqp": self.amqp_port}
        if self.http_port:
            ports["http"] = self.http_port
        return ports

    def metrics(self) -> dict:
        """``GET /metrics`` as {'name{labels}': value} (needs ``websocket``)."""
        import urllib.request
        with urllib.request.urlopen(f"http://{self.host}:{self.http_port}/metrics", timeout=5) as r:
            text = r.read().decode()
        values = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                key, _, value = line.rpartition(" ")
                values[key] = float(value)
        return values

    def rss_bytes(self) -> int:
        """The broker process's resident set size."""
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def start(self, timeout=20.0):
        assert self.proc is None
        self._log = open(self.log_path, "ab")
        self._log.write(f"\n===== start {self.starts} =====\n".encode())
        self._log.flush()
        env = dict(os.environ)
        env.setdefault("RUST_LOG", "info")
        self.proc = subprocess.Popen(
            [str(rosetta_bin()), "--config", str(self.config)],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            env=env,
        )
        self.starts += 1
        deadline = time.monotonic() + timeout
        pending = set(self.ports().values())
        while pending:
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker did not listen within {timeout}s:\n{self.log_tail()}")
            for port in list(pending):
                try:
                    socket.create_connection((self.host, port), timeout=0.2).close()
                    pending.discard(port)
                except OSError:
                    pass
            time.sleep(0.05)
        # The admin listener is bound before recovery and answers 503 until
        # the broker is ready: wait for the line that says so.
        while not self._ready_logged():
            if self.proc.poll() is not None:
                raise RuntimeError(f"broker exited with {self.proc.returncode}:\n{self.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"broker not ready within {timeout}s:\n{self.log_tail()}")
            time.sleep(0.05)

    def _ready_logged(self) -> bool:
        """Whether this start's log has the broker's ready line
        (`rosetta::READY_LOG_LINE`)."""
        self._log.flush()
        text = self.log_path.read_text(errors="replace")
        return READY_LOG_LINE in text.rsplit(f"===== start {self.starts - 1} =====", 1)[-1]

    def stop(self, timeout=15.0):
        """SIGTERM (phased shutdown); SIGKILL if it hangs. Returns the exit code."""
        if self.proc is None:
            return None
        self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            rc = self.proc.wait()
        self.proc = None
        self._log.close()
        return rc

    def kill(self):
        """SIGKILL: a crash, no shutdown at all."""
        if self.proc is None:
            return
        self.proc.kill()
        self.proc.wait()
        self.proc = None
        self._log.close()

    def restart(self, hard=False):
        if hard:
            self.kill()
        else:
            self.stop()
        self.start()

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n=40) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def cleanup(self):
        if self.proc is not None:
            self.stop()
        if os.environ.get("INTEROP_KEEP"):
            print(f"kept broker dir {self.dir}")
        else:
            shutil.rmtree(self.dir, ignore_errors=True)


class BoundQueues:
    """Hands out the config's topic->queue bindings, one per test."""

    def __init__(self):
        self.next = 0

    def take(self):
        i = self.next
        self.next += 1
        if i >= BOUND_QUEUES:
            raise RuntimeError("out of bound queues: raise BOUND_QUEUES in conftest.py")
        return f"bq/{i}", f"bq{i}"


def _broker(name):
    b = Broker(name)
    b.start()
    b.bound = BoundQueues()
    return b


@pytest.fixture(scope="session")
def broker():
    b = _broker("session")
    yield b
    alive = b.alive()
    b.cleanup()
    assert alive, "the shared broker died during the session"


@pytest.fixture(scope="module")
def fresh_broker(request):
    b = _broker(request.module.__name__.rsplit(".", 1)[-1])
    yield b
    b.cleanup()


_counter = [0]


@pytest.fixture
def uniq(request):
    """A short name unique in the session, for topics and queues."""
    _counter[0] += 1
    return f"t{os.getpid()}x{_counter[0]}"


def pytest_report_header(config):
    return f"rosetta binary: {os.environ.get('ROSETTA_BIN', ROOT / 'target/release/rosetta')}"
