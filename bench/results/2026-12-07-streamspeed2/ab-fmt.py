import json, sys
r = json.load(sys.stdin)
n = max(r.get("received") or 1, 1)
print(sys.argv[1], f"{r['msg_per_s']:.0f} msg/s", f"broker {r['broker_cpu_us']/n:.3f} us/msg", f"load {r['load_cpu_us']/n:.3f} us/msg")
