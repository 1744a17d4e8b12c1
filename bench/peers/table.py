#!/usr/bin/env python3
"""Prints the comparison table from rosetta-load's RESULT lines (JSON lines
on stdin): per scenario, each broker's figures, and Rosetta's ratios against
the faster peer (throughput, p99) and the leaner peer (CPU, RSS)."""
import json
import sys

rows = [json.loads(l) for l in sys.stdin if l.strip()]
scenarios = []
for r in rows:
    if r["scenario"] not in scenarios:
        scenarios.append(r["scenario"])


def fmt(v, spec=".0f"):
    return "-" if v is None else format(v, spec)


def tool_pct(r):
    """The load generator's CPU over the run, in % of one core."""
    if r.get("load_cpu_us") is None or not r.get("elapsed_s"):
        return None
    return r["load_cpu_us"] / 1e4 / r["elapsed_s"]


for sc in scenarios:
    rs = [r for r in rows if r["scenario"] == sc]
    idle = sc.startswith("mqtt-idle")
    print(f"\n== {sc}")
    if idle:
        print(f"{'broker':<10} {'conns':>7} {'RSS/conn B':>11} {'status'}")
    else:
        print(f"{'broker':<10} {'msgs':>8} {'msg/s':>9} {'p50 µs':>9} {'p99 µs':>9} {'CPU µs/msg':>11} {'tool CPU%':>9} {'status'}")
    for r in rs:
        status = "ok" if not r.get("error") else "ERROR " + r["error"]
        if idle:
            print(f"{r['broker']:<10} {r['received']:>7} {fmt(r.get('rss_per_conn_bytes')):>11} {status}")
        else:
            print(f"{r['broker']:<10} {r['received']:>8} {fmt(r['msg_per_s']):>9} {fmt(r['p50_us']):>9} "
                  f"{fmt(r['p99_us']):>9} {fmt(r['cpu_us_per_msg'], '.1f'):>11} {fmt(tool_pct(r)):>9} {status}")
    ros = [r for r in rs if r["broker"] == "rosetta" and not r.get("error")]
    peers = [r for r in rs if r["broker"] != "rosetta" and not r.get("error")]
    if not ros or not peers:
        print("ratios: n/a (rosetta or every peer failed)")
        continue
    ro = ros[0]
    if idle:
        lean = min(peers, key=lambda r: r.get("rss_per_conn_bytes") or float("inf"))
        if lean.get("rss_per_conn_bytes") and ro.get("rss_per_conn_bytes") is not None:
            print(f"rosetta RSS/conn = {ro['rss_per_conn_bytes'] / lean['rss_per_conn_bytes']:.2f} x leaner peer ({lean['broker']})")
        continue
    fast = max(peers, key=lambda r: r["msg_per_s"])
    line = f"rosetta throughput = {ro['msg_per_s'] / fast['msg_per_s']:.2f} x faster peer ({fast['broker']})"
    if ro["p99_us"] and fast["p99_us"]:
        line += f"; p99 = {ro['p99_us'] / fast['p99_us']:.2f} x its p99"
    print(line)
    with_cpu = [r for r in peers if r.get("cpu_us_per_msg")]
    if with_cpu and ro.get("cpu_us_per_msg") is not None:
        lean = min(with_cpu, key=lambda r: r["cpu_us_per_msg"])
        print(f"rosetta CPU/msg = {ro['cpu_us_per_msg'] / lean['cpu_us_per_msg']:.2f} x leaner peer ({lean['broker']})")
