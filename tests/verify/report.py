"""The campaign's report (issue 28 §4): versions, topology, seed, duration,
the exact command, and per mode the checker's figures (summary.json) with
the faults injected by kind from events.jsonl. Printed and written to
report.md in the run directory; the documentation page is made from it."""
import json
import os
import platform
import shutil
import subprocess

from procs import ROOT

# What a passed run keeps of each mode's directory (the logs and histories
# are large: a failed run keeps everything).
KEEP = ("report.md", "run.json", "events.jsonl", "summary.json", "load.out")


def sh(args):
    try:
        r = subprocess.run(args, capture_output=True, text=True, timeout=10, cwd=ROOT)
        return r.stdout.strip() if r.returncode == 0 else ""
    except (OSError, subprocess.SubprocessError):
        return ""


def versions(c):
    commit = sh(["git", "rev-parse", "--short=12", "HEAD"]) or "unknown"
    if sh(["git", "status", "--porcelain", "--untracked-files=no"]):
        commit += " (with uncommitted changes)"
    return [("idemproxy", commit),
            ("PostgreSQL", getattr(c, "pg_version", "") or "unknown"),
            ("kernel", platform.release()),
            ("libcurl", sh(["curl-config", "--version"]) or "unknown"),
            ("nftables", sh(["nft", "--version"]) or "unknown"),
            ("machine", "%s, %d cpus" % (platform.machine(), os.cpu_count() or 0))]


def topology(c):
    n = c.net
    rows = ["namespaces joined by a bridge in a namespace of its own, 10.231.%d.0/24:"
            % n.subnet]
    for node, what in (("cl", "load generator (build/verify_load)"),
                       ("p1", "idemproxy instance 1 (upstream: ledger port 9001)"),
                       ("p2", "idemproxy instance 2 (upstream: ledger port 9002)"),
                       ("up", "ledger upstream (build/verify_ledger)"),
                       ("pg1", "PostgreSQL, primary at the start"),
                       ("pg2", "PostgreSQL, synchronous streaming standby at the start")):
        rows.append("- `%s` %s: %s" % (node, n.ip(node), what))
    rows.append("- database URL: `postgresql://postgres@%s:5432,%s:5432/verify_MODE"
                "?target_session_attrs=read-write`; `synchronous_commit = on`, "
                "`synchronous_standby_names` naming the standby" % (n.ip("pg1"), n.ip("pg2")))
    rows.append("- routes (tenant from `X-Tenant-Id`, t1..t4): `/v1/payments` ttl 1h reject; "
                "`/v1/refunds` ttl %gs reject; `/v1/transfers` ttl 1h wait (wait_max 2s); "
                "lease 3s, upstream_timeout 1s" % c.a.short_ttl)
    return rows


def fault_counts(rd):
    counts = {}
    try:
        with open(os.path.join(rd, "events.jsonl")) as f:
            for ln in f:
                ev = json.loads(ln)
                k = ev["kind"]
                if k == "partition":
                    k = "partition %s↔%s %s" % ("proxy", ev.get("b"), ev.get("dir"))
                if k not in ("heal", "scrape"):
                    counts[k] = counts.get(k, 0) + 1
    except (OSError, ValueError):
        pass
    return counts


def total_faults(dirs):
    out = {}
    for d in dirs:
        for k, v in fault_counts(d).items():
            k = k.split(" ")[0]
            out[k] = out.get(k, 0) + v
    return out


def fmt(v):
    if isinstance(v, float):
        return "%.4g" % v
    return str(v)


INVARIANTS = [
    ("1", "at most one execution per key (release mode: a second only after a lost answer "
          "whose lease ended)"),
    ("2", "every answer is its key's one execution, byte for byte"),
    ("3", "no answer crosses tenants; a mismatched body never executes"),
    ("4", "when the proxy says nothing was executed, the ledger agrees"),
    ("5", "a replayable answer replays until expiry, across restarts and failover"),
    ("6", "after the heal every key is final within lease + bound; the gauge falls below "
          "the lease"),
    ("7", "no replay after expiry; no second execution before it"),
    ("8", "a waiter gets the original's answer or a bounded 409"),
]


def load_summary(rd):
    try:
        with open(os.path.join(rd, "summary.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def dig(d, *path):
    for k in path:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d


def figures(s):
    """The §4 rows from the checker's summary (a missing figure is left out)."""
    rows = []

    def add(name, value):
        if value is not None and "None" not in str(value):
            rows.append((name, value))
    add("client requests", s.get("requests"))
    add("operations (flows)", s.get("flows"))
    add("keys", s.get("keys"))
    r = s.get("retries_per_operation") or {}
    add("retries per operation (mean / p99 / max)", "%s / %s / %s" % (
        fmt(r.get("mean")), r.get("p99"), r.get("max")))
    add("concurrent duplicates sent", s.get("concurrent_duplicates"))
    add("upstream forwards / executions", "%s / %s" % (dig(s, "ledger", "forwards"),
                                                       dig(s, "ledger", "executions")))
    for k, label in (("under_faults", "under faults"), ("outside_faults", "outside faults")):
        lat = dig(s, "latency_ms", k) or {}
        add("latency p50 / p99 %s (ms)" % label, "%s / %s (n %s)" % (
            fmt(lat.get("p50_ms")), fmt(lat.get("p99_ms")), lat.get("n")))
    h = s.get("after_heal") or {}
    add("in flight at the heal", h.get("in_flight_at_heal"))
    add("time to a final state after the heal, p99 / max (s)",
        "%s / %s (bound: %s s after the heal)" % (
            fmt(h.get("time_to_final_p99_s")), fmt(h.get("time_to_final_max_s")),
            fmt(h.get("bound_s"))))
    for inst, g in sorted((h.get("gauge") or {}).items()):
        add("oldest processing after the heal, %s (lowest, s)" % inst, "%s (%s)" % (
            fmt(g.get("min_oldest_s")), "below the lease" if g.get("below_lease") else
            "not below the lease"))
    return rows


def anomaly_rows(s):
    rows = ["| invariant | anomalies | by class |", "|---|---|---|"]
    for n, text in INVARIANTS:
        classes = dig(s, "anomaly_classes", n) or {}
        rows.append("| %s. %s | %s | %s |" % (n, text, dig(s, "anomalies", n),
                                            ", ".join("%s %s" % kv for kv in
                                                      sorted(classes.items()))))
    for k, v in sorted((s.get("excused") or {}).items()):
        rows.append("| excused: %s | %s | |" % (k, v))
    return rows


def mode_section(r):
    rd = r["dir"]
    lines = ["## Mode `%s`" % r["mode"], "",
             "checker: %s; load ran %.0f s; run directory `%s`" % (
                 {0: "**every invariant held**", 1: "**VIOLATIONS**"}.get(
                     r["rc"], "**did not run (exit %d)**" % r["rc"]), r["seconds"], rd), ""]
    if r["nemesis_errors"]:
        lines += ["faults that failed to apply: %s" % "; ".join(r["nemesis_errors"]), ""]
    lines += ["| fault injected | count |", "|---|---|"]
    lines += ["| %s | %d |" % kv for kv in sorted(fault_counts(rd).items())]
    lines.append("")
    s = load_summary(rd)
    if s is None:
        return lines + ["(no summary.json)", ""]
    lines += ["| figure | value |", "|---|---|"]
    lines += ["| %s | %s |" % (k, fmt(v)) for k, v in figures(s)]
    return lines + [""] + anomaly_rows(s) + [""]


def render(c, duration_s, command):
    lines = ["# Verification campaign %s" % os.path.basename(c.root), "",
             "seed **%d**, %d requests asked for in all (modes: %s), %.0f s in all" % (
                 c.a.seed, c.a.requests, ", ".join(c.a.modes), duration_s), "",
             "reproduce: `%s`" % command, "", "## Versions", ""]
    lines += ["- %s: %s" % kv for kv in versions(c)]
    lines += ["", "## Topology", ""] + topology(c) + [""]
    sums = [load_summary(r["dir"]) or {} for r in c.results]
    lines += ["## In all", "",
              "- client requests: %d; keys: %d; anomalies: %d" % (
                  sum(x.get("requests") or 0 for x in sums),
                  sum(x.get("keys") or 0 for x in sums),
                  sum(sum(v for v in (x.get("anomalies") or {}).values() if v) for x in sums)),
              "- faults injected: %s" % ", ".join("%s %d" % kv for kv in sorted(
                  total_faults([r["dir"] for r in c.results]).items())), ""]
    for r in c.results:
        lines += mode_section(r)
    return "\n".join(lines) + "\n"


def tidy(root, keep):
    """A passed run keeps its report and summaries only."""
    if keep or not os.path.isdir(root):
        return
    for sub in os.listdir(root):
        d = os.path.join(root, sub)
        if not os.path.isdir(d):
            continue
        for name in os.listdir(d):
            if name not in KEEP:
                p = os.path.join(d, name)
                shutil.rmtree(p) if os.path.isdir(p) else os.unlink(p)
