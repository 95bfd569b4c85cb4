#!/usr/bin/python3
"""Turns what ab.sh collected into build-bench/ab.md: for each row, the
base's and the current tree's medians over the rounds, their ratio
(current/base), CPU per request of each (idemproxy, and PostgreSQL), the
host's steal share during the row's slices, and a verdict.

--data holds, for every slice, ROW.SIDE.ROUND.sum ("requests duration_us
errors"), .hist ("microseconds count"), .cpu and .pgcpu ("cpu_seconds
requests") and .steal ("steal_ticks total_ticks"), as run.sh writes them.

The verdict: a row is a regression when every slice of the current tree
is worse than every slice of the base by more than LIMIT (10 %): a lower
rate (throughput rows), a higher p50 (the one-connection row), or more
idemproxy CPU per request (every row). Two slices of identical binaries
(an A/A run, BENCH_BASE=HEAD) differ by 50 % and more on a busy shared
machine, so a ratio of medians proves nothing alone; a complete
separation of the two sides does: if the slices were noise around one
value, all n of one side would fall below all n of the other with a
chance of 1 / C(2n, n) (1/6 for 2 rounds, 1/20 for 3, 1/70 for 4)."""
import argparse
import math
import os
import statistics
import sys

from report import load_hist, percentile

LIMIT = 0.10
ROWS = [
    ("fresh-c16", "fresh keys, 16 connections", "rate"),
    ("replay-c16", "replays from the replay cache, 16 connections", "rate"),
    ("replay-c16-store", "replays from the store (replay_cache_size = 0), 16 connections", "rate"),
    ("fresh-c1", "fresh keys, 1 connection", "p50"),
]
SIDES = ("base", "cur")


def read_pairs(path):
    """The lines of PATH as lists of numbers (none if it is missing)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [[float(x) for x in line.split()] for line in f if line.strip()]


def slice_stats(data, rid):
    """One slice: rate (req/s), p50 (us), CPU seconds and requests of the
    proxy and of PostgreSQL, steal and total ticks; None if it did not run."""
    base = os.path.join(data, rid)
    s = read_pairs(base + ".sum")
    if not s:
        return None
    n, dur_us = s[0][0], s[0][1]
    cpu = read_pairs(base + ".cpu") or [[0, 0]]
    pg = read_pairs(base + ".pgcpu") or [[0, 0]]
    st = read_pairs(base + ".steal") or [[0, 0]]
    hist = load_hist(base + ".hist") if os.path.exists(base + ".hist") else []
    return {"rate": n / (dur_us / 1e6) if dur_us else 0.0,
            "p50": percentile(hist, 50), "n": n,
            "cpu": cpu[0][0], "cpu_n": cpu[0][1],
            "pg": pg[0][0], "pg_n": pg[0][1],
            "steal": st[0][0], "ticks": st[0][1]}


def per_request_us(slices, key):
    """CPU microseconds per request over all the slices of one side."""
    t = sum(s[key] for s in slices)
    n = sum(s[key + "_n"] for s in slices)
    return t / n * 1e6 if n else 0.0


def judge(metric, base, cur):
    """Whether every current value is worse than every base value by more
    than LIMIT."""
    if not base or not cur:
        return False
    if metric == "rate":
        return max(cur) < (1.0 - LIMIT) * min(base)
    return min(cur) > (1.0 + LIMIT) * max(base)


def row_line(data, rounds, row, label, metric):
    got = {side: [slice_stats(data, f"{row}.{side}.{r}")
                  for r in range(1, rounds + 1)] for side in SIDES}
    pairs = [(b, c) for b, c in zip(got["base"], got["cur"]) if b and c]
    if not pairs:
        return f"| {label} | not run | | | | | | | |"
    med = {side: statistics.median(p[i][metric] for p in pairs)
           for i, side in enumerate(SIDES)}
    ratio = med["cur"] / med["base"] if med["base"] else 0.0
    rounds_q = [c[metric] / b[metric] for b, c in pairs if b[metric]]
    cpu = {side: per_request_us([p[i] for p in pairs], "cpu")
           for i, side in enumerate(SIDES)}
    pg = {side: per_request_us([p[i] for p in pairs], "pg")
          for i, side in enumerate(SIDES)}
    cpu_slices = {side: [p[i]["cpu"] / p[i]["cpu_n"] for p in pairs if p[i]["cpu_n"]]
                  for i, side in enumerate(SIDES)}
    cpu_ratio = cpu["cur"] / cpu["base"] if cpu["base"] else 0.0
    why = []
    if judge(metric, [b[metric] for b, _ in pairs], [c[metric] for _, c in pairs]):
        why.append("rate" if metric == "rate" else "p50")
    if judge("cpu", cpu_slices["base"], cpu_slices["cur"]):
        why.append("CPU")
    verdict = f"**regression** ({', '.join(why)})" if why else "within noise"
    steal = sum(s["steal"] for p in pairs for s in p)
    ticks = sum(s["ticks"] for p in pairs for s in p)
    fmt = (lambda v: f"{v:,.0f} req/s") if metric == "rate" else (lambda v: f"{v / 1000:.2f} ms")
    return (f"| {label} | {fmt(med['base'])} | {fmt(med['cur'])} | {ratio:.3f} | "
            f"{' '.join(f'{q:.2f}' for q in rounds_q)} | "
            f"{cpu['base']:.0f} / {pg['base']:.0f} | {cpu['cur']:.0f} / {pg['cur']:.0f} "
            f"(proxy {cpu_ratio:.2f}x) | "
            f"{100.0 * steal / ticks if ticks else 0.0:.1f} % | {verdict} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, required=True)
    ap.add_argument("--duration", required=True)
    ap.add_argument("--workers", required=True)
    ap.add_argument("--base", required=True)
    ap.add_argument("--current", required=True)
    ap.add_argument("--load", default="")
    ap.add_argument("--cpus", default="")
    ap.add_argument("--failures", default="")
    a = ap.parse_args()
    out = [
        f"# A/B: base {a.base} against the current tree {a.current}",
        "",
        f"{a.rounds} rounds of {a.duration} s slices, base and current "
        "interleaved (A B, then B A); one PostgreSQL (fsync and "
        "synchronous_commit on), one stub upstream, a database per side; "
        f"{a.workers} workers; {a.cpus} CPUs, load average {a.load}.",
        "",
        "| row | base | current | current/base | per round | CPU/req base (proxy / PG, us) "
        "| CPU/req current (proxy / PG, us) | steal | verdict |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row, label, metric in ROWS:
        out.append(row_line(a.data, a.rounds, row, label, metric))
    out += [
        "",
        "Rates are the median over the rounds of each slice's requests per "
        "second; the one-connection row compares the median of each slice's "
        "p50. CPU per request: idemproxy's own CPU and PostgreSQL's (the "
        "postmaster and all its children), over all the side's slices. "
        "Steal: the host's steal time as a share of all CPU time during the "
        "row's slices (/proc/stat); above a few per cent, rates say more "
        "about the neighbours than about the code.",
        "",
        f"Verdict: **regression** when every slice of the current tree is worse "
        f"than every slice of the base by more than {LIMIT:.0%}: a lower rate, a "
        "higher p50, or more idemproxy CPU per request. Otherwise within noise. "
        "Were the slices noise around one value, such a separation would "
        f"happen by chance once in {math.comb(2 * a.rounds, a.rounds)} runs "
        f"at {a.rounds} rounds (BENCH_AB_ROUNDS); two slices of one binary "
        "differ by 50 % and more on a busy shared machine, so the ratio of "
        "the medians alone proves nothing.",
    ]
    fails = [f for f in a.failures.splitlines() if f]
    if fails:
        out += ["", "Checks failed:", ""] + [f"- {f}" for f in fails]
    text = "\n".join(out) + "\n"
    sys.stdout.write(text)
    with open(a.out, "w") as f:
        f.write(text)


if __name__ == "__main__":
    main()
