"""The soak's stalls: what a demanding user's network, resolver, log reader
and scheduler do to a proxy besides crashing it.

  hold_answer     a relay between the proxies and PostgreSQL runs the next
                  execution of one statement (claim_new, claim_many or
                  complete_many) and holds its answer past the lease, then
                  delivers it or cuts that connection
  hold_statement  the same, holding the statement before the server sees it
  hold_all        every byte of every relayed connection is held past the
                  lease, then delivered or every connection cut
  dns             every relayed connection is closed while lookups of the
                  database's host name hang (a gate file of the resolver
                  shim, build/slow_resolver.so) past the lease
  log             a proxy's log reader stops reading for a while (its
                  stderr goes through a one-page pipe)
  freeze          a proxy's serving thread is stopped with ptrace for
                  FREEZE_S while /readyz is asked on its admin listener

Meanwhile a prober replays requests whose answers a proxy has already
replayed from its cache, on that proxy, and records each replay's latency:
checker.check_replays_answer bounds it while the store or the log stalls.
"""
import os
import random
import sys
import threading
import time

import requests

import procs

sys.path.insert(0, os.path.join(procs.ROOT, "tests", "integration"))
from freeze import freeze_thread  # noqa: E402
from pg_relay import PgRelay  # noqa: E402

KINDS = ["hold_answer", "hold_statement", "hold_all", "dns", "log", "freeze"]
HELD_STATEMENTS = ["claim_new", "claim_many", "complete_many"]
FREEZE_S = 4.5          # longer than loop_stall_max (2 s) with room to see it
LOG_STALL_S = (4.0, 6.0)
SHIM_HOST = "idemproxy-db.chaos.test"
SHIM_DELAY_MS = 50      # every lookup of the name is a little slow


def shim_path():
    return os.path.join(procs.ROOT, "build", "slow_resolver.so")


class Stalls:
    def __init__(self, tmp, pg_port, lease_s, seed, kinds=None):
        self.lease_s = lease_s
        self.rng = random.Random(seed)
        self.kinds = list(kinds or KINDS)
        self.bag = []
        self.relay = PgRelay(pg_port)
        procs.at_cleanup(self.relay.stop)
        self.gate = os.path.join(tmp, "dns.gate")

    def url(self, db):
        """The database as the proxies see it: by a host name the shim
        resolves to the relay."""
        return ("postgresql://postgres@%s:%d/%s?sslmode=disable&gssencmode=disable"
                % (SHIM_HOST, self.relay.port, db))

    def env(self):
        return {"LD_PRELOAD": shim_path(), "IDEMPROXY_SHIM_HOST": SHIM_HOST,
                "IDEMPROXY_SHIM_ADDR": "127.0.0.1",
                "IDEMPROXY_SHIM_DELAY_MS": str(SHIM_DELAY_MS),
                "IDEMPROXY_SHIM_GATE": self.gate}

    def next_kind(self):
        """Every kind once, in a random order, then again: a short run
        still sees each."""
        if not self.bag:
            self.bag = list(self.kinds)
            self.rng.shuffle(self.bag)
        return self.bag.pop()

    def past_lease(self):
        """Just past the lease (a retry may find its own claim expired
        before another attempt took the key) up to well past it."""
        return self.rng.uniform(self.lease_s + 0.1, self.lease_s + 1.5)

    def run(self, kind, proxies, event):
        """Injects one stall; returns its event (t and t_end bound it)."""
        p = self.rng.choice([q for q in proxies if q.alive()] or proxies)
        if kind in ("hold_answer", "hold_statement"):
            return self.hold_one(kind, event)
        if kind == "hold_all":
            then = self.rng.choice(["deliver", "cut"])
            e = event("stall", stall=kind, then=then, store=True)
            seconds = self.past_lease()
            self.relay.hold_all(seconds, then=then)
            time.sleep(seconds + 0.05)   # its own timer ends it
        elif kind == "dns":
            e = event("stall", stall=kind, store=True)
            open(self.gate, "w").close()
            try:
                self.relay.terminate_all()
                time.sleep(self.past_lease())
            finally:
                os.unlink(self.gate)
        elif kind == "log":
            e = event("stall", p.name, stall=kind)
            p.draining.clear()
            try:
                time.sleep(self.rng.uniform(*LOG_STALL_S))
            finally:
                p.draining.set()
        else:
            e = event("stall", p.name, stall=kind, polls=[])
            self.freeze(p, e)
        e["t_end"] = time.time()
        return e

    def hold_one(self, kind, event):
        stmt = self.rng.choice(HELD_STATEMENTS)
        then = self.rng.choice(["deliver", "cut"])
        phase = "answer" if kind == "hold_answer" else "statement"
        seconds = self.past_lease()
        before = self.relay.held
        # two executions: a batch claim and a lone one, or two batches
        self.relay.hold(stmt, seconds=seconds, then=then, phase=phase, shots=2)
        deadline = time.time() + 3.0
        while self.relay.held == before and time.time() < deadline:
            time.sleep(0.02)
        if self.relay.held == before:
            self.relay.clear()   # no such statement came: nothing held
            e = event("stall", stall=kind, stmt=stmt, then=then, started=False)
            e["t_end"] = e["t"]
            return e
        e = event("stall", stall=kind, stmt=stmt, then=then, started=True)
        time.sleep(seconds)
        e["t_end"] = time.time()
        return e

    def freeze(self, p, e):
        """Stops p's serving thread for FREEZE_S and asks /readyz every
        250 ms meanwhile; the answers go into e["polls"]."""
        done = threading.Event()
        url = "http://127.0.0.1:%d/readyz" % p.admin_port

        def poll():
            while not done.is_set():
                t = time.time()
                try:
                    st = requests.get(url, timeout=1).status_code
                except requests.RequestException as x:
                    st = type(x).__name__
                e["polls"].append({"t": t, "status": st})
                done.wait(0.25)
        poller = threading.Thread(target=poll, daemon=True)
        try:
            with freeze_thread(p.proc.pid, "ip-serve"):
                e["frozen_at"] = time.time()
                poller.start()
                time.sleep(FREEZE_S)
            e["thawed_at"] = time.time()
        except (OSError, AssertionError) as x:
            e["error"] = "%s: %s" % (type(x).__name__, x)
        finally:
            done.set()
            if poller.is_alive():
                poller.join(2)


class ReplayProber(threading.Thread):
    """Replays answers a proxy has already served from its cache, on that
    proxy, every PERIOD_S: a completion is replayed once when fresh and
    kept as warm when that replay came from the proxy at once
    (Idempotent-Replayed, under WARM_S); warm ones are replayed again
    while they are younger than the cache's ttl allows. Each replay is a
    sample: t0, t1, inst, status, replayed, error."""
    PERIOD_S = 0.15
    WARM_S = 0.3
    MAX_AGE_S = 15.0     # the soak's replay_cache_ttl is 20-30 s

    def __init__(self, run, pay_route):
        super().__init__(daemon=True)
        self.run_ = run
        self.pay_route = pay_route
        self.done = threading.Event()
        self.fresh = []
        self.warm = []
        self.samples = []
        self.rng = random.Random(run.seed + 13)

    def completed(self, a, route, body):
        """A client got its final answer to a fresh request (a 201/402 of
        the payment route: its record lives an hour)."""
        if route == self.pay_route and a["status"] in (201, 402) and not a["code"]:
            self.fresh.append((a["key"], a["inst"], route, body, a["t1"]))
            del self.fresh[:-50]

    def run(self):
        sessions = {p.name: requests.Session() for p in self.run_.proxies}
        by_name = {p.name: p for p in self.run_.proxies}
        while not self.done.wait(self.PERIOD_S):
            ent, warming = self.pick()
            if ent is None:
                continue
            key, inst, route, body, _ = ent
            p = by_name[inst]
            if not p.alive() or p.started > ent[4]:
                continue   # restarted since: its cache is empty
            a, _ = self.run_.attempt(sessions[inst], p, "prober", "replay", key, route,
                                     body)
            # only a replay of a warm answer must come from the cache
            a["warm"] = not warming
            self.samples.append(a)
            if warming and a["replayed"] and a["t1"] - a["t0"] < self.WARM_S:
                self.warm.append(ent)
        for s in sessions.values():
            s.close()

    def pick(self):
        now = time.time()
        self.warm = [w for w in self.warm if now - w[4] < self.MAX_AGE_S]
        if self.fresh and (not self.warm or self.rng.random() < 0.3):
            return self.fresh.pop(), True
        if self.warm:
            return self.rng.choice(self.warm), False
        return None, False
