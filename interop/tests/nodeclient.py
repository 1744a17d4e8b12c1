"""Runs interop/node/client.js (mqtt.js, @stomp/stompjs, rhea) as a
subprocess and returns its JSON result."""

import base64
import json
import subprocess
import threading

from conftest import NODE_DIR


def spec_for(broker, lib, **kw):
    port = {"mqtt": broker.mqtt_port, "stomp": broker.stomp_port, "rhea": broker.amqp_port}[lib]
    spec = {"lib": lib, "host": broker.host, "port": port}
    if "payloads" in kw:
        kw["payloads"] = [base64.b64encode(p).decode() for p in kw["payloads"]]
    spec.update(kw)
    return spec


def _parse(stdout):
    lines = [l for l in stdout.splitlines() if l.strip().startswith("{")]
    res = json.loads(lines[-1]) if lines else {"ok": False, "error": "no output"}
    for r in res.get("received", []) or []:
        r["body"] = base64.b64decode(r["body"])
    return res


def run(broker, lib, timeout_s=30, **kw):
    spec = spec_for(broker, lib, timeoutMs=int(timeout_s * 1000) - 2000, **kw)
    p = subprocess.run(["node", "client.js", json.dumps(spec)], cwd=NODE_DIR, capture_output=True,
                       text=True, timeout=timeout_s + 5)
    res = _parse(p.stdout)
    res["stderr"] = p.stderr[-2000:]
    return res


class Background:
    """A node subscriber running in the background: ``wait_ready`` returns
    once it is subscribed, ``result`` once it has everything."""

    def __init__(self, broker, lib, timeout_s=30, **kw):
        spec = spec_for(broker, lib, mode="sub", timeoutMs=int(timeout_s * 1000), **kw)
        self.p = subprocess.Popen(["node", "client.js", json.dumps(spec)], cwd=NODE_DIR,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.lines = []
        self.ready = threading.Event()
        self.t = threading.Thread(target=self._read, daemon=True)
        self.t.start()

    def _read(self):
        for line in self.p.stdout:
            self.lines.append(line)
            if '"ready"' in line:
                self.ready.set()
        self.ready.set()

    def wait_ready(self, timeout=15):
        assert self.ready.wait(timeout), "node subscriber never became ready"
        assert any('"ready"' in l for l in self.lines), f"node subscriber failed: {self.lines} {self.p.stderr.read() if self.p.poll() is not None else ''}"

    def result(self, timeout=40):
        self.p.wait(timeout=timeout)
        self.t.join(5)
        res = _parse("".join(self.lines))
        res["stderr"] = self.p.stderr.read()[-2000:]
        return res

    def kill(self):
        if self.p.poll() is None:
            self.p.kill()
            self.p.wait()
