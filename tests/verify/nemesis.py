"""The campaign's nemesis: faults at random moments for random lengths,
drawn from one seeded PRNG, each written to events.jsonl.

Faults overlap, except on the same resource: one fault at a time per
proxy instance (kill, term, freeze, the skew restarts), per partitioned
pair, and on the database (crash-restart, failover). A failover waits
until the standby is synchronous again. The first draws go through every
kind once (in a seeded order), so a short run sees each; later draws are
weighted. stop() ends the faults early (each heals at once) and waits for
the last one; the heal event carries that time.
"""
import json
import os
import random
import signal
import sys
import threading
import time
import traceback

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..",
                                "integration"))
from freeze import freeze_thread  # noqa: E402

KINDS = {"part_pg": 4, "part_up": 3, "part_cl": 3, "kill": 2, "term": 2,
         "pg_crash": 1, "failover": 1, "freeze": 2}
DIRS = ["both", "a_to_b", "b_to_a"]


class Events:
    def __init__(self, path):
        self.f = open(path, "a")
        self.lock = threading.Lock()
        self.counts = {}

    def write(self, ev):
        with self.lock:
            self.f.write(json.dumps(ev) + "\n")
            self.f.flush()
            self.counts[ev["kind"]] = self.counts.get(ev["kind"], 0) + 1

    def close(self):
        self.f.close()


class Nemesis:
    def __init__(self, seed, net, cluster, proxies, events, log=print, gap_s=1.5):
        self.rng = random.Random(seed)
        self.net = net
        self.cluster = cluster
        self.proxies = {p.name: p for p in proxies}
        self.events = events
        self.log = log
        self.gap_s = gap_s
        self.stopping = threading.Event()
        self.threads = []
        self.locks = {}
        self.errors = []
        self.skew = None

    # --- the loop ------------------------------------------------------------

    def start(self, skew_window, skew_sign=1):
        """Starts the fault loop and, when skew_window = (start_s, end_s)
        from now, the skewed proxy's stretch: its clock 8-12 s ahead
        (skew_sign 1) or behind (-1), more than the lease either way."""
        if skew_window:
            self._spawn(self.do_skew, self.rng.choice(sorted(self.proxies)), *skew_window,
                        skew_sign * self.rng.uniform(8.0, 12.0))
        self.loop = threading.Thread(target=self._loop, daemon=True)
        self.loop.start()

    def _loop(self):
        first = list(KINDS)
        self.rng.shuffle(first)
        while not self.stopping.wait(self.rng.expovariate(1.0 / self.gap_s)):
            if first:
                kind = first.pop()
            else:
                kind = self.rng.choices(list(KINDS), weights=list(KINDS.values()))[0]
            getattr(self, "plan_" + kind)()

    def stop(self):
        """Ends every fault, waits for them; returns the heal time."""
        self.stopping.set()
        if getattr(self, "loop", None):
            self.loop.join(30)
        for t in self.threads:
            t.join(240)
        self.net.heal_all()
        return time.time()

    def _spawn(self, fn, *args):
        def body():
            try:
                fn(*args)
            except Exception as e:  # a fault that failed is reported, not fatal
                self.errors.append("%s%r: %s" % (fn.__name__, args, e))
                self.log("nemesis: %s failed: %s\n%s" % (fn.__name__, e,
                                                          traceback.format_exc()))
        t = threading.Thread(target=body, daemon=True)
        t.start()
        self.threads.append(t)

    def _take(self, name):
        lock = self.locks.setdefault(name, threading.Lock())
        return lock.acquire(blocking=False) and lock

    def _length(self, lo, hi):
        return self.rng.uniform(lo, hi)

    # --- partitions ----------------------------------------------------------

    def plan_part_pg(self):
        self._plan_part("pg", self.rng.choice(DIRS), self._length(0.5, 5.0))

    def plan_part_up(self):
        self._plan_part("up", self.rng.choice(DIRS), self._length(0.3, 3.0))

    def plan_part_cl(self):
        self._plan_part("cl", self.rng.choice(DIRS), self._length(0.3, 3.0))

    def _plan_part(self, b, direction, length):
        inst = self.rng.choice(sorted(self.proxies))
        lock = self._take("part:%s:%s" % (inst, b))
        if lock:
            self._spawn(self.do_partition, lock, inst, b, direction, length)

    def do_partition(self, lock, inst, b, direction, length):
        nodes = ["pg1", "pg2"] if b == "pg" else [b]
        try:
            t0 = time.time()
            self.net.cut(inst, nodes, direction)
            self.stopping.wait(length)
            self.net.heal(inst, nodes, direction)
            self.events.write({"kind": "partition", "a": inst, "b": b, "dir": direction,
                               "t0_s": t0, "t1_s": time.time()})
        finally:
            lock.release()

    # --- proxies -------------------------------------------------------------

    def plan_kill(self):
        self._plan_proxy(self.do_stop, "kill", self._length(0.1, 2.0))

    def plan_term(self):
        self._plan_proxy(self.do_stop, "term", self._length(0.1, 2.0))

    def plan_freeze(self):
        self._plan_proxy(self.do_freeze, self._length(0.5, 4.0))

    def _plan_proxy(self, fn, *args):
        inst = self.rng.choice(sorted(self.proxies))
        lock = self._take("proxy:" + inst)
        if lock:
            self._spawn(fn, lock, self.proxies[inst], *args)

    def do_stop(self, lock, p, how, down_s):
        try:
            t0 = time.time()
            p.stop(signal.SIGKILL if how == "kill" else signal.SIGTERM)
            self.stopping.wait(down_s)
            p.start()
            self.events.write({"kind": how, "inst": p.name, "t0_s": t0, "t1_s": time.time()})
        finally:
            lock.release()

    def do_freeze(self, lock, p, length):
        try:
            if not p.alive():
                return
            with freeze_thread(p.proc.pid, "ip-serve"):
                t0 = time.time()
                self.stopping.wait(length)
            self.events.write({"kind": "freeze", "inst": p.name, "t0_s": t0,
                               "t1_s": time.time()})
        finally:
            lock.release()

    def do_skew(self, inst, start_in, end_in, offset):
        """Restarts inst under a clock offset by more than a lease for the
        stretch [start_in, end_in] seconds from now, then normally."""
        begin = time.monotonic()
        if self.stopping.wait(start_in):
            return
        p = self.proxies[inst]
        lock = self.locks.setdefault("proxy:" + inst, threading.Lock())
        with lock:
            t0 = time.time()
            p.stop(signal.SIGTERM)
            p.skew = offset
            p.start()
        self.stopping.wait(max(0.0, end_in - (time.monotonic() - begin)))
        with lock:
            p.stop(signal.SIGTERM)
            p.skew = None
            p.start()
            self.events.write({"kind": "skew", "inst": inst, "offset_s": offset, "t0_s": t0,
                               "t1_s": time.time()})

    # --- the database --------------------------------------------------------

    def plan_pg_crash(self):
        if self.cluster.lock.acquire(blocking=False):
            self._spawn(self.do_pg_crash)

    def plan_failover(self):
        if self.cluster.sync and self.cluster.lock.acquire(blocking=False):
            self._spawn(self.do_failover)

    def do_pg_crash(self):
        try:
            t0 = time.time()
            self.cluster.crash_restart()
            self.events.write({"kind": "pg_crash", "t0_s": t0, "t1_s": time.time()})
        finally:
            self.cluster.lock.release()

    def do_failover(self):
        try:
            t0 = time.time()

            def promoted(old, new):
                self.events.write({"kind": "failover", "from": old, "to": new, "t0_s": t0,
                                   "t1_s": time.time()})
                self.log("nemesis: failover %s -> %s in %.2fs" % (old, new, time.time() - t0))
            self.cluster.failover(promoted)
        finally:
            self.cluster.lock.release()
