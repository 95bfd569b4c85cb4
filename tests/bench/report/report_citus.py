#!/usr/bin/python3
"""The table of citus.sh: each row on the plain store and on Citus (a
coordinator and two workers on this machine), and their ratios. --data
holds what run.sh's functions collect (see report.py), each row's id ending
in -plain or -citus."""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from report import load_rows, ms, us  # noqa: E402

WORKERS = 2


def ratio(a, b, floor=0.0):
    """b / a, or "-" when either is missing or below floor (a replay served
    from the replay cache costs PostgreSQL nearly nothing: no ratio)."""
    return "-" if not a or not b or a < floor or b < floor else "%.2f" % (b / a)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--duration", type=int, default=8)
    ap.add_argument("--cpus", default="?")
    ap.add_argument("--elapsed", type=int, default=0)
    ap.add_argument("--load", default="?")
    ap.add_argument("--failures", default="")
    a = ap.parse_args()
    rows = {r["id"]: r for r in load_rows(a.data)}
    bases = []
    for rid in rows:
        base = rid.rsplit("-", 1)[0]
        if base not in bases:
            bases.append(base)
    out = ["| row | conns | plain req/s | Citus req/s | Citus ÷ plain | "
           "Citus req/s per worker | p50 plain / Citus | p99 plain / Citus | "
           "PostgreSQL CPU per request, plain / Citus (all 3 nodes) | CPU ratio |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    for base in bases:
        p, c = rows.get(base + "-plain"), rows.get(base + "-citus")
        if not p or not c:
            continue
        name = p["scenario"] if p["target"] != "idemproxy" else p["scenario"] + ", idemproxy"
        out.append("| %s | %d | %.0f | %.0f | %s | %.0f | %s / %s | %s / %s | %s / %s | %s |" % (
            name, p["conns"], p["rps"], c["rps"], ratio(p["rps"], c["rps"]),
            c["rps"] / WORKERS, ms(p["p50"]), ms(c["p50"]), ms(p["p99"]), ms(c["p99"]),
            us(p["cpu_pg"]), us(c["cpu_pg"]), ratio(p["cpu_pg"], c["cpu_pg"], 5.0)))
    fails = [f for f in a.failures.splitlines() if f.strip()]
    out.append("")
    out.append("%s cpus, %d s per row and store (two interleaved halves), load average %s, "
               "%d s in all; exactly-once checks: %s." % (
                   a.cpus, a.duration, a.load, a.elapsed,
                   "every one passed" if not fails else "%d FAILED" % len(fails)))
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    with open(a.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
