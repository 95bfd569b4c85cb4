#!/usr/bin/env python3
"""The checker of the verification campaign (issue 28, section 3).

    invariants.py RUN_DIR [--json OUT]

Reads a run directory (run.json, events.jsonl, ledger.tsv, load.tsv,
p1.log/p2.log; formats in the campaign's interface description), holds the
eight invariants over the whole history, computes the figures the
verification page publishes, prints a report, writes RUN_DIR/summary.json
(and OUT with --json) and exits 1 when any invariant is violated.

Terms
-----
scope        (tenant, route path, key): what the proxy keys a record by. A
             `tenant` flow's second tenant is a new scope; keys are unique
             per flow, so a scope is one logical operation.
forward      one ledger line: a request the proxy sent and the ledger read
             whole. An execution is a forward with effect=1.
epoch        one record lifetime of a scope. Records expire at
             claim + ttl (the claim's `now()`, the database's clock:
             sql/009_own_token_lease.sql; completing never moves
             `expires_at`, a release keeps the row and its `expires_at`, a
             takeover moves it to at most takeover + lease). The claim
             that opened an epoch may come from any attempt of the scope,
             not only the one forwarded (an attempt that claimed, got
             upstream_unavailable and released, say), so
                 claim >= claim_lo = earliest t0 of the scope's attempts
             (in a later epoch: of those still going when the previous
             epoch may have expired, and not before that, exp_lo - slack)
             and the epoch lives at least until exp_lo = claim_lo + ttl. A
             forward at t_start < exp_lo - clock_slack is in the same epoch;
             later ones open a new epoch (that is how `late` refunds may
             execute again). The epoch surely ended by
                 exp_hi = max(first.t_start + ttl, last.t_end + lease).
final        a client answer that ends a flow: 2xx, 402, 422, any 4xx but
             409 (what the load generator stops on). Every ledger answer
             carrying an exec (201, 402) is final, and so is a *stored*
             answer: a non-effect ledger answer with a status not in
             release_statuses (an e503 in hold mode, release_statuses
             empty), read whole, heading its epoch; the proxy gives it
             (no problem code, no exec) and replays it until expiry.
seen         a ledger answer (an exec, or a stored answer, matched by
             resp_hash) received by a client; its seen time is the earliest
             t1 of the attempts that got it. A problem the proxy answered
             instead (idempotency_outcome_unrecorded: the upstream answered
             but the answer was not recorded, so it is withheld) is never a
             sighting.
faults       the windows [t0_s, t1_s] of partition, kill, term, restart,
             pg_crash, failover and freeze events. Skew is counted as a
             fault injected but does not open a window: a skewed clock
             stalls nothing, and the checker must not excuse anything for
             it (leases and expiry follow the database's clock).

The invariants and how these files prove them
---------------------------------------------
1. One execution per key. hold (release_statuses empty there, so every
   answer the ledger gives, 503 included, completes the record): a second
   forward in one epoch is a violation (`hold_second_forward`).
   release_after_lease: a forward R1 is *released* when the ledger answered
   it whole with a status in release_statuses and effect=0 (an e503 the
   proxy read): a retry may go at once. Any other earlier forward R1 of the
   epoch (an execution, or an e503/drop the proxy could not know the outcome
   of: cut=1) binds every later forward R2 of the epoch:
   - `overlap`: R2.t_start < R1.t_end (two at once);
   - `before_lease_end`: R2.t_start < lease_lo(R1) + lease - clock_slack,
     lease_lo(R1) = max(t0 of R1's attempt, R1.t_start - lease): a lease
     starts at its claim (or renewal), never before the attempt was sent;
   - `after_answer_seen`: R1's answer reached a client before R2.t_start
     (then the record was completed and nothing may take the key over).
   Every forward counts as R2, not only executions: whether the ledger's
   dice gave a forward an effect is luck, forwarding during a lease is the
   bug.
2. Every answer a client got that carries X-Ledger-Exec is a ledger
   execution (`unknown_exec`) of the same route and key (`wrong_key`; another
   tenant is invariant 3), with the ledger's resp_hash byte for byte
   (`bytes_differ`: status, content type, exec header, body), and all
   answers of one epoch carry one exec (`two_execs_answered`, one per extra
   exec): after the first final ledger answer reached a client, every other
   answer before expiry is the same exec. `unknown_replay`: an answer
   with Idempotent-Replayed, no exec and no code that is not its scope's
   stored answer (another status or other bytes, or a released one). `no_exec`: a 2xx or 402 that is
   no proxy problem and carries no exec (only the ledger makes those, and a
   replay must give its replay headers back, X-Ledger-Exec included).
3. `cross_tenant`: an answer whose exec the ledger made for another tenant
   (or the same key of another tenant). `mismatch_executed`: one epoch's
   forwards carry two body hashes (a `mismatch` send, or any other body,
   went out under a key whose record held another; once the record may have
   expired the new body opens a new epoch and may execute).
   `mismatch_answered`: a `mismatch` attempt got the answer of an execution
   of another body (the original's replay instead of a problem).
4. A proxy problem whose code means "not forwarded" has no ledger line
   with its attempt id (`forwarded_after_refusal`). The codes, from
   src/problem.c, src/proxy.c and doc/design.md ("Errors the proxy
   answers"), answered before anything is sent or without sending:
   idempotency_key_missing, idempotency_key_invalid, tenant_missing,
   bad_request, credentials_missing, credentials_invalid, route_not_found,
   request_too_large, request_timeout (the request was never read whole),
   idempotency_key_in_use (in flight, held, or a wait that ended),
   idempotency_key_mismatch, idempotency_response_not_replayable and
   idempotency_record_unreadable (a completed record answers; nothing is
   forwarded), idempotency_lease_expired (released before the send),
   upstream_unavailable (UP_NOT_SENT: libcurl's pre-request hook never
   let a byte go), idempotency_store_unavailable (the claim failed: with
   unavailable = reject nothing is sent; with "forward" the client gets the
   upstream's own answer, never this code), overloaded and shutting_down
   (not started). Not in it: upstream_outcome_unknown,
   idempotency_outcome_unrecorded and upstream_response_too_large (sent),
   internal_error (no promise made).
5. Once a client saw a final ledger answer of an epoch (at T, the earliest
   t1), `different_after_seen`: an answer to an attempt sent after T (t0 >
   T) carries another exec; `forwarded_after_seen`: the ledger got a forward
   of the scope after T in the same epoch (before exp_lo);
   `refused_as_mismatch`: an attempt (any kind but `mismatch`) was
   answered idempotency_key_mismatch while its scope's record surely held
   its very body (a forward of that body before it, in an epoch that
   cannot have ended): its key no longer answers its own payload. Attempts across
   restarts and failover (`recheck`) are held to the same rule: nothing
   excuses them but expiry.
6. After each `heal` event h, every flow in progress at h (t_first <= h,
   no final answer before h) gets a final answer by h + lease +
   final_bound_s (`not_final_in_bound`). A flow's final state is its first
   final answer in the A lines (its F line's t_final may be a later phase:
   a late, tenant or mismatch send); a flow with none is judged by its F
   line (final, cause, and t_final as the time it gave up). Excused: a
   flow whose forwards after h met the upstream's own failures (no answer,
   or a released status: drawn ledger behaviours) and that was final by the
   bound counted from the last of them. Every instance scraped after the
   last heal shows oldest_processing_s < lease in some scrape
   (`gauge_not_below_lease`).
7. `replay_after_expiry`: an answer with replayed=1 sent (t0) after the
   epoch of its exec surely ended: t0 > exp_hi + replay_slack.
   `second_execution_before_ttl`: two executions (effect=1) of one epoch
   that invariant 1 does not allow (each such pair also counts under 1,
   which counts every forward).
8. A `wait` attempt or any attempt on the transfer route (but `mismatch`
   sends: a mismatch is refused before anything waits) that got an answer
   got: the key's one execution or stored answer (the epoch's first seen,
   `not_original` otherwise; `other_tenant` for another scope's), a 409
   with a code, or the answer to its own forward (a waiter that took a
   released or expired key over is the original then). `bad_answer`: a 409
   without a code, or an answer with neither exec nor code that is not its
   own forward's (another request's released 503, say). `hang`: t1 - t0 > wait_max + upstream_timeout +
   wait_slack. The bound: a waiter waits at most wait_max, or until the
   lease it waits on ends and it takes over, and then its own upstream
   call ends within upstream_timeout; wait_slack (1 s) covers the store
   round trips and the client.

Excuses (never violations; each counted under "excused" in the summary)
-----------------------------------------------------------------------
- A timeout or transport error (status 0) is never a violation by itself,
  and tells nothing about what the proxy did: such attempts are judged by
  invariant 4 only if they carry a code (they do not).
- A ledger answer no client received cannot be judged: a forward after an
  unseen execution's lease ended is allowed in release_after_lease (the
  proxy may never have read it, or read it and withheld it as
  idempotency_outcome_unrecorded), and its bytes are not compared.
- A released forward (e503 read whole, release mode) binds nothing.
- A forward at or after exp_lo - clock_slack opens a new epoch (the record
  may have expired): allowed.
- Invariant 8: a 5xx problem with a code (store unavailable, overloaded,
  shutting down, lease expired, upstream unavailable or outcome unknown:
  the proxy refused or lost its own forward, nothing waited) is not a
  violation, nor is another 4xx problem (a refusal of the request itself,
  judged by invariants 4 and 5); an over-long wait is excused when it overlaps a fault window
  of its instance (its kill, term, restart, freeze, or a partition naming
  it) or of PostgreSQL (pg_crash, failover, partition to pg).
- Invariant 6: a flow the client gave up (deadline, stop) before the bound
  passed is not judged; a heal followed by a new fault window before the
  bound passed is not judged; in hold mode a scope whose outcome became
  unknown (a forward cut, or a client got upstream_outcome_unknown or
  idempotency_outcome_unrecorded) is held
  for an operator by design, and so is the gauge while such keys exist.
- Answers to attempts whose exec is in no ledger line are `unknown_exec`,
  never excused.

- A line without its newline (a writer stopped mid-line) or with a
  time or status that is not a number is skipped and counted
  (`malformed_lines`), never judged.

Figures (summary.json)
----------------------
requests (A lines), flows (F lines), keys (scopes: forwarded ones plus
those never forwarded), attempts and flows by kind, retries per operation
(F attempts - 1: mean, p99, max), concurrent duplicates (`dup` attempts),
ledger forwards and executions, faults injected by kind (events), anomalies
by invariant (all eight rows, target 0) and by class with samples, the
excused cases by kind, latency p50/p99 of answered attempts whose
[t0, t1] overlaps a fault window and of the others, after each heal: flows
in flight, time to their first final answer (max, p99), and per instance
the scraped oldest_processing_s (its lowest after the last heal, and
whether it fell below the lease); per proxy log, lines, errors and
warnings; the check's own time and peak RSS.

The checker streams ledger.tsv once and load.tsv twice (first only to learn
the t0 of the attempts the ledger saw) and keeps the ledger lines by scope
and by exec, plus small per-epoch tallies.
"""
import argparse
from array import array
import bisect
import json
import os
import resource
import sys
import time

ROUTE_PATHS = {"pay": "/v1/payments", "refund": "/v1/refunds",
               "transfer": "/v1/transfers"}
TRANSFER_PATH = "/v1/transfers"
DEFAULT_RELEASE = [408, 425, 429, 500, 502, 503, 504]

NOT_FORWARDED = frozenset([
    "idempotency_key_missing", "idempotency_key_invalid", "tenant_missing",
    "bad_request", "credentials_missing", "credentials_invalid",
    "route_not_found", "request_too_large", "request_timeout",
    "idempotency_key_in_use", "idempotency_key_mismatch",
    "idempotency_response_not_replayable", "idempotency_record_unreadable",
    "idempotency_lease_expired", "upstream_unavailable",
    "idempotency_store_unavailable", "overloaded", "shutting_down",
])
# Codes after which a hold-mode record stays processing until an operator
# releases it: the upstream was called and its outcome is not recorded.
HELD_CODES = frozenset(["upstream_outcome_unknown",
                        "idempotency_outcome_unrecorded"])
WINDOW_FAULTS = frozenset(["partition", "kill", "term", "restart",
                           "pg_crash", "failover", "freeze"])
ALL_FAULTS = WINDOW_FAULTS | {"skew"}
INVARIANTS = ["1", "2", "3", "4", "5", "6", "7", "8"]
US = 1_000_000

LEDGER_COLS = ("seq port t_start t_end tenant key attempt_id method target "
               "body_sha kind effect exec status resp_hash cut").split()
A_COLS = ("A flow seq akind proxy t0 t1 tenant route key body_sha "
          "attempt_id status code replayed exec resp_hash retry_after_ms "
          "error").split()
F_COLS = ("F flow fkind tenant route key body_sha t_first t_final final "
          "cause attempts").split()


def route_path(route):
    """A route name (pay) or path (/v1/payments?x) as its path."""
    if route.startswith("/"):
        q = route.find("?")
        return route if q < 0 else route[:q]
    return ROUTE_PATHS.get(route, route)


def hexint(h):
    try:
        return int(h, 16) if h else None
    except ValueError:
        return h


def percentile(sorted_vals, p):
    if not sorted_vals:
        return None
    k = max(0, min(len(sorted_vals) - 1,
                   int(-(-p * len(sorted_vals) // 100)) - 1))
    return sorted_vals[k]


def peak_rss_mb():
    """This process's peak RSS. VmHWM, not ru_maxrss: Linux keeps
    ru_maxrss across exec, so a checker started by a large parent would
    report the parent's."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return round(int(line.split()[1]) / 1024.0)
    except OSError:
        pass
    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0)


class Fwd:
    """One ledger line (a forward); the first of an epoch is its head."""
    __slots__ = ("t_start", "t_end", "att", "effect", "exec", "status",
                 "rhash", "cut", "body", "scope", "att_t0", "seen_t1",
                 "seen_t0", "head", "members", "exp_lo", "exp_hi", "first")

    def __init__(self, f, c, scope):
        self.t_start = int(f[c["t_start"]])
        self.t_end = int(f[c["t_end"]])
        self.att = f[c["attempt_id"]]
        self.effect = f[c["effect"]] == "1"
        self.exec = f[c["exec"]]
        self.status = int(f[c["status"]] or 0)
        self.rhash = hexint(f[c["resp_hash"]])
        self.cut = f[c["cut"]] == "1"
        self.body = hexint(f[c["body_sha"]])
        self.scope = scope
        self.att_t0 = self.seen_t1 = self.seen_t0 = None
        self.head = self.members = self.first = None
        self.exp_lo = self.exp_hi = 0

    @property
    def tenant(self):
        return self.scope.partition("\t")[0]

    def epoch(self):
        """The forwards of the epoch this one heads."""
        return self.members or (self,)


class Tally:
    """Violations by invariant and class, with a few samples each."""

    def __init__(self, samples):
        self.n = {i: {} for i in INVARIANTS}
        self.samples = {i: [] for i in INVARIANTS}
        self.excused = {}
        self.max_samples = samples

    def bad(self, inv, cls, **detail):
        d = self.n[inv]
        d[cls] = d.get(cls, 0) + 1
        if sum(1 for x in self.samples[inv]
               if x["class"] == cls) < self.max_samples:
            detail["class"] = cls
            self.samples[inv].append(detail)

    def excuse(self, what):
        self.excused[what] = self.excused.get(what, 0) + 1

    def count(self, inv):
        return sum(self.n[inv].values())


class Windows:
    """Merged time windows (µs) with an overlap query."""

    def __init__(self, spans):
        merged = []
        for a, b in sorted(spans):
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        self.starts = [m[0] for m in merged]
        self.ends = [m[1] for m in merged]

    def overlaps(self, a, b):
        i = bisect.bisect_right(self.starts, b) - 1
        return i >= 0 and self.ends[i] >= a



class Checker:
    def __init__(self, run_dir, samples=5, clock_slack_s=0.25,
                 replay_slack_s=1.0, wait_slack_s=1.0):
        self.dir = run_dir
        self.t = Tally(samples)
        with open(os.path.join(run_dir, "run.json")) as fh:
            self.run = json.load(fh)
        r = self.run
        self.hold = r.get("mode", "hold") == "hold"
        self.release = frozenset(r.get("release_statuses",
                                       [] if self.hold else DEFAULT_RELEASE))
        self.lease = int(float(r.get("lease_s", 3.0)) * US)
        self.up_timeout = int(float(r.get("upstream_timeout_s", 1.0)) * US)
        self.wait_max = int(float(r.get("wait_max_s", 2.0)) * US)
        self.final_bound = int(float(r.get("final_bound_s", 10.0)) * US)
        self.ttl = {route_path(k): int(float(v) * US)
                    for k, v in r.get("ttl_s", {}).items()}
        self.proxies = r.get("proxies", ["p1", "p2"])
        self.clock_slack = int(clock_slack_s * US)
        self.replay_slack = int(replay_slack_s * US)
        self.wait_bound = self.wait_max + self.up_timeout + int(
            wait_slack_s * US)
        self.by_scope = {}
        self.by_exec = {}
        self.by_att = {}
        self.fig = {}
        self.malformed = {"ledger.tsv": 0, "load.tsv": 0}
        self.load_cut = False
        self.held = set()
        self.first_t0 = {}
        self.att_times = {}

    def ttl_of(self, path):
        return self.ttl.get(path, 3600 * US)

    # --- events ------------------------------------------------------------

    def read_events(self):
        self.faults = {}
        self.heals = []
        self.scrapes = []
        spans, inst_spans, pg_spans = [], {}, []
        path = os.path.join(self.dir, "events.jsonl")
        lines = open(path).read().splitlines() if os.path.exists(path) else []
        for line in lines:
            if not line.strip():
                continue
            e = json.loads(line)
            k = e.get("kind")
            if k == "heal":
                self.heals.append(int(e["t_s"] * US))
            elif k == "scrape":
                self.scrapes.append(e)
            if k not in ALL_FAULTS:
                continue
            self.faults[k] = self.faults.get(k, 0) + 1
            if k not in WINDOW_FAULTS:
                continue
            w = (int(e["t0_s"] * US), int(e.get("t1_s", e["t0_s"]) * US))
            spans.append(w)
            if k in ("pg_crash", "failover") or (
                    k == "partition" and e.get("b") == "pg"):
                pg_spans.append(w)
            for who in (e.get("inst"), e.get("a"), e.get("b")):
                if who:
                    inst_spans.setdefault(who, []).append(w)
        self.fault_win = Windows(spans)
        self.fault_starts = sorted(a for a, _ in spans)
        self.inst_win = {i: Windows(s + pg_spans)
                         for i, s in inst_spans.items()}
        self.pg_win = Windows(pg_spans)

    # --- ledger ------------------------------------------------------------

    def read_ledger(self):
        c = {n: i for i, n in enumerate(LEDGER_COLS)}
        n = effects = 0
        with open(os.path.join(self.dir, "ledger.tsv")) as fh:
            for line in fh:
                if not line.endswith("\n"):
                    self.malformed["ledger.tsv"] += 1  # cut mid-write
                    continue
                f = line.rstrip("\n").split("\t")
                if f[0] == "seq":
                    c = {name: i for i, name in enumerate(f)}
                    continue
                if len(f) < len(c):
                    f += [""] * (len(c) - len(f))
                tenant = f[c["tenant"]]
                scope = "%s\t%s\t%s" % (tenant, route_path(f[c["target"]]),
                                        f[c["key"]])
                try:
                    r = Fwd(f, c, scope)
                except ValueError:
                    self.malformed["ledger.tsv"] += 1
                    continue
                n += 1
                effects += r.effect
                # One forward per scope is the rule: a list only for more.
                have = self.by_scope.get(scope)
                if have is None:
                    self.by_scope[scope] = r
                elif type(have) is list:
                    have.append(r)
                else:
                    self.by_scope[scope] = [have, r]
                if r.exec:
                    self.by_exec[r.exec] = r
                if r.att:
                    self.by_att[r.att] = r
        self.fig["ledger"] = {"forwards": n, "executions": effects}

    def learn_attempt_t0(self):
        """Pass 1 over load.tsv: t0 of every attempt the ledger saw, the
        earliest t0 of each forwarded scope's attempts (any of them may
        have made the claim that fixed the record's expiry) and, for
        scopes forwarded more than once, every attempt's (t0, t1)."""
        ca = {n: i for i, n in enumerate(A_COLS)}
        by_att, by_scope = self.by_att, self.by_scope
        first_t0, times = self.first_t0, self.att_times
        for f in self.load_lines():
            if f[0] != "A":
                continue
            if f[1] == "flow":
                ca = {n: i for i, n in enumerate(f)}
                continue
            if len(f) < len(ca) or not f[ca["t0"]].isdigit():
                continue
            t0 = int(f[ca["t0"]])
            r = by_att.get(f[ca["attempt_id"]])
            if r is not None:
                r.att_t0 = t0
            scope = "%s\t%s\t%s" % (f[ca["tenant"]],
                                    route_path(f[ca["route"]]), f[ca["key"]])
            fwds = by_scope.get(scope)
            if fwds is None:
                continue
            v = first_t0.get(scope)
            if v is None or t0 < v:
                first_t0[scope] = t0
            if type(fwds) is list:
                t1 = int(f[ca["t1"]]) if f[ca["t1"]].isdigit() else 0
                if f[ca["status"]] in ("", "0"):
                    t1 = 1 << 62  # given up: the proxy may still claim
                times.setdefault(scope, []).append((t0, t1))

    def build_epochs(self):
        slack, lease = self.clock_slack, self.lease
        for scope, fwds in self.by_scope.items():
            if type(fwds) is list:
                fwds.sort(key=lambda r: r.t_start)
            else:
                fwds = (fwds,)
            ttl = self.ttl_of(scope.split("\t")[1])
            head = None
            for r in fwds:
                if head is None or r.t_start >= head.exp_lo - slack:
                    r.exp_lo = self.claim_lo(scope, r, head) + ttl
                    r.exp_hi = r.t_start + ttl
                    head = r
                else:
                    if head.members is None:
                        head.members = [head]
                    head.members.append(r)
                    head.exp_hi = max(head.exp_hi, r.t_end + lease)
                r.head = head
                if self.hold and (r.cut or not r.status):
                    self.held.add(scope)

    def claim_lo(self, scope, r, prev):
        """The earliest the claim that opened r's epoch can have been. The
        first claim of a record fixes its expiry and a release or a
        takeover keeps it (sql/009_own_token_lease.sql), so the claim may
        come from any attempt of the scope, not only the forwarded one
        (one answered upstream_unavailable, say, and released). In a later
        epoch the claim came after the previous record expired (at or
        after prev.exp_lo), from an attempt still going then."""
        if prev is None:
            lo = self.first_t0.get(scope)
            if lo is None or lo > r.t_start:
                lo = r.t_start - self.lease
            if r.att_t0 is not None and r.att_t0 < lo:
                lo = r.att_t0
            return lo
        floor = prev.exp_lo - self.clock_slack
        lo = None
        for t0, t1 in self.att_times.get(scope, ()):
            if t0 <= r.t_start and t1 >= floor and (lo is None or t0 < lo):
                lo = t0
        if lo is None:
            lo = r.t_start - self.lease
        return max(lo, prev.exp_lo - self.clock_slack)

    # --- load --------------------------------------------------------------

    def load_lines(self):
        with open(os.path.join(self.dir, "load.tsv")) as fh:
            for line in fh:
                f = line.rstrip("\n").split("\t")
                if not line.endswith("\n"):
                    self.load_cut = True  # the writer stopped mid-line
                    continue
                if len(f) >= 2:
                    yield f

    def read_load(self):
        ca = {n: i for i, n in enumerate(A_COLS)}
        cf = {n: i for i, n in enumerate(F_COLS)}
        self.lat_fault, self.lat_calm = array("f"), array("f")
        self.akinds, self.fkinds = {}, {}
        self.retries = []
        self.unforwarded = set()
        self.waits = []
        self.inflight = []
        self.first_final = {}
        self.requests = self.flows = self.wait_answered = 0
        for f in self.load_lines():
            if f[1] == "flow":
                if f[0] == "A":
                    ca = {n: i for i, n in enumerate(f)}
                elif f[0] == "F":
                    cf = {n: i for i, n in enumerate(f)}
                continue
            if f[0] == "A":
                if len(f) < len(ca):
                    f += [""] * (len(ca) - len(f))
                if not (f[ca["t0"]].isdigit() and
                        f[ca["status"]].isdigit()):
                    self.malformed["load.tsv"] += 1
                    continue
                self.attempt(f, ca)
            elif f[0] == "F":
                if len(f) < len(cf):
                    f += [""] * (len(cf) - len(f))
                self.flow(f, cf)

    def attempt(self, f, c):
        t = self.t
        self.requests += 1
        akind = f[c["akind"]]
        self.akinds[akind] = self.akinds.get(akind, 0) + 1
        t0, t1 = int(f[c["t0"]]), int(f[c["t1"]] or 0)
        tenant, path = f[c["tenant"]], route_path(f[c["route"]])
        scope = "%s\t%s\t%s" % (tenant, path, f[c["key"]])
        if scope not in self.by_scope:
            self.unforwarded.add(scope)
        att = f[c["attempt_id"]]
        status = int(f[c["status"]] or 0)
        code, ex = f[c["code"]], f[c["exec"]]
        fwd = self.by_att.get(att)
        if status:
            lat = (t1 - t0) / 1000.0
            if self.fault_win.overlaps(t0, t1):
                self.lat_fault.append(lat)
            else:
                self.lat_calm.append(lat)
        if code in NOT_FORWARDED and fwd is not None:
            t.bad("4", "forwarded_after_refusal", attempt=att, code=code,
                  status=status, exec=fwd.exec)
        if self.hold and (code in HELD_CODES
                          or (status == 0 and fwd is not None)):
            self.held.add(scope)
        stored = None
        if status and not ex and not code:
            stored = self.stored_answer(f, c, scope, att, t0, t1, status)
        if self.heals and (stored is not None or (
                200 <= status < 500 and status != 409)):
            fl = f[c["flow"]]
            v = self.first_final.get(fl)
            if v is None or t1 < v:
                self.first_final[fl] = t1
        r = None
        if ex:
            r = self.answer(f, c, scope, tenant, att, t0, t1, ex)
        if akind == "mismatch":
            if r is not None and r.body != hexint(f[c["body_sha"]]):
                t.bad("3", "mismatch_answered", attempt=att, exec=ex)
        elif code == "idempotency_key_mismatch" and self.holds_body(
                scope, hexint(f[c["body_sha"]]), t0):
            t.bad("5", "refused_as_mismatch", attempt=att, akind=akind)
        if not ex and not code and (200 <= status < 300 or status == 402):
            t.bad("2", "no_exec", attempt=att, status=status)
        if akind == "wait" or (path == TRANSFER_PATH and akind != "mismatch"):
            self.wait_attempt(f, c, scope, att, t0, t1, status, code, ex,
                              r or stored, fwd)

    def stored_answer(self, f, c, scope, att, t0, t1, status):
        """An answer without exec or problem code that is the scope's
        stored non-effect answer (an e503 the record completed with:
        release_statuses empty in hold mode): the ledger's answer to the
        epoch's first forward, read whole, byte for byte. It is final, it
        is the key's one answer, and a client seeing it counts as seen.
        A replay of anything else is `unknown_replay` (invariant 2)."""
        rh = hexint(f[c["resp_hash"]])
        fwds = self.by_scope.get(scope, ())
        # The latest such epoch head before the answer: a key whose record
        # expired opens a new epoch, and its stored 503 has the very same
        # bytes as the old one's.
        found = None
        for g in (fwds if type(fwds) is list else (fwds,)):
            if (g.head is g and not g.effect and not g.cut and g.status
                    and g.status == status and g.status not in self.release
                    and g.rhash == rh and g.t_start <= t1
                    and (found is None or g.t_start > found.t_start)):
                found = g
        if found is not None:
            self.saw(found, att, t0, t1, f[c["replayed"]] == "1")
            return found
        if f[c["replayed"]] == "1":
            self.t.bad("2", "unknown_replay", attempt=att, status=status,
                       got=f[c["resp_hash"]])
        return None

    def saw(self, r, att, t0, t1, replayed):
        """A client got r's answer (sent at t0, received at t1)."""
        if r.seen_t1 is None or t1 < r.seen_t1:
            r.seen_t1 = t1
        if r.seen_t0 is None or t0 > r.seen_t0:
            r.seen_t0 = t0
        h = r.head
        if replayed and t0 > h.exp_hi + self.replay_slack:
            self.t.bad("7", "replay_after_expiry", attempt=att,
                       exec=r.exec, t0=t0, expired_by=h.exp_hi)

    def holds_body(self, scope, body, t):
        """Did scope's record surely hold this body at t (a forward of it
        before t, in an epoch that cannot have ended by t)?"""
        fwds = self.by_scope.get(scope, ())
        for g in (fwds if type(fwds) is list else (fwds,)):
            if g.body == body and g.t_start < t < g.head.exp_lo:
                return True
        return False

    def answer(self, f, c, scope, tenant, att, t0, t1, ex):
        """An answer carrying a ledger exec: invariants 2, 3 and 7."""
        t = self.t
        r = self.by_exec.get(ex)
        if r is None:
            t.bad("2", "unknown_exec", attempt=att, exec=ex)
            return None
        if r.scope != scope:
            if r.tenant != tenant:
                t.bad("3", "cross_tenant", attempt=att, exec=ex,
                      attempt_scope=scope, exec_scope=r.scope)
            else:
                t.bad("2", "wrong_key", attempt=att, exec=ex,
                      attempt_scope=scope, exec_scope=r.scope)
            return r
        if hexint(f[c["resp_hash"]]) != r.rhash:
            t.bad("2", "bytes_differ", attempt=att, exec=ex,
                  got=f[c["resp_hash"]], ledger="%016x" % r.rhash
                  if isinstance(r.rhash, int) else r.rhash)
        self.saw(r, att, t0, t1, f[c["replayed"]] == "1")
        return r

    def wait_attempt(self, f, c, scope, att, t0, t1, status, code, ex, r,
                     fwd):
        t = self.t
        if not status:
            t.excuse("8: wait attempt without an answer (timeout/transport)")
            return
        self.wait_answered += 1
        if r is not None and (ex or r.scope == scope):
            if r.tenant != f[c["tenant"]]:
                t.bad("8", "other_tenant", attempt=att, exec=ex)
            elif r.scope == scope:
                self.waits.append(r)
            else:
                t.bad("8", "not_original", attempt=att, exec=ex)
        elif ex:
            pass  # unknown_exec: invariant 2
        elif status == 409 and code:
            pass
        elif fwd is not None:
            pass  # its own forward's answer: it was the original
        elif code and status >= 500:
            t.excuse("8: proxy refusal (5xx with a code)")
        elif code and status != 409:
            t.excuse("8: the request refused itself (4xx with a code)")
        else:
            t.bad("8", "bad_answer", attempt=att, status=status, code=code)
        if t1 - t0 > self.wait_bound:
            proxy = f[c["proxy"]]
            inst = None
            if proxy.isdigit() and int(proxy) < len(self.proxies):
                inst = self.proxies[int(proxy)]
            win = self.inst_win.get(inst, self.pg_win)
            if win.overlaps(t0, t1):
                t.excuse("8: long wait overlapping a fault of its instance")
            else:
                t.bad("8", "hang", attempt=att, waited_s=(t1 - t0) / US,
                      bound_s=self.wait_bound / US)

    def flow(self, f, c):
        self.flows += 1
        fk = f[c["fkind"]]
        self.fkinds[fk] = self.fkinds.get(fk, 0) + 1
        att = f[c["attempts"]]
        if att.isdigit():
            self.retries.append(max(0, int(att) - 1))
        if not self.heals:
            return
        t_first = int(f[c["t_first"]] or 0)
        t_final = int(f[c["t_final"]] or 0)
        final = f[c["final"]] == "1"
        for h in self.heals:
            if t_first <= h and not (final and t_final <= h):
                scope = "%s\t%s\t%s" % (f[c["tenant"]],
                                        route_path(f[c["route"]]),
                                        f[c["key"]])
                self.inflight.append((h, scope, final, t_final,
                                      f[c["cause"]], f[c["flow"]]))

    # --- after the passes ---------------------------------------------------

    def judge_epochs(self):
        for fwds in self.by_scope.values():
            for head in (fwds if type(fwds) is list else (fwds,)):
                if head.head is not head:
                    continue
                first_t = self.judge_answers(head)
                if head.members is not None or first_t is not None:
                    self.judge_forwards(head, first_t)

    def judge_answers(self, head):
        """The answers of one epoch: one exec (2), none other after the
        first was seen (5). Returns when the first was seen."""
        if head.members is None:
            if head.seen_t1 is not None:
                head.first = head.exec
            return head.seen_t1
        seen = [m for m in head.members if m.seen_t1 is not None]
        if not seen:
            return None
        first = min(seen, key=lambda m: m.seen_t1)
        head.first = first.exec
        for m in seen:
            if m is first:
                continue
            self.t.bad("2", "two_execs_answered", scope=head.scope,
                       first=first.exec, other=m.exec)
            if m.seen_t0 > first.seen_t1:
                self.t.bad("5", "different_after_seen", scope=head.scope,
                           seen=first.exec, got=m.exec)
        return first.seen_t1

    def judge_forwards(self, head, first_t):
        t = self.t
        mem = head.epoch()
        bodies = {m.body for m in mem}
        if len(bodies) > 1:
            t.bad("3", "mismatch_executed", scope=head.scope,
                  bodies=len(bodies))
        for i, r2 in enumerate(mem):
            if first_t is not None and r2.t_start > first_t:
                t.bad("5", "forwarded_after_seen", scope=head.scope,
                      attempt=r2.att, exec=r2.exec)
            if i == 0:
                continue
            if self.hold:
                t.bad("1", "hold_second_forward", scope=head.scope,
                      first=mem[0].att, second=r2.att)
                if r2.effect and any(m.effect for m in mem[:i]):
                    t.bad("7", "second_execution_before_ttl",
                          scope=head.scope, attempt=r2.att)
                continue
            self.judge_takeover(head, mem[:i], r2)

    def judge_takeover(self, head, earlier, r2):
        t = self.t
        why = None
        for r1 in earlier:
            if not r1.effect and not r1.cut and r1.status in self.release:
                continue
            lease_lo = r1.t_start - self.lease
            if r1.att_t0 is not None and r1.att_t0 > lease_lo:
                lease_lo = r1.att_t0
            if r2.t_start < r1.t_end:
                why = "overlap"
            elif r2.t_start < lease_lo + self.lease - self.clock_slack:
                why = "before_lease_end"
            elif r1.seen_t1 is not None and r1.seen_t1 < r2.t_start:
                why = "after_answer_seen"
            if why:
                t.bad("1", why, scope=head.scope, first=r1.att,
                      second=r2.att)
                if r1.effect and r2.effect:
                    t.bad("7", "second_execution_before_ttl",
                          scope=head.scope, attempt=r2.att)
                return

    def judge_waits(self):
        for r in self.waits:
            first = r.head.first
            if first is not None and r.exec != first:
                self.t.bad("8", "not_original", scope=r.scope, exec=r.exec,
                           original=first)

    def judge_heal(self):
        t = self.t
        bound = self.lease + self.final_bound
        ttf = []
        n_in = 0
        for h, scope, final, t_final, cause, flow in self.inflight:
            # A flow's first final answer ends it (F's t_final may be a
            # later phase: a late, tenant or mismatch send).
            ff = self.first_final.get(flow)
            if ff is not None:
                if ff <= h:
                    continue
                final, t_final = True, ff
            else:
                final = False
            n_in += 1
            i = bisect.bisect_right(self.fault_starts, h)
            if i < len(self.fault_starts) and self.fault_starts[i] <= h + bound:
                t.excuse("6: another fault began before the bound passed")
            elif final and t_final <= h + bound:
                ttf.append((t_final - h) / US if t_final > h else 0.0)
            elif final and t_final <= self.upstream_failed(scope, h,
                                                          t_final) + bound:
                t.excuse("6: the upstream's own failures after the heal "
                         "(no answer, or a released status) delayed it")
            elif not final and t_final and t_final < h + bound:
                t.excuse("6: flow given up (%s) before the bound" % cause)
            elif self.hold and scope in self.held:
                t.excuse("6: hold mode, outcome unknown: held for an "
                         "operator")
            else:
                t.bad("6", "not_final_in_bound", flow=flow, scope=scope,
                      final=final, after_heal_s=(t_final - h) / US
                      if t_final else None, bound_s=bound / US)
        ttf.sort()
        gauge = self.judge_gauge()
        self.fig["after_heal"] = {
            "heals": len(self.heals),
            "heal_t_s": [h / US for h in self.heals],
            "bound_s": bound / US,
            "in_flight_at_heal": n_in,
            "reached_final_in_bound": len(ttf),
            "time_to_final_max_s": ttf[-1] if ttf else None,
            "time_to_final_p99_s": percentile(ttf, 99),
            "gauge": gauge,
        }

    def upstream_failed(self, scope, h, t_final):
        """The end of the scope's last forward after h (and before t_final)
        that the upstream answered with nothing or a released status, by
        its own drawn behaviour: every retry it forced is the upstream's
        time, not the proxy's; h when there is none."""
        fwds = self.by_scope.get(scope)
        last = h
        for r in (fwds if type(fwds) is list else (fwds,) if fwds else ()):
            if h < r.t_start and r.t_end < t_final and r.t_end > last and (
                    r.status == 0 or r.status in self.release):
                last = r.t_end
        return last

    def judge_gauge(self):
        if not self.heals:
            return {}
        last = max(self.heals)
        per = {}
        for e in self.scrapes:
            if int(e["t_s"] * US) < last:
                continue
            v = e.get("oldest_processing_s") or 0.0
            g = per.setdefault(e.get("inst", "?"), {"scrapes": 0,
                                                   "min_oldest_s": v})
            g["scrapes"] += 1
            g["min_oldest_s"] = min(g["min_oldest_s"], v)
        for inst, g in per.items():
            g["below_lease"] = g["min_oldest_s"] < self.lease / US
            if g["below_lease"]:
                continue
            if self.hold and self.held:
                self.t.excuse("6: gauge above the lease with held keys "
                              "(hold mode)")
            else:
                self.t.bad("6", "gauge_not_below_lease", inst=inst,
                           min_oldest_s=g["min_oldest_s"])
        return per

    def proxy_logs(self):
        out = {}
        for inst in self.proxies:
            path = os.path.join(self.dir, inst + ".log")
            if not os.path.exists(path):
                continue
            n = err = warn = 0
            with open(path, errors="replace") as fh:
                for line in fh:
                    n += 1
                    if '"level":"error"' in line:
                        err += 1
                    elif '"level":"warn"' in line:
                        warn += 1
            out[inst] = {"lines": n, "error": err, "warn": warn}
        return out

    # --- the whole --------------------------------------------------------

    def check(self):
        t_begin = time.monotonic()
        self.read_events()
        self.read_ledger()
        self.learn_attempt_t0()
        self.build_epochs()
        self.read_load()
        self.judge_epochs()
        self.judge_waits()
        self.judge_heal()
        return self.summary(time.monotonic() - t_begin)

    def summary(self, took):
        def lat(v):
            v = sorted(v)
            r3 = lambda x: None if x is None else round(x, 3)  # noqa: E731
            return {"n": len(v), "p50_ms": r3(percentile(v, 50)),
                    "p99_ms": r3(percentile(v, 99))}
        r = self.retries
        rs = sorted(r)
        an = {i: self.t.count(i) for i in INVARIANTS}
        run = self.run
        out = {
            "seed": run.get("seed"), "mode": run.get("mode"),
            "duration_s": (run["t_end_s"] - run["t_start_s"])
            if "t_end_s" in run and "t_start_s" in run else None,
            "requests": self.requests, "flows": self.flows,
            "keys": len(self.by_scope) + len(self.unforwarded),
            "attempts_by_kind": self.akinds, "flows_by_kind": self.fkinds,
            "retries_per_operation": {
                "mean": sum(r) / len(r) if r else None,
                "p99": percentile(rs, 99), "max": rs[-1] if rs else None},
            "concurrent_duplicates": self.akinds.get("dup", 0),
            "faults": self.faults,
            "anomalies": an,
            "anomaly_classes": self.t.n,
            "samples": self.t.samples,
            "excused": self.t.excused,
            "latency_ms": {"under_faults": lat(self.lat_fault),
                           "outside_faults": lat(self.lat_calm)},
            "wait_attempts_answered": self.wait_answered,
            "proxy_logs": self.proxy_logs(),
            "malformed_lines": dict(self.malformed, **{
                "load.tsv": self.malformed["load.tsv"] + self.load_cut}),
            "check_seconds": round(took, 2),
            "check_peak_rss_mb": peak_rss_mb(),
            "ok": not any(an.values()),
        }
        out.update(self.fig)
        return out


def report(s):
    p = print
    p("run: seed %s, mode %s, duration %s s" % (s["seed"], s["mode"],
                                                s["duration_s"]))
    p("requests %d, flows %d, keys %d, concurrent duplicates %d" % (
        s["requests"], s["flows"], s["keys"], s["concurrent_duplicates"]))
    p("ledger: %(forwards)d forwards, %(executions)d executions" % s["ledger"])
    rp = s["retries_per_operation"]
    p("retries per operation: mean %s, p99 %s, max %s" % (
        None if rp["mean"] is None else round(rp["mean"], 3), rp["p99"],
        rp["max"]))
    p("faults: %s" % (", ".join("%s %d" % kv for kv in
                                sorted(s["faults"].items())) or "none"))
    for k, v in s["latency_ms"].items():
        p("latency %s: n %d, p50 %s ms, p99 %s ms" % (k, v["n"], v["p50_ms"],
                                                     v["p99_ms"]))
    ah = s.get("after_heal", {})
    if ah.get("heals"):
        p("after heal: %d in flight, time to final max %s s, p99 %s s "
          "(bound %s s); gauge %s" % (
              ah["in_flight_at_heal"], ah["time_to_final_max_s"],
              ah["time_to_final_p99_s"], ah["bound_s"],
              {i: g["below_lease"] for i, g in ah["gauge"].items()}))
    p("anomalies by invariant (target 0):")
    for i in INVARIANTS:
        cls = s["anomaly_classes"][i]
        p("  %s: %d %s" % (i, s["anomalies"][i],
                           json.dumps(cls) if cls else ""))
        for smp in s["samples"][i]:
            p("      %s" % json.dumps(smp))
    for k, v in sorted(s["excused"].items()):
        p("  excused: %s: %d" % (k, v))
    p("checked in %.2f s, peak RSS %d MB: %s" % (
        s["check_seconds"], s["check_peak_rss_mb"],
        "OK" if s["ok"] else "VIOLATIONS"))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run_dir")
    ap.add_argument("--json", help="also write the summary here")
    ap.add_argument("--samples", type=int, default=5)
    a = ap.parse_args(argv)
    s = Checker(a.run_dir, samples=a.samples).check()
    text = json.dumps(s, indent=1, sort_keys=True)
    with open(os.path.join(a.run_dir, "summary.json"), "w") as fh:
        fh.write(text + "\n")
    if a.json:
        with open(a.json, "w") as fh:
            fh.write(text + "\n")
    report(s)
    return 0 if s["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
