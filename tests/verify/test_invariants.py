"""The checker of the verification campaign (tests/verify/invariants.py)
against small run directories written here: a clean history passes, a
history breaking each invariant is caught under its class, every excuse
holds, and a large clean history shows the checker's time and memory."""
import hashlib
import json
import os
import subprocess
import sys
import time

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import invariants  # noqa: E402

BASE = 1_800_000_000  # seconds; every time below is an offset from it
ROUTES = {"pay": "/v1/payments", "refund": "/v1/refunds",
          "transfer": "/v1/transfers"}
LEDGER_HEAD = invariants.LEDGER_COLS
A_HEAD = invariants.A_COLS
F_HEAD = invariants.F_COLS


def us(t):
    return int(round((BASE + t) * 1_000_000))


def h16(*parts):
    return hashlib.blake2b("|".join(map(str, parts)).encode(),
                           digest_size=8).hexdigest()


class Run:
    """A run directory written line by line; times in seconds from BASE."""

    def __init__(self, path, mode="release_after_lease"):
        self.path = str(path)
        self.ledger, self.load, self.events = [], [], []
        self.hashes = {}
        self.seq = 0
        self.run = {"seed": 7, "mode": mode, "lease_s": 3.0,
                    "upstream_timeout_s": 1.0, "wait_max_s": 2.0,
                    "ttl_s": {"/v1/payments": 3600, "/v1/refunds": 20,
                              "/v1/transfers": 3600},
                    "proxies": ["p1", "p2"],
                    "ports": {"9001": "p1", "9002": "p2"},
                    "t_start_s": BASE, "t_end_s": BASE + 100,
                    "final_bound_s": 5.0}

    def forward(self, att, key, t_start, t_end, tenant="t1", route="pay",
                effect=1, status=201, cut=0, body="b1", port=9001):
        """A ledger line; returns its exec ('' when no effect)."""
        self.seq += 1
        ex = "%d-%d-%d" % (port, us(t_start), self.seq) if effect else ""
        rh = "" if status == 0 else h16(status, ex, tenant, key)
        kind = {201: "ok", 402: "e402", 503: "e503", 0: "drop"}[status]
        self.hashes[ex] = rh
        self.ledger.append([self.seq, port, us(t_start), us(t_end), tenant,
                            key, att, "POST", ROUTES[route],
                            h16("body", body), kind, effect, ex, status, rh,
                            cut])
        return ex

    def attempt(self, att, key, t0, t1, status=201, ex="", code="",
                replayed=0, akind="req", tenant="t1", route="pay",
                body="b1", proxy=0, flow=1, rhash=None, error=""):
        if rhash is None:
            rhash = self.hashes.get(ex, "") if ex else (
                h16(status, code) if status else "")
        self.load.append(["A", flow, len(self.load), akind, proxy, us(t0),
                          us(t1) if status or error else us(t1), tenant,
                          route, key, h16("body", body), att, status, code,
                          replayed, ex, rhash, 0, error])

    def flow(self, flow, key, t_first, t_final, final=1, cause="201",
             attempts=1, fkind="plain", tenant="t1", route="pay"):
        self.load.append(["F", flow, fkind, tenant, route, key,
                          h16("body", "b1"), us(t_first), us(t_final),
                          final, cause, attempts])

    def event(self, kind, **e):
        e["kind"] = kind
        for k in ("t0_s", "t1_s", "t_s"):
            if k in e:
                e[k] = BASE + e[k]
        self.events.append(e)

    def write(self):
        os.makedirs(self.path, exist_ok=True)
        j = lambda name: os.path.join(self.path, name)  # noqa: E731
        with open(j("run.json"), "w") as fh:
            json.dump(self.run, fh)
        with open(j("events.jsonl"), "w") as fh:
            fh.writelines(json.dumps(e) + "\n" for e in self.events)
        with open(j("ledger.tsv"), "w") as fh:
            fh.write("\t".join(LEDGER_HEAD) + "\n")
            fh.writelines("\t".join(map(str, r)) + "\n" for r in self.ledger)
        with open(j("load.tsv"), "w") as fh:
            fh.write("\t".join(A_HEAD) + "\n" + "\t".join(F_HEAD) + "\n")
            fh.writelines("\t".join(map(str, r)) + "\n" for r in self.load)
        for inst in ("p1", "p2"):
            with open(j(inst + ".log"), "w") as fh:
                fh.write('{"level":"info","msg":"listening"}\n')

    def check(self):
        self.write()
        return invariants.Checker(self.path).check()


def clean(path, mode="release_after_lease"):
    """A history holding every invariant, with every excuse in it."""
    r = Run(path, mode)
    clean_operations(r)
    clean_waits_and_heal(r)
    return r


def clean_operations(r):
    # A plain payment, its timed-out retry, and a replay much later.
    e1 = r.forward("a1", "k1", 1.01, 1.02)
    r.attempt("a1", "k1", 1.0, 1.05, ex=e1)
    r.attempt("a1t", "k1", 1.1, 4.1, status=0, error="timeout")
    r.attempt("a1r", "k1", 50.0, 50.01, ex=e1, replayed=1, akind="recheck")
    r.flow(1, "k1", 1.0, 1.05)
    # The same key with another body: refused, never forwarded.
    r.attempt("a1m", "k1", 1.2, 1.21, status=422, akind="mismatch",
              code="idempotency_key_mismatch", body="b2")
    # The same key under another tenant: a scope of its own.
    e1t = r.forward("a1x", "k1", 1.31, 1.32, tenant="t2")
    r.attempt("a1x", "k1", 1.3, 1.33, ex=e1t, akind="tenant", tenant="t2")
    # Concurrent duplicates: one forwards, the other is refused, then
    # replayed.
    e2 = r.forward("a2", "k2", 2.01, 2.2, port=9002)
    r.attempt("a2", "k2", 2.0, 2.21, ex=e2, proxy=1, flow=2)
    r.attempt("a3", "k2", 2.0, 2.02, status=409, akind="dup",
              code="idempotency_key_in_use", flow=2)
    r.attempt("a3r", "k2", 2.5, 2.51, ex=e2, replayed=1, flow=2)
    r.flow(2, "k2", 2.0, 2.51, fkind="dup", attempts=3)
    # A refund executed again after its ttl (a late retry).
    e5 = r.forward("a5", "k5", 2.01, 2.02, route="refund")
    r.attempt("a5", "k5", 2.0, 2.03, ex=e5, route="refund", flow=5)
    e5b = r.forward("a5l", "k5", 25.01, 25.02, route="refund")
    r.attempt("a5l", "k5", 25.0, 25.03, ex=e5b, route="refund",
              akind="late", flow=5)
    r.flow(5, "k5", 2.0, 25.03, route="refund", fkind="late", attempts=2)
    # An answer lost upstream (slow, cut): taken over after its lease.
    r.forward("a6", "k6", 3.01, 4.5, cut=1)
    r.attempt("a6", "k6", 3.0, 4.02, status=504, flow=6,
              code="upstream_outcome_unknown")
    e6 = r.forward("a7", "k6", 6.1, 6.2)
    r.attempt("a7", "k6", 6.05, 6.21, ex=e6, flow=6)
    r.flow(6, "k6", 3.0, 6.21, attempts=2)
    # A 503 the proxy read: released, the retry executes at once.
    r.forward("a8", "k7", 5.01, 5.02, effect=0, status=503)
    r.attempt("a8", "k7", 5.0, 5.03, status=503, flow=7)
    e7 = r.forward("a9", "k7", 5.21, 5.22)
    r.attempt("a9", "k7", 5.2, 5.23, ex=e7, flow=7)
    r.flow(7, "k7", 5.0, 5.23, attempts=2)


def clean_waits_and_heal(r):
    # Waiters on a transfer: the original's answer, a 409 at wait_max, a
    # proxy refusal, and a long wait through a fault of its instance.
    e8 = r.forward("a10", "k8", 7.01, 7.1, route="transfer")
    r.attempt("a10", "k8", 7.0, 7.11, ex=e8, route="transfer", flow=8,
              akind="wait")
    r.attempt("a11", "k8", 7.05, 7.12, ex=e8, replayed=1, route="transfer",
              flow=8, akind="wait")
    r.attempt("a12", "k8", 7.0, 9.0, status=409, route="transfer", flow=8,
              code="idempotency_key_in_use", akind="wait")
    r.attempt("a13", "k8", 10.5, 10.6, status=503, route="transfer",
              code="idempotency_store_unavailable", flow=8, akind="wait")
    r.attempt("a14", "k8", 10.0, 16.0, status=409, route="transfer",
              code="idempotency_key_in_use", flow=8, akind="wait")
    r.flow(8, "k8", 7.0, 7.11, route="transfer", fkind="wait", attempts=5)
    # A fault, its heal, a flow in flight across it, the gauges.
    r.event("partition", a="p1", b="pg", dir="both", t0_s=10.0, t1_s=12.0)
    r.event("skew", inst="p2", offset_s=-12.0, t0_s=0.0, t1_s=90.0)
    r.event("heal", t_s=12.0)
    r.attempt("a20", "k20", 11.0, 11.5, status=503, flow=20,
              code="idempotency_store_unavailable")
    e20 = r.forward("a21", "k20", 12.51, 12.52)
    r.attempt("a21", "k20", 12.5, 12.6, ex=e20, flow=20)
    r.flow(20, "k20", 11.0, 12.6, attempts=2)
    # A flow the client gave up before the bound passed: not judged.
    r.attempt("a22", "k22", 11.5, 12.5, status=0, error="connect", flow=22)
    r.flow(22, "k22", 11.5, 13.0, final=0, cause="stopped")
    r.event("scrape", inst="p1", t_s=14.0, oldest_processing_s=4.0,
            processing=1)
    r.event("scrape", inst="p1", t_s=16.0, oldest_processing_s=0.2,
            processing=1)
    r.event("scrape", inst="p2", t_s=14.0, oldest_processing_s=0.0,
            processing=0)


def classes(s, inv):
    return set(s["anomaly_classes"][inv])


def only(s, inv, cls):
    """The violation is caught under its invariant and class."""
    assert cls in classes(s, inv), (inv, cls, s["anomaly_classes"])
    assert not s["ok"]


# --- the clean history ------------------------------------------------------

def test_clean_history_passes(tmp_path):
    s = clean(tmp_path).check()
    assert s["ok"], s["anomaly_classes"]
    assert all(v == 0 for v in s["anomalies"].values())
    assert s["faults"] == {"partition": 1, "skew": 1}
    assert s["requests"] == 22 and s["flows"] == 8
    assert s["concurrent_duplicates"] == 1
    ah = s["after_heal"]
    assert ah["in_flight_at_heal"] == 2 and ah["reached_final_in_bound"] == 1
    assert ah["time_to_final_max_s"] == pytest.approx(0.6)
    assert ah["gauge"]["p1"]["below_lease"] and ah["gauge"]["p2"]["below_lease"]
    assert s["latency_ms"]["under_faults"]["n"] == 3
    assert set(s["excused"]) == {
        "6: flow given up (stopped) before the bound",
        "8: long wait overlapping a fault of its instance",
        "8: proxy refusal (5xx with a code)"}


def test_cli_writes_summary_and_exits_zero(tmp_path):
    clean(tmp_path / "run").write()
    out = tmp_path / "out.json"
    p = subprocess.run([sys.executable, invariants.__file__,
                        str(tmp_path / "run"), "--json", str(out)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(out.read_text())["ok"]
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["ok"]


def test_cli_exits_one_on_a_violation(tmp_path):
    r = clean(tmp_path / "run")
    r.attempt("b1", "k1", 60.0, 60.1, ex="9001-1-999")
    r.write()
    p = subprocess.run([sys.executable, invariants.__file__,
                        str(tmp_path / "run")], capture_output=True, text=True)
    assert p.returncode == 1
    assert "unknown_exec" in p.stdout


def test_lines_cut_mid_write_are_counted_not_fatal(tmp_path):
    r = clean(tmp_path)
    r.write()
    for name in ("ledger.tsv", "load.tsv"):
        with open(os.path.join(r.path, name), "a") as fh:
            fh.write("99\t9001\t18000")
    s = invariants.Checker(r.path).check()
    assert s["ok"], s["anomaly_classes"]
    assert s["malformed_lines"] == {"ledger.tsv": 1, "load.tsv": 1}
    assert s["requests"] == 22


# --- invariant 1 ------------------------------------------------------------

def test_1_hold_second_forward(tmp_path):
    r = clean(tmp_path, mode="hold")
    s = r.check()
    # In hold mode the clean history's takeover and 503 retry break it.
    only(s, "1", "hold_second_forward")
    r2 = Run(tmp_path / "h", mode="hold")
    r2.forward("a", "k", 1.01, 1.02, effect=0, status=503)
    r2.attempt("a", "k", 1.0, 1.03, status=503)
    r2.forward("b", "k", 1.21, 1.22, effect=0, status=503)
    only(r2.check(), "1", "hold_second_forward")


def test_1_hold_clean_history_without_takeovers_passes(tmp_path):
    r = Run(tmp_path, mode="hold")
    e = r.forward("a", "k", 1.01, 1.02)
    r.attempt("a", "k", 1.0, 1.03, ex=e)
    r.attempt("b", "k", 2.0, 2.01, ex=e, replayed=1)
    assert r.check()["ok"]


def test_1_release_overlap(tmp_path):
    r = Run(tmp_path)
    r.forward("a", "k", 3.0, 4.5, cut=1)
    r.forward("b", "k", 4.0, 4.1)
    only(r.check(), "1", "overlap")


def test_1_release_before_lease_end(tmp_path):
    r = Run(tmp_path)
    r.forward("a", "k", 3.0, 3.1, cut=1)
    r.attempt("a", "k", 2.99, 4.0, status=504,
              code="upstream_outcome_unknown")
    r.forward("b", "k", 5.5, 5.6)  # the lease ends at 2.99 + 3 at the earliest
    s = r.check()
    only(s, "1", "before_lease_end")
    only(s, "7", "second_execution_before_ttl")


def test_1_release_after_answer_seen(tmp_path):
    r = Run(tmp_path)
    e = r.forward("a", "k", 3.0, 3.1)
    r.attempt("a", "k", 2.99, 3.2, ex=e)
    r.forward("b", "k", 7.0, 7.1)
    s = r.check()
    only(s, "1", "after_answer_seen")
    only(s, "5", "forwarded_after_seen")


def test_1_excuse_cut_503_binds_but_read_503_does_not(tmp_path):
    r = Run(tmp_path)
    r.forward("a", "k", 3.0, 3.01, effect=0, status=503, cut=1)
    r.attempt("a", "k", 2.99, 4.0, status=504,
              code="upstream_outcome_unknown")
    r.forward("b", "k", 3.5, 3.6)
    only(r.check(), "1", "before_lease_end")
    r2 = Run(tmp_path / "read")
    r2.forward("a", "k", 3.0, 3.01, effect=0, status=503)
    r2.forward("b", "k", 3.5, 3.6)
    assert r2.check()["ok"]


def test_1_excuse_takeover_after_unseen_lost_answer(tmp_path):
    r = Run(tmp_path)
    r.forward("a", "k", 3.0, 3.1)  # answered, but no client got it
    r.attempt("a", "k", 2.99, 6.0, status=0, error="timeout")
    e = r.forward("b", "k", 6.1, 6.2)
    r.attempt("b", "k", 6.05, 6.3, ex=e)
    assert r.check()["ok"]


# --- invariant 2 ------------------------------------------------------------

def test_2_bytes_differ(tmp_path):
    r = clean(tmp_path)
    e = r.forward("b", "kb", 30.01, 30.02)
    r.attempt("b", "kb", 30.0, 30.03, ex=e, rhash="0123456789abcdef")
    only(r.check(), "2", "bytes_differ")


def test_2_unknown_exec(tmp_path):
    r = clean(tmp_path)
    r.attempt("b", "kb", 30.0, 30.03, ex="9001-5-777", rhash="00")
    only(r.check(), "2", "unknown_exec")


def test_2_answer_without_exec(tmp_path):
    r = clean(tmp_path)
    r.attempt("b", "k1", 60.0, 60.01, status=201, replayed=1)
    only(r.check(), "2", "no_exec")


def test_2_wrong_key(tmp_path):
    r = clean(tmp_path)
    e = r.forward("b", "kb", 30.01, 30.02)
    r.attempt("c", "kc", 30.0, 30.03, ex=e)
    only(r.check(), "2", "wrong_key")


def test_2_two_execs_answered(tmp_path):
    r = Run(tmp_path)
    e1 = r.forward("a", "k", 3.0, 3.1)
    r.attempt("a", "k", 2.99, 6.0, status=0, error="timeout")
    e2 = r.forward("b", "k", 6.1, 6.2)
    r.attempt("b", "k", 6.05, 6.3, ex=e2)
    r.attempt("c", "k", 6.0, 6.4, ex=e1, replayed=1)  # the lost one, late
    s = r.check()
    only(s, "2", "two_execs_answered")
    assert s["anomalies"]["5"] == 0  # sent before the first was seen


# --- invariant 3 ------------------------------------------------------------

def test_3_cross_tenant(tmp_path):
    r = clean(tmp_path)
    e = r.forward("b", "kb", 30.01, 30.02, tenant="t1")
    r.attempt("c", "kb", 30.0, 30.03, ex=e, tenant="t3")
    only(r.check(), "3", "cross_tenant")


def test_3_mismatch_executed(tmp_path):
    r = clean(tmp_path)
    r.forward("a1m2", "k1", 40.01, 40.02, body="b3")
    r.attempt("a1m2", "k1", 40.0, 40.03, status=0, akind="mismatch",
              body="b3", error="timeout")
    only(r.check(), "3", "mismatch_executed")


def test_3_mismatch_answered_with_the_original(tmp_path):
    r = clean(tmp_path)
    e1 = r.ledger[0][12]
    r.attempt("m2", "k1", 60.0, 60.01, ex=e1, replayed=1, akind="mismatch",
              body="b2")
    only(r.check(), "3", "mismatch_answered")


def test_3_excuse_other_body_after_expiry_executes(tmp_path):
    r = Run(tmp_path)
    e = r.forward("a", "k", 1.01, 1.02, route="refund")
    r.attempt("a", "k", 1.0, 1.03, ex=e, route="refund")
    e2 = r.forward("m", "k", 23.01, 23.02, route="refund", body="b2")
    r.attempt("m", "k", 23.0, 23.03, ex=e2, route="refund", body="b2",
              akind="mismatch")
    assert r.check()["ok"]


def test_3_two_bodies_in_one_epoch(tmp_path):
    r = Run(tmp_path)
    r.forward("a", "k", 1.0, 1.1, effect=0, status=503)
    r.forward("b", "k", 1.5, 1.6, body="other")
    only(r.check(), "3", "mismatch_executed")


# --- invariant 4 ------------------------------------------------------------

@pytest.mark.parametrize("status,code", [
    (409, "idempotency_key_in_use"), (422, "idempotency_key_mismatch"),
    (502, "upstream_unavailable"), (503, "idempotency_lease_expired"),
    (503, "idempotency_store_unavailable")])
def test_4_refused_but_forwarded(tmp_path, status, code):
    r = clean(tmp_path)
    r.forward("b", "kb", 30.01, 30.02, effect=0, status=503)
    r.attempt("b", "kb", 30.0, 30.03, status=status, code=code)
    only(r.check(), "4", "forwarded_after_refusal")


def test_4_excuse_outcome_unknown_may_be_forwarded(tmp_path):
    r = Run(tmp_path)
    r.forward("b", "kb", 30.01, 30.02, cut=1)
    r.attempt("b", "kb", 30.0, 31.0, status=504,
              code="upstream_outcome_unknown")
    assert r.check()["ok"]


# --- invariant 5 ------------------------------------------------------------

def test_5_different_answer_after_seen(tmp_path):
    r = clean(tmp_path)
    e = r.forward("x", "k1", 30.0, 30.1)  # k1 was seen at 1.05
    r.attempt("y", "k1", 60.0, 60.1, ex=e, replayed=1, akind="recheck")
    s = r.check()
    only(s, "5", "different_after_seen")
    only(s, "5", "forwarded_after_seen")


def test_5_refused_as_mismatch(tmp_path):
    r = clean(tmp_path)
    r.attempt("y", "k1", 60.0, 60.1, status=422, akind="recheck",
              code="idempotency_key_mismatch")
    only(r.check(), "5", "refused_as_mismatch")


def test_5_excuse_mismatch_refusal_when_the_record_may_hold_another_body(
        tmp_path):
    r = Run(tmp_path)
    e = r.forward("a", "k", 1.01, 1.02, route="refund", body="b2")
    r.attempt("a", "k", 1.0, 1.03, ex=e, route="refund", body="b2")
    # Its own body never went out under this key: the refusal is right.
    r.attempt("b", "k", 2.0, 2.01, status=422, route="refund",
              code="idempotency_key_mismatch", akind="late")
    # After the record may have expired: not judged.
    e2 = r.forward("c", "k", 25.0, 25.01, route="refund")
    r.attempt("c", "k", 24.99, 25.02, ex=e2, route="refund")
    assert r.check()["ok"]


# --- invariant 6 ------------------------------------------------------------

def test_6_flow_not_final_within_bound(tmp_path):
    r = clean(tmp_path)
    r.attempt("h1", "kh", 11.0, 11.5, status=409,
              code="idempotency_key_in_use", flow=30)
    r.flow(30, "kh", 11.0, 40.0, final=0, cause="deadline", attempts=9)
    only(r.check(), "6", "not_final_in_bound")


def test_6_final_too_late(tmp_path):
    r = clean(tmp_path)
    e = r.forward("h2", "kh", 30.01, 30.02)
    r.attempt("h2", "kh", 30.0, 30.03, ex=e, flow=31)
    r.flow(31, "kh", 11.0, 30.03, attempts=9)
    only(r.check(), "6", "not_final_in_bound")


def test_6_excuse_the_upstreams_own_failures_after_the_heal(tmp_path):
    r = clean(tmp_path)
    # After the heal (12 s; bound 3 + 5 s) the upstream drops one forward
    # and answers another 503: the final answer at 24 s is past 20 s but
    # within the bound of the last failure (19.01 s).
    r.forward("h3", "kf", 14.0, 14.01, status=0)
    r.attempt("h3", "kf", 13.99, 14.02, status=504, flow=32,
              code="upstream_outcome_unknown")
    r.forward("h4", "kf", 19.0, 19.01, status=503)
    r.attempt("h4", "kf", 18.99, 19.02, status=503, flow=32)
    e = r.forward("h5", "kf", 24.0, 24.01)
    r.attempt("h5", "kf", 23.99, 24.02, ex=e, flow=32)
    r.flow(32, "kf", 11.0, 24.02, attempts=4)
    s = r.check()
    assert s["ok"], s["anomaly_classes"]
    assert any("upstream's own failures" in k for k in s["excused"])


def test_6_upstream_failures_before_the_heal_excuse_nothing(tmp_path):
    r = clean(tmp_path)
    r.forward("h3", "kf", 11.5, 11.51, status=0)
    r.attempt("h3", "kf", 11.49, 11.52, status=504, flow=32,
              code="upstream_outcome_unknown")
    e = r.forward("h5", "kf", 24.0, 24.01)
    r.attempt("h5", "kf", 23.99, 24.02, ex=e, flow=32)
    r.flow(32, "kf", 11.0, 24.02, attempts=2)
    only(r.check(), "6", "not_final_in_bound")


def test_6_gauge_not_below_lease(tmp_path):
    r = clean(tmp_path)
    r.events = [e for e in r.events
                if not (e["kind"] == "scrape" and e["inst"] == "p1"
                        and e["oldest_processing_s"] < 3)]
    only(r.check(), "6", "gauge_not_below_lease")


def test_6_excuse_hold_mode_keeps_unknown_outcomes_for_an_operator(tmp_path):
    r = Run(tmp_path, mode="hold")
    r.forward("a", "k", 9.0, 9.5, cut=1)
    r.attempt("a", "k", 8.99, 10.0, status=504,
              code="upstream_outcome_unknown")
    r.attempt("b", "k", 13.0, 13.01, status=409,
              code="idempotency_key_in_use")
    r.flow(1, "k", 8.99, 39.0, final=0, cause="deadline", attempts=5)
    r.event("heal", t_s=12.0)
    r.event("scrape", inst="p1", t_s=14.0, oldest_processing_s=5.0)
    s = r.check()
    assert s["ok"], s["anomaly_classes"]
    assert any(k.startswith("6: hold mode") for k in s["excused"])


def test_6_excuse_new_fault_before_bound(tmp_path):
    r = clean(tmp_path)
    r.flow(30, "kh", 11.0, 40.0, final=0, cause="deadline", attempts=9)
    r.event("freeze", inst="p2", t0_s=14.0, t1_s=15.0)
    s = r.check()
    assert s["ok"], s["anomaly_classes"]


# --- invariant 7 ------------------------------------------------------------

def test_7_replay_after_expiry(tmp_path):
    r = clean(tmp_path)
    e = r.forward("r1", "kr", 30.01, 30.02, route="refund")
    r.attempt("r1", "kr", 30.0, 30.03, ex=e, route="refund")
    r.attempt("r2", "kr", 52.0, 52.01, ex=e, replayed=1, route="refund",
              akind="recheck")
    only(r.check(), "7", "replay_after_expiry")


def test_7_excuse_replay_just_before_expiry(tmp_path):
    r = Run(tmp_path)
    e = r.forward("r1", "kr", 30.01, 30.02, route="refund")
    r.attempt("r1", "kr", 30.0, 30.03, ex=e, route="refund")
    r.attempt("r2", "kr", 50.5, 50.51, ex=e, replayed=1, route="refund")
    assert r.check()["ok"]


def test_7_second_execution_before_ttl(tmp_path):
    r = Run(tmp_path, mode="hold")
    r.forward("r1", "kr", 30.01, 30.02, route="refund")
    r.forward("r2", "kr", 45.0, 45.1, route="refund")
    s = r.check()
    only(s, "7", "second_execution_before_ttl")
    only(s, "1", "hold_second_forward")


# --- invariant 8 ------------------------------------------------------------

def test_8_hang_past_wait_max(tmp_path):
    r = clean(tmp_path)
    r.attempt("w1", "k8", 30.0, 35.0, status=409, route="transfer",
              code="idempotency_key_in_use", akind="wait", proxy=1)
    only(r.check(), "8", "hang")


def test_8_bad_answer(tmp_path):
    r = clean(tmp_path)
    r.attempt("w1", "k8", 30.0, 30.1, status=409, route="transfer",
              akind="wait")  # no code
    only(r.check(), "8", "bad_answer")


def test_8_other_tenant(tmp_path):
    r = clean(tmp_path)
    e = r.forward("w0", "kw", 30.01, 30.02, route="transfer", tenant="t4")
    r.attempt("w1", "kw", 30.0, 30.1, ex=e, route="transfer", akind="wait",
              tenant="t1")
    s = r.check()
    only(s, "8", "other_tenant")
    only(s, "3", "cross_tenant")


def test_8_not_original(tmp_path):
    r = Run(tmp_path)
    e1 = r.forward("a", "k", 3.0, 3.1, route="transfer")
    r.attempt("a", "k", 2.99, 6.0, status=0, route="transfer",
              error="timeout")
    e2 = r.forward("b", "k", 6.1, 6.2, route="transfer")
    r.attempt("b", "k", 6.05, 6.3, ex=e2, route="transfer")
    r.attempt("w", "k", 6.0, 6.4, ex=e1, route="transfer", akind="wait")
    only(r.check(), "8", "not_original")


def test_8_excuse_mismatch_send_on_the_transfer_route(tmp_path):
    r = Run(tmp_path)
    e = r.forward("a", "k", 1.01, 1.02, route="transfer")
    r.attempt("a", "k", 1.0, 1.03, ex=e, route="transfer")
    r.attempt("m", "k", 2.0, 2.01, status=422, route="transfer", body="b2",
              code="idempotency_key_mismatch", akind="mismatch")
    r.attempt("x", "k", 2.0, 2.01, status=400, route="transfer",
              code="idempotency_key_invalid")
    s = r.check()
    assert s["ok"], s["anomaly_classes"]
    assert s["excused"] == {
        "8: the request refused itself (4xx with a code)": 1}


def test_8_excuses_timeout_and_own_forward(tmp_path):
    r = Run(tmp_path)
    r.forward("w", "k", 3.0, 3.01, effect=0, status=503, route="transfer")
    r.attempt("w", "k", 2.99, 3.02, status=503, route="transfer",
              akind="wait")
    r.attempt("w2", "k", 4.0, 7.0, status=0, route="transfer", akind="wait",
              error="timeout")
    assert r.check()["ok"]


# --- a large clean history ---------------------------------------------------

def write_large(path, flows):
    """flows operations: a forward each, the answer, a replayed retry of
    every other one; every tenth a timeout first."""
    os.makedirs(path, exist_ok=True)
    led = ["\t".join(LEDGER_HEAD)]
    load = ["\t".join(A_HEAD), "\t".join(F_HEAD)]
    routes = ("pay", "refund", "transfer")
    seq = 0
    for i in range(flows):
        t = 1.0 + i * 0.0004
        route, tenant, key = routes[i % 3], "t%d" % (1 + i % 4), "s-%d" % i
        body = "%016x" % (i * 2654435761 % (1 << 64))
        n = 1
        if i % 10 == 0:
            load.append("A\t%d\t0\treq\t0\t%d\t%d\t%s\t%s\t%s\t%s\tt%d-0\t0"
                        "\t\t0\t\t\t0\ttimeout" % (i, us(t), us(t + 3),
                                                  tenant, route, key, body, i))
            t += 3.5
            n += 1
        seq += 1
        ex = "9001-%d-%d" % (us(t), seq)
        rh = "%016x" % (seq * 11400714819323198485 % (1 << 64))
        led.append("%d\t9001\t%d\t%d\t%s\t%s\tt%d-1\tPOST\t%s\t%s\tok\t1\t%s"
                   "\t201\t%s\t0" % (seq, us(t + 0.001), us(t + 0.002),
                                     tenant, key, i, ROUTES[route], body, ex,
                                     rh))
        load.append("A\t%d\t1\treq\t0\t%d\t%d\t%s\t%s\t%s\t%s\tt%d-1\t201\t\t0"
                    "\t%s\t%s\t0\t" % (i, us(t), us(t + 0.003), tenant, route,
                                       key, body, i, ex, rh))
        if i % 2 == 0:
            load.append("A\t%d\t2\trecheck\t1\t%d\t%d\t%s\t%s\t%s\t%s\tt%d-2"
                        "\t201\t\t1\t%s\t%s\t0\t" % (
                            i, us(t + 1), us(t + 1.001), tenant, route, key,
                            body, i, ex, rh))
        load.append("F\t%d\tplain\t%s\t%s\t%s\t%s\t%d\t%d\t1\t201\t%d" % (
            i, tenant, route, key, body, us(t), us(t + 0.003), n))
    r = Run(path)
    r.run["t_end_s"] = BASE + 1.0 + flows * 0.0004 + 10
    with open(os.path.join(path, "run.json"), "w") as fh:
        json.dump(r.run, fh)
    open(os.path.join(path, "events.jsonl"), "w").close()
    with open(os.path.join(path, "ledger.tsv"), "w") as fh:
        fh.write("\n".join(led) + "\n")
    with open(os.path.join(path, "load.tsv"), "w") as fh:
        fh.write("\n".join(load) + "\n")
    return sum(1 for x in load if x.startswith("A\t") and x[2] != "f")


def test_large_clean_history_time_and_memory(tmp_path):
    attempts = write_large(str(tmp_path), 125_000)
    assert attempts >= 200_000
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, invariants.__file__, str(tmp_path)],
                       capture_output=True, text=True)
    took = time.monotonic() - t0
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    s = json.loads((tmp_path / "summary.json").read_text())
    print("\nlarge history: %d attempts, %d ledger lines: checked in %.1f s "
          "(%.1f s with the interpreter's start), peak RSS %d MB" % (
              attempts, 125_000, s["check_seconds"], took,
              s["check_peak_rss_mb"]))
    assert s["requests"] == attempts and s["keys"] == 125_000


# --- answers the first campaign runs showed --------------------------------

def stored_503(r, att, key, t_start, **kw):
    """An e503 forward; returns its resp_hash (what a replay carries)."""
    r.forward(att, key, t_start, t_start + 0.01, effect=0, status=503, **kw)
    return r.ledger[-1][14]


def test_stored_503_in_hold_mode_is_the_keys_final_answer(tmp_path):
    # release_statuses = []: the e503 completes the record and is replayed
    # (without X-Ledger-Exec) for as long as the record lives.
    r = Run(tmp_path, mode="hold")
    r.run["release_statuses"] = []
    r.event("partition", a="p1", b="pg", dir="both", t0_s=10.0, t1_s=12.0)
    r.event("heal", t_s=12.0)
    r.attempt("a0", "k", 11.0, 11.5, status=503, route="transfer",
              code="idempotency_store_unavailable", akind="wait")
    rh = stored_503(r, "a1", "k", 12.51, route="transfer")
    r.attempt("a1", "k", 12.5, 12.53, status=503, rhash=rh,
              route="transfer", akind="wait")
    r.attempt("a2", "k", 13.0, 13.01, status=503, rhash=rh, replayed=1,
              route="transfer", akind="wait")
    r.flow(1, "k", 11.0, 41.0, final=0, cause="deadline", attempts=3,
           route="transfer", fkind="wait")
    s = r.check()
    assert s["ok"], s["anomaly_classes"]
    assert s["after_heal"]["reached_final_in_bound"] == 1


def test_stored_503_only_where_it_is_the_keys_stored_answer(tmp_path):
    # Other bytes than the ledger's answer for the key: not its answer.
    r = Run(tmp_path, mode="hold")
    stored_503(r, "a1", "k", 1.01, route="transfer")
    r.attempt("a2", "k", 2.0, 2.01, status=503, rhash="00000000000000aa",
              replayed=1, route="transfer", akind="wait")
    s = r.check()
    only(s, "2", "unknown_replay")
    only(s, "8", "bad_answer")
    # release_after_lease: a read 503 is released, never stored.
    r2 = Run(tmp_path / "release")
    rh = stored_503(r2, "a1", "k", 1.01)
    r2.attempt("a2", "k", 2.0, 2.01, status=503, rhash=rh, replayed=1)
    only(r2.check(), "2", "unknown_replay")
    # Not final when it is not the stored answer (invariant 6).
    r3 = Run(tmp_path / "notfinal")
    r3.event("heal", t_s=12.0)
    r3.attempt("a0", "k", 11.0, 11.5, status=503,
               code="idempotency_store_unavailable")
    rh = stored_503(r3, "a1", "k", 12.51)
    r3.attempt("a1", "k", 12.5, 12.53, status=503, rhash=rh)
    r3.flow(1, "k", 11.0, 41.0, final=0, cause="deadline", attempts=2)
    only(r3.check(), "6", "not_final_in_bound")


def test_stored_503_of_a_new_epoch_replays_until_its_own_expiry(tmp_path):
    # A refund (ttl 20 s) completed with a stored 503 at 1.0; the record
    # expired, a retry at 21.5 forwarded again (a new epoch) and stored the
    # same 503 bytes; a replay at 23.0 is that new epoch's answer, not a
    # replay of the first one after its expiry.
    r = Run(tmp_path, mode="hold")
    r.run["release_statuses"] = []
    rh = stored_503(r, "a1", "k", 1.01, route="refund")
    r.attempt("a1", "k", 1.0, 1.03, status=503, rhash=rh, route="refund")
    rh2 = stored_503(r, "a2", "k", 21.51, route="refund")
    assert rh2 == rh
    r.attempt("a2", "k", 21.5, 21.53, status=503, rhash=rh, route="refund")
    r.attempt("a3", "k", 23.0, 23.01, status=503, rhash=rh, replayed=1,
              route="refund")
    s = r.check()
    assert s["ok"], s["anomaly_classes"]
    # A replay of the stored 503 when no epoch can still be alive is one.
    r2 = Run(tmp_path / "late", mode="hold")
    r2.run["release_statuses"] = []
    rh = stored_503(r2, "a1", "k", 1.01, route="refund")
    r2.attempt("a1", "k", 1.0, 1.03, status=503, rhash=rh, route="refund")
    r2.attempt("a3", "k", 23.5, 23.51, status=503, rhash=rh, replayed=1,
               route="refund")
    only(r2.check(), "7", "replay_after_expiry")


def test_stored_503_seen_binds_the_key(tmp_path):
    # A forward after a client saw the key's stored 503 (invariant 5).
    r = Run(tmp_path, mode="hold")
    rh = stored_503(r, "a1", "k", 1.01)
    r.attempt("a1", "k", 1.0, 1.03, status=503, rhash=rh)
    r.forward("a2", "k", 2.01, 2.02)
    s = r.check()
    only(s, "5", "forwarded_after_seen")
    only(s, "1", "hold_second_forward")


def test_epoch_starts_at_the_first_claim_not_the_first_forward(tmp_path):
    # The first attempt claimed (expiry = 1.0 + 20 s at the earliest), got
    # upstream_unavailable and released; the retry forwarded at 3.31. A
    # body executed at 21.6 is after the earliest expiry: a new epoch.
    r = Run(tmp_path, mode="hold")
    r.attempt("a0", "k", 1.0, 1.01, status=503, route="refund",
              code="upstream_unavailable")
    e = r.forward("a1", "k", 3.31, 3.32, route="refund")
    r.attempt("a1", "k", 3.3, 3.33, ex=e, route="refund")
    e2 = r.forward("m", "k", 21.6, 21.61, route="refund", body="b2")
    r.attempt("m", "k", 21.6, 21.62, ex=e2, route="refund", body="b2",
              akind="mismatch")
    # Replays are judged against the latest expiry: 3.31 + 20 + slack.
    r.attempt("a2", "k", 24.2, 24.21, ex=e, replayed=1, route="refund")
    s = r.check()
    assert s["ok"], s["anomaly_classes"]
    # Before the earliest expiry less the slack it is still one epoch.
    r2 = Run(tmp_path / "early", mode="hold")
    r2.attempt("a0", "k", 1.0, 1.01, status=503, route="refund",
               code="upstream_unavailable")
    r2.forward("a1", "k", 3.31, 3.32, route="refund")
    r2.forward("m", "k", 20.6, 20.61, route="refund", body="b2")
    s = r2.check()
    only(s, "1", "hold_second_forward")
    only(s, "3", "mismatch_executed")
    r3 = Run(tmp_path / "late_replay", mode="hold")
    r3.attempt("a0", "k", 1.0, 1.01, status=503, route="refund",
               code="upstream_unavailable")
    e = r3.forward("a1", "k", 3.31, 3.32, route="refund")
    r3.attempt("a2", "k", 24.4, 24.41, ex=e, replayed=1, route="refund")
    only(r3.check(), "7", "replay_after_expiry")


def test_outcome_unrecorded_hold_mode_keeps_the_key_for_an_operator(
        tmp_path):
    r = Run(tmp_path, mode="hold")
    r.event("partition", a="p1", b="pg", dir="both", t0_s=8.0, t1_s=12.0)
    r.event("heal", t_s=12.0)
    r.forward("a", "k", 9.01, 9.02)  # executed; the record write failed
    r.attempt("a", "k", 9.0, 10.0, status=503,
              code="idempotency_outcome_unrecorded")
    r.attempt("b", "k", 13.0, 13.01, status=409,
              code="idempotency_key_in_use")
    r.flow(1, "k", 9.0, 39.0, final=0, cause="deadline", attempts=5)
    r.event("scrape", inst="p1", t_s=14.0, oldest_processing_s=5.0)
    s = r.check()
    assert s["ok"], s["anomaly_classes"]
    assert any(k.startswith("6: hold mode") for k in s["excused"])


def test_outcome_unrecorded_release_mode_answer_was_lost(tmp_path):
    # The client never got the answer: not seen, so after the lease the
    # key may execute again; the code is no "not forwarded" refusal.
    r = Run(tmp_path)
    r.forward("a", "k", 3.0, 3.1)
    r.attempt("a", "k", 2.99, 3.2, status=503,
              code="idempotency_outcome_unrecorded")
    e = r.forward("b", "k", 6.1, 6.2)
    r.attempt("b", "k", 6.05, 6.3, ex=e)
    s = r.check()
    assert s["ok"], s["anomaly_classes"]
    # The same history with the answer given is a takeover after it was
    # seen.
    r2 = Run(tmp_path / "seen")
    e = r2.forward("a", "k", 3.0, 3.1)
    r2.attempt("a", "k", 2.99, 3.2, ex=e)
    r2.forward("b", "k", 6.1, 6.2)
    only(r2.check(), "1", "after_answer_seen")
