"""The chaos soak: two idemproxy instances on one PostgreSQL, a faulty
upstream, retrying clients, and chaos (SIGKILL, SIGTERM and restart of a
proxy, PostgreSQL crash-restarts, SIGHUP) taking turns with stalls
(stalls.py: statements, answers or all traffic held past the lease by a
relay, a resolver that hangs, a log reader that stops, a frozen serving
thread), then the invariants of checker.py on what the upstream, the
clients and the proxies recorded.

  soak.py [--seconds 60] [--modes hold,release] [--seed N] [--fuzz-seconds 30]
          [--citus] [--no-stalls]

--no-stalls keeps the crashes only (--citus implies it: the relay and the
resolver shim sit in front of one server).

--citus runs it on a Citus coordinator with two workers (procs.CitusPg,
database.distributed = "citus"): the keys are spread over four tenants, two
on each worker, and a crash-restart hits the coordinator or one worker.

Each mode runs for --seconds plus a drain (clients finish the keys they
hold), on its own database of one cluster. The HTTP front-end fuzzer
(fuzz_http.py) runs after them for --fuzz-seconds (0 skips it). Exits 1 with
the list of violated invariants, 0 when none was violated.
"""
import argparse
import base64
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter

import requests

import checker
import procs
import stalls as stalls_mod
from procs import Pg, Proxy, describe_rc, make_tmp, rss_kb

LEASE_S = 3.0
UPSTREAM_TIMEOUT_S = 1.0
SLOW_S = 1.6            # beyond upstream_timeout, well inside the lease
SHORT_TTL_S = 4.0       # refunds in release mode: a takeover outlives it
FLOW_SECONDS = 8.0      # how long a client retries one request
RETRY_CAP_S = 1.0       # Retry-After is honoured up to this
CLIENTS = 12
CLIENT_TIMEOUT_S = 6.0
# A replay of an answer the proxy holds in its cache is answered within
# this while the store or the log stalls (a hit takes about a millisecond;
# the bound leaves room for a loaded 2-core machine).
REPLAY_BOUND_S = 1.5
LOOP_STALL_MAX_S = 2.0  # the default loop_stall_max: /readyz fails past it

PAY, REFUND = "/v1/payments", "/v1/refunds"
TENANT_HEADER = "X-Tenant-Id"
TENANTS_PER_WORKER = 2


def settings_for(mode, url, upstream_port, citus=False):
    defaults = {"lease": "3s", "upstream_timeout": "1s", "retry_after": "500ms",
                "ttl": "1h",
                "on_unknown": "hold" if mode == "hold" else "release_after_lease"}
    refund = {"name": "refund", "path": REFUND,
              "upstream": "http://127.0.0.1:%d" % upstream_port}
    if mode == "hold":
        # "At most one request per key, ever": a 503 is recorded as it is,
        # never released for a second attempt.
        defaults["release_statuses"] = []
    else:
        refund["ttl"] = "%ds" % SHORT_TTL_S
    routes = [{"name": "create_payment", "path": PAY,
               "upstream": "http://127.0.0.1:%d" % upstream_port}, refund]
    database = {"url": url, "statement_timeout": "2s"}
    if citus:
        database["distributed"] = "citus"
        for r in routes:
            r["tenant"] = "header:" + TENANT_HEADER
    return {
        "workers": 4,
        "shutdown_grace": "3s",
        "log_level": "info",
        "log_format": "json",
        "replay_cache_ttl": "30s",
        "database": database,
        "reaper": {"interval": "1s"},
        "defaults": defaults,
        "routes": routes,
    }


class Upstream:
    def __init__(self, tmp, dedup, seed):
        self.log_path = os.path.join(tmp, "upstream.log")
        args = [sys.executable, os.path.join(procs.HERE, "faulty_upstream.py"),
                "--log", self.log_path, "--seed", str(seed), "--slow", str(SLOW_S)]
        if dedup:
            args.append("--dedup")
        self.err = open(os.path.join(tmp, "upstream.err"), "wb")
        self.proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=self.err,
                                     preexec_fn=procs.die_with_parent)
        procs.at_cleanup(self.stop)
        line = self.proc.stdout.readline()
        self.ports = json.loads(line)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.err.close()

    def records(self):
        by_seq = {}
        with open(self.log_path) as f:
            for ln in f:
                try:
                    rec = json.loads(ln)
                except ValueError:
                    continue   # a line cut by the stop
                by_seq.setdefault(rec["seq"], {"end": None}).update(rec)
        out = []
        for rec in by_seq.values():
            if "start" not in rec:
                continue
            rec["body"] = base64.b64decode(rec.pop("body_b64"))
            out.append(rec)
        return sorted(out, key=lambda r: r["seq"])


class Run:
    """One mode's soak."""

    def __init__(self, mode, pg, seconds, seed, stalls=stalls_mod.KINDS):
        self.mode = mode
        self.pg = pg
        self.citus = isinstance(pg, procs.CitusPg)
        self.tenants = [None]
        self.tenant_node = {}
        self.seconds = seconds
        self.rng = random.Random(seed)
        self.seed = seed
        self.tmp = make_tmp("idemproxy-chaos-%s-" % mode, logs=True)
        self.attempts = []
        self.flows = []
        self.keys = {}
        self.chaos = []
        self.exits = []
        self.rss_max = {}
        self.lock = threading.Lock()
        self.stop_new = threading.Event()
        self.hard_stop = None
        self.rid_seq = 0
        self.stall_kinds = [] if self.citus else list(stalls)
        self.stalls = None
        self.prober = None

    # --- set-up --------------------------------------------------------------

    def setup(self):
        url = self.pg.create_db("chaos_%s" % self.mode)
        if self.stall_kinds:
            # each mode its own order of stalls
            self.stalls = stalls_mod.Stalls(self.tmp, self.pg.port, LEASE_S,
                                            self.seed * 31 + len(self.mode), self.stall_kinds)
            url = self.stalls.url("chaos_%s" % self.mode)
        self.upstream = Upstream(self.tmp, self.mode == "release", self.seed)
        self.proxies = []
        for i, port in enumerate(self.upstream.ports):
            p = Proxy("p%d" % (i + 1), self.tmp, settings_for(self.mode, url, port,
                                                              self.citus))
            p.managed = False
            if self.stalls:
                p.extra_env = self.stalls.env()
                p.log_pipe = True
            self.proxies.append(p)
        self.port_inst = {port: p.name for port, p in zip(self.upstream.ports, self.proxies)}
        self.proxies[0].migrate()
        if self.citus:
            self.pick_tenants()
        for p in self.proxies:
            p.start()

    def pick_tenants(self):
        """TENANTS_PER_WORKER tenants on each worker (the stored tenant names
        its source, which decides the shard)."""
        per = {}
        for i in range(500):
            t = "t%d" % i
            node = self.pg.worker_of("chaos_%s" % self.mode, "header:" + t)
            if len(per.setdefault(node, [])) < TENANTS_PER_WORKER:
                per[node].append(t)
                self.tenant_node[t] = node
            if len(per) == len(self.pg.workers) and \
                    all(len(ts) == TENANTS_PER_WORKER for ts in per.values()):
                self.tenants = sorted(self.tenant_node)
                return
        raise RuntimeError("no %d tenants on each worker: %r" % (TENANTS_PER_WORKER, per))

    # --- clients -------------------------------------------------------------

    def next_rid(self, tag):
        with self.lock:
            self.rid_seq += 1
            return "%s-%s-%d" % (self.mode[0], tag, self.rid_seq)

    def attempt(self, sess, inst, flow, kind, key, route, body):
        rid = self.next_rid(kind[0])
        headers = {"Idempotency-Key": key, "X-Request-Id": rid,
                   "Content-Type": "application/json"}
        tenant = self.keys[key].get("tenant")
        if tenant:
            headers[TENANT_HEADER] = tenant
        a = {"key": key, "flow": flow, "kind": kind, "inst": inst.name, "rid": rid,
             "t0": time.time(), "status": None, "code": None, "error": None, "id": None,
             "body_key": None, "ctypes": 0, "trailer": False, "decodable": False,
             "detail": None, "replayed": None}
        try:
            r = sess.post(inst.url + route, data=body, timeout=CLIENT_TIMEOUT_S,
                          headers=headers)
        except requests.RequestException as e:
            a["error"] = type(e).__name__
            a["t1"] = time.time()
            self.attempts.append(a)
            return a, None
        a["t1"] = time.time()
        a["status"] = r.status_code
        a["ctypes"] = len(r.raw.headers.getlist("Content-Type"))
        a["trailer"] = "X-Chaos-Trailer" in r.headers
        a["replayed"] = r.headers.get("Idempotent-Replayed")
        try:
            j = r.json()
            a["decodable"] = isinstance(j, dict)
        except ValueError:
            j = None
        if isinstance(j, dict):
            if r.headers.get("Content-Type", "").startswith("application/problem+json"):
                a["code"] = j.get("code")
                a["detail"] = j.get("detail")
            else:
                a["id"] = j.get("id")
                a["body_key"] = j.get("key")
        self.attempts.append(a)
        return a, r

    def cause_of(self, a, r):
        """(final, cause) of one answer."""
        if a["error"]:
            return False, "transport"
        st, code = a["status"], a["code"]
        if code is None:
            if st in (201, 402):
                return True, "ok" if st == 201 else "declined"
            if st == 503:
                return self.mode == "hold", "upstream_503"
            return True, "status_%d" % st
        if code == "idempotency_key_in_use":
            return False, "held" if "operator" in (a["detail"] or "") else "in_use"
        if code == "idempotency_key_mismatch":
            return True, "mismatch"
        # shutting_down: a draining proxy refused to start it (retry on
        # another connection, as the answer says)
        if code in ("idempotency_store_unavailable", "overloaded",
                    "upstream_unavailable", "upstream_outcome_unknown",
                    "shutting_down", "idempotency_lease_expired"):
            return False, {"idempotency_store_unavailable": "store_unavailable",
                           "upstream_outcome_unknown": "outcome_unknown"}.get(code, code)
        return True, code

    def until_final(self, sessions, kind, key, route, body, first):
        """Sends one request until a final answer or the flow's deadline;
        returns the flow record."""
        flow = {"key": key, "flow": uuid.uuid4().hex[:8], "kind": kind, "final": False,
                "cause": None, "answer": None}
        deadline = min(time.time() + FLOW_SECONDS, self.hard_stop)
        rng = random.Random()
        inst = first
        while time.time() < deadline:
            a, r = self.attempt(sessions[inst.name], inst, flow["flow"], kind, key, route,
                                body)
            final, cause = self.cause_of(a, r)
            flow["cause"] = cause
            if final:
                flow["final"] = True
                flow["answer"] = (a["status"], a["id"])
                if self.prober and kind == "req":
                    self.prober.completed(a, route, body)
                break
            wait = 0.2
            if r is not None and r.headers.get("Retry-After", "").isdigit():
                wait = min(float(r.headers["Retry-After"]), RETRY_CAP_S)
            time.sleep(wait * rng.uniform(0.8, 1.2))
            inst = rng.choice(self.proxies)
        self.flows.append(flow)
        return flow

    def client(self, n):
        rng = random.Random(self.seed * 1000 + n)
        mine = {p.name: requests.Session() for p in self.proxies}
        while not self.stop_new.is_set():
            key = "%s-%d-%s" % (self.mode, n, uuid.uuid4().hex[:12])
            route = PAY if rng.random() < 0.7 else REFUND
            amount = rng.randint(1, 10 ** 6)
            body = json.dumps({"amount": amount, "currency": "EUR", "order": key}).encode()
            self.keys[key] = {"route": route, "body": body, "probes": []}
            if self.citus:
                self.keys[key]["tenant"] = rng.choice(self.tenants)
            first = rng.choice(self.proxies)
            if rng.random() < 0.25:
                # duplicates racing the same key, one on each instance
                other = {p.name: requests.Session() for p in self.proxies}
                twin = [p for p in self.proxies if p is not first][0]
                t = threading.Thread(target=self.until_final,
                                     args=(other, "req", key, route, body, twin), daemon=True)
                t.start()
                f = self.until_final(mine, "req", key, route, body, first)
                t.join()
                for s in other.values():
                    s.close()
            else:
                f = self.until_final(mine, "req", key, route, body, first)
            if f["final"] and f["cause"] in ("ok", "declined", "upstream_503"):
                if route == PAY and rng.random() < 0.25:
                    probe = json.dumps({"amount": amount + 1, "currency": "EUR",
                                        "order": key}).encode()
                    self.keys[key]["probes"].append(probe)
                    self.until_final(mine, "probe", key, route, probe, rng.choice(self.proxies))
                if rng.random() < 0.3:
                    # the answer was "lost": the same request again
                    self.until_final(mine, "replay", key, route, body, rng.choice(self.proxies))
            time.sleep(0.02)
        for s in mine.values():
            s.close()

    # --- chaos ---------------------------------------------------------------

    def event(self, kind, inst=None, **kw):
        e = dict(kind=kind, inst=inst, t=time.time(), **kw)
        self.chaos.append(e)
        return e

    def restart(self, p):
        try:
            p.start()
        except RuntimeError as e:
            self.exits.append({"inst": p.name, "rc": None, "expected": False, "t": time.time(),
                               "why": "could not restart: %s" % e})

    def chaos_loop(self, end):
        """Every 1.5-3.5 s a crash; with stalls, a crash and a stall take
        turns, 0.3-1.2 s apart (a stall lasts past the lease: about 7 of
        each in 50 s)."""
        rng = random.Random(self.seed + 7)
        turn = 0
        while time.time() < end:
            time.sleep(rng.uniform(0.3, 1.2) if self.stalls else rng.uniform(1.5, 3.5))
            if time.time() >= end:
                break
            if self.stalls and turn % 2 == 1:
                turn += 1
                self.stalls.run(self.stalls.next_kind(), self.proxies, self.event)
                continue
            kind = rng.choices(["kill", "term", "pg_restart", "hup"], [30, 20, 25, 25])[0]
            p = self.proxies[turn % 2]
            other = self.proxies[(turn + 1) % 2]
            turn += 1
            if kind in ("kill", "term") and not other.alive():
                kind = "hup"   # never both proxies down
            if kind == "kill":
                p.managed = True
                e = self.event("kill", p.name)
                p.proc.kill()
                rc = p.proc.wait(10)
                self.exits.append({"inst": p.name, "rc": rc, "expected": True,
                                   "signal": "KILL", "t": time.time(), "why": describe_rc(rc)})
                time.sleep(rng.uniform(0.2, 1.0))
                self.restart(p)
                e["t_end"] = time.time()
                p.managed = False
            elif kind == "term":
                p.managed = True
                e = self.event("term", p.name)
                p.proc.send_signal(signal.SIGTERM)
                try:
                    rc = p.proc.wait(15)
                except subprocess.TimeoutExpired:
                    p.proc.kill()
                    rc = "hung"
                    p.proc.wait(10)
                self.exits.append({"inst": p.name, "rc": rc, "expected": True,
                                   "signal": "TERM", "t": time.time(),
                                   "why": rc if rc == "hung" else describe_rc(rc)})
                self.restart(p)
                e["t_end"] = time.time()
                p.managed = False
            elif kind == "pg_restart":
                e = self.event("pg_restart")
                try:
                    if self.citus:
                        # the coordinator or a worker, each as often
                        e["node"] = self.pg.restart_immediate(rng.randrange(3))
                    else:
                        self.pg.restart_immediate()
                except (RuntimeError, subprocess.SubprocessError) as x:
                    e["error"] = str(x)
                e["t_end"] = time.time()
            else:
                ttl = "20s" if p.settings["replay_cache_ttl"] == "30s" else "30s"
                p.settings["replay_cache_ttl"] = ttl
                p.write_conf()
                self.event("hup", p.name)
                p.signal(signal.SIGHUP)

    def monitor(self, until):
        while not until.is_set():
            for p in self.proxies:
                if p.proc is None:
                    continue
                r = rss_kb(p.proc.pid)
                if r:
                    self.rss_max[p.name] = max(self.rss_max.get(p.name, 0), r)
                if not p.managed and p.proc.poll() is not None:
                    p.managed = True
                    rc = p.proc.returncode
                    self.exits.append({"inst": p.name, "rc": rc, "expected": False,
                                       "t": time.time(), "why": "%s; log tail: %s" % (
                                           describe_rc(rc), p.log_tail(600))})
                    self.restart(p)
                    p.managed = False
            until.wait(0.1)

    # --- the run -------------------------------------------------------------

    def run(self):
        self.setup()
        t0 = time.time()
        end = t0 + self.seconds
        self.hard_stop = end + FLOW_SECONDS + 1
        mon_stop = threading.Event()
        mon = threading.Thread(target=self.monitor, args=(mon_stop,), daemon=True)
        mon.start()
        clients = [threading.Thread(target=self.client, args=(n,), daemon=True)
                   for n in range(CLIENTS)]
        for c in clients:
            c.start()
        if self.stalls:
            self.prober = stalls_mod.ReplayProber(self, PAY)
            self.prober.start()
        self.chaos_loop(end)
        self.stop_new.set()
        if self.prober:
            self.prober.done.set()
            self.prober.join(CLIENT_TIMEOUT_S + 1)
        for c in clients:
            c.join(max(1.0, self.hard_stop + 5 - time.time()))
        self.rss_end = {p.name: rss_kb(p.proc.pid) for p in self.proxies if p.alive()}
        mon_stop.set()
        mon.join()
        for p in self.proxies:   # every proxy still running must stop cleanly
            if not p.alive():
                continue
            p.managed = True
            p.proc.send_signal(signal.SIGTERM)
            try:
                rc = p.proc.wait(15)
            except subprocess.TimeoutExpired:
                p.proc.kill()
                p.proc.wait(10)
                rc = "hung"
            self.exits.append({"inst": p.name, "rc": rc, "expected": True, "signal": "TERM",
                               "t": time.time(), "why": "final stop: %s" % rc})
        self.duration = time.time() - t0
        time.sleep(SLOW_S)   # let the upstream finish what it still holds
        self.upstream.stop()
        self.ups = self.upstream.records()
        self.logs = [ln for p in self.proxies for ln in p.log_lines()]
        self.db_states = self.record_states()
        with open(os.path.join(self.tmp, "chaos.json"), "w") as f:
            json.dump({"chaos": self.chaos, "exits": self.exits, "flows": self.flows,
                       "attempts": self.attempts}, f, default=str)
        ttl = {REFUND: SHORT_TTL_S - 0.2} if self.mode == "release" else None
        self.violations = checker.check_run(self.mode, self.ups, self.attempts, self.flows,
                                            self.keys, self.logs, self.chaos, self.exits,
                                            self.port_inst, ttl, LEASE_S)
        if self.stalls:
            self.violations += checker.check_stalls(
                self.chaos, self.prober.samples, REPLAY_BOUND_S, LOOP_STALL_MAX_S)
        return self.violations

    def record_states(self):
        import psycopg
        try:
            with psycopg.connect(self.pg.url("chaos_%s" % self.mode), connect_timeout=10) as c:
                return dict(c.execute("SELECT state, count(*) FROM idempotency_records "
                                      "GROUP BY state").fetchall())
        except psycopg.Error as e:
            return {"error": str(e)}

    def figures(self):
        out = []
        keys_final = Counter()
        stuck = Counter()
        per_key_final = {}
        for f in self.flows:
            if f["kind"] == "req":
                per_key_final[f["key"]] = per_key_final.get(f["key"], False) or f["final"]
        for f in self.flows:
            if f["kind"] == "req" and not per_key_final[f["key"]]:
                stuck[f["cause"]] += 1
            if f["final"]:
                keys_final[f["cause"]] += 1
        answers = Counter((a["status"], a["code"]) if not a["error"] else ("error", a["error"])
                          for a in self.attempts)
        per_key = checker.by_key(self.ups)
        out.append("mode %s: %.0f s, %d client requests, %d keys, %d upstream requests "
                   "(%d keys with more than one)" % (
                       self.mode, self.duration, len(self.attempts), len(self.keys),
                       len(self.ups), sum(1 for rs in per_key.values() if len(rs) > 1)))
        out.append("  flows: %d (%s)" % (len(self.flows), ", ".join(
            "%s %d" % kv for kv in sorted(Counter(f["kind"] for f in self.flows).items()))))
        out.append("  answers: " + ", ".join("%s %s: %d" % (s, c or "", n) for (s, c), n in
                                             sorted(answers.items(), key=lambda x: -x[1])))
        out.append("  upstream behaviours: " + ", ".join(
            "%s %d" % kv for kv in sorted(Counter(r.get("kind") for r in self.ups).items())))
        out.append("  chaos events: " + ", ".join(
            "%s %d" % kv for kv in sorted(Counter(e["kind"] for e in self.chaos).items())))
        out.append("  stuck keys by cause (no final answer within %.0f s): %s" % (
            FLOW_SECONDS, ", ".join("%s %d" % kv for kv in sorted(stuck.items())) or "none"))
        out.append("  records by state: %s" % self.db_states)
        pgr = [e["t_end"] - e["t"] for e in self.chaos if e["kind"] == "pg_restart"]
        if pgr:
            out.append("  PostgreSQL crash-restarts took %.1f-%.1f s" % (min(pgr), max(pgr)))
        if self.stalls:
            out += self.stall_figures()
        if self.citus:
            out.append("  Citus: tenants %s; crash-restarts by node: %s" % (
                ", ".join("%s on %s" % kv for kv in sorted(self.tenant_node.items())),
                ", ".join("%s %d" % kv for kv in sorted(Counter(
                    e.get("node") for e in self.chaos if e["kind"] == "pg_restart").items()))
                or "none"))
        out.append("  RSS (kB): " + ", ".join("%s max %s, at end %s" % (
            p.name, self.rss_max.get(p.name), self.rss_end.get(p.name)) for p in self.proxies))
        return out


    def stall_figures(self):
        out = []
        st = [e for e in self.chaos if e["kind"] == "stall"]
        kinds = Counter("%s%s%s" % (e["stall"], " " + e["stmt"] if e.get("stmt") else "",
                                    " then " + e["then"] if e.get("then") else "")
                        for e in st if e.get("started", True))
        out.append("  stalls injected: %d (%s)" % (sum(kinds.values()), ", ".join(
            "%s %d" % kv for kv in sorted(kinds.items())) or "none"))
        missed = [e for e in st if e.get("started") is False]
        if missed:
            out.append("  holds that found no such statement within 3 s: %d" % len(missed))
        keyed = checker.by_key(self.ups)
        per_key = Counter(len(rs) for rs in keyed.values())
        out.append("  executions per key: " + ", ".join(
            "%d: %d keys" % kv for kv in sorted(per_key.items())))
        # The proxies' own word that an attempt acted on a lease another
        # attempt had taken over: the upstream cannot tell that from a
        # repeat after a lost record, so it is counted, not checked.
        fenced = {checker._rid_of(ln.get("detail")) for ln in self.logs
                  if (ln.get("msg") or "").startswith("attempt lost its lease")}
        by_rid = {r.get("rid"): r for r in self.ups}
        again = {by_rid[rid]["key"] for rid in fenced if rid in by_rid
                 and len(keyed[by_rid[rid]["key"]]) > 1}
        out.append("  attempts that sent and then found their lease taken over: %d "
                   "(keys executed again: %d)" % (len(fenced), len(again)))
        for name, picked in (("during store/log stalls", True), ("otherwise", False)):
            lat = checker.replay_latencies(self.chaos, self.prober.samples, picked)
            out.append("  replay from the cache %s: %s" % (name, checker.latency_line(lat)))
        for e in st:
            if e["stall"] == "freeze":
                out.append("  freeze of %s's serving thread %.1f s: /readyz %s" % (
                    e["inst"], e.get("thawed_at", e["t_end"]) - e.get("frozen_at", e["t"]),
                    ", ".join("%+.1fs %s" % (q["t"] - e.get("frozen_at", e["t"]), q["status"])
                              for q in e["polls"][::2]) or e.get("error")))
        return out


def report(name, violations, limit=12):
    lines = []
    by = Counter(inv for inv, _ in violations)
    lines.append("%s: %d violation(s)%s" % (name, len(violations), "" if not by else " — " +
                                             ", ".join("%s %d" % kv for kv in sorted(by.items()))))
    shown = Counter()
    for inv, text in violations:
        shown[inv] += 1
        if shown[inv] <= limit:
            lines.append("  VIOLATED %s: %s" % (inv, text))
    for inv, n in sorted(by.items()):
        if n > limit:
            lines.append("  ... and %d more %s" % (n - limit, inv))
    return lines


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=60)
    ap.add_argument("--modes", default="hold,release")
    ap.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED", "0")) or
                    int(time.time()) % 100000)
    ap.add_argument("--fuzz-seconds", type=float, default=30)
    ap.add_argument("--citus", action="store_true",
                    help="on a Citus coordinator with two workers")
    ap.add_argument("--no-stalls", action="store_true",
                    help="crashes only: no relay, resolver shim, log or loop stalls")
    ap.add_argument("--stall-kinds", default=",".join(stalls_mod.KINDS),
                    help="the stalls to draw from (default: all)")
    a = ap.parse_args()
    kinds = [] if a.no_stalls else [k for k in a.stall_kinds.split(",") if k]
    if set(kinds) - set(stalls_mod.KINDS):
        print("unknown stall kinds: %s" % ", ".join(sorted(set(kinds) - set(stalls_mod.KINDS))))
        return 2

    def on_term(*_):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, on_term)
    if not os.access(procs.BINARY, os.X_OK):
        print("%s is missing: run make first" % procs.BINARY)
        return 2
    print("chaos soak%s: seed %d (CHAOS_SEED=%d reproduces the draws), %.0f s per mode"
          % (" on Citus (a coordinator, two workers)" if a.citus else "",
             a.seed, a.seed, a.seconds), flush=True)
    failed = []
    summary = []
    try:
        pg = (procs.CitusPg if a.citus else Pg)(make_tmp("idemproxy-chaos-pg-"))
        pg.start()
        for mode in [m for m in a.modes.split(",") if m]:
            run = Run(mode, pg, a.seconds, a.seed, stalls=kinds)
            v = run.run()
            lines = run.figures() + report("mode %s" % mode, v)
            print("\n".join(lines), flush=True)
            summary += lines
            failed += v
        if a.fuzz_seconds > 0:
            import fuzz_http
            v, lines = fuzz_http.run(pg, a.fuzz_seconds, a.seed)
            lines += report("fuzz", v)
            print("\n".join(lines), flush=True)
            failed += v
    except KeyboardInterrupt:
        print("interrupted; cleaning up", file=sys.stderr)
        return 130
    except BaseException:
        procs.KEEP_LOGS["on"] = True
        raise
    finally:
        procs.KEEP_LOGS["on"] = procs.KEEP_LOGS["on"] or bool(failed)
        procs.cleanup_all()
    if failed:
        print("\nFAILED: %d invariant violation(s) (seed %d), listed above" % (len(failed),
                                                                            a.seed))
        return 1
    print("\npassed: every invariant held (seed %d)" % a.seed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
