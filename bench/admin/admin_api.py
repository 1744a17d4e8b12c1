#!/usr/bin/env python3
"""Admin API latency with many queues (issue 18): creates QUEUES queues
through `PUT /api/v1/queues/{name}` (several keep-alive connections at
once, so the journal's group commit takes their creations together), then
times SAMPLES requests of each kind over one keep-alive connection:
`/healthz` (no authentication, no broker work: the HTTP round trip on this
machine, measured in the same run as the yardstick), the overview, a plain
page deep in the listing, and a filtered page. Prints one line per kind
with p50, p99 and max in milliseconds and p50 as a multiple of /healthz's.

Only the Python standard library: bench/admin.sh runs it with python3.

    admin_api.py PORT USER PASSWORD [QUEUES] [SAMPLES]
"""

import base64
import http.client
import json
import sys
import threading
import time

CREATORS = 8
TIMEOUT_S = 60


def connection(port):
    return http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)


def request(conn, method, path, auth, body=None):
    headers = {"Authorization": auth}
    if body is not None:
        headers["Content-Type"] = "application/json"
    conn.request(method, path, body=body, headers=headers)
    response = conn.getresponse()
    data = response.read()
    return response.status, data


def create(port, auth, names, failures):
    conn = connection(port)
    for name in names:
        status, data = request(conn, "PUT", f"/api/v1/queues/{name}", auth, b'{"durable": true}')
        if status not in (200, 201):
            failures.append(f"PUT {name}: {status} {data[:200]!r}")
            return
    conn.close()


def percentile(sorted_values, p):
    index = min(len(sorted_values) - 1, int(round(p / 100 * (len(sorted_values) - 1))))
    return sorted_values[index]


def main():
    port, user, password = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    queues = int(sys.argv[4]) if len(sys.argv) > 4 else 100_000
    samples = int(sys.argv[5]) if len(sys.argv) > 5 else 50
    auth = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()

    names = [f"q{i:06d}" for i in range(queues)]
    failures = []
    started = time.monotonic()
    threads = [threading.Thread(target=create, args=(port, auth, names[i::CREATORS], failures))
               for i in range(CREATORS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if failures:
        sys.exit("queue creation failed: " + failures[0])
    took = time.monotonic() - started
    print(f"created {queues} durable queues in {took:.1f} s ({queues / took:.0f}/s, {CREATORS} connections)")

    page = max(1, queues // 100 // 2)
    kinds = [
        ("healthz", "/healthz", None),
        ("overview", "/api/v1/overview", lambda b: b["queues"]["count"] == queues),
        (f"page {page} of 100", f"/api/v1/queues?page={page}&page_size=100",
         # Each item carries its rates, sampled by the request itself.
         lambda b: b["total"] == queues and len(b["items"]) == 100
         and all("window_s" in q["rates"] for q in b["items"])),
        ("filtered page", "/api/v1/queues?name=q0999&page_size=100",
         lambda b: b["total"] == min(100, max(0, queues - 99900))),
    ]
    conn = connection(port)
    base = None
    for label, path, check in kinds:
        times = []
        for _ in range(samples):
            t0 = time.perf_counter()
            status, data = request(conn, "GET", path, auth)
            times.append((time.perf_counter() - t0) * 1000)
            if status != 200:
                sys.exit(f"{path}: {status} {data[:200]!r}")
        if check is not None and not check(json.loads(data)):
            sys.exit(f"{path}: unexpected answer {data[:300]!r}")
        times.sort()
        p50 = percentile(times, 50)
        base = base or p50
        print(f"{label:>18}: p50 {p50:8.2f} ms  p99 {percentile(times, 99):8.2f} ms"
              f"  max {times[-1]:8.2f} ms  ({p50 / base:6.1f}x /healthz)")


if __name__ == "__main__":
    main()
