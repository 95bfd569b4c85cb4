"""Every invariant the soak and the fuzzer check must be able to fail: each
check is fed a synthetic record that satisfies it (no violation) and one
that breaks it (the named violation). Run by `make chaos` before the soak."""
import pytest

import checker as c

P1, P2 = 9001, 9002
PORTS = {P1: "p1", P2: "p2"}


def up(seq, key, start, end, kind="ok", effect=True, rid=None, port=P1, result=None,
       status=201, answered=True, body=b"B", target="/v1/payments", method="POST"):
    return {"seq": seq, "port": port, "method": method, "target": target, "key": key,
            "rid": rid or "r%d" % seq, "body": body, "start": start, "end": end,
            "kind": kind, "effect": effect, "result_id": result or "pay_%d" % seq,
            "status": status, "answered": answered}


def att(key, status=201, id_="pay_1", body_key=None, kind="req", code=None, **kw):
    a = {"key": key, "flow": "f", "kind": kind, "inst": "p1", "rid": "x", "t0": 0, "t1": 0,
         "status": status, "code": code, "error": None, "id": id_,
         "body_key": key if body_key is None else body_key, "ctypes": 1, "trailer": False,
         "decodable": True, "replayed": None}
    a.update(kw)
    return a


def names(v):
    return sorted({inv for inv, _ in v})


# --- hold ----------------------------------------------------------------------

def test_one_request_per_key():
    assert c.check_one_request_per_key([up(1, "a", 0, 1), up(2, "b", 0, 1)]) == []
    v = c.check_one_request_per_key([up(1, "a", 0, 1), up(2, "a", 5, 6)])
    assert names(v) == ["one_request_per_key"]


def test_held_explained():
    held = [{"key": "a", "kind": "req", "final": False, "cause": "held"}]
    unanswered = [up(1, "a", 0, 1.6, kind="slow", answered=False)]
    assert c.check_held_explained(held, [att("a", status=409, code="x")], unanswered) == []
    crash = [att("a", status=None, id_=None, error="ConnectionError")]
    assert c.check_held_explained(held, crash, []) == []
    # answered by the upstream, no crash, no outage: nothing explains the hold
    v = c.check_held_explained(held, [att("a", status=409, code="idempotency_key_in_use")],
                               [up(1, "a", 0, 0.01)])
    assert names(v) == ["held_explained"]
    v = c.check_held_explained(held, [att("a", status=409, code="idempotency_key_in_use")], [])
    assert names(v) == ["held_explained"]
    # answered, but its record failed while every store connection was held
    # longer than the lease: the record stays processing, so held
    answered = [att("a", status=201, code=None)]
    fail = [{"msg": "could not record the outcome; retrying in the background",
             "time": "2026-12-01T09:26:05.100Z",
             "detail": "request_id=r1 route=x key=a no answer from the store"}]
    at = c.log_time(fail[0])
    long_stall = [{"kind": "stall", "stall": "hold_all", "store": True,
                   "t": at - 0.3, "t_end": at + 3.8}]
    assert c.check_held_explained(held, answered, [up(1, "a", 0, 0.01)], fail,
                                  long_stall, 3.0) == []
    # a stall shorter than the lease explains nothing: a retry within the
    # lease could have written the record
    short_stall = [dict(long_stall[0], t_end=at + 1.0)]
    v = c.check_held_explained(held, answered, [up(1, "a", 0, 0.01)], fail,
                               short_stall, 3.0)
    assert names(v) == ["held_explained"]


# --- release -------------------------------------------------------------------

def test_one_effect_per_key():
    ok = [up(1, "a", 0, 1), up(2, "a", 4, 5, effect=False)]
    assert c.check_one_effect_per_key(ok) == []
    v = c.check_one_effect_per_key([up(1, "a", 0, 1), up(2, "a", 4, 5)])
    assert names(v) == ["one_effect_per_key"]


def test_no_overlap():
    assert c.check_no_overlap([up(1, "a", 0, 1), up(2, "a", 1.5, 2)]) == []
    assert names(c.check_no_overlap([up(1, "a", 0, 2), up(2, "a", 1.5, 3)])) == ["no_overlap"]
    # a request still running at the end overlaps everything after it
    assert names(c.check_no_overlap([up(1, "a", 0, None), up(2, "a", 9, 10)])) == ["no_overlap"]


def req_line(rid, outcome, status, inst="p1"):
    return {"msg": "request", "request_id": rid, "outcome": outcome, "status": status,
            "inst": inst}


def test_repeat_explained_by_release_unknown_or_crash():
    rs = [up(1, "a", 0, 0.1, rid="r1"), up(2, "a", 4, 4.1, rid="r2", effect=False)]
    for logs in ([req_line("r1", "forwarded", 503)],
                 [req_line("r1", "outcome_unknown", 504)],
                 [{"msg": "upstream outcome unknown", "detail": "request_id=r1 key=a x"}]):
        assert c.check_repeats_explained(rs, logs, [], PORTS) == []
    kill = [{"inst": "p1", "t": 0.5, "rc": -9}]
    assert c.check_repeats_explained(rs, [], kill, PORTS) == []
    # the death of the other proxy, or one before the request, explains nothing
    assert names(c.check_repeats_explained(rs, [], [{"inst": "p2", "t": 0.5}],
                                           PORTS)) == ["repeats_explained"]
    assert c.check_repeats_explained(rs, [], [{"inst": "p1", "t": -0.5}],
                                     PORTS) == []   # the request was on its way
    assert names(c.check_repeats_explained(rs, [], [{"inst": "p1", "t": -3}],
                                           PORTS)) == ["repeats_explained"]


def test_repeat_after_a_recorded_answer_is_unexplained():
    rs = [up(1, "a", 0, 0.1, rid="r1"), up(2, "a", 4, 4.1, rid="r2", effect=False)]
    logs = [req_line("r1", "forwarded", 201),
            {"msg": "could not record the outcome; the record stays processing until its "
             "lease ends", "detail": "request_id=r1 route=create_payment key=a server closed"}]
    v = c.check_repeats_explained(rs, logs, [], PORTS)
    assert names(v) == ["repeats_explained"]
    assert "record_failed" in v[0][1]
    # ... unless PostgreSQL was down longer than the lease just then
    logs[1]["time"] = "2026-12-01T09:26:05.100Z"
    at = c.log_time(logs[1])
    short = [{"kind": "pg_restart", "t": at - 0.5, "t_end": at + 1}]
    long_ = [{"kind": "pg_restart", "t": at - 0.5, "t_end": at + 3}]
    assert names(c.check_repeats_explained(rs, logs, [], PORTS, chaos=short, lease_s=3)) == \
        ["repeats_explained"]
    assert c.check_repeats_explained(rs, logs, [], PORTS, chaos=long_, lease_s=3) == []


def test_repeat_after_expiry_on_a_short_ttl_route():
    rs = [up(1, "a", 0, 0.1, rid="r1", target="/v1/refunds"),
          up(2, "a", 5, 5.1, rid="r2", target="/v1/refunds", effect=False)]
    logs = [req_line("r1", "forwarded", 201)]
    assert c.check_repeats_explained(rs, logs, [], PORTS, {"/v1/refunds": 4}) == []
    assert names(c.check_repeats_explained(rs, logs, [], PORTS, {"/v1/refunds": 6})) == \
        ["repeats_explained"]
    # the claim came before the upstream saw anything: the client's first try
    assert c.check_repeats_explained(rs, logs, [], PORTS, {"/v1/refunds": 6},
                                     first_try={"a": -1.5}) == []


def test_takeover_only_after_the_lease():
    # r1's client sent at t=10, so its lease ran until 13 at least
    sent = [att("a", rid="r1", t0=10.0), att("a", rid="r2", t0=12.0)]
    late = [up(1, "a", 10.1, 11.2, rid="r1", answered=False),
            up(2, "a", 13.4, 13.5, rid="r2", effect=False)]
    assert c.check_takeover_after_lease(late, sent, [], 3.0) == []
    early = [up(1, "a", 10.1, 11.2, rid="r1", answered=False),
             up(2, "a", 12.1, 12.2, rid="r2", effect=False)]
    v = c.check_takeover_after_lease(early, sent, [req_line("r1", "outcome_unknown", 504)],
                                     3.0)
    assert names(v) == ["takeover_after_lease"] and "inside its 3.0 s lease" in v[0][1]
    # a 503 released the key at once: the retry may go right after it
    assert c.check_takeover_after_lease(early, sent, [req_line("r1", "forwarded", 503)],
                                        3.0) == []
    keys = {"a": {"route": "/v1/payments", "body": b"B", "probes": []}}
    rel = names(c.check_run("release", early, sent, [], keys,
                            [req_line("r1", "outcome_unknown", 504)], [], [], PORTS,
                            lease_s=3.0))
    assert rel == ["takeover_after_lease"]   # the upstream deduplicated it


def test_a_store_stall_past_the_lease_excuses_a_lost_record():
    lost = [{"key": "a", "kind": "replay", "final": False, "cause": "held"}]
    fail = [{"msg": "could not record the outcome", "time": "2026-12-01T09:26:05.100Z",
             "detail": "request_id=r1 route=x key=a server closed"}]
    at = c.log_time(fail[0])
    every = {"kind": "stall", "stall": "hold_all", "store": True, "t": at - 1,
             "t_end": at + 2.5}
    assert c.check_known_outcome_kept(lost, fail, [every], 3) == []
    # one held statement leaves the other connections: the record can go there
    one = dict(every, stall="hold_answer", store=False)
    assert names(c.check_known_outcome_kept(lost, fail, [one], 3)) == ["known_outcome_kept"]


def replay(t0, t1, inst="p1", warm=True, error=None, key="k"):
    return dict(att(key, rid="x%s" % t0, t0=t0, t1=t1, inst=inst, kind="replay",
                    replayed="true", error=error), warm=warm)


def stall(kind, t, t_end, inst=None, **kw):
    return dict({"kind": "stall", "stall": kind, "inst": inst, "t": t, "t_end": t_end}, **kw)


def test_replays_answer_during_stalls():
    chaos = [stall("hold_all", 10, 14, store=True), stall("log", 20, 25, "p2"),
             stall("hold_answer", 30, 34, started=False), stall("freeze", 40, 45, "p1"),
             {"kind": "kill", "inst": "p1", "t": 50, "t_end": 51},
             {"kind": "pg_restart", "t": 60, "t_end": 62}]
    fast = [replay(11, 11.002), replay(21, 21.001, "p2"), replay(61, 61.01)]
    assert c.check_replays_answer(chaos, fast, 1.0) == []
    for slow in (replay(12, 13.7), replay(22, 24.5, "p2"), replay(61, 63),
                 replay(12, 18, error="ReadTimeout")):
        v = c.check_replays_answer(chaos, [slow], 1.0)
        assert names(v) == ["replay_during_stall"], slow
    # outside the stalls, in a hold that never started, on a proxy frozen
    # or killed meanwhile, or while warming (maybe not in the cache yet):
    # not bounded here
    for free in (replay(5, 7), replay(31, 33), replay(41, 44), replay(50.2, 52),
                 replay(12, 13.7, warm=False)):
        assert c.check_replays_answer(chaos, [free], 1.0) == []
    assert [x for _, x in c.replay_latencies(chaos, [replay(5, 5.5)], False)] == [0.5]
    assert "p99" in c.latency_line(c.replay_latencies(chaos, fast, True))


def frozen(statuses, length=4.5):
    e = stall("freeze", 100, 100 + length, "p1", frozen_at=100.0, thawed_at=100 + length)
    e["polls"] = [{"t": 100 + 0.25 * i, "status": st} for i, st in enumerate(statuses)]
    return e


def test_readyz_sees_a_frozen_loop():
    ready_then_not = [200] * 10 + [503] * 8
    assert c.check_readyz_frozen([frozen(ready_then_not)], 2.0) == []
    timeouts = [200] * 12 + ["ReadTimeout"] * 6
    assert c.check_readyz_frozen([frozen(timeouts)], 2.0) == []
    v = c.check_readyz_frozen([frozen([200] * 18)], 2.0)
    assert names(v) == ["readyz_sees_frozen_loop"]
    assert names(c.check_readyz_frozen([frozen([])], 2.0)) == ["readyz_sees_frozen_loop"]
    # not 200 only before loop_stall_max had passed: not seen as frozen
    assert names(c.check_readyz_frozen([frozen([503] * 4 + [200] * 14)], 2.0)) == \
        ["readyz_sees_frozen_loop"]
    failed = dict(frozen([]), error="ptrace: Operation not permitted")
    assert names(c.check_readyz_frozen([failed], 2.0)) == ["stall_injected"]
    both = c.check_stalls([frozen([200] * 18), stall("hold_all", 10, 14, store=True)],
                          [replay(11, 13)], 1.0, 2.0)
    assert names(both) == ["readyz_sees_frozen_loop", "replay_during_stall"]


# --- both modes ----------------------------------------------------------------

def test_answers_carry_the_keys_result():
    ups = [up(1, "a", 0, 1, result="pay_A"), up(2, "b", 0, 1, result="pay_B")]
    good = [att("a", id_="pay_A"), att("a", id_="pay_A", kind="replay"), att("b", id_="pay_B"),
            att("a", status=409, id_=None, code="idempotency_key_in_use")]
    assert c.check_answers_carry_result(good, ups, dedup=True) == []
    # another key's answer (a shifted upstream connection)
    v = c.check_answers_carry_result([att("b", id_="pay_A", body_key="a")], ups, True)
    assert names(v) == ["answer_is_result"]
    # an id the upstream never gave for the key
    assert names(c.check_answers_carry_result([att("a", id_="stray_1", body_key=None)], ups,
                                              True)) == ["answer_is_result"]
    # two answers of one key, both ids the upstream gave (no dedup)
    two = [up(1, "a", 0, 1, result="pay_A"), up(2, "a", 3, 4, result="pay_A2")]
    v = c.check_answers_carry_result([att("a", id_="pay_A"), att("a", id_="pay_A2")], two,
                                     dedup=False)
    assert names(v) == ["answer_is_result"]
    # dedup: only the first effect's id is the result
    v = c.check_answers_carry_result([att("a", id_="pay_A2")],
                                     [two[0], dict(two[1], effect=False)], dedup=True)
    assert names(v) == ["answer_is_result"]


def test_answers_are_whole():
    ups = [up(1, "a", 0, 1, result="pay_A")]
    assert names(c.check_answers_carry_result([att("a", id_=None, decodable=False)], ups,
                                              True)) == ["answer_readable"]
    assert names(c.check_answers_carry_result([att("a", id_="pay_A", ctypes=2)], ups,
                                              True)) == ["answer_headers"]
    assert names(c.check_answers_carry_result([att("a", id_="pay_A", trailer=True)], ups,
                                              True)) == ["answer_headers"]


def test_bodies_as_claimed():
    keys = {"a": {"route": "/v1/payments", "body": b"A", "probes": [b"A2"]}}
    assert c.check_bodies([up(1, "a", 0, 1, body=b"A")], keys) == []
    v = c.check_bodies([up(1, "a", 0, 1, body=b"A2")], keys)
    assert names(v) == ["body_as_claimed"] and "probe" in v[0][1]
    assert names(c.check_bodies([up(1, "a", 0, 1, body=b"other")], keys)) == ["body_as_claimed"]
    assert names(c.check_bodies([up(1, "zz", 0, 1, body=b"A")], keys)) == ["body_as_claimed"]
    assert names(c.check_bodies([up(1, None, 0, 1, body=b"A")], keys)) == ["body_as_claimed"]
    assert names(c.check_bodies([up(1, "a", 0, 1, body=b"A", target="/v1/refunds")],
                                keys)) == ["body_as_claimed"]


def test_probes_refused():
    assert c.check_probes([{"key": "a", "kind": "probe", "final": True,
                            "cause": "mismatch"}]) == []
    assert names(c.check_probes([{"key": "a", "kind": "probe", "final": True,
                                  "cause": "ok"}])) == ["probe_refused"]


def test_same_body_never_mismatch():
    assert c.check_same_body_never_mismatch([att("a", kind="probe", status=409,
                                                 code="idempotency_key_mismatch")]) == []
    assert names(c.check_same_body_never_mismatch(
        [att("a", kind="replay", status=409, code="idempotency_key_mismatch")])) == \
        ["same_body_not_mismatch"]


def test_known_outcome_kept_after_the_record_expired():
    stuck = [{"key": "a", "kind": "replay", "final": False, "cause": "in_use"}]
    ttl = {"/v1/refunds": 4}
    # sent again 5 s later on a 4 s ttl route: a new key, whose own attempt
    # may be in flight
    again = [up(1, "a", 0, 0.2, target="/v1/refunds"), up(2, "a", 5, 5.1, target="/v1/refunds")]
    assert c.check_known_outcome_kept(stuck, ups=again, ttl_by_target=ttl) == []
    # within the ttl it is the same key: stuck behind 409 is a violation
    soon = [up(1, "a", 0, 0.2, target="/v1/refunds"), up(2, "a", 2, 2.1, target="/v1/refunds")]
    v = c.check_known_outcome_kept(stuck, ups=soon, ttl_by_target=ttl)
    assert names(v) == ["known_outcome_kept"]


def test_known_outcome_kept():
    assert c.check_known_outcome_kept([{"key": "a", "kind": "replay", "final": True,
                                        "cause": "ok"},
                                       {"key": "b", "kind": "replay", "final": False,
                                        "cause": "store_unavailable"}]) == []
    for cause in ("held", "in_use"):
        assert names(c.check_known_outcome_kept([{"key": "a", "kind": "replay",
                                                  "final": False, "cause": cause}])) == \
            ["known_outcome_kept"]
    lost = [{"key": "a", "kind": "replay", "final": False, "cause": "held"}]
    fail = [{"msg": "could not record the outcome", "time": "2026-12-01T09:26:05.100Z",
             "detail": "request_id=r1 route=x key=a server closed"}]
    at = c.log_time(fail[0])
    assert c.log_time({"time": "1970-01-01T00:00:01.500Z"}) == 1.5
    v = c.check_known_outcome_kept(lost, fail, [{"kind": "pg_restart", "t": at - 1,
                                                 "t_end": at + 0.5}], 3)
    assert names(v) == ["known_outcome_kept"] and "record_failed" in v[0][1]
    assert c.check_known_outcome_kept(lost, fail, [{"kind": "pg_restart", "t": at - 1,
                                                    "t_end": at + 2.5}], 3) == []


def test_proxies_survive():
    ok = [{"inst": "p1", "rc": -9, "expected": True, "signal": "KILL", "why": ""},
          {"inst": "p1", "rc": 0, "expected": True, "signal": "TERM", "why": ""}]
    assert c.check_proxies(ok) == []
    assert names(c.check_proxies([{"inst": "p1", "rc": -11, "expected": False,
                                   "why": "signal SIGSEGV"}])) == ["proxy_survives"]
    assert names(c.check_proxies([{"inst": "p1", "rc": -6, "expected": True,
                                   "signal": "TERM", "why": ""}])) == ["proxy_survives"]


def test_check_run_modes():
    ups = [up(1, "a", 0, 2, body=b"A"), up(2, "a", 1, 3, body=b"A")]
    keys = {"a": {"route": "/v1/payments", "body": b"A", "probes": []}}
    hold = names(c.check_run("hold", ups, [], [], keys, [], [], [], PORTS))
    assert hold == ["one_request_per_key"]
    rel = names(c.check_run("release", ups, [], [], keys, [], [], [], PORTS))
    assert rel == ["no_overlap", "one_effect_per_key", "repeats_explained"]


# --- the fuzzer's oracles --------------------------------------------------------

ROUTES = [{"name": "create_payment", "path": "/v1/payments"},
          {"name": "capture", "path": "/v1/payments/{id}/capture"},
          {"name": "hooks", "path": "/hooks/*", "tenant": "header:X-Tenant-Id"},
          {"name": "optional", "path": "/v1/optional", "key": "optional"},
          {"name": "catchall", "path": "/*", "key": "optional"}]


@pytest.mark.parametrize("target,path", [
    ("/v1/pay%6dents", "/v1/payments"), ("/v1/payments/", "/v1/payments"),
    ("/v1/./payments", "/v1/payments"), ("/v1/x/../payments?q=1", "/v1/payments"),
    ("/v1/payments/x#/capture", "/v1/payments/x"), ("/v1/a%2Fb", "/v1/a%2Fb"), ("/", "/")])
def test_normalise_path(target, path):
    assert c.normalise_path(target) == path


def test_match_route():
    assert c.match_route(ROUTES, "POST", "/v1/payments")[0]["name"] == "create_payment"
    assert c.match_route(ROUTES, "post", "/v1/pay%6dents") == (ROUTES[0], True)
    assert c.match_route(ROUTES, "POST", "/v1/payments/x/capture")[0]["name"] == "capture"
    assert c.match_route(ROUTES, "POST", "/v1/payments//capture")[0]["name"] == "catchall"
    assert c.match_route(ROUTES, "GET", "/v1/payments") == (ROUTES[0], False)
    assert c.match_route(ROUTES, "POST", "/hooks")[0]["name"] == "hooks"
    assert c.match_route(ROUTES[:2], "POST", "/elsewhere") == (None, False)


def test_parse_key():
    assert c.parse_key("k1") == "k1"
    assert c.parse_key('"k1";retry=1') == "k1"
    assert c.parse_key(' k1 ') == "k1"
    assert c.parse_key(None) is None


def fz(method, target, headers, body=b"{}"):
    return {"method": method, "target": target, "headers": headers, "body": body}


SENT = c.sent_header_set([b"POST /v1/payments HTTP/1.1\r\nHost: x\r\nIdempotency-Key: k1\r\n"
                          b"Content-Type: application/json\r\nX-Tenant-Id: t1\r\n\r\n{}"
                          b"POST /hooks/a HTTP/1.1\r\nX-Tenant-Id: t2\x00junk\r\n\r\n",
                          b"POST /x HTTP/1.1\r\nX-Tenant-I: VICTIM\r\n d\r\n\r\n"])


def test_sent_header_set():
    assert ("x-tenant-id", "t1") in SENT
    assert ("x-tenant-id", "t2") in SENT             # cut at the NUL, second request
    assert ("x-tenant-id", "VICTIM") not in SENT     # the fold is not a line of its own
    assert ("x-tenant-i", "VICTIM") in SENT


def test_fuzz_clean_traffic_passes():
    ups = [fz("POST", "/v1/payments", [("Idempotency-Key", "k1"),
                                       ("Content-Type", "application/json")]),
           fz("POST", "/v1/payments", [("Idempotency-Key", "k1")], b'{ }'),  # released, again
           fz("GET", "/v1/payments", []),
           fz("POST", "/v1/optional", []),
           fz("POST", "/hooks/a", [("Idempotency-Key", '"k2"'), ("X-Tenant-Id", "t1")])]
    rec = {("create_payment", "k1"): "default", ("hooks", "k2"): "t1"}
    assert c.check_fuzz(ups, rec, ROUTES, SENT) == []


def test_fuzz_oracles_fire():
    rec = {("create_payment", "k1"): "default", ("capture", "k9"): "default"}
    cases = {
        # a lowercase method run as a POST without a key (C12)
        "fuzz_key_required": fz("post", "/v1/payments", []),
        # executed on another route than claimed (C11, C15)
        "fuzz_claimed": fz("POST", "/v1/payments/x", [("Idempotency-Key", "k9")]),
        # a header made by gluing an obs-fold (C14)
        "fuzz_headers_as_sent": fz("GET", "/v1/payments", [("X-Tenant-Id", "VICTIM")]),
        # a target no route matches
        "fuzz_routed": None,
    }
    for inv, r in cases.items():
        if r is None:
            v = c.check_fuzz([fz("POST", "/nowhere", [])], rec, ROUTES[:2], SENT)
        else:
            v = c.check_fuzz([r], rec, ROUTES, SENT)
        assert names(v) == [inv], (inv, v)
    # one key under two tenants is two claims
    hooks = [fz("POST", "/hooks/a", [("Idempotency-Key", "k3"), ("X-Tenant-Id", "t1")], b"1"),
             fz("POST", "/hooks/a", [("Idempotency-Key", "k3"), ("X-Tenant-Id", "t2")], b"2")]
    assert c.check_fuzz(hooks, {("hooks", "k3"): "t1"}, ROUTES,
                        SENT | {("x-tenant-id", "t2")}) == []
    assert names(c.check_fuzz([hooks[0], dict(hooks[1], headers=hooks[0]["headers"])],
                              {("hooks", "k3"): "t1"}, ROUTES, SENT)) == ["fuzz_claimed"]
    # one key, two different requests at the upstream
    v = c.check_fuzz([fz("POST", "/v1/payments", [("Idempotency-Key", "k1")], b'{"a":1}'),
                      fz("POST", "/v1/payments", [("Idempotency-Key", "k1")], b'{"a":2}')],
                     rec, ROUTES, SENT)
    assert names(v) == ["fuzz_claimed"]
    # a protected request with a key that has no record at all
    v = c.check_fuzz([fz("PATCH", "/v1/payments", [("Idempotency-Key", "k-none")])], rec,
                     ROUTES, SENT)
    assert names(v) == ["fuzz_claimed"]


def test_canonical_bodies():
    assert c._canon(b'{"a": 1, "b": 2}') == c._canon(b'{"b":2,"a":1}')
    assert c._canon(b'{"a": 1, "a": 2}')[0] == "raw"
