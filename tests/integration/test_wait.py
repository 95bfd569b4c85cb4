"""Duplicates that wait for the original (in_flight = "wait", Prefer: wait):
answered with the original's response as soon as it is recorded, on
whichever instance they wait, holding no worker while they wait."""
import hashlib
import hmac
import signal
import socket
import struct
import threading
import time

import psycopg
import requests

from helpers import (TIMEOUT, assert_problem, assert_retry_after, fire_together, is_replay,
                     new_key, wait_until)
from store_support import metrics

PAY = "/v1/payments"
WAIT = {"in_flight": "wait", "wait_max": "30s", "lease": "60s"}
LONG = 60  # client timeout for requests that wait


def wait_routes(**extra):
    return {"create_payment": dict(WAIT, **extra)}


def waiters(p):
    return metrics(p).get("idemproxy_waiters", 0)


def outcome(p, route, what):
    return metrics(p).get('idemproxy_wait_outcomes_total{route="%s",outcome="%s"}'
                          % (route, what), 0)


def listeners(pg):
    return pg.query("SELECT count(*) AS n FROM pg_stat_activity "
                    "WHERE application_name = 'idemproxy-listen'")[0]["n"]


def wait_waiters(n, *proxies):
    wait_until(lambda: sum(waiters(p) for p in proxies) == n, timeout=30,
               what="%d waiters" % n)


class Bg:
    """A request sent in the background; .result() waits for it."""

    def __init__(self, fn):
        self.value = None
        self.t = threading.Thread(target=self._run, args=(fn,))
        self.t.start()

    def _run(self, fn):
        try:
            self.value = fn()
        except Exception as e:
            self.value = e

    def result(self):
        self.t.join(LONG + 10)
        assert not self.t.is_alive(), "request still running"
        if isinstance(self.value, Exception):
            raise self.value
        return self.value


def post(p, key, body=None, headers=None):
    h = {"Idempotency-Key": key}
    h.update(headers or {})
    return requests.post(p.url + PAY, json=body or {"amount": 100}, headers=h, timeout=LONG)


def start_original(stub, p, key, gate="orig", **rule):
    stub.configure(dict({"prefix": PAY, "key": key, "gate": gate, "times": 1}, **rule),
                   append=True)
    bg = Bg(lambda: post(p, key))
    stub.wait_for(1, key=key)
    return bg


def assert_same_answer(replay, original):
    assert replay.status_code == original.status_code, (replay.status_code, replay.content)
    assert is_replay(replay), dict(replay.headers)
    assert replay.content == original.content
    for h in ("Content-Type", "Location"):
        assert replay.headers.get(h) == original.headers.get(h), h


def test_duplicate_on_other_instance_gets_the_original_response(make_proxy, stub):
    a = make_proxy(route_overrides=wait_routes())
    b = make_proxy(route_overrides=wait_routes())
    key = new_key("other")
    orig = start_original(stub, a, key)
    dup = Bg(lambda: post(b, key))
    wait_waiters(1, b)
    stub.release("orig")
    first, second = orig.result(), dup.result()
    assert first.status_code == 201 and not is_replay(first)
    assert_same_answer(second, first)
    assert stub.count(key=key) == 1
    assert outcome(b, "create_payment", "replayed") == 1
    assert waiters(b) == 0
    assert "duplicate done waiting" in b.log()


def test_hundred_duplicates_over_two_instances_reach_the_upstream_once(make_proxy, stub):
    a = make_proxy(route_overrides=wait_routes())
    b = make_proxy(route_overrides=wait_routes())
    key = new_key("burst")
    orig = start_original(stub, a, key)
    n = 100

    def send(i):
        return post((a, b)[i % 2], key)

    results = []
    t = threading.Thread(target=lambda: results.extend(fire_together(n, send)))
    t.start()
    wait_waiters(n, a, b)
    stub.release("orig")
    t.join(LONG + 30)
    first = orig.result()
    assert first.status_code == 201 and not is_replay(first)
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors[:3]
    assert len(results) == n
    for r in results:
        assert_same_answer(r, first)
    assert stub.count(key=key) == 1
    assert (outcome(a, "create_payment", "replayed") +
            outcome(b, "create_payment", "replayed")) == n


def test_release_lets_exactly_one_waiter_take_over(make_proxy, stub):
    a = make_proxy(route_overrides=wait_routes())
    b = make_proxy(route_overrides=wait_routes())
    key = new_key("release")
    # The first attempt gets 503 (a release status); the one after it is
    # slow, so the other waiters are still waiting when it answers.
    stub.configure({"prefix": PAY, "key": key, "gate": "orig", "status": 503, "times": 1},
                   {"prefix": PAY, "key": key, "delay": 0.5})
    orig = Bg(lambda: post(a, key))
    stub.wait_for(1, key=key)
    dups = [Bg(lambda p=p: post(p, key)) for p in (a, b, a, b, a, b, a, b)]
    wait_waiters(len(dups), a, b)
    stub.release("orig")
    assert orig.result().status_code == 503
    got = [d.result() for d in dups]
    fresh = [r for r in got if r.status_code == 201 and not is_replay(r)]
    assert len(fresh) == 1, [(r.status_code, dict(r.headers)) for r in got]
    for r in got:
        if r is not fresh[0]:
            assert_same_answer(r, fresh[0])
    assert stub.count(key=key) == 2  # the released attempt and one takeover
    assert (outcome(a, "create_payment", "took_over") +
            outcome(b, "create_payment", "took_over")) == 1


def test_listener_terminated_mid_wait_still_answers_every_waiter(make_proxy, stub, pg):
    a = make_proxy(route_overrides=wait_routes())
    b = make_proxy(route_overrides=wait_routes())
    wait_until(lambda: listeners(pg) == 2, what="both listeners connected")
    key = new_key("listen")
    orig = start_original(stub, a, key)
    dups = [Bg(lambda: post(b, key)) for _ in range(5)]
    wait_waiters(5, b)
    pg.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
             "WHERE application_name = 'idemproxy-listen'")
    # Recorded while b's listener is away: its notification is lost, and
    # b's waiters must claim again once the listener is back.
    stub.release("orig")
    first = orig.result()
    for d in dups:
        assert_same_answer(d.result(), first)
    assert stub.count(key=key) == 1
    wait_until(lambda: listeners(pg) == 2, what="listeners back")


def test_wait_max_expiry_gives_409_with_retry_after(make_proxy, stub):
    p = make_proxy(route_overrides=wait_routes(wait_max="1s"))
    key = new_key("expire")
    orig = start_original(stub, p, key)
    r = post(p, key)
    assert_problem(r, 409, "idempotency_key_in_use")
    assert_retry_after(r)
    assert outcome(p, "create_payment", "timed_out") == 1
    assert waiters(p) == 0
    stub.release("orig")
    assert orig.result().status_code == 201
    assert stub.count(key=key) == 1


def test_max_waiters_overflow_is_answered_at_once(make_proxy, stub):
    p = make_proxy(route_overrides=wait_routes(),
                   top={"max_waiters": 2, "max_waiters_per_tenant": 2})
    key = new_key("full")
    orig = start_original(stub, p, key)
    dups = [Bg(lambda: post(p, key)) for _ in range(2)]
    wait_waiters(2, p)
    r = post(p, key)  # the gate is still closed: answered without waiting
    assert_problem(r, 409, "idempotency_key_in_use")
    assert_retry_after(r)
    assert outcome(p, "create_payment", "rejected_full") == 1
    assert waiters(p) == 2
    stub.release("orig")
    first = orig.result()
    for d in dups:
        assert_same_answer(d.result(), first)
    assert stub.count(key=key) == 1


def test_fifty_waiters_do_not_stop_two_workers_serving_other_routes(make_proxy, stub):
    p = make_proxy(route_overrides=wait_routes(), top={"workers": 2})
    key = new_key("hold")
    orig = start_original(stub, p, key)
    dups = [Bg(lambda: post(p, key)) for _ in range(50)]
    wait_waiters(50, p)
    for i in range(10):
        k = new_key("other%d" % i)
        r = requests.post(p.url + "/v1/refunds", json={"n": i},
                          headers={"Idempotency-Key": k}, timeout=TIMEOUT)
        assert r.status_code == 201 and not is_replay(r), r.content
        assert stub.count(key=k) == 1
    assert waiters(p) == 50
    stub.release("orig")
    first = orig.result()
    for d in dups:
        assert_same_answer(d.result(), first)
    assert stub.count(key=key) == 1


def test_prefer_wait_on_a_reject_route(make_proxy, stub):
    p = make_proxy()  # in_flight = "reject" (the default), wait_max 10s
    key = new_key("prefer")
    orig = start_original(stub, p, key)
    plain = post(p, key)
    assert_problem(plain, 409, "idempotency_key_in_use")
    assert "Preference-Applied" not in plain.headers
    asked = Bg(lambda: post(p, key, headers={"Prefer": "respond-async, wait=5"}))
    capped = Bg(lambda: post(p, key, headers={"Prefer": "wait=100"}))
    wait_waiters(2, p)
    stub.release("orig")
    first = orig.result()
    a, c = asked.result(), capped.result()
    assert_same_answer(a, first)
    assert_same_answer(c, first)
    assert a.headers.get("Preference-Applied") == "wait=5"
    assert c.headers.get("Preference-Applied") == "wait=10"
    assert stub.count(key=key) == 1


def test_prefer_wait_zero_on_a_wait_route_is_answered_at_once(make_proxy, stub):
    p = make_proxy(route_overrides=wait_routes())
    key = new_key("zero")
    orig = start_original(stub, p, key)
    r = post(p, key, headers={"Prefer": "wait=0"})
    assert_problem(r, 409, "idempotency_key_in_use")
    assert_retry_after(r)
    assert r.headers.get("Preference-Applied") == "wait=0"
    assert waiters(p) == 0
    stub.release("orig")
    assert orig.result().status_code == 201


def test_mismatch_is_answered_at_once_and_never_waits(make_proxy, stub):
    p = make_proxy(route_overrides=wait_routes())
    key = new_key("mismatch")
    orig = start_original(stub, p, key)
    r = post(p, key, body={"amount": 999})  # the gate is still closed
    assert_problem(r, 409, "idempotency_key_mismatch")
    assert waiters(p) == 0
    stub.release("orig")
    assert orig.result().status_code == 201
    assert stub.count(key=key) == 1


def test_client_that_hangs_up_is_dropped_from_the_wait_list(make_proxy, stub):
    p = make_proxy(route_overrides=wait_routes())
    key = new_key("gone")
    orig = start_original(stub, p, key)
    body = b'{"amount": 100}'
    s = socket.create_connection(("127.0.0.1", p.port), timeout=TIMEOUT)
    s.sendall(b"POST " + PAY.encode() + b" HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nIdempotency-Key: " + key.encode() +
              b"\r\nContent-Length: %d\r\n\r\n" % len(body) + body)
    wait_waiters(1, p)
    # An abortive close (RST), as a client that gives up does: a plain
    # close() is a FIN, which a half-closed client sends too.
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    s.close()
    wait_waiters(0, p)
    # the gauge drops just before the outcome is counted
    wait_until(lambda: outcome(p, "create_payment", "client_gone") == 1,
               what="the client_gone outcome")
    stub.release("orig")
    assert orig.result().status_code == 201
    assert stub.count(key=key) == 1
    # The proxy still serves, and the key replays.
    assert is_replay(post(p, key))


def test_waiters_whose_claim_fails_get_503_and_nothing_is_forwarded(make_proxy, stub, pg):
    from test_records import break_idem_claim
    p = make_proxy(route_overrides=wait_routes())
    key = new_key("storefail")
    orig = start_original(stub, p, key)
    dups = [Bg(lambda: post(p, key)) for _ in range(3)]
    wait_waiters(3, p)
    # The original records (complete does not call idem_claim); the woken
    # waiters' claims then fail: each is answered 503, none hangs, none is
    # forwarded in the original's place.
    break_idem_claim(pg, "RAISE EXCEPTION 'boom';")
    stub.release("orig")
    assert orig.result().status_code == 201
    for d in dups:
        r = d.result()
        assert_problem(r, 503, "idempotency_store_unavailable")
        assert_retry_after(r)
    assert waiters(p) == 0
    assert stub.count(key=key) == 1
    assert outcome(p, "create_payment", "store_unavailable") == 3


def test_sigterm_answers_every_waiter_then_finishes_the_original(make_proxy, stub, pg):
    p = make_proxy(route_overrides=wait_routes(), top={"shutdown_grace": "20s"})
    key = new_key("drain")
    orig = start_original(stub, p, key)
    dups = [Bg(lambda: post(p, key)) for _ in range(3)]
    wait_waiters(3, p)
    p.proc.send_signal(signal.SIGTERM)
    # The waiters are answered at once, before the front end stops (a
    # connection still suspended then would abort libmicrohttpd) ...
    for d in dups:
        r = d.result()
        assert_problem(r, 409, "idempotency_key_in_use")
        assert_retry_after(r)
    # ... while the original, already with the upstream, is finished and
    # recorded within the grace.
    stub.release("orig")
    assert orig.result().status_code == 201
    assert p.stop() == 0
    assert pg.record(key)["state"] == "completed"
    assert stub.count(key=key) == 1


def raw_wait_request(p, key, extra=b""):
    """A waiting request on a raw socket (Prefer: wait on any route)."""
    body = b'{"amount": 100}'
    s = socket.create_connection(("127.0.0.1", p.port), timeout=LONG)
    s.sendall(b"POST " + PAY.encode() + b" HTTP/1.1\r\nHost: x\r\n"
              b"Content-Type: application/json\r\nIdempotency-Key: " + key.encode() +
              b"\r\n" + extra + b"Content-Length: %d\r\n\r\n" % len(body) + body)
    return s


def read_all(s):
    out = b""
    while True:
        chunk = s.recv(65536)
        if not chunk:
            return out
        out += chunk


def test_client_that_half_closes_after_sending_gets_the_original_answer(make_proxy, stub):
    # shutdown(SHUT_WR) says "no more requests", not "gone": the client
    # still reads, and is owed the original's answer.
    p = make_proxy(route_overrides=wait_routes())
    key = new_key("halfclose")
    orig = start_original(stub, p, key)
    s = raw_wait_request(p, key, b"Connection: close\r\n")
    wait_waiters(1, p)
    s.shutdown(socket.SHUT_WR)
    # The hang-up watch polls at once; give it the moment to see the
    # half-close before the original completes (no timing is asserted).
    time.sleep(0.5)
    assert outcome(p, "create_payment", "client_gone") == 0
    stub.release("orig")
    first = orig.result()
    assert first.status_code == 201
    raw = read_all(s)
    s.close()
    # The proxy kept the waiter and replayed the original's answer to it
    # (before, it was dropped as client_gone and answered 409).
    assert stub.count(key=key) == 1
    assert outcome(p, "create_payment", "client_gone") == 0
    assert outcome(p, "create_payment", "replayed") == 1
    assert not raw.startswith(b"HTTP/1.1 409"), raw[:200]
    # libmicrohttpd 0.9.75 may close a half-closed connection when it
    # resumes it, before the answer is written (doc/design.md, Waiting for
    # the original); whatever the client reads is the original's answer.
    if raw:
        head, _, body = raw.partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 201"), raw[:200]
        assert b"\r\nidempotent-replayed: true" in head.lower(), head
        assert body == first.content


def tenant_post(p, key, tenant):
    return requests.post(p.url + PAY, json={"amount": 100},
                         headers={"Idempotency-Key": key, "X-Tenant-Id": tenant},
                         timeout=LONG)


def test_one_tenant_cannot_take_every_waiting_place(make_proxy, stub):
    p = make_proxy(route_overrides=wait_routes(tenant="header:X-Tenant-Id"),
                   top={"max_waiters": 4, "max_waiters_per_tenant": 2})
    ka, kb = new_key("tenant-a"), new_key("tenant-b")
    stub.configure({"prefix": PAY, "key": ka, "gate": "a", "times": 1},
                   {"prefix": PAY, "key": kb, "gate": "b", "times": 1})
    orig_a = Bg(lambda: tenant_post(p, ka, "a"))
    orig_b = Bg(lambda: tenant_post(p, kb, "b"))
    stub.wait_for(1, key=ka)
    stub.wait_for(1, key=kb)
    dups_a = [Bg(lambda: tenant_post(p, ka, "a")) for _ in range(2)]
    wait_waiters(2, p)
    # A's share is full: its next duplicate is answered at once ...
    r = tenant_post(p, ka, "a")
    assert_problem(r, 409, "idempotency_key_in_use")
    assert_retry_after(r)
    assert outcome(p, "create_payment", "rejected_tenant_full") == 1
    # ... while B, with places left in the pool, still waits.
    dup_b = Bg(lambda: tenant_post(p, kb, "b"))
    wait_waiters(3, p)
    stub.release("b")
    first_b = orig_b.result()
    assert first_b.status_code == 201
    assert_same_answer(dup_b.result(), first_b)
    stub.release("a")
    first_a = orig_a.result()
    for d in dups_a:
        assert_same_answer(d.result(), first_a)
    assert stub.count(key=ka) == 1 and stub.count(key=kb) == 1
    assert outcome(p, "create_payment", "rejected_full") == 0


CHANNEL = "idemproxy_wait"


def scope_message(tenant, operation, key):
    return b"\0".join(x.encode() for x in ("idemproxy-wait", tenant, operation, key))


def keyed_payload(pg, tenant, operation, key):
    """What the instances send: keyed with the secret migration 011 made."""
    secret = pg.query("SELECT secret FROM idemproxy_secrets "
                      "WHERE name = 'wait_notify'")[0]["secret"]
    return hmac.new(bytes(secret), scope_message(tenant, operation, key),
                    hashlib.sha256).hexdigest()[:32]


def listen(pg):
    """A session of any role LISTENing on the proxies' channel."""
    conn = psycopg.connect(pg.url, autocommit=True)
    got = []
    conn.add_notify_handler(lambda n: got.append(n.payload) if n.channel == CHANNEL else None)
    conn.execute("LISTEN " + CHANNEL)
    return conn, got


def test_notify_payload_does_not_reveal_the_key(make_proxy, stub, pg):
    a = make_proxy(route_overrides=wait_routes())
    b = make_proxy(route_overrides=wait_routes())
    conn, got = listen(pg)
    key = new_key("secret")
    orig = start_original(stub, a, key)
    dup = Bg(lambda: post(b, key))
    wait_waiters(1, b)
    stub.release("orig")
    first = orig.result()
    assert_same_answer(dup.result(), first)
    # Each query lets psycopg hand over what was notified meanwhile.
    wait_until(lambda: conn.execute("SELECT 1") and got, what="a notification")
    conn.close()
    # A listener that guesses tenant, route and key cannot match them ...
    unkeyed = hashlib.sha256(scope_message("default", "create_payment", key)).hexdigest()[:32]
    assert unkeyed not in got, got
    # ... the payload is keyed with the instances' shared secret.
    assert got == [keyed_payload(pg, "default", "create_payment", key)]
    assert stub.count(key=key) == 1


def test_flood_of_repeated_notifies_does_not_crowd_out_fresh_keys(make_proxy, stub, pg):
    # A NOTIFY repeated by any session (or every listener reconnect) makes
    # every waiter of its key claim again; the re-claims must leave room
    # for fresh requests in the workers' queue.
    p = make_proxy(route_overrides=wait_routes(), top={"workers": 2, "queue_size": 4})
    key = new_key("storm")
    orig = start_original(stub, p, key)
    n = 30
    dups = []
    for i in range(n):  # one at a time: the queue holds only 4
        dups.append(Bg(lambda: post(p, key)))
        wait_waiters(i + 1, p)
    payload = keyed_payload(pg, "default", "create_payment", key)
    stop = threading.Event()
    sent = [0]

    def flood():
        with psycopg.connect(pg.url, autocommit=True) as c:
            while not stop.is_set():
                c.execute("SELECT pg_notify(%s, %s)", (CHANNEL, payload))
                sent[0] += 1

    t = threading.Thread(target=flood)
    t.start()
    try:
        wait_until(lambda: sent[0] >= 200, what="the flood under way")
        fresh = [new_key("fresh%d" % i) for i in range(20)]
        got = [requests.post(p.url + "/v1/refunds", json={"n": i},
                             headers={"Idempotency-Key": k}, timeout=TIMEOUT)
               for i, k in enumerate(fresh)]
        during = sent[0]
    finally:
        stop.set()
        t.join()
    assert during > 200
    assert [r.status_code for r in got] == [201] * len(fresh), \
        [(r.status_code, r.content[:80]) for r in got if r.status_code != 201][:3]
    # Each fresh key reached the upstream once, in the order sent.
    seen = [r.key for r in stub.requests(prefix="/v1/refunds")]
    assert seen == fresh
    assert waiters(p) == n
    stub.release("orig")
    first = orig.result()
    for d in dups:
        assert_same_answer(d.result(), first)
    assert stub.count(key=key) == 1
