"""W3C Trace Context (doc/security.md#trace-context): the proxy does not
take part in tracing. traceparent and tracestate reach the upstream as the
client sent them, valid or not; the trace id of a valid traceparent is in
every log line of its request and stored with the record its request
claims first; nothing of an invalid one is ever logged."""
import threading

import pytest

from conftest import CITUS
from helpers import assert_problem, is_replay, log_entries, new_key, raw_request, wait_until
from store_support import PAY, HeldRows, lock_waits, metrics, pay
from test_batch import fibers, queued
from test_ops import admin
from test_records import FAILURES, break_idem_claim

TID = "4bf92f3577b34da6a3ce929d0e0e4736"
TID2 = "0af7651916cd43dd8448eb211c80319c"
PID = "00f067aa0ba902b7"


def tp(trace_id=TID, version="00", parent=PID, flags="01"):
    return "%s-%s-%s-%s" % (version, trace_id, parent, flags)


def lines_of(proxy, request_id):
    """The JSON log lines of one request: its request line, and every other
    line that names its request id."""
    out = []
    for d in log_entries(proxy):
        if d.get("request_id") == request_id or \
                ("request_id=%s " % request_id) in d.get("detail", ""):
            out.append(d)
    return out


def request_line(proxy, key):
    found = [d for d in log_entries(proxy) if d.get("msg") == "request" and d.get("key") == key]
    assert len(found) == 1, found
    return found[0]


def post_raw(proxy, key, extra):
    body = b'{"amount": 100, "currency": "EUR"}'
    return raw_request(proxy.port, "POST", PAY,
                       [("Idempotency-Key", key), ("Content-Type", "application/json")]
                       + extra, body)


def test_traceparent_and_tracestate_reach_the_upstream_unchanged(proxy, stub, pg):
    key = new_key("tp")
    state = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
    r = post_raw(proxy, key, [("TraceParent", tp()), ("tracestate", state),
                              ("tracestate", "extra=1")])
    assert r.status_code == 201
    (got,) = stub.requests(key=key)
    assert got.headers("traceparent") == [tp()]
    assert [n for n, _ in got.header_list if n.lower() == "traceparent"] == ["TraceParent"]
    # Both fields, in order, as they came (not joined into one).
    assert got.headers("tracestate") == [state, "extra=1"]
    line = request_line(proxy, key)
    assert line["trace_id"] == TID
    assert bytes(pg.record(key)["trace_id"]) == bytes.fromhex(TID)


def test_a_request_without_traceparent_gets_none(proxy, stub, pg):
    key = new_key("none")
    assert pay(proxy, key).status_code == 201
    (got,) = stub.requests(key=key)
    assert got.headers("traceparent") == [] and got.headers("tracestate") == []
    assert request_line(proxy, key)["trace_id"] is None
    assert pg.record(key)["trace_id"] is None
    g = admin(proxy, "GET", "default", "create_payment", key)
    assert g.status_code == 200 and g.json()["trace_id"] is None


def test_a_replay_logs_the_retrys_trace_and_the_record_keeps_the_originals(
        proxy, stub, pg):
    key = new_key("replay")
    first = pay(proxy, key, headers={"traceparent": tp(TID)})
    assert first.status_code == 201
    retry = pay(proxy, key, headers={"traceparent": tp(TID2, parent="b7ad6b7169203331")})
    assert retry.status_code == 201 and is_replay(retry)
    assert retry.content == first.content
    assert stub.count(key=key) == 1
    lines = [d for d in log_entries(proxy) if d.get("msg") == "request" and d.get("key") == key]
    assert [(d["outcome"], d["trace_id"]) for d in lines] == [
        ("forwarded", TID), ("replayed", TID2)]
    g = admin(proxy, "GET", "default", "create_payment", key)
    assert g.status_code == 200, g.text
    assert g.json()["trace_id"] == TID
    assert bytes(pg.record(key)["trace_id"]) == bytes.fromhex(TID)


def test_a_waiting_duplicates_lines_carry_its_own_trace(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides={"create_payment": {
        "in_flight": "wait", "wait_max": "30s", "lease": "60s"}})
    key = new_key("wait")
    stub.configure({"prefix": PAY, "key": key, "gate": "orig", "times": 1})
    answers = {}

    def send(name, trace):
        answers[name] = pay(proxy, key, headers={"traceparent": tp(trace)}, timeout=60)

    first = threading.Thread(target=send, args=("first", TID))
    first.start()
    stub.wait_for(1, key=key)
    dup = threading.Thread(target=send, args=("dup", TID2))
    dup.start()
    wait_until(lambda: metrics(proxy).get("idemproxy_waiters", 0) == 1,
               what="the duplicate waiting")
    stub.release("orig")
    first.join(60)
    dup.join(60)
    assert answers["first"].status_code == 201 and is_replay(answers["dup"])
    assert stub.count(key=key) == 1
    rid = [d["request_id"] for d in log_entries(proxy)
           if d.get("msg") == "request" and d.get("key") == key and d["trace_id"] == TID2]
    assert len(rid) == 1, rid
    lines = lines_of(proxy, rid[0])
    waited = [d for d in lines if d["msg"] == "duplicate done waiting"]
    assert len(waited) == 1, lines
    assert waited[0]["detail"].startswith("request_id=%s trace_id=%s " % (rid[0], TID2))
    assert TID not in str(lines)


def test_a_store_error_line_carries_the_trace(proxy, stub, pg):
    break_idem_claim(pg, FAILURES["other_error"])
    key = new_key("refused")
    r = pay(proxy, key, headers={"traceparent": tp()})
    assert_problem(r, 503, "idempotency_store_unavailable")
    assert stub.count(key=key) == 0
    rid = r.json()["request_id"]
    lines = lines_of(proxy, rid)
    errors = [d for d in lines if d["msg"] == "store error"]
    assert len(errors) == 1, lines
    assert errors[0]["detail"].startswith("request_id=%s trace_id=%s " % (rid, TID))
    assert [d["trace_id"] for d in lines if d["msg"] == "request"] == [TID]


# The values a traceparent must not be trusted with: each is forwarded as it
# came, and neither it nor any part of it is logged or stored.
MALFORMED = {
    "uppercase": tp(TID.upper()),
    "uppercase_parent": tp(parent=PID.upper()),
    "zero_trace": tp("0" * 32),
    "zero_parent": tp(parent="0" * 16),
    "short_trace": tp(TID[:-1]),
    "long_trace": tp(TID + "a"),
    "v00_trailing": tp() + "-01",
    "version_ff": tp(version="ff"),
    "version_one_digit": "0-%s-%s-01" % (TID, PID),
    "tab_inside": "00-%s\t-%s-01" % (TID[:-1], PID),
    "high_bytes": "00-%s\xe9-%s-01" % (TID[:-1], PID),
    "not_a_traceparent": "hello world",
}


@pytest.mark.parametrize("name", sorted(MALFORMED))
def test_a_malformed_traceparent_is_passed_on_and_never_logged(proxy, stub, pg, name):
    value = MALFORMED[name]
    key = new_key("bad-" + name.replace("_", "-"))
    r = post_raw(proxy, key, [("traceparent", value), ("tracestate", "congo=t61rcWkgMzE")])
    assert r.status_code == 201, r.content
    (got,) = stub.requests(key=key)
    assert got.headers("traceparent") == [value.strip()]
    assert got.headers("tracestate") == ["congo=t61rcWkgMzE"]
    assert request_line(proxy, key)["trace_id"] is None
    assert pg.record(key)["trace_id"] is None
    assert_never_logged(proxy, value)


def assert_never_logged(proxy, value):
    log = proxy.log()
    for part in [value] + value.split("-"):
        if len(part) >= 8:  # the trace id or the parent id, well-formed or not
            assert part not in log and part.lower() not in log, part


def test_a_higher_version_is_read_by_its_version_00_prefix(proxy, stub, pg):
    key = new_key("v-cc")
    value = tp(version="cc") + "-what-comes-next"
    assert pay(proxy, key, headers={"traceparent": value}).status_code == 201
    (got,) = stub.requests(key=key)
    assert got.headers("traceparent") == [value]
    assert request_line(proxy, key)["trace_id"] == TID
    assert bytes(pg.record(key)["trace_id"]) == bytes.fromhex(TID)


@pytest.mark.parametrize("second", [tp(), tp(TID2)], ids=["same", "different"])
def test_duplicate_traceparents_are_passed_on_and_never_logged(proxy, stub, pg, second):
    key = new_key("dup")
    r = post_raw(proxy, key, [("traceparent", tp()), ("traceparent", second)])
    assert r.status_code == 201
    (got,) = stub.requests(key=key)
    assert got.headers("traceparent") == [tp(), second]
    assert request_line(proxy, key)["trace_id"] is None
    assert pg.record(key)["trace_id"] is None
    assert TID not in proxy.log() and TID2 not in proxy.log()


def test_a_control_byte_refuses_the_request_and_is_never_logged(proxy, stub, pg):
    # Any header with a control byte is refused before anything else
    # (http_head.h); a traceparent gets no exception.
    key = new_key("ctl")
    value = "00-%s\x01-%s-01" % (TID[:-1], PID)
    r = post_raw(proxy, key, [("traceparent", value)])
    assert_problem(r, 400, "bad_request")
    assert stub.count(key=key) == 0 and pg.record(key) is None
    assert_never_logged(proxy, value)


@pytest.mark.skipif(CITUS, reason="on Citus a claim is the tenant's delegated call, "
                    "never batched (test_batch.py)")
def test_claims_in_one_batch_each_store_their_own_trace(make_proxy, stub, pg):
    proxy = make_proxy(top=fibers(pg))
    held = HeldRows(pg)
    blockers = [new_key("held-alone"), new_key("held-batch")]
    keys = [new_key("batched") for _ in range(4)]
    traces = {keys[0]: TID, keys[1]: TID2, keys[2]: None, keys[3]: "ab" * 16}
    answers = {}
    threads = []

    def send(k, trace):
        h = {"traceparent": tp(trace)} if trace else {}
        answers[k] = pay(proxy, k, headers=h)

    def start(k, trace=None):
        t = threading.Thread(target=send, args=(k, trace))
        t.start()
        threads.append(t)

    for k in blockers:
        held.insert(k)
    start(blockers[0])
    wait_until(lambda: lock_waits(pg) == 1, what="the first claim waiting")
    start(blockers[1])
    wait_until(lambda: lock_waits(pg) == 2, what="the batch's claim waiting")
    for k in keys:
        start(k, traces[k])
    wait_until(lambda: queued(proxy, "claim") == len(keys), what="claims queued")
    held.release()
    for t in threads:
        t.join(60)
    for k in keys:
        assert answers[k].status_code == 201 and not is_replay(answers[k])
        rec = pg.record(k)
        want = traces[k]
        assert (bytes(rec["trace_id"]).hex() if rec["trace_id"] else None) == want, k
        assert request_line(proxy, k)["trace_id"] == want
