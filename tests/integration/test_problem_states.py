"""Every problem answer says what the proxy knows of the operation
(`operation_state`) and what the client may do (`client_action`), and the
claim agrees with the upstream's own log (doc/problems.md): never
`not_executed` for a request the upstream received, `completed` or
`in_progress` only for one it did receive. Each code of the registry is
provoked here against the real binary, the stub upstream and PostgreSQL
(pg_relay.py where the store must hold or cut an answer); the only one
that is not, `internal_error`, has no call site (doc/problems.md).

Problem types and their documentation link follow problem_type_base and
problem_doc_url, on both listeners and in the watchdog's 408, and a reload
changes them for the next answer."""
import http.client
import json
import signal
import socket
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed

import pytest
import requests

from conftest import ADMIN_TOKEN, run_binary
from helpers import (TIMEOUT, assert_problem, free_port, new_key, raw_request,
                     wait_until)
from pg_relay import PgRelay
from store_support import PAY, pay, wait_state
from test_front import assert_problem_bytes, split_response, trickle
from test_jwt_tenants import PATH as JWT_PATH
from test_jwt_tenants import jproxy, keys  # noqa: F401 (fixtures)
from test_jwt_tenants import pay as jwt_pay
from test_ops import set_connections
from test_records import break_idem_claim
from test_seal import sealed_proxy
from test_store_waits import relay  # noqa: F401 (a fixture)
from test_unrecorded import cut_records
from test_unrecorded import start as unrecorded_proxy
from test_wait import Bg, post, start_original, wait_routes, wait_waiters

STATES = {"not_executed", "in_progress", "unknown", "completed"}
ACTIONS = {"retry_same_key", "retry_new_key", "fix_request", "do_not_retry"}
AUTH = {"Authorization": "Bearer " + ADMIN_TOKEN}


def facts(doc, state, action):
    """The two members, with values from the fixed sets, as expected."""
    assert doc.get("operation_state") in STATES, doc
    assert doc.get("client_action") in ACTIONS, doc
    assert (doc["operation_state"], doc["client_action"]) == (state, action), doc
    return doc


def check(resp, status, code, state, action):
    return facts(assert_problem(resp, status, code), state, action)


def agrees(doc, received):
    """The claim against the upstream's log: received is how many times the
    upstream got the operation the answer speaks of."""
    s = doc["operation_state"]
    if s == "not_executed":
        assert received == 0, "not_executed, but the upstream received it: %r" % doc
    if s in ("completed", "in_progress"):
        assert received >= 1, "%s, but the upstream never received it: %r" % (s, doc)


def admin(proxy, method, key, headers=AUTH, path=None):
    url = proxy.admin_url + (path or "/admin/keys/default/create_payment/" + key)
    return requests.request(method, url, headers=headers, timeout=TIMEOUT)


# --- rejected before any claim ------------------------------------------------

def test_rejections_are_not_executed_and_ask_for_a_fixed_request(make_proxy, stub, pg):
    proxy = make_proxy(top={"max_request_body": "1KiB"})
    cases = [
        (proxy.post(PAY, json={"a": 1}), 400, "idempotency_key_missing"),
        (proxy.post(PAY, key="k" * 300, json={"a": 1}), 400, "idempotency_key_invalid"),
        (proxy.post("/hooks/x", key=new_key(), json={}), 400, "tenant_missing"),
        (raw_request(proxy.port, "POST", "/v1/auth/x",
                     [("Idempotency-Key", new_key()), ("Authorization", "Bearer a"),
                      ("Authorization", "Bearer b")], b"{}"), 400, "bad_request"),
        (proxy.post("/v1/auth/x", key=new_key(), json={}), 401, "credentials_missing"),
        (proxy.post("/nowhere", key=new_key(), json={}), 404, "route_not_found"),
        (proxy.post(PAY, key=new_key(), data=b"x" * 2048), 413, "request_too_large"),
    ]
    for r, status, code in cases:
        agrees(check(r, status, code, "not_executed", "fix_request"), 0)
    assert stub.count() == 0 and pg.records() == []


def test_an_invalid_token_is_not_executed(jproxy, stub, pg):  # noqa: F811
    r = jwt_pay(jproxy, "not-a-token", new_key())
    check(r, 401, "credentials_invalid", "not_executed", "fix_request")
    assert stub.count(prefix=JWT_PATH) == 0 and pg.records() == []


# --- the key's own state --------------------------------------------------------

def test_a_key_in_flight_is_in_progress_and_a_mismatch_is_about_this_request(
        make_proxy, stub, pg):
    proxy = make_proxy()
    key = new_key("busy")
    stub.configure({"prefix": PAY, "key": key, "gate": "g", "times": 1})
    with ThreadPoolExecutor(1) as ex:
        first = ex.submit(pay, proxy, key)
        stub.wait_for(key=key)
        doc = check(pay(proxy, key), 409, "idempotency_key_in_use", "in_progress",
                    "retry_same_key")
        agrees(doc, stub.count(key=key))
        stub.release("g")
        assert first.result(TIMEOUT).status_code == 201
    other = {"amount": 999, "currency": "EUR"}
    doc = check(pay(proxy, key, body=other), 409, "idempotency_key_mismatch",
                "not_executed", "retry_new_key")
    this = [q for q in stub.requests(key=key) if json.loads(q.body) == other]
    agrees(doc, len(this))
    assert stub.count(key=key) == 1


def test_an_unknown_outcome_with_hold_may_be_retried_and_the_held_key_may_not(
        make_proxy, stub, pg):
    """on_unknown = hold: the retry can never run the request again, so
    the 504 says retry_same_key; the key held after the lease is for a
    person to settle."""
    proxy = make_proxy(route_overrides={"create_payment": {
        "on_unknown": "hold", "lease": "1500ms", "upstream_timeout": "500ms"}})
    key = new_key("unknown")
    stub.configure({"prefix": PAY, "key": key, "action": "close", "times": 1})
    doc = check(pay(proxy, key), 504, "upstream_outcome_unknown", "unknown",
                "retry_same_key")
    assert stub.count(key=key) == 1
    seen = {}

    def held():
        r = pay(proxy, key)
        d = assert_problem(r, 409, "idempotency_key_in_use")
        seen[d["operation_state"]] = d
        return d["operation_state"] == "unknown"
    wait_until(held, what="the key held after its lease")
    facts(seen["unknown"], "unknown", "do_not_retry")
    if "in_progress" in seen:  # a retry within the lease
        facts(seen["in_progress"], "in_progress", "retry_same_key")
    assert stub.count(key=key) == 1, "a retry ran the request again"
    assert pg.record(key)["state"] == "processing"
    assert "never sent again" in doc["detail"]


def test_an_unknown_outcome_that_a_retry_would_run_again_says_do_not_retry(
        make_proxy, stub, pg):
    proxy = make_proxy(route_overrides={"create_payment": {
        "on_unknown": "release_after_lease"}})
    key = new_key("unknown")
    stub.configure({"prefix": PAY, "key": key, "action": "close", "times": 1},
                   {"prefix": "/v1/optional", "action": "close", "times": 1})
    doc = check(pay(proxy, key), 504, "upstream_outcome_unknown", "unknown",
                "do_not_retry")
    assert "executed again" in doc["detail"]
    assert stub.count(key=key) == 1
    # unprotected (no key): nothing stops a retry from running it again
    r = proxy.post("/v1/optional", json={"n": 1})
    check(r, 504, "upstream_outcome_unknown", "unknown", "do_not_retry")
    assert stub.count(prefix="/v1/optional") == 1


def test_an_upstream_that_cannot_be_reached_did_not_execute(make_proxy, stub, pg):
    dead = "http://127.0.0.1:%d" % free_port()
    proxy = make_proxy(route_overrides={"create_payment": {"upstream": dead},
                                        "optional": {"upstream": dead}})
    key = new_key("down")
    agrees(check(pay(proxy, key), 502, "upstream_unavailable", "not_executed",
                 "retry_same_key"), stub.count())
    assert wait_state(pg, key, "released")["attempt"] == 1
    check(proxy.post("/v1/optional", json={}), 502, "upstream_unavailable",
          "not_executed", "retry_same_key")
    assert stub.count() == 0


# --- answers the upstream gave --------------------------------------------------

def test_answers_too_large_to_pass_or_replay_are_completed(make_proxy, stub, pg):
    proxy = make_proxy(top={"max_stored_response": "1KiB", "max_response": "16KiB"})
    big, stored_not = new_key("big"), new_key("unstored")
    stub.configure({"prefix": PAY, "key": big, "size": 100000},
                   {"prefix": PAY, "key": stored_not, "size": 4000})
    doc = check(pay(proxy, big), 502, "upstream_response_too_large", "completed",
                "do_not_retry")
    agrees(doc, stub.count(key=big))
    assert pay(proxy, stored_not).status_code == 201
    doc = check(pay(proxy, stored_not), 409, "idempotency_response_not_replayable",
                "completed", "do_not_retry")
    agrees(doc, stub.count(key=stored_not))
    assert stub.count(key=big) == 1 and stub.count(key=stored_not) == 1


@pytest.mark.no_replay_cache
def test_a_stored_answer_that_does_not_open_is_completed(make_proxy, stub, pg, tmp_path):
    proxy, _ = sealed_proxy(make_proxy, tmp_path)
    key = new_key()
    assert pay(proxy, key).status_code == 201
    assert pg.execute("UPDATE idempotency_records SET response_body = "
                      "set_byte(response_body, 20, get_byte(response_body, 20) # 1) "
                      "WHERE idem_key = %s", (key,)) == 1
    doc = check(pay(proxy, key), 500, "idempotency_record_unreadable", "completed",
                "do_not_retry")
    agrees(doc, stub.count(key=key))
    assert stub.count(key=key) == 1


@pytest.mark.no_replay_cache
def test_an_answer_not_recorded_is_completed(make_proxy, stub, pg, relay):  # noqa: F811
    proxy = unrecorded_proxy(make_proxy, relay, pg, on_unknown="release_after_lease")
    key = new_key("unrecorded")
    cut_records(relay, None)
    r = pay(proxy, key, timeout=30)
    relay.clear()
    doc = check(r, 503, "idempotency_outcome_unrecorded", "completed", "do_not_retry")
    agrees(doc, stub.count(key=key))
    assert stub.count(key=key) == 1


# --- the store ------------------------------------------------------------------

def test_a_store_that_cannot_be_reached_before_the_claim_executed_nothing(
        make_proxy, stub, pg):
    proxy = make_proxy()
    assert pay(proxy, new_key("warm")).status_code == 201
    key = new_key("nostore")
    set_connections(pg, False)
    try:
        r = pay(proxy, key)
        g = admin(proxy, "GET", key)
        d = admin(proxy, "DELETE", key)
    finally:
        set_connections(pg, True)
    agrees(check(r, 503, "idempotency_store_unavailable", "not_executed",
                 "retry_same_key"), stub.count(key=key))
    # the admin listener: a read did nothing; a DELETE may have
    check(g, 503, "idempotency_store_unavailable", "not_executed", "retry_same_key")
    check(d, 503, "idempotency_store_unavailable", "unknown", "do_not_retry")
    assert d.headers.get("Retry-After") is None
    assert stub.count(key=key) == 0 and pg.record(key) is None


def test_a_request_forwarded_without_the_store_is_never_advised_a_retry(make_proxy,
                                                                         stub, pg):
    """database.unavailable = "forward": no record stops a retry from
    executing again, so an unknown outcome says do_not_retry."""
    proxy = make_proxy(top={"database": {"url": pg.url, "unavailable": "forward"}})
    assert pay(proxy, new_key("warm")).status_code == 201
    key = new_key("unprotected")
    stub.configure({"prefix": PAY, "key": key, "action": "close", "times": 1})
    set_connections(pg, False)
    try:
        r = pay(proxy, key)
    finally:
        set_connections(pg, True)
    check(r, 504, "upstream_outcome_unknown", "unknown", "do_not_retry")
    assert stub.count(key=key) == 1 and pg.record(key) is None


def test_a_woken_waiter_whose_claim_fails_does_not_say_not_executed(make_proxy, stub,
                                                                     pg):
    p = make_proxy(route_overrides=wait_routes())
    key = new_key("storefail")
    orig = start_original(stub, p, key)
    dup = Bg(lambda: post(p, key))
    wait_waiters(1, p)
    break_idem_claim(pg, "RAISE EXCEPTION 'boom';")
    stub.release("orig")
    assert orig.result().status_code == 201
    doc = check(dup.result(), 503, "idempotency_store_unavailable", "unknown",
                "retry_same_key")
    agrees(doc, stub.count(key=key))
    assert stub.count(key=key) == 1 and pg.record(key)["state"] == "completed"


def test_a_waiter_whose_wait_cannot_be_marked_knows_the_key_is_in_flight(
        make_proxy, stub, pg):
    """The claim said in flight a moment ago; marking the record for a
    wake-up fails (a trigger refuses exactly that update)."""
    p = make_proxy(route_overrides=wait_routes())
    key = new_key("markfail")
    orig = start_original(stub, p, key)
    pg.execute("CREATE FUNCTION no_mark() RETURNS trigger LANGUAGE plpgsql AS $f$ "
               "BEGIN IF NEW.wait_notify AND NOT OLD.wait_notify THEN "
               "RAISE EXCEPTION 'boom'; END IF; RETURN NEW; END $f$")
    pg.execute("CREATE TRIGGER no_mark BEFORE UPDATE ON idempotency_records "
               "FOR EACH ROW EXECUTE FUNCTION no_mark()")
    try:
        doc = check(post(p, key), 503, "idempotency_store_unavailable", "in_progress",
                    "retry_same_key")
        agrees(doc, stub.count(key=key))
    finally:
        stub.release("orig")
    assert orig.result().status_code == 201
    assert stub.count(key=key) == 1


@pytest.mark.no_replay_cache
def test_a_claim_answered_too_late_to_send_executed_nothing(make_proxy, stub, pg):
    r_ = PgRelay(pg.cluster.port)
    try:
        proxy = make_proxy(
            route_overrides={"create_payment": {"lease": "3s", "upstream_timeout": "1s"}},
            top={"workers": 2, "database": {"url": r_.url(pg.name), "batch": 1}})
        assert pay(proxy, new_key("warm")).status_code == 201
        key = new_key("late")
        r_.hold("claim_new", seconds=2.5)
        r = pay(proxy, key)
    finally:
        r_.release()
        r_.stop()
    agrees(check(r, 503, "idempotency_lease_expired", "not_executed",
                 "retry_same_key"), stub.count(key=key))


# --- the front end --------------------------------------------------------------

def test_a_full_queue_executed_nothing(make_proxy, stub, pg):
    proxy = make_proxy(top={"workers": 1, "queue_size": 1})
    stub.configure({"prefix": PAY, "gate": "busy"})
    first = new_key("busy")
    keys_ = [new_key("more%d" % i) for i in range(2)]
    with ThreadPoolExecutor(3) as ex:
        try:
            held = ex.submit(pay, proxy, first)
            stub.wait_for(key=first)
            futs = {ex.submit(pay, proxy, k): k for k in keys_}
            shed = next(as_completed(futs, timeout=TIMEOUT * 2))
        finally:
            stub.release("busy")
        shed_key = futs[shed]
        doc = check(shed.result(), 503, "overloaded", "not_executed", "retry_same_key")
        for f in futs:
            f.result(TIMEOUT * 2)
        assert held.result(TIMEOUT * 2).status_code == 201
    agrees(doc, stub.count(key=shed_key))


def test_a_request_during_the_drain_executed_nothing(make_proxy, stub, pg):
    proxy = make_proxy(top={"shutdown_grace": "30s"})
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=TIMEOUT)
    conn.request("GET", "/v1/payments/p1/capture")  # opens a keep-alive connection
    assert conn.getresponse().read() is not None
    held = new_key("held")
    stub.configure({"prefix": PAY, "key": held, "gate": "drain", "times": 1})
    bg = Bg(lambda: pay(proxy, held))
    stub.wait_for(key=held)
    proxy.proc.send_signal(signal.SIGTERM)

    def refused():
        try:
            socket.create_connection(("127.0.0.1", proxy.port), timeout=1).close()
            return False
        except OSError:
            return True
    wait_until(refused, what="the listening socket closed by the drain")
    key = new_key("late")
    conn.request("POST", PAY, body=b"{}", headers={"Idempotency-Key": key,
                                                   "Content-Type": "application/json"})
    resp = conn.getresponse()
    body = resp.read()
    conn.close()
    stub.release("drain")
    assert bg.result().status_code == 201
    assert proxy.wait_exit(timeout=40) == 0
    assert resp.status == 503, body
    doc = facts(json.loads(body), "not_executed", "retry_same_key")
    assert doc["code"] == "shutting_down"
    agrees(doc, stub.count(key=key))


def test_a_request_that_never_arrived_whole_executed_nothing(make_proxy, stub, pg):
    proxy = make_proxy(top={"request_head_timeout": "1s"})
    first = b"POST " + PAY.encode() + b" HTTP/1.1\r\nHost: x\r\n"
    raw, _ = trickle(proxy.port, first, [b"X-L-%d: v\r\n" % i for i in range(100)], 0.3)
    doc = facts(assert_problem_bytes(raw, 408, "request_timeout"), "not_executed",
                "retry_same_key")
    agrees(doc, stub.count())


# --- the admin listener ---------------------------------------------------------

def test_admin_problems_state_what_the_action_did(make_proxy, stub, pg):
    proxy = make_proxy()
    key = new_key("adm")
    check(admin(proxy, "GET", key, headers={}), 401, "admin_unauthorized",
          "not_executed", "fix_request")
    check(admin(proxy, "GET", key), 404, "not_found", "not_executed", "fix_request")
    check(admin(proxy, "POST", key, path="/metrics"), 405, "method_not_allowed",
          "not_executed", "fix_request")
    bad = raw_request(proxy.admin_port, "GET", "/admin/keys/default/create_payment/%zz",
                      list(AUTH.items()))
    check(bad, 400, "bad_request", "not_executed", "fix_request")
    stub.configure({"prefix": PAY, "key": key, "gate": "adm", "times": 1})
    bg = Bg(lambda: pay(proxy, key))
    stub.wait_for(key=key)
    try:
        d = admin(proxy, "DELETE", key)
        check(d, 409, "attempt_in_flight", "not_executed", "retry_same_key")
        assert pg.record(key)["state"] == "processing"  # the DELETE did nothing
    finally:
        stub.release("adm")
    assert bg.result().status_code == 201
    assert stub.count(key=key) == 1


# --- type URIs and the documentation link ---------------------------------------

def test_types_and_link_follow_the_settings_and_a_reload(make_proxy, stub, pg):
    base, doc_url = "https://docs.example.com/problems/", "https://docs.example.com/p#x"
    proxy = make_proxy(top={"problem_type_base": base, "problem_doc_url": doc_url,
                            "request_head_timeout": "1s"})
    r = proxy.post(PAY, json={})
    doc = assert_problem(r, 400, "idempotency_key_missing")
    assert doc["type"] == base + "idempotency_key_missing"
    assert r.headers["Link"] == '<%s>; rel="describedby"' % doc_url
    a = admin(proxy, "GET", new_key())
    assert a.json()["type"] == base + "not_found"
    assert a.headers["Link"] == '<%s>; rel="describedby"' % doc_url
    raw, _ = trickle(proxy.port, b"POST / HTTP/1.1\r\n", [b"X: y\r\n"] * 100, 0.3)
    _, h, body, _ = split_response(raw)
    assert json.loads(body)["type"] == base + "request_timeout"
    assert h["link"] == '<%s>; rel="describedby"' % doc_url
    # a reload: back to the default type, no link
    text = open(proxy.conf_path).read()
    text = "\n".join(l for l in text.splitlines() if not l.startswith("problem_"))
    with open(proxy.conf_path, "w") as f:
        f.write(text + "\n")
    n = proxy.log().count("configuration reloaded")
    proxy.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: proxy.log().count("configuration reloaded") > n,
               what="the reload")
    r = proxy.post(PAY, json={})
    assert r.json()["type"] == "urn:idemproxy:problem:idempotency_key_missing"
    assert "Link" not in r.headers
    a = admin(proxy, "GET", new_key())
    assert a.json()["type"] == "urn:idemproxy:problem:not_found" and "Link" not in a.headers

    def default_408():
        raw, _ = trickle(proxy.port, b"POST / HTTP/1.1\r\n", [b"X: y\r\n"] * 100, 0.3)
        _, h, body, _ = split_response(raw)
        return json.loads(body)["type"].startswith("urn:") and "link" not in h
    wait_until(default_408, what="the watchdog's 408 after the reload")


@pytest.mark.parametrize("setting,value,why", [
    ("problem_type_base", "docs.example.com/problems/", "must be an absolute URI"),
    ("problem_type_base", "", "must be 1 to 512 bytes long"),
    ("problem_doc_url", "https://x/a\"b", "may not appear in a URI"),
    ("problem_doc_url", "https://x/a b", "may not appear in a URI"),
    ("problem_doc_url", "https://x/<a>", "may not appear in a URI"),
])
def test_bad_problem_settings_are_refused_at_load(make_proxy, stub, pg, setting, value, why):
    proxy = make_proxy(top={setting: value}, migrate=False, start=False)
    r = run_binary(["-c", proxy.conf_path, "--check"])
    assert r.returncode != 0
    assert "%s: " % setting in r.stderr and why in r.stderr, r.stderr
