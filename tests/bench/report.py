#!/usr/bin/python3
"""Turns what run.sh collected into the markdown table and the target
ratios, prints them, and writes them to --out.

--data holds rows.tsv (id, scenario, target, conns, in the order run) and
for each id ID.sum (one "requests duration_us errors" line per slice) and
ID.hist ("microseconds count" lines, merged over the slices), plus rss.tsv
(wanted count, count seen, VmRSS kB)."""
import argparse
import os
import sys


def percentile(hist, p):
    """The smallest latency with at least p% of the samples at or below."""
    total = sum(n for _, n in hist)
    if total == 0:
        return 0.0
    rank = max(1, round(p / 100.0 * total + 0.5))
    seen = 0
    for v, n in hist:
        seen += n
        if seen >= rank:
            return float(v)
    return float(hist[-1][0])


def load_hist(path):
    counts = {}
    with open(path) as f:
        for line in f:
            parts = line.split()
            if len(parts) == 2:
                v, n = int(parts[0]), int(parts[1])
                counts[v] = counts.get(v, 0) + n
    return sorted(counts.items())


def load_rows(data):
    rows = []
    with open(os.path.join(data, "rows.tsv")) as f:
        for line in f:
            parts = line.rstrip("\n").split("\t")
            if len(parts) != 4:
                continue
            rid, scenario, target, conns = parts
            requests = duration = errors = slices = 0
            with open(os.path.join(data, rid + ".sum")) as s:
                for sl in s:
                    r, d, e = (int(x) for x in sl.split())
                    requests += r
                    duration += d
                    errors += e
                    slices += 1
            hist = load_hist(os.path.join(data, rid + ".hist"))
            total = sum(n for _, n in hist)
            rows.append({
                "id": rid, "scenario": scenario, "target": target,
                "conns": int(conns), "requests": requests,
                "rps": requests / (duration / 1e6) if duration else 0.0,
                "p50": percentile(hist, 50), "p99": percentile(hist, 99),
                "mean": sum(v * n for v, n in hist) / total if total else 0,
                "errors": errors, "slices": slices,
            })
    return rows


def load_rss(data):
    out = []
    try:
        with open(os.path.join(data, "rss.tsv")) as f:
            for line in f:
                want, seen, kb = line.split()
                out.append((int(want), int(seen), int(kb)))
    except FileNotFoundError:
        pass
    return out


def load_cpu(data, rid):
    """Microseconds of CPU per request over the slices of a row, or None."""
    seconds = requests = 0
    try:
        with open(os.path.join(data, rid + ".cpu")) as f:
            for line in f:
                s, n = line.split()
                seconds += float(s)
                requests += int(n)
    except FileNotFoundError:
        return None
    return seconds * 1e6 / requests if requests else None


def ms(us):
    v = us / 1000.0
    if v >= 100:
        return "%.0f ms" % v
    if v >= 10:
        return "%.1f ms" % v
    return "%.2f ms" % v


def find(rows, rid):
    for r in rows:
        if r["id"] == rid:
            return r
    return None


def verdict(ok):
    return "met" if ok else "MISSED"


def targets(rows, rss, busy):
    out = ["| target | rule | measured | ratio | verdict |",
           "|---|---|---|---|---|"]
    pg16, f16 = find(rows, "pgbench-c16"), find(rows, "fresh-c16")
    if pg16 and f16:
        ratio = f16["rps"] / pg16["rps"]
        out.append("| fresh keys, 16 conns | idemproxy req/s >= 0.6 x "
                   "pgbench claim+record tps (16 clients) | %.0f vs %.0f | "
                   "%.2f | %s |" % (f16["rps"], pg16["rps"], ratio,
                                    verdict(ratio >= 0.6)))
    r16, n16 = find(rows, "replay-c16"), find(rows, "nginx-replay-c16")
    if r16 and n16:
        ratio = r16["rps"] / n16["rps"]
        out.append("| replays of one key, 16 conns | idemproxy req/s >= "
                   "0.5 x nginx req/s | %.0f vs %.0f | %.2f | %s |"
                   % (r16["rps"], n16["rps"], ratio, verdict(ratio >= 0.5)))
    d1, pg1 = find(rows, "direct-c1"), find(rows, "pgbench-c1")
    for rid, label in (("fresh-c1", "default (busy_poll off)"),
                       ("fresh-c1-busy", "busy_poll " + busy)):
        f1 = find(rows, rid)
        if not (f1 and d1 and pg1):
            continue
        bound = d1["p50"] + 1.5 * pg1["mean"]
        ratio = f1["p50"] / bound
        out.append("| fresh keys, 1 conn, %s | idemproxy p50 <= direct p50 + "
                   "1.5 x pgbench claim+record mean latency (1 client) | "
                   "%s vs %s + 1.5 x %s = %s | %.2f | %s |"
                   % (label, ms(f1["p50"]), ms(d1["p50"]), ms(pg1["mean"]),
                      ms(bound), ratio, verdict(ratio <= 1.0)))
    by_count = {want: (seen, kb) for want, seen, kb in rss}
    if 20000 in by_count and 200000 in by_count:
        (s1, kb1), (s2, kb2) = by_count[20000], by_count[200000]
        ratio = kb2 / kb1
        out.append("| memory, mixed load, 16 conns | VmRSS after 200,000 "
                   "requests within 10%% of after 20,000 | %d kB (at %d) vs "
                   "%d kB (at %d) | %.3f | %s |"
                   % (kb2, s2, kb1, s1, ratio,
                      verdict(abs(ratio - 1.0) <= 0.10)))
    else:
        reached = max((s for _, s, _ in rss), default=0)
        out.append("| memory, mixed load, 16 conns | VmRSS after 200,000 "
                   "requests within 10%% of after 20,000 | only %d requests "
                   "in the time allowed | - | MISSED |" % reached)
    return "\n".join(out) + "\n"


def table(rows):
    out = ["| scenario | target | conns | req/s | p50 | p99 | errors |",
           "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        scenario = r["scenario"]
        if r["slices"] > 1:
            scenario += " *"
        out.append("| %s | %s | %d | %.0f | %s | %s | %d |"
                   % (scenario, r["target"], r["conns"], r["rps"],
                      ms(r["p50"]), ms(r["p99"]), r["errors"]))
    return "\n".join(out) + "\n"


def notes(rows, rss, a):
    out = ["- \\* interleaved with the other side of its target ratio, in "
           "halves (A B A B); percentiles from the merged histograms. wrk's "
           "latencies include its correction for coordinated omission; "
           "pgbench's are its per-transaction log (one claim+record pair, "
           "or one replay claim)."]
    warn, info = find(rows, "fresh-c16-warn"), find(rows, "fresh-c16-info")
    if warn and info:
        out.append("- log_level: every other idemproxy row uses \"warn\" "
                   "(no line per request). The pair of 16-connection "
                   "fresh-key runs on one process: warn %.0f req/s, p50 %s; "
                   "info %.0f req/s, p50 %s (info/warn = %.2f)."
                   % (warn["rps"], ms(warn["p50"]), info["rps"],
                      ms(info["p50"]), info["rps"] / warn["rps"]))
    r16, pr16 = find(rows, "replay-c16"), find(rows, "pgbench-replay-c16")
    n16 = find(rows, "nginx-replay-c16")
    if r16 and pr16 and n16:
        out.append("- replays, 16 conns: the replay claim alone (pgbench, "
                   "16 clients) made %.0f tps = %.2f x nginx; idemproxy "
                   "made %.2f x the bare claim."
                   % (pr16["rps"], pr16["rps"] / n16["rps"],
                      r16["rps"] / pr16["rps"]))
    cpu = [(r, load_cpu(a.data, r["id"])) for r in rows
           if r["id"] in ("fresh-c1", "fresh-c1-busy")]
    cpu = [(r, c) for r, c in cpu if c]
    if cpu:
        out.append("- CPU time of idemproxy per request at 1 connection "
                   "(user + system, from /proc): " + "; ".join(
                       "%s %.0f us" % (r["scenario"], c) for r, c in cpu) +
                   ". busy_poll trades CPU for latency; it is off by "
                   "default.")
    if rss:
        out.append("- VmRSS under the mixed load (fresh process): " +
                   ", ".join("%d kB at %d requests" % (kb, seen)
                             for _, seen, kb in rss) + ".")
    out.append("- %s idemproxy workers, %s s per run, PostgreSQL with fsync "
               "and synchronous_commit on; errors counts answers >= 400 "
               "and socket errors (pgbench: failed transactions)."
               % (a.workers, a.duration))
    out.append("- whole run: %d s; load average at the start / end: %s "
               "(%s cpus, shared with everything else running)."
               % (a.elapsed, a.load, a.cpus))
    fails = [f for f in a.failures.split("\n") if f.strip()]
    if fails:
        out.append("- CHECKS FAILED:")
        out.extend("  - " + f for f in fails)
    else:
        out.append("- exactly-once checks: passed (no key reached the "
                   "upstream twice; every forward reached it once).")
    return "\n".join(out) + "\n"


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--workers", default="?")
    p.add_argument("--duration", default="?")
    p.add_argument("--elapsed", type=int, default=0)
    p.add_argument("--load", default="?")
    p.add_argument("--cpus", default="?")
    p.add_argument("--failures", default="")
    p.add_argument("--busy", default="?")
    a = p.parse_args()
    rows = load_rows(a.data)
    rss = load_rss(a.data)
    text = ("# idemproxy benchmark\n\n" + table(rows) + "\n## Targets\n\n"
            + targets(rows, rss, a.busy) + "\n## Notes\n\n"
            + notes(rows, rss, a))
    with open(a.out, "w") as f:
        f.write(text)
    sys.stdout.write("\n" + text)


if __name__ == "__main__":
    main()
