"""Failure semantics: what each upstream outcome does to the record
(SPEC 3.4), sending an attempt upstream at most once even on a dead
keep-alive connection (3.3), takeover and fencing (3.2, 3.4, 4), a client
that disconnects (3.3), and replays that do not write (4).

The upstreams that misbehave on purpose are raw sockets (misbehaving.py),
so that what reached the upstream is counted at the socket level."""
import os
import socket
import struct
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import ROOT
from helpers import TIMEOUT, assert_problem, assert_retry_after, is_replay, new_key
from misbehaving import Close, Half, RawUpstream, Reset, Respond, Sleep, closed_port
from store_support import PAY, pay, reaper_pass, row_version, wait_state

STORE_CHECK = os.environ.get("IDEMPROXY_STORE_CHECK",
                             os.path.join(ROOT, "build", "store_check"))


@pytest.fixture
def raw():
    """raw(handler=None, port=0, idle_close=None) -> a started RawUpstream,
    stopped at teardown."""
    started = []

    def factory(*args, **kw):
        u = RawUpstream(*args, **kw)
        started.append(u)
        return u

    yield factory
    for u in started:
        u.stop()


def pay_route(upstream, **settings):
    return [dict({"name": "create_payment", "path": PAY, "upstream": upstream}, **settings)]


def first_time_then_respond(action):
    """A handler that answers the first request with each key with action,
    and every later one normally."""
    seen = {}
    lock = threading.Lock()

    def handler(req):
        with lock:
            seen[req.key] = seen.get(req.key, 0) + 1
            n = seen[req.key]
        return action if n == 1 else Respond()
    return handler


def expire_lease(pg, key):
    assert pg.execute("UPDATE idempotency_records SET lease_until = now() - interval "
                      "'1 second' WHERE idem_key = %s AND state = 'processing'", (key,)) == 1


# --- 3.4: a response -----------------------------------------------------------

def test_release_status_frees_the_key_for_a_retry(proxy, stub, pg):
    key = new_key()
    stub.configure({"prefix": PAY, "status": 503, "times": 1, "json": {"error": "busy"}})
    r1 = pay(proxy, key)
    assert r1.status_code == 503
    assert r1.content == b'{"error": "busy"}'  # the upstream's answer, not a problem
    rec = pg.record(key)
    assert rec["state"] == "released"
    assert rec["attempt"] == 1

    r2 = pay(proxy, key)
    assert r2.status_code == 201 and not is_replay(r2)
    assert stub.count(key=key) == 2
    rec = pg.record(key)
    assert rec["state"] == "completed"
    assert rec["attempt"] == 2
    assert bytes(rec["response_body"]) == r2.content


@pytest.mark.parametrize("status,release_statuses", [
    (402, None),     # a decline is an answer
    (503, [429]),    # release_statuses is the route's list, not a fixed one
])
def test_status_outside_release_statuses_is_recorded_and_replayed(
        make_proxy, stub, pg, status, release_statuses):
    over = {"release_statuses": release_statuses} if release_statuses else {}
    proxy = make_proxy(route_overrides={"create_payment": over} if over else None)
    key = new_key()
    stub.configure({"prefix": PAY, "status": status, "json": {"error": "declined"}})
    r1 = pay(proxy, key)
    assert r1.status_code == status
    rec = pg.record(key)
    assert rec["state"] == "completed"
    assert rec["response_status"] == status
    r2 = pay(proxy, key)
    assert r2.status_code == status
    assert is_replay(r2)
    assert r2.content == r1.content
    assert stub.count(key=key) == 1


# --- 3.4: no connection could be made ----------------------------------------

def test_no_connection_is_502_and_releases_the_key(make_proxy, raw, pg):
    port = closed_port()
    proxy = make_proxy(routes=pay_route("http://127.0.0.1:%d" % port))
    key = new_key()
    r1 = pay(proxy, key)
    assert_problem(r1, 502, "upstream_unavailable")
    rec = pg.record(key)
    assert rec["state"] == "released"
    assert rec["attempt"] == 1

    up = raw(port=port)
    r2 = pay(proxy, key)
    assert r2.status_code == 201 and not is_replay(r2)
    assert up.count(key) == 1
    rec = pg.record(key)
    assert rec["state"] == "completed"
    assert rec["attempt"] == 2
    r3 = pay(proxy, key)
    assert is_replay(r3) and r3.content == r2.content
    assert up.count(key) == 1


# --- 3.4: sent, but no complete response -------------------------------------

UNKNOWN_OUTCOMES = {
    "closed_after_reading": Close(),
    "reset_after_reading": Reset(),
    "half_a_body": Half(status=201, size=400),
    "slower_than_upstream_timeout": Sleep(3.0, then=Close()),
}


@pytest.mark.parametrize("how", sorted(UNKNOWN_OUTCOMES))
def test_unknown_outcome_keeps_the_key_for_the_lease(make_proxy, raw, pg, how):
    up = raw(first_time_then_respond(UNKNOWN_OUTCOMES[how]))
    proxy = make_proxy(routes=pay_route(up.url, lease="30s", upstream_timeout="1s",
                                        ttl="1h"))
    key = new_key()
    r1 = pay(proxy, key)
    assert_problem(r1, 504, "upstream_outcome_unknown")
    assert_retry_after(r1)
    assert up.count(key) == 1
    rec = pg.record(key)
    assert rec["state"] == "processing"
    assert rec["attempt"] == 1
    assert rec["response_status"] is None

    # within the lease: the key is in use, nothing goes upstream
    r2 = pay(proxy, key)
    assert_problem(r2, 409, "idempotency_key_in_use")
    assert_retry_after(r2)
    assert up.count(key) == 1
    assert pg.record(key)["state"] == "processing"

    # the lease ends: the retry takes the key over (release_after_lease)
    expire_lease(pg, key)
    r3 = pay(proxy, key)
    assert r3.status_code == 201 and not is_replay(r3)
    seen = up.seen(key)
    assert len(seen) == 2
    assert seen[0].body == seen[1].body
    rec = pg.record(key)
    assert rec["state"] == "completed"
    assert rec["attempt"] == 2
    assert bytes(rec["response_body"]) == r3.content


def test_unknown_outcome_is_released_by_the_reaper_when_the_lease_ends(make_proxy, raw, pg):
    up = raw(first_time_then_respond(Close()))
    proxy = make_proxy(routes=pay_route(up.url, lease="2s", upstream_timeout="1s", ttl="1h"),
                       top={"reaper": {"interval": "200ms"}})
    key = new_key()
    assert_problem(pay(proxy, key), 504, "upstream_outcome_unknown")
    rec = pg.record(key)
    assert rec["state"] == "processing"
    # the lease is the route's, measured on the database clock
    assert pg.query("SELECT lease_until - updated_at AS lease FROM idempotency_records "
                    "WHERE idem_key = %s", (key,))[0]["lease"].total_seconds() == 2.0
    # nobody retries: the reaper releases the record once the lease has ended
    rec = wait_state(pg, key, "released", timeout=15)
    assert rec["attempt"] == 1
    assert up.count(key) == 1

    r = pay(proxy, key)
    assert r.status_code == 201 and not is_replay(r)
    assert up.count(key) == 2
    rec = pg.record(key)
    assert rec["state"] == "completed"
    assert rec["attempt"] == 2


def test_on_unknown_hold_keeps_the_key_after_the_lease(make_proxy, raw, pg):
    up = raw(first_time_then_respond(Close()))
    proxy = make_proxy(routes=pay_route(up.url, lease="30s", upstream_timeout="1s", ttl="1h",
                                        on_unknown="hold"),
                       top={"reaper": {"interval": "200ms"}})
    key = new_key()
    assert_problem(pay(proxy, key), 504, "upstream_outcome_unknown")
    rec = pg.record(key)
    assert rec["state"] == "processing"
    assert rec["hold_on_unknown"] is True

    expire_lease(pg, key)
    before = row_version(pg, key)
    for _ in range(2):
        reaper_pass(pg)
        assert pg.record(key)["state"] == "processing"
    for _ in range(2):
        r = pay(proxy, key)
        assert_problem(r, 409, "idempotency_key_in_use")
        assert_retry_after(r)
    assert up.count(key) == 1
    rec = pg.record(key)
    assert rec["state"] == "processing"
    assert rec["attempt"] == 1
    assert row_version(pg, key) == before


# --- 3.4: a response too large to store --------------------------------------

def test_response_larger_than_max_stored_response_is_passed_but_not_replayable(
        make_proxy, stub, pg):
    proxy = make_proxy(top={"max_stored_response": "1KiB"})
    stub.configure({"prefix": PAY, "size": 5000, "headers": {"Content-Type": "text/plain"}})
    key = new_key()
    r1 = pay(proxy, key)
    assert r1.status_code == 201
    assert len(r1.content) == 5000
    assert r1.content == stub_pattern(5000)
    rec = pg.record(key)
    assert rec["state"] == "completed"
    assert rec["replayable"] is False
    assert rec["response_status"] == 201

    for _ in range(2):
        assert_problem(pay(proxy, key), 409, "idempotency_response_not_replayable")
    assert stub.count(key=key) == 1
    assert pg.record(key)["state"] == "completed"


def test_response_of_exactly_max_stored_response_is_replayable(make_proxy, stub, pg):
    proxy = make_proxy(top={"max_stored_response": "1KiB"})
    stub.configure({"prefix": PAY, "size": 1024, "headers": {"Content-Type": "text/plain"}})
    key = new_key()
    r1 = pay(proxy, key)
    assert r1.status_code == 201 and len(r1.content) == 1024
    assert pg.record(key)["replayable"] is True
    r2 = pay(proxy, key)
    assert is_replay(r2) and r2.content == r1.content
    assert stub.count(key=key) == 1


def stub_pattern(n):
    pattern = b"0123456789abcdefghijklmnopqrstuvwxyz\n"
    return (pattern * (n // len(pattern) + 1))[:n]


# --- 3.3: never twice, even on a reused connection ----------------------------

def test_attempt_on_a_dead_keep_alive_connection_is_sent_once(make_proxy, raw, pg):
    """libcurl resends a request, a POST too, when a reused connection
    returns nothing. The upstream below reads the attempt and closes the
    connection without a word: it must see that attempt exactly once."""
    together = threading.Barrier(2)
    times_seen = {}
    lock = threading.Lock()

    def handler(req):
        with lock:
            times_seen[req.key] = times_seen.get(req.key, 0) + 1
            first = times_seen[req.key] == 1
        if first and req.key.startswith(("warm-", "doomed-")):
            # Each pair is held until both of its requests have arrived:
            # one per worker, so each worker uses its own connection.
            together.wait(TIMEOUT)
        return Close() if req.key.startswith("doomed-") else Respond()

    up = raw(handler)
    proxy = make_proxy(routes=pay_route(up.url), top={"workers": 2})

    def pair(prefix):
        keys = [new_key("%s-%d" % (prefix, i)) for i in range(2)]
        with ThreadPoolExecutor(2) as ex:
            return keys, list(ex.map(lambda k: pay(proxy, k), keys))

    for _ in range(3):
        _, answers = pair("warm")
        assert [r.status_code for r in answers] == [201, 201]
    assert up.accepted == 2, "expected two kept-alive connections, got %d" % up.accepted

    keys, answers = pair("doomed")
    for key, r in zip(keys, answers):
        assert_problem(r, 504, "upstream_outcome_unknown")
        assert_retry_after(r)
        seen = up.seen(key)
        assert len(seen) == 1, "the attempt reached the upstream %d times: %r" % (
            len(seen), seen)
        assert seen[0].index > 1, "the attempt did not go on a reused connection"
        rec = pg.record(key)
        assert rec["state"] == "processing"
        assert rec["attempt"] == 1

    # and the proxy goes on serving
    for _ in range(3):
        key = new_key()
        assert pay(proxy, key).status_code == 201
        assert up.count(key) == 1


def test_upstream_closing_idle_connections_does_not_fail_requests(make_proxy, raw, pg):
    # 1 s idle: a worker stalled between two requests of a batch must not
    # meet the close (its attempt would then be unknown, a 504)
    up = raw(idle_close=1.0)
    proxy = make_proxy(routes=pay_route(up.url), top={"workers": 2})
    for _ in range(2):
        keys = [new_key() for _ in range(4)]
        with ThreadPoolExecutor(2) as ex:
            results = list(ex.map(lambda k: pay(proxy, k), keys))
        last = time.monotonic()
        assert [r.status_code for r in results] == [201] * 4, [
            (r.status_code, r.content[:200]) for r in results]
        for k in keys:
            assert up.count(k) == 1
            assert pg.record(k)["state"] == "completed"
        # the upstream drops every idle connection; the proxy must notice
        # rather than write the next attempt into a closed one
        up.wait_all_closed()
        time.sleep(max(0.0, 2.0 - (time.monotonic() - last)))
    assert up.closed_idle >= 2


# --- 3.2: takeover forwards the same key -------------------------------------

@pytest.mark.no_replay_cache
@pytest.mark.parametrize("how", ["released", "expired_lease"])
def test_takeover_forwards_the_same_idempotency_key(proxy, stub, pg, how):
    key = new_key()
    header = '"%s"' % key  # the sf-string form; the upstream gets the bare one
    if how == "released":
        stub.configure({"prefix": PAY, "status": 429, "times": 1})
    r1 = pay(proxy, header)
    if how == "released":
        assert r1.status_code == 429
        assert pg.record(key)["state"] == "released"
    else:
        assert r1.status_code == 201
        assert pg.execute("UPDATE idempotency_records SET state = 'processing', "
                          "lease_until = now() - interval '1 second', response_status = NULL, "
                          "response_headers = NULL, response_body = NULL, replayable = NULL "
                          "WHERE idem_key = %s", (key,)) == 1
    before = pg.record(key)

    r2 = pay(proxy, header)
    assert r2.status_code == 201 and not is_replay(r2)
    seen = stub.requests(key=key)
    assert len(seen) == 2
    assert [s.headers("Idempotency-Key") for s in seen] == [[key], [key]]
    assert seen[0].body == seen[1].body
    after = pg.record(key)
    assert after["attempt"] == before["attempt"] + 1 == 2
    assert after["owner_token"] != before["owner_token"]
    assert after["state"] == "completed"


# --- 3.4, 4: fencing, checked on the store itself ----------------------------

@pytest.fixture(scope="session")
def store_check():
    # `make integration` builds it; a direct pytest run builds it here
    # (unless IDEMPROXY_STORE_CHECK names one built elsewhere).
    if "IDEMPROXY_STORE_CHECK" in os.environ:
        assert os.access(STORE_CHECK, os.X_OK), "%s is missing" % STORE_CHECK
        return STORE_CHECK
    r = subprocess.run(["make", "--no-print-directory", "-s", "build/store_check"], cwd=ROOT,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and os.access(STORE_CHECK, os.X_OK), \
        "cannot build store_check:\n%s%s" % (r.stdout, r.stderr)
    return STORE_CHECK


def test_store_fences_stale_owners_and_reads_do_not_write(make_proxy, pg, store_check):
    make_proxy(start=False)  # migrates the test database
    r = subprocess.run([store_check, pg.url], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, "store_check failed:\n%s%s" % (r.stdout, r.stderr)
    for check in ("complete_is_fenced", "release_is_fenced", "reads_do_not_write", "hold"):
        assert "ok %s\n" % check in r.stdout, r.stdout


def test_replay_and_mismatch_do_not_write_the_row(proxy, stub, pg):
    key = new_key()
    r1 = pay(proxy, key, {"amount": 1})
    assert r1.status_code == 201
    before = row_version(pg, key)
    assert before["xmax"] == "0"
    for _ in range(3):
        assert is_replay(pay(proxy, key, {"amount": 1}))
    assert_problem(pay(proxy, key, {"amount": 2}), 409, "idempotency_key_mismatch")
    assert row_version(pg, key) == before
    assert stub.count(key=key) == 1


# --- 3.3: a client that disconnects ------------------------------------------

@pytest.mark.parametrize("close", ["fin", "rst"])
def test_client_disconnect_does_not_cancel_the_attempt(proxy, stub, pg, close):
    key = new_key()
    stub.configure({"key": key, "delay": 1.5})
    body = b'{"amount": 100, "currency": "EUR"}'
    head = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nIdempotency-Key: %s\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n"
            % (PAY, proxy.port, key, len(body))).encode()
    s = socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT)
    s.sendall(head + body)
    stub.wait_for(1, key=key)
    if close == "rst":
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()

    rec = wait_state(pg, key, "completed", timeout=15)
    assert rec["response_status"] == 201
    assert rec["attempt"] == 1
    r = pay(proxy, key)
    assert r.status_code == 201
    assert is_replay(r)
    assert r.content == bytes(rec["response_body"])
    assert stub.count(key=key) == 1
