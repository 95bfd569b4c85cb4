"""The store failing under a running proxy (SPEC 2 `database.unavailable`,
3.4, doc/design.md "When things fail"): PostgreSQL stopped and started again on
the same port, a statement that would hang, and an outcome that cannot be
recorded.

These tests stop PostgreSQL, so they run against a cluster of their own
(private_pg.py): the pg_cluster fixture below replaces the session's shared
one for this module only, and conftest's pg and make_proxy fixtures build on
it unchanged."""
import json
import re
import threading
import time
import uuid

import psycopg
import pytest
import requests

from helpers import (TIMEOUT, assert_problem, assert_retry_after, fire_together, is_replay,
                     log_entries, new_key, wait_until)
from private_pg import PrivatePgCluster
from store_support import PAY, pay

# A request that hangs is a bug; one that takes this long on a loaded
# machine is not a timing question any more.
HANG = 10.0


@pytest.fixture(scope="module")
def pg_cluster():
    cluster = PrivatePgCluster()
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.dropper.shutdown(wait=True)
        cluster.stop()


class Outage:
    """with Outage(pg, pg_cluster): PostgreSQL is down inside the block and
    back (same port, accepting connections) after it, even on failure."""

    def __init__(self, pg, cluster):
        self.pg = pg
        self.cluster = cluster

    def __enter__(self):
        self.pg.close()  # the test's own session would die with the server
        self.cluster.pause()
        return self

    def __exit__(self, *exc):
        self.cluster.resume()


SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def counter(proxy, name, **labels):
    """The sum of name's samples on /metrics whose labels include the given
    ones (0 before a labelled counter is first used)."""
    r = requests.get(proxy.admin_url + "/metrics", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    total = 0.0
    for line in r.text.splitlines():
        m = SAMPLE.match(line)
        if not m or line.startswith("#") or m.group(1) != name:
            continue
        have = dict(LABEL.findall(m.group(2) or ""))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def request_line(proxy, request_id):
    lines = [e for e in log_entries(proxy)
             if e.get("msg") == "request" and e.get("request_id") == request_id]
    assert len(lines) == 1, "request lines for %s: %r" % (request_id, lines)
    return lines[0]


def timed(fn):
    """Runs fn(); returns (result, seconds). A request that does not answer
    within HANG fails the test as a hang."""
    t0 = time.monotonic()
    try:
        out = fn()
    except requests.Timeout:
        pytest.fail("no answer within %.0fs: the request hangs" % HANG)
    return out, time.monotonic() - t0


def assert_protected_again(proxy, stub, pg, workers):
    """After the outage: as many concurrent first attempts as there are
    workers (the upstream holds each long enough that every worker takes
    one), then their retries; everything is recorded and replayed."""
    keys = [new_key("back") for _ in range(workers)]
    stub.configure(*[{"prefix": PAY, "key": k, "delay": 0.5} for k in keys], append=True)
    results = fire_together(workers, lambda i: pay(proxy, keys[i]))
    bad = [(keys[i], r if isinstance(r, Exception) else (r.status_code, r.content[:300]))
           for i, r in enumerate(results)
           if isinstance(r, Exception) or r.status_code != 201 or is_replay(r)]
    assert not bad, "first attempts after the outage failed: %r" % bad
    for k, r in zip(keys, results):
        rec = pg.record(k)
        assert rec is not None and rec["state"] == "completed", rec
        assert bytes(rec["response_body"]) == r.content
        again = pay(proxy, k)
        assert again.status_code == 201 and is_replay(again), again.content
        assert again.content == r.content
        assert stub.count(key=k) == 1


# --- PostgreSQL down, then back ------------------------------------------------

def test_store_down_reject_forward_passthrough_then_recovery(make_proxy, stub, pg, pg_cluster):
    reject = make_proxy(top={"workers": 2})
    forward = make_proxy(top={"workers": 2,
                              "database": {"url": pg.url, "unavailable": "forward"}})
    # Not used during the outage: its connections break while idle and it
    # learns of it only from its first requests afterwards.
    idle = make_proxy(top={"workers": 2})
    # All protect while the store is up; every worker is connected.
    for p in (reject, forward, idle):
        k = new_key("up")
        assert pay(p, k).status_code == 201
        assert is_replay(pay(p, k))
    unavailable0 = counter(forward, "idemproxy_requests_total", route="create_payment",
                           outcome="store_unavailable")
    unprotected0 = counter(forward, "idemproxy_events_total", event="forwarded_unprotected")
    seen0 = stub.count()

    rejected = [new_key("rej") for _ in range(4)]
    fwd_key = new_key("fwd")
    fwd_ids = ["outage-fwd-%s" % uuid.uuid4().hex for _ in range(2)]
    with Outage(pg, pg_cluster):
        # reject: 503 with Retry-After, on whichever worker takes it
        for k in rejected:
            r, _ = timed(lambda: pay(reject, k, timeout=HANG))
            assert_problem(r, 503, "idempotency_store_unavailable")
            assert_retry_after(r)
        assert stub.count() == seen0, "a rejected request reached the upstream: %r" % (
            stub.requests()[seen0:],)

        # pass-through requests need no store and keep working
        for p in (reject, forward):
            r, _ = timed(lambda: p.get(PAY + "?during=outage", timeout=HANG))
            assert r.status_code == 201, r.content
        assert stub.count(prefix=PAY + "?during=outage", method="GET") == 2

        # forward: passed through unprotected, so a retry goes through too
        for rid in fwd_ids:
            r, _ = timed(lambda: pay(forward, fwd_key, headers={"X-Request-Id": rid},
                                     timeout=HANG))
            assert r.status_code == 201 and not is_replay(r), r.content
        assert stub.count(key=fwd_key) == 2

    # counted ...
    assert counter(forward, "idemproxy_requests_total", route="create_payment",
                   outcome="store_unavailable") - unavailable0 == 2
    assert counter(forward, "idemproxy_events_total",
                   event="forwarded_unprotected") - unprotected0 == 2
    # ... and logged, each request with what happened to it
    for rid in fwd_ids:
        line = request_line(forward, rid)
        assert line["outcome"] == "store_unavailable" and line["status"] == 201, line

    # Back on the same port: no restart of the proxy, workers reconnect.
    assert_protected_again(idle, stub, pg, workers=2)
    assert_protected_again(reject, stub, pg, workers=2)
    assert_protected_again(forward, stub, pg, workers=2)
    for k in rejected + [fwd_key]:
        assert pg.record(k) is None, "a request during the outage left a record"
    assert stub.count(key=rejected[0]) == 0


# --- a statement that would hang ------------------------------------------------

def test_hung_statement_is_cut_by_statement_timeout(make_proxy, stub, pg):
    proxy = make_proxy(top={"workers": 1,
                            "database": {"url": pg.url, "statement_timeout": "500ms"}})
    # A released record: the retry's claim must update the row.
    key = new_key("locked-row")
    stub.configure({"prefix": PAY, "key": key, "status": 503, "times": 1})
    assert pay(proxy, key).status_code == 503
    assert pg.record(key)["state"] == "released"

    locker = psycopg.connect(pg.url)  # not autocommit: the lock lasts until rollback
    try:
        locker.execute("SELECT 1 FROM idempotency_records WHERE idem_key = %s FOR UPDATE",
                       (key,))
        r, _ = timed(lambda: pay(proxy, key, timeout=HANG))
        assert_problem(r, 503, "idempotency_store_unavailable")
        assert_retry_after(r)
        locker.rollback()
        assert stub.count(key=key) == 1, "the blocked retry reached the upstream"

        # The whole table locked: even the claim's first read waits.
        other = new_key("locked-table")
        locker.execute("LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE")
        r, _ = timed(lambda: pay(proxy, other, timeout=HANG))
        assert_problem(r, 503, "idempotency_store_unavailable")
        assert_retry_after(r)
        locker.rollback()
    finally:
        locker.close()
    assert stub.count(key=other) == 0

    # The worker's connection survived the cancelled statements.
    r = pay(proxy, key)
    assert r.status_code == 201 and not is_replay(r), r.content
    rec = pg.record(key)
    assert rec["state"] == "completed" and rec["attempt"] == 2, rec
    r = pay(proxy, other)
    assert r.status_code == 201 and not is_replay(r), r.content
    assert pg.record(other)["state"] == "completed"


# --- an outcome that cannot be recorded ----------------------------------------

def test_outcome_that_cannot_be_recorded_is_not_given_to_the_client(
        make_proxy, stub, pg, pg_cluster):
    # The store stays down for the whole lease: the worker's own tries of
    # the record give up when it ends (less its margin), and only then is
    # record_failed counted and the client answered, with 503
    # idempotency_outcome_unrecorded instead of the upstream's 201 (a 201
    # the key would never replay). The lease also covers stopping
    # PostgreSQL, which can take seconds on a loaded machine.
    proxy = make_proxy(top={"workers": 1}, route_overrides={
        "create_payment": {"lease": "10s", "upstream_timeout": "5s"}})
    key = new_key("unrecorded")
    rid = "record-fails-%s" % uuid.uuid4().hex
    stub.configure({"prefix": PAY, "key": key, "gate": "hold", "times": 1})
    failed0 = counter(proxy, "idemproxy_events_total", event="record_failed")

    out = []
    t = threading.Thread(target=lambda: out.append(
        pay(proxy, key, headers={"X-Request-Id": rid}, timeout=30)))
    t.start()
    try:
        stub.wait_for(key=key)  # claimed, and now upstream
        with Outage(pg, pg_cluster):
            stub.release("hold")
            t.join(30)
            assert out, "no answer to the client"
            r = out[0]
            # not the upstream's answer: it is not recorded
            assert r.status_code == 503, r.content
            assert r.json()["code"] == "idempotency_outcome_unrecorded", r.content
            assert len(stub.requests(key=key)) == 1
            assert counter(proxy, "idemproxy_events_total", event="record_deferred") == 0
            assert counter(proxy, "idemproxy_events_total",
                           event="record_failed") - failed0 == 1
            assert counter(proxy, "idemproxy_events_total",
                           event="outcome_unrecorded") == 1
            # counted just before its line is written
            wait_until(lambda: [e for e in log_entries(proxy)
                                if e.get("level") == "error" and rid in json.dumps(e)],
                       what="the failure to record logged with the request id")
    finally:
        stub.release("hold")
        t.join(30)

    # The claim stands: processing, attempt 1, nothing recorded.
    rec = pg.query("SELECT state, attempt, response_status "
                   "FROM idempotency_records WHERE idem_key = %s", (key,))
    assert rec == [{"state": "processing", "attempt": 1, "response_status": None}], rec
    # The lease rules apply: the client was answered a margin before the
    # lease ends; once it has, a retry takes the key over.
    wait_until(lambda: pg.query("SELECT lease_until < now() AS over FROM "
                                "idempotency_records WHERE idem_key = %s",
                                (key,))[0]["over"], what="the lease to end")
    r = pay(proxy, key)
    assert r.status_code == 201 and not is_replay(r), r.content
    assert stub.count(key=key) == 2
    rec = pg.record(key)
    assert rec["state"] == "completed" and rec["attempt"] == 2, rec
