"""The verification campaign (issue 28): two idemproxy instances, a
PostgreSQL primary with a synchronous standby and the ledger upstream, each
in a network namespace of its own; the load generator drives them while a
nemesis partitions, kills, crashes, fails over, freezes and skews; then
everything heals, the load drains and tests/verify/invariants.py checks the
whole history. See tests/verify/verify_spec.md for the files it writes.

  campaign.py [--requests 1000000] [--seed N] [--modes hold,release_after_lease]
              [--rate 700] [--seconds S] [--short-ttl 20] [--flow-ms 30000]
              [--out build/verify] [--keep]

--requests is shared by the modes. Each mode runs on its own database of
the one cluster (a failover in the first leaves the roles swapped for the
second) with its own ledger, proxies and load, and gets its own run
directory under OUT/<run id>/. The seed is printed first; the same seed
draws the same faults at the same offsets and the same load. Exits 0 when
every invariant held in every mode; the run directory is kept and printed
when not (with --keep, always).
"""
import argparse
import json
import os
import random
import shlex
import shutil
import signal
import subprocess
import sys
import time

import netns
import nemesis as nemesis_mod
import pgcluster
import report
from procs import ROOT, Ledger, Load, Proxy

LEASE_S = 3.0
UPSTREAM_TIMEOUT_S = 1.0
WAIT_MAX_S = 2.0
RETRY_CAP_MS = 2000
CLIENT_TIMEOUT_MS = 3000
REAPER_S = 1.0
TENANT_HEADER = "X-Tenant-Id"
LEDGER_PORTS = {"p1": 9001, "p2": 9002}
PAY, REFUND, TRANSFER = "/v1/payments", "/v1/refunds", "/v1/transfers"
MODES = ("hold", "release_after_lease")
DEFAULT_RELEASE = [408, 425, 429, 500, 502, 503, 504]   # the proxy's release_statuses


def log(msg):
    print("[%s] %s" % (time.strftime("%H:%M:%S"), msg), flush=True)


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=1000000,
                    help="client requests in all, shared by the modes")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--modes", default=",".join(MODES))
    ap.add_argument("--rate", type=float, default=700.0, help="flows started per second")
    ap.add_argument("--concurrency", type=int, default=256)
    ap.add_argument("--seconds", type=float, default=None,
                    help="hard stop of each mode's load (default: from requests and rate)")
    ap.add_argument("--short-ttl", type=float, default=20.0, help="ttl of /v1/refunds (s)")
    ap.add_argument("--flow-ms", type=int, default=30000)
    ap.add_argument("--slow-ms", type=int, default=1500)
    ap.add_argument("--fault-frac", type=float, default=0.8,
                    help="faults run until this share of a mode's requests was sent")
    ap.add_argument("--out", default=os.path.join(ROOT, "build", "verify"))
    ap.add_argument("--keep", action="store_true", help="keep the whole run directory")
    ap.add_argument("--no-faults", action="store_true",
                    help="no nemesis (a baseline of the same load)")
    ap.add_argument("--binary", default=os.path.join(ROOT, "build", "idemproxy"))
    ap.add_argument("--skew-binary", default=os.path.join(ROOT, "build", "idemproxy-glibc-malloc"),
                    help="the proxy run under libfaketime: built with glibc's malloc "
                         "(make build/idemproxy-glibc-malloc)")
    a = ap.parse_args(argv)
    a.modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    for m in a.modes:
        if m not in MODES:
            ap.error("unknown mode %r (modes: %s)" % (m, ", ".join(MODES)))
    if a.seed is None:
        a.seed = random.SystemRandom().randrange(1, 2**31)
    if a.short_ttl <= LEASE_S:
        ap.error("--short-ttl must exceed the lease (%.0fs)" % LEASE_S)
    return a


def settings_for(mode, url, ledger_url, short_ttl):
    """The proxies' conf: the spec's three routes, tenants from a header."""
    defaults = {"lease": "%ds" % LEASE_S, "upstream_timeout": "%ds" % UPSTREAM_TIMEOUT_S,
                "retry_after": "500ms", "ttl": "1h", "on_unknown": mode,
                # the ledger's exec header is part of the answer a replay must give back
                "replay_headers": ["Content-Type", "X-Ledger-Exec"]}
    if mode == "hold":
        # at most one execution per key, ever: the ledger's 503 is stored
        defaults["release_statuses"] = []
    tenant = "header:" + TENANT_HEADER
    routes = [
        {"name": "pay", "path": PAY, "upstream": ledger_url, "tenant": tenant},
        {"name": "refund", "path": REFUND, "upstream": ledger_url, "tenant": tenant,
         "ttl": "%ds" % short_ttl},
        {"name": "transfer", "path": TRANSFER, "upstream": ledger_url, "tenant": tenant,
         "in_flight": "wait", "wait_max": "%ds" % WAIT_MAX_S},
    ]
    return {"workers": 64, "shutdown_grace": "3s", "log_level": "info", "log_format": "json",
            "database": {"url": url, "statement_timeout": "2s"},
            "reaper": {"interval": "%ds" % REAPER_S}, "defaults": defaults, "routes": routes}


def final_bound_s():
    """After the heal, a key in flight reaches a final state within the
    lease plus this: its lease's end found by the reaper, a client's
    backoff, one more upstream call and a client timeout, and a second
    lease for an attempt whose outcome the upstream left unknown again."""
    return (LEASE_S + REAPER_S + RETRY_CAP_MS / 1000.0 + UPSTREAM_TIMEOUT_S
            + CLIENT_TIMEOUT_MS / 1000.0)


class Campaign:
    def __init__(self, args):
        self.a = args
        self.run_id = "%04x" % random.SystemRandom().randrange(0x10000)
        self.root = os.path.join(args.out, time.strftime("%Y%m%d-%H%M%S-") + self.run_id)
        self.net = netns.Net(self.run_id, random.Random(args.seed).randrange(1, 255))
        self.cluster = None
        self.live = []             # what the cleanup stops: objects with stop()
        self.results = []

    def dbname(self, mode):
        return "verify_" + mode

    def setup(self):
        netns.sweep(log)
        os.makedirs(self.root)
        self.net.up()
        log("network: namespaces %s-*, 10.231.%d.0/24" % (self.net.ns("")[:-1],
                                                          self.net.subnet))
        self.pgbase = "/tmp/%s%s-pg" % (netns.PREFIX, self.run_id)
        self.cluster = pgcluster.Cluster(self.net, self.pgbase, log)
        self.cluster.start([self.dbname(m) for m in self.a.modes])
        self.pg_version = self.cluster.primary.version()
        log("postgresql %s: primary pg1, synchronous standby pg2" % self.pg_version)

    def teardown(self):
        for obj in reversed(self.live):
            try:
                obj.stop()
            except Exception as e:  # every step is tried
                log("cleanup: %s" % e)
        self.live = []
        if self.cluster:
            try:
                self.cluster.stop()
            except Exception as e:
                log("cleanup: %s" % e)
        self.net.down()
        if getattr(self, "pgbase", None):
            shutil.rmtree(self.pgbase, ignore_errors=True)


def mode_seconds(a, requests):
    """The hard stop of a mode's load: three times what requests at the
    rate need (about 3.5 requests a flow: retries and follow-ups; faults
    halve the rate a loaded 2-core machine sustains), at least 20 s."""
    if a.seconds:
        return a.seconds
    return max(20.0, 3.0 * requests / (a.rate * 3.5))


def start_mode(c, mode, rd):
    url = c.cluster.url(c.dbname(mode))
    proxies = []
    for name in ("p1", "p2"):
        ledger_url = "http://%s:%d" % (c.net.ip("up"), LEDGER_PORTS[name])
        proxies.append(Proxy(c.net, name, rd, settings_for(mode, url, ledger_url,
                                                           c.a.short_ttl),
                             c.a.binary, c.a.skew_binary))
    proxies[0].migrate()
    for p in proxies:
        p.start()
        c.live.append(p)
    return proxies


def load_args(c, mode_seed, requests, seconds, proxies):
    args = []
    for p in proxies:
        args += ["--target", p.url]
    return args + ["--seed", str(mode_seed), "--rate", "%g" % c.a.rate,
                   "--requests", str(requests), "--seconds", "%g" % seconds,
                   "--concurrency", str(c.a.concurrency),
                   "--timeout-ms", str(CLIENT_TIMEOUT_MS), "--flow-ms", str(c.a.flow_ms),
                   "--short-ttl-s", "%g" % c.a.short_ttl, "--retry-cap-ms", str(RETRY_CAP_MS),
                   "--tenants", "4"]


def fault_phase(c, nem, load, requests, seconds, skew_sign):
    """Runs the nemesis until the fault share of the requests was sent (or
    of the time passed, or the load ended); returns the heal time."""
    t0 = time.monotonic()
    skew_at = (seconds * c.a.fault_frac * 0.15, seconds * c.a.fault_frac * 0.6)
    if not c.a.no_faults:
        nem.start(skew_at, skew_sign)
    while True:
        sent = load.progress()
        if (sent >= c.a.fault_frac * requests or load.proc.poll() is not None
                or time.monotonic() - t0 >= c.a.fault_frac * seconds):
            break
        time.sleep(0.5)
    log("faults end after %.1fs, %d requests sent; healing" % (time.monotonic() - t0, sent))
    return nem.stop()


def scrape_once(proxies, events):
    for p in proxies:
        try:
            m = p.metrics()
        except Exception as e:  # an instance that does not answer is noted
            log("scrape %s: %s" % (p.name, e))
            continue
        events.write({"kind": "scrape", "inst": p.name, "t_s": time.time(),
                      "oldest_processing_s": m.get("idemproxy_oldest_processing_age_seconds"),
                      "processing": m.get("idemproxy_processing_records")})


def scrape_through(proxies, events, load, timeout):
    """The oldest-processing gauge of both instances every second from a
    lease after the heal until the load has drained and a lease plus a
    reaper pass more (while clients still send, attempts whose answer was
    lost keep the gauge near the lease until the reaper releases them)."""
    time.sleep(LEASE_S)
    deadline = time.monotonic() + timeout
    ended = None
    while time.monotonic() < deadline:
        scrape_once(proxies, events)
        if ended is None and load.proc.poll() is not None:
            ended = time.monotonic()
        if ended is not None and time.monotonic() - ended > LEASE_S + REAPER_S + 1.0:
            break
        time.sleep(1.0)
    return load.wait(max(0.0, deadline - time.monotonic()))


def write_run_json(c, rd, mode, mode_seed, t_start, t_end, requests):
    run = {"seed": mode_seed, "mode": mode, "lease_s": LEASE_S,
           "upstream_timeout_s": UPSTREAM_TIMEOUT_S, "wait_max_s": WAIT_MAX_S,
           "ttl_s": {PAY: 3600, REFUND: c.a.short_ttl, TRANSFER: 3600},
           "proxies": ["p1", "p2"], "ports": {str(v): k for k, v in LEDGER_PORTS.items()},
           "t_start_s": t_start, "t_end_s": t_end, "final_bound_s": final_bound_s(),
           "campaign_seed": c.a.seed, "requests_target": requests, "rate": c.a.rate,
           "flow_ms": c.a.flow_ms,
           "release_statuses": [] if mode == "hold" else DEFAULT_RELEASE}
    with open(os.path.join(rd, "run.json"), "w") as f:
        json.dump(run, f, indent=1)


def run_mode(c, i, mode, requests):
    rd = os.path.join(c.root, mode)
    os.makedirs(rd)
    mode_seed = c.a.seed * 10 + i
    seconds = mode_seconds(c.a, requests)
    log("mode %s: %d requests, rate %g flows/s, at most %.0fs, run directory %s"
        % (mode, requests, c.a.rate, seconds, rd))
    events = nemesis_mod.Events(os.path.join(rd, "events.jsonl"))
    ledger = Ledger(c.net, rd, sorted(LEDGER_PORTS.values()), mode_seed, c.a.slow_ms)
    c.live.append(ledger)
    proxies = start_mode(c, mode, rd)
    t_start = time.time()
    load = Load(c.net, rd, load_args(c, mode_seed, requests, seconds, proxies))
    c.live.append(load)
    nem = nemesis_mod.Nemesis(mode_seed, c.net, c.cluster, proxies, events, log,
                              gap_s=min(3.0, max(0.8, seconds * c.a.fault_frac / 40.0)))
    # the first mode skews a clock ahead, the second behind
    heal = fault_phase(c, nem, load, requests, seconds, 1 if i % 2 == 0 else -1)
    events.write({"kind": "heal", "t_s": heal})
    rc = scrape_through(proxies, events, load,
                        seconds + c.a.flow_ms / 1000.0 + 60 - (time.time() - t_start))
    log("load ended (%s): %s" % (rc, json.dumps(load.summary())))
    for p in proxies:
        p.stop()
    ledger.stop()
    c.live = []
    t_end = time.time()
    events.close()
    write_run_json(c, rd, mode, mode_seed, t_start, t_end, requests)
    return rd, nem.errors, t_end - t_start


def check(rd):
    """The checker on a run directory: its exit code (2: it could not run)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "invariants.py")
    if not os.path.exists(script):
        log("no checker at %s" % script)
        return 2
    try:
        return subprocess.run([sys.executable, script, rd], timeout=3600).returncode
    except subprocess.TimeoutExpired:
        log("the checker took over an hour")
        return 2


def command_line(a):
    return "python3 tests/verify/campaign.py " + " ".join(shlex.quote(x) for x in [
        "--requests", str(a.requests), "--seed", str(a.seed), "--modes", ",".join(a.modes),
        "--rate", "%g" % a.rate, "--concurrency", str(a.concurrency),
        "--short-ttl", "%g" % a.short_ttl, "--flow-ms", str(a.flow_ms)]
        + (["--seconds", "%g" % a.seconds] if a.seconds else []))


def run_all(c):
    a = c.a
    share = a.requests // len(a.modes)
    for i, mode in enumerate(a.modes):
        rd, errors, took = run_mode(c, i, mode, share)
        rc = check(rd)
        c.results.append({"mode": mode, "dir": rd, "rc": rc, "nemesis_errors": errors,
                          "seconds": took})
        log("mode %s: checker exit %d%s" % (mode, rc, "" if not errors else
                                              "; nemesis errors: %s" % errors))


def main(argv=None):
    a = parse_args(sys.argv[1:] if argv is None else argv)
    if os.geteuid() != 0:
        sys.exit("campaign.py: needs root (it makes network namespaces and runs "
                 "PostgreSQL as the postgres user)")
    print("verify: seed %d (repeat with --seed %d)" % (a.seed, a.seed), flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    c = Campaign(a)
    t0 = time.time()
    ok = False
    try:
        c.setup()
        run_all(c)
        ok = bool(c.results) and all(r["rc"] == 0 and not r["nemesis_errors"]
                                     for r in c.results)
        text = report.render(c, time.time() - t0, command_line(a))
        with open(os.path.join(c.root, "report.md"), "w") as f:
            f.write(text)
        print(text, flush=True)
    except KeyboardInterrupt:
        log("interrupted")
    finally:
        c.teardown()
        report.tidy(c.root, keep=a.keep or not ok)
        print("verify: %s (seed %d); run directory %s" % (
            "passed" if ok else "FAILED", a.seed, c.root if (a.keep or not ok) else
            c.root + " (report.md and summaries kept)"), flush=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
