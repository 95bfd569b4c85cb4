#!/usr/bin/python3
"""Turns what run.sh collected into the markdown table and the target
ratios, prints them, and writes them to --out.

--data holds rows.tsv (id, scenario, target, conns, in the order run) and
for each id ID.sum (one "requests duration_us errors" line per slice) and
ID.hist ("microseconds count" lines, merged over the slices); where
measured, ID.pgcpu (PostgreSQL) and ID.cpu (the proxy: idemproxy or nginx),
one "cpu_seconds requests" line per slice, and ID.dups (keys the upstream
saw more than once, one line per slice); plus rss.tsv (wanted count, count
seen, VmRSS kB, the replay cache's bytes; counted after the warm-up),
rss-warm.tsv (the same at the end of the warm-up) and rss.dups."""
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
            cpu_pg = load_cpu(data, rid + ".pgcpu")
            cpu_px = load_cpu(data, rid + ".cpu")
            total = sum(n for _, n in hist)
            rows.append({
                "id": rid, "scenario": scenario, "target": target,
                "conns": int(conns), "requests": requests,
                "rps": requests / (duration / 1e6) if duration else 0.0,
                "p50": percentile(hist, 50), "p99": percentile(hist, 99),
                "mean": sum(v * n for v, n in hist) / total if total else 0,
                "errors": errors, "slices": slices,
                "cpu_pg": cpu_pg, "cpu_px": cpu_px,
                "wal": load_per(data, rid + ".wal"),  # bytes per request
                # the host's steal over all the machine's time, from
                # lines "STEAL TOTAL" in ticks
                "steal": load_per(data, rid + ".steal"),
            })
    return rows


# The rows whose ratios are targets (and the busy_poll row run with them).
TARGET_ROWS = ("direct-c1", "raw-c1", "pgbench-c1", "fresh-c1",
               "fresh-c1-busy", "raw-c16", "pgbench-c16", "fresh-c16",
               "raw-c%s", "pgbench-c%s", "fresh-c%s", "nginx-replay-c16",
               "replay-c16")


def load_rss(data, name="rss.tsv"):
    """(wanted, seen, VmRSS kB, cache bytes or None) per line of NAME."""
    out = []
    try:
        with open(os.path.join(data, name)) as f:
            for line in f:
                want, seen, kb, *cache = line.split()
                out.append((want if want == "warm" else int(want), int(seen),
                            int(kb), int(cache[0]) if cache else None))
    except FileNotFoundError:
        pass
    return out


def load_per(data, name):
    """A row's total over its requests, from lines "AMOUNT REQUESTS" (one
    per slice), or None."""
    total = requests = 0
    try:
        with open(os.path.join(data, name)) as f:
            for line in f:
                s, n = line.split()
                total += float(s)
                requests += int(n)
    except FileNotFoundError:
        return None
    return total / requests if requests else None


def load_cpu(data, name):
    """Microseconds of CPU per request over the slices of a row, or None."""
    per = load_per(data, name)
    return per * 1e6 if per is not None else None


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


def load_dups(data):
    """(duplicated keys, slices checked, rows checked) over every *.dups
    (rss.dups, the memory check, counts as a row)."""
    keys = slices = nrows = 0
    for name in sorted(os.listdir(data)):
        if not name.endswith(".dups"):
            continue
        nrows += 1
        with open(os.path.join(data, name)) as f:
            for line in f:
                if line.strip():
                    keys += int(line)
                    slices += 1
    return keys, slices, nrows


def verdict(ok):
    return "met" if ok else "MISSED"


def us(v):
    return "-" if v is None else "%.0f µs" % v


def targets(rows, rss, dups, a):
    out = ["| target | rule | measured | ratio | verdict |",
           "|---|---|---|---|---|"]

    def add(what, rule, measured, ratio, ok):
        out.append("| %s | %s | %s | %.2f | %s |"
                   % (what, rule, measured, ratio, verdict(ok)))

    raw16, f16 = find(rows, "raw-c16"), find(rows, "fresh-c16")
    pg16 = find(rows, "pgbench-c16")
    if raw16 and f16:
        ratio = f16["rps"] / raw16["rps"]
        add("fresh keys, 16 conns", "idemproxy req/s >= 0.75 x the raw "
            "two-commit pair's tps (pgbench, 16 clients)",
            "%.0f vs %.0f" % (f16["rps"], raw16["rps"]), ratio,
            ratio >= 0.75)
        if f16["cpu_pg"] and raw16["cpu_pg"]:
            ratio = f16["cpu_pg"] / raw16["cpu_pg"]
            add("PostgreSQL CPU per fresh key, 16 conns", "<= 1.4 x its "
                "CPU per raw pair (16 clients)", "%s vs %s"
                % (us(f16["cpu_pg"]), us(raw16["cpu_pg"])), ratio,
                ratio <= 1.4)
        if f16["cpu_px"] and raw16["cpu_pg"]:
            ratio = f16["cpu_px"] / raw16["cpu_pg"]
            add("idemproxy CPU per fresh key, 16 conns", "<= 0.5 x "
                "PostgreSQL's CPU per raw pair (16 clients)", "%s vs %s"
                % (us(f16["cpu_px"]), us(raw16["cpu_pg"])), ratio,
                ratio <= 0.5)
    if pg16 and f16:
        ratio = f16["rps"] / pg16["rps"]
        add("fresh keys, 16 conns, over the own statements", "idemproxy "
            "req/s >= 0.6 x pgbench claim+record tps (16 clients)",
            "%.0f vs %.0f" % (f16["rps"], pg16["rps"]), ratio, ratio >= 0.6)
    fw = find(rows, "fresh-c%s" % a.wide) if a.wide else None
    if fw and f16:
        ratio = fw["rps"] / f16["rps"]
        add("fresh keys, %s conns" % a.wide, "idemproxy req/s >= its "
            "16-connection req/s", "%.0f vs %.0f" % (fw["rps"], f16["rps"]),
            ratio, ratio >= 1.0)
    d1, raw1, f1 = find(rows, "direct-c1"), find(rows, "raw-c1"), \
        find(rows, "fresh-c1")
    if d1 and raw1 and f1:
        bound = d1["p50"] + 1.3 * raw1["mean"]
        ratio = f1["p50"] / bound
        add("fresh keys, 1 conn, default (busy_poll off)", "idemproxy p50 "
            "<= direct p50 + 1.3 x the raw pair's mean latency (pgbench, "
            "1 client)", "%s vs %s + 1.3 x %s = %s"
            % (ms(f1["p50"]), ms(d1["p50"]), ms(raw1["mean"]), ms(bound)),
            ratio, ratio <= 1.0)
    r16, n16 = find(rows, "replay-c16"), find(rows, "nginx-replay-c16")
    if r16 and n16:
        ratio = r16["rps"] / n16["rps"]
        add("replays of one key, 16 conns", "idemproxy req/s >= 1.0 x "
            "nginx req/s", "%.0f vs %.0f" % (r16["rps"], n16["rps"]), ratio,
            ratio >= 1.0)
    by_count = {want: (seen, kb) for want, seen, kb, _ in rss}
    what = ("VmRSS after 200,000 requests within 10% of after 20,000 "
            "(counted after the warm-up)")
    if 20000 in by_count and 200000 in by_count:
        (s1, kb1), (s2, kb2) = by_count[20000], by_count[200000]
        ratio = kb2 / kb1
        add("memory, mixed load, 16 conns", what,
            "%d kB (at %d) vs %d kB (at %d)" % (kb2, s2, kb1, s1), ratio,
            abs(ratio - 1.0) <= 0.10)
    else:
        reached = max((s for _, s, _, _ in rss), default=0)
        out.append("| memory, mixed load, 16 conns | %s | only %d requests "
                   "in the time allowed | - | MISSED |" % (what, reached))
    keys, slices, nrows = dups
    out.append("| exactly once | zero keys reaching the upstream twice, in "
               "every idemproxy row | %d duplicated keys in %d slices of "
               "%d runs (the rows and the memory check) | - | %s |"
               % (keys, slices, nrows, verdict(keys == 0 and slices > 0)))
    return "\n".join(out) + "\n"


def nbytes(b):
    return "-" if b is None else "%.0f B" % b


def load_checkpoints(data):
    """checkpoints.txt: how many the server made during the measured rows."""
    try:
        with open(os.path.join(data, "checkpoints.txt")) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def load_wake(data):
    """wake.txt: tests/bench/programs/wake_cost.c's key=value line, or None."""
    try:
        with open(os.path.join(data, "wake.txt")) as f:
            pairs = dict(kv.split("=", 1) for kv in f.read().split())
        return {k: float(v) for k, v in pairs.items()}
    except (OSError, ValueError):
        return None


def load_batches(data):
    """batches.txt: the default proxy's batch counters (claim statements,
    claims, record statements, records) before and after batch_runs."""
    try:
        with open(os.path.join(data, "batches.txt")) as f:
            v = [int(x) for x in f.read().split()]
        return v if len(v) == 8 else None
    except (OSError, ValueError):
        return None


def table(rows):
    out = ["| scenario | target | conns | req/s | p50 | p99 | "
           "PostgreSQL CPU/req | proxy (or pgbench) CPU/req | errors |",
           "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        scenario = r["scenario"]
        if r["slices"] > 1:
            scenario += " *"
        out.append("| %s | %s | %d | %.0f | %s | %s | %s | %s | %d |"
                   % (scenario, r["target"], r["conns"], r["rps"],
                      ms(r["p50"]), ms(r["p99"]), us(r["cpu_pg"]),
                      us(r["cpu_px"]), r["errors"]))
    return "\n".join(out) + "\n"


def steal_note(rows, a):
    """What the host took from the machine during the target rows: on a
    virtual machine, a row that ran while the host was busy elsewhere
    compares unequal machines, whatever the interleaving."""
    ids = [r % a.wide if "%s" in r else r for r in TARGET_ROWS
           if a.wide or "%s" not in r]
    found = [(rid, find(rows, rid)) for rid in ids]
    got = [(rid, r["steal"]) for rid, r in found
           if r and r["steal"] is not None]
    if not got:
        return None
    worst = max(v for _, v in got)
    text = ("- the host's steal time (a vCPU ready to run while the host ran "
            "something else, /proc/stat) during the target rows: at most "
            "%.1f %% of the machine's time (%s)"
            % (100 * worst, ", ".join("%s %.1f %%" % (rid, 100 * v)
                                      for rid, v in got)))
    if worst > 0.05:
        text += ("; above 5 %, the two sides of a ratio may have run on "
                 "unequal machines: run again before reading a verdict")
    return text + "."


def load_tombstones(data):
    try:
        with open(os.path.join(data, "tombstones.txt")) as f:
            return "{:,}".format(int(f.read().strip()))
    except OSError:
        return "?"


def notes(rows, rss, a):
    order = ("; the 16- and %s-connection groups A B B A" % a.wide
             if a.wide else "")
    out = ["- \\* interleaved with the other side of its target ratio, in "
           "halves (A B A B%s); percentiles from the merged histograms. "
           "wrk's " % order +
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
    quiet, heavy = find(rows, "replay-c1-quiet"), find(rows, "replay-c1-heavy")
    if quiet and heavy:
        hpath = os.path.join(a.data, "heavy_requests.txt")
        nheavy = open(hpath).read().strip() if os.path.exists(hpath) else "?"
        out.append("- heavy pair: cache-hit replays at one connection while "
                   "another client retries a ~900 KB JSON body (%s requests, "
                   "each one's canonical JSON made by a helper thread): p50 "
                   "%s, p99 %s, %.0f req/s; without that client p50 %s, p99 "
                   "%s, %.0f req/s. The loop keeps answering; what is left is "
                   "the helper's share of the CPUs."
                   % (nheavy, ms(heavy["p50"]), ms(heavy["p99"]), heavy["rps"],
                      ms(quiet["p50"]), ms(quiet["p99"]), quiet["rps"]))
    pairs = []
    for c in (["16"] + ([a.wide] if a.wide else [])):
        al, ba = find(rows, "fresh-c%s-alone" % c), find(rows, "fresh-c%s-batch" % c)
        if al and ba:
            pairs.append("%s connections %.0f against %.0f req/s (%.2f x), "
                         "PostgreSQL's CPU %s against %s per request, the "
                         "proxy's %s against %s"
                         % (c, ba["rps"], al["rps"], ba["rps"] / al["rps"],
                            us(ba["cpu_pg"]), us(al["cpu_pg"]),
                            us(ba["cpu_px"]), us(al["cpu_px"])))
    if pairs:
        line = ("- database.batch (first attempts claimed and recorded "
                "together), the default 64 against 1 (each alone), two "
                "proxies interleaved: " + "; ".join(pairs) + ".")
        b = load_batches(a.data)
        if b and b[4] > b[0] and b[6] > b[2]:
            line += (" Over those rows the default proxy's claims went "
                     "out %.1f to a statement and its records %.1f "
                     "(idemproxy_store_batched_total over "
                     "idemproxy_store_batches_total; a claim or record "
                     "that found none of its kind with the database went "
                     "alone and is not counted)."
                     % ((b[5] - b[1]) / (b[4] - b[0]),
                        (b[7] - b[3]) / (b[6] - b[2])))
        out.append(line)
    t0, t1 = find(rows, "fresh-c16-tomb0"), find(rows, "fresh-c16-tomb1m")
    if t0 and t1:
        out.append("- tombstones (retain_key 30d, ttl 24h): fresh keys at 16 "
                   "connections beside %s stripped tombstones %.0f req/s "
                   "against %.0f req/s on an empty store (%.2f x), "
                   "PostgreSQL's CPU %s against %s per request; two proxies, "
                   "two databases of one server, interleaved."
                   % (load_tombstones(a.data), t1["rps"], t0["rps"],
                      t1["rps"] / t0["rps"], us(t1["cpu_pg"]),
                      us(t0["cpu_pg"])))
    r16, pr16 = find(rows, "replay-c16"), find(rows, "pgbench-replay-c16")
    n16 = find(rows, "nginx-replay-c16")
    if r16 and pr16 and n16:
        out.append("- replays, 16 conns: the replay claim alone (pgbench, "
                   "16 clients) made %.0f tps = %.2f x nginx; idemproxy "
                   "made %.2f x the bare claim."
                   % (pr16["rps"], pr16["rps"] / n16["rps"],
                      r16["rps"] / pr16["rps"]))
    out.append("- CPU per request: user + system time from /proc/PID/stat "
               "before and after each slice, divided by the requests (or "
               "pgbench transactions) it answered. PostgreSQL: the "
               "postmaster's own and its exited children's time (utime, "
               "stime, cutime, cstime) plus its live children's, so every "
               "backend and background process; for pgbench rows from "
               "0.2 s after its clients connected, over the transactions "
               "that ended after that (its backends' exit included); "
               "proxy: idemproxy's "
               "process (all threads), or nginx's master and workers; "
               "in pgbench rows, pgbench's own process, sampled every "
               "50 ms from the same start until it exits, over the "
               "transactions that ended within the samples. wrk and the "
               "stub are not counted.")
    wake = load_wake(a.data)
    if wake:
        out.append("- wake-ups on this machine (tests/bench/programs/wake_cost.c, "
                   "before PostgreSQL starts): a thread waking another "
                   "that sleeps in read(2) costs %.1f us of CPU per wake-up "
                   "(%.1f us elapsed) where the scheduler places them, "
                   "%.1f us (%.1f us) with both on one CPU. Every CPU "
                   "figure above includes such wake-ups: each statement, "
                   "request or answer that finds its receiver asleep pays "
                   "one."
                   % (wake["any_cpu_us"], wake["any_wall_us"],
                      wake["one_cpu_us"], wake["one_wall_us"]))
    raw16, f16 = find(rows, "raw-c16"), find(rows, "fresh-c16")
    ck = load_checkpoints(a.data)
    rawk, fk = find(rows, "raw-c16-ckpt"), find(rows, "fresh-c16-ckpt")
    if ck is not None:
        line = ("- checkpoints: %d during the rows above the two \"just "
                "after a CHECKPOINT\" rows (PostgreSQL runs with "
                "max_wal_size 16GB and checkpoint_timeout 1h, and one "
                "CHECKPOINT follows the warm-up), so that none lands in one "
                "row and not in the row it is compared with." % ck)
        if rawk and fk and raw16 and f16:
            line += (" Right after a CHECKPOINT (when every page a "
                     "statement touches first is written whole to the WAL), "
                     "at 16 connections idemproxy made %.0f req/s against the raw "
                     "pair's %.0f (%.2f; %.2f without), PostgreSQL's CPU "
                     "%s against %s per request (%s and %s without), WAL "
                     "%s against %s per request (%s and %s without)."
                     % (fk["rps"], rawk["rps"], fk["rps"] / rawk["rps"],
                        f16["rps"] / raw16["rps"], us(fk["cpu_pg"]),
                        us(rawk["cpu_pg"]), us(f16["cpu_pg"]),
                        us(raw16["cpu_pg"]), nbytes(fk["wal"]),
                        nbytes(rawk["wal"]), nbytes(f16["wal"]),
                        nbytes(raw16["wal"])))
        out.append(line)
    if raw16 and f16 and raw16["cpu_px"] and f16["cpu_px"]:
        out.append("- 16 connections: pgbench spent %s per raw pair (two "
                   "statements and their answers, its connections driven "
                   "by one event loop per thread); idemproxy %s per fresh "
                   "key (the client's request and answer, the same two "
                   "statements, the upstream's request and answer) = "
                   "%.2f x pgbench."
                   % (us(raw16["cpu_px"]), us(f16["cpu_px"]),
                      f16["cpu_px"] / raw16["cpu_px"]))
    raw16, pg16 = find(rows, "raw-c16"), find(rows, "pgbench-c16")
    if raw16 and pg16:
        out.append("- the store's schema and statements, 16 clients: "
                   "pgbench claim+record %.0f tps = %.2f x the raw pair; "
                   "PostgreSQL CPU %s per claim+record = %.2f x the raw "
                   "pair's %s; WAL per request: raw pair %s, claim+record "
                   "%s, idemproxy's fresh keys %s."
                   % (pg16["rps"], pg16["rps"] / raw16["rps"],
                      us(pg16["cpu_pg"]),
                      (pg16["cpu_pg"] or 0) / (raw16["cpu_pg"] or 1),
                      us(raw16["cpu_pg"]), nbytes(raw16["wal"]),
                      nbytes(pg16["wal"]),
                      nbytes(f16["wal"] if f16 else None)))
    d1, raw1 = find(rows, "direct-c1"), find(rows, "raw-c1")
    fb, f1 = find(rows, "fresh-c1-busy"), find(rows, "fresh-c1")
    if d1 and raw1 and fb and f1:
        bound = d1["p50"] + 1.3 * raw1["mean"]
        out.append("- one connection with busy_poll %s (not the default): "
                   "p50 %s against the same bound %s (%.2f); idemproxy "
                   "CPU %s per request, %s without busy_poll."
                   % (a.busy, ms(fb["p50"]), ms(bound), fb["p50"] / bound,
                      us(fb["cpu_px"]), us(f1["cpu_px"])))
    warm = load_rss(a.data, "rss-warm.tsv")
    if rss:
        def cache(b):
            return "" if b is None else " (replay cache %.0f kB)" % (b / 1024)
        out.append("- VmRSS under the mixed load (fresh process)" +
                   "".join(", %d kB after the warm-up (%d requests)%s"
                           % (kb, seen, cache(b)) for _, seen, kb, b in warm)
                   + "; then " +
                   ", ".join("%d kB at %d requests more%s" % (kb, seen, cache(b))
                             for _, seen, kb, b in rss) + ".")
    out.append("- %s idemproxy workers, %s s per run, PostgreSQL with fsync "
               "and synchronous_commit on; errors counts answers >= 400 "
               "and socket errors (pgbench: failed transactions)."
               % (a.workers, a.duration))
    out.append("- whole run: %d s; load average at the start / end: %s "
               "(%s cpus, shared with everything else running)."
               % (a.elapsed, a.load, a.cpus))
    steal = steal_note(rows, a)
    if steal:
        out.append(steal)
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
    p.add_argument("--wide", default="")
    p.add_argument("--only", default="",
                   help="BENCH_ONLY's runs: no targets (their rows are not run)")
    a = p.parse_args()
    rows = load_rows(a.data)
    rss = load_rss(a.data)
    goals = ("" if a.only else "\n## Targets\n\n"
             + targets(rows, rss, load_dups(a.data), a))
    text = ("# idemproxy benchmark\n\n" + table(rows) + goals
            + "\n## Notes\n\n" + notes(rows, rss, a))
    with open(a.out, "w") as f:
        f.write(text)
    sys.stdout.write("\n" + text)


if __name__ == "__main__":
    main()
