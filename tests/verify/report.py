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


def flatten(d, prefix=""):
    out = []
    for k, v in d.items():
        name = prefix + str(k)
        if isinstance(v, dict):
            out += flatten(v, name + ".")
        elif isinstance(v, list):
            if v and all(not isinstance(x, (dict, list)) for x in v):
                out.append((name, ", ".join(str(x) for x in v)))
            else:
                out.append((name, "%d item(s)" % len(v)))
        else:
            out.append((name, v))
    return out


def fmt(v):
    if isinstance(v, float):
        return "%.4g" % v
    return str(v)


def mode_section(r):
    rd = r["dir"]
    lines = ["## Mode `%s`" % r["mode"], "",
             "checker: %s; load ran %.0f s; run directory `%s`" % (
                 {0: "**every invariant held**", 1: "**VIOLATIONS**"}.get(
                     r["rc"], "**did not run (exit %d)**" % r["rc"]), r["seconds"], rd), ""]
    if r["nemesis_errors"]:
        lines += ["faults that failed to apply: %s" % "; ".join(r["nemesis_errors"]), ""]
    lines += ["| fault | count |", "|---|---|"]
    lines += ["| %s | %d |" % kv for kv in sorted(fault_counts(rd).items())]
    lines.append("")
    try:
        with open(os.path.join(rd, "summary.json")) as f:
            summary = json.load(f)
    except (OSError, ValueError):
        return lines + ["(no summary.json)", ""]
    lines += ["| figure | value |", "|---|---|"]
    lines += ["| %s | %s |" % (k, fmt(v)) for k, v in flatten(summary)]
    return lines + [""]


def render(c, duration_s, command):
    lines = ["# Verification campaign %s" % os.path.basename(c.root), "",
             "seed **%d**, %d requests asked for in all (modes: %s), %.0f s in all" % (
                 c.a.seed, c.a.requests, ", ".join(c.a.modes), duration_s), "",
             "reproduce: `%s`" % command, "", "## Versions", ""]
    lines += ["- %s: %s" % kv for kv in versions(c)]
    lines += ["", "## Topology", ""] + topology(c) + [""]
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
