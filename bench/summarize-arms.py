#!/usr/bin/env python3
"""Medians per (protocol, arm, phase) over every run of every round that
bench/tls-at-rest.sh wrote, and each arm's throughput against the "off" arm."""
import glob
import json
import os
import statistics
import sys

out = sys.argv[1] if len(sys.argv) > 1 else "./tls-at-rest"
rows = {}
for path in glob.glob(os.path.join(out, "round*", "*.jsonl")):
    proto, arm = os.path.basename(path)[: -len(".jsonl")].split("-", 1)
    for line in open(path):
        r = json.loads(line)
        if r["run"] == 0 or not r["what"].startswith(("PUT", "GET")):
            continue
        rows.setdefault((proto, r["what"], arm), []).append(r)

arms = ["off", "at-rest", "tls", "tls+at-rest"]
med = lambda rs, k: statistics.median(x[k] for x in rs if x[k] is not None)
print("| protocol | phase | " + " | ".join(f"{a} GB/s" for a in arms)
      + " | at-rest / off | tls / off | tls+at-rest / off | node CPU s/GiB off → both | client CPU s/GiB off → both | runs |")
print("|---" * (2 + len(arms) + 6) + "|")
for proto in ["cxp1", "http"]:
    for phase in ["PUT durable", "GET cold (flash)", "GET hot (DRAM)"]:
        got = {a: rows.get((proto, phase, a), []) for a in arms}
        if not all(got.values()):
            continue
        gb = {a: med(got[a], "gb_per_s") for a in arms}
        cells = [f"{gb[a]:.3f}" for a in arms]
        cells += [f"{100 * gb[a] / gb['off']:.0f} %" for a in arms[1:]]
        cells.append(f"{med(got['off'], 'node_cpu_s_per_gib'):.2f} → {med(got['tls+at-rest'], 'node_cpu_s_per_gib'):.2f}")
        cells.append(f"{med(got['off'], 'client_cpu_s_per_gib'):.2f} → {med(got['tls+at-rest'], 'client_cpu_s_per_gib'):.2f}")
        cells.append(str(min(len(v) for v in got.values())))
        print(f"| {proto.upper() if proto == 'cxp1' else 'HTTP'} | {phase} | " + " | ".join(cells) + " |")
