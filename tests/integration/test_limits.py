"""Limits and slow clients (doc/configuration.md, ENGINEERING "a full
queue is answered with 503 at once"): the job queue, clients that trickle
their request, connections per IP, header and body sizes. A request refused
by a limit reaches neither the upstream nor the store."""
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import pytest
import requests

from helpers import (TIMEOUT, assert_problem, assert_retry_after, is_replay, new_key, raw_request,
                     wait_until)

PAY = "/v1/payments"
JSON = ("Content-Type", "application/json")
HANG = 10.0  # a hang detector, not a timing expectation


def pay(proxy, key, **kw):
    kw.setdefault("timeout", 60)
    return proxy.post(PAY, key=key, json={"amount": 100, "currency": "EUR"}, **kw)


def nothing_stored_or_sent(stub, pg, keys):
    for k in keys:
        assert stub.count(key=k) == 0, "%s reached the upstream" % k
        assert pg.record(k) is None, "%s left a record" % k


def read_answer(sock):
    """Reads what the proxy sends until it closes or stops sending; returns
    the bytes (b"" when it closed without answering). A silent open
    connection is a hang and fails the test."""
    data = b""
    sock.settimeout(HANG)
    try:
        while True:
            chunk = sock.recv(65536)
            if not chunk:
                return data
            data += chunk
            if b"\r\n\r\n" in data:
                sock.settimeout(0.5)
    except socket.timeout:
        if data:
            return data
        pytest.fail("the proxy neither answered nor closed within %.0fs" % HANG)
    except ConnectionResetError:
        return data


# --- the job queue -------------------------------------------------------------

def test_full_queue_sheds_the_surplus_at_once_with_503_overloaded(make_proxy, stub, pg):
    proxy = make_proxy(top={"workers": 1, "queue_size": 1})
    stub.configure({"prefix": PAY, "gate": "busy"})
    first = new_key("busy")
    keys = [new_key("more%d" % i) for i in range(6)]
    with ThreadPoolExecutor(1 + len(keys)) as ex:
        try:
            held = ex.submit(pay, proxy, first)
            stub.wait_for(key=first)  # the only worker is now busy upstream
            futs = {ex.submit(pay, proxy, k): k for k in keys}
            # One of them fits in the queue; the other five are answered
            # while the worker is still busy, i.e. without waiting for it.
            shed = {}
            for f in as_completed(futs, timeout=HANG * 3):
                shed[futs[f]] = f.result()
                if len(shed) == len(keys) - 1:
                    break
            queued = [k for k in keys if k not in shed]
            assert len(queued) == 1
            assert not held.done()
        finally:
            stub.release("busy")
        for k, r in shed.items():
            assert_problem(r, 503, "overloaded")
            assert_retry_after(r)
        results = {f: f.result(timeout=60) for f in futs}
        assert held.result(timeout=60).status_code == 201
    late = [r for f, r in results.items() if futs[f] == queued[0]][0]
    assert late.status_code == 201 and not is_replay(late), late.content
    assert stub.count(key=first) == 1 and stub.count(key=queued[0]) == 1
    assert stub.count() == 2
    nothing_stored_or_sent(stub, pg, list(shed))


# --- slow clients ----------------------------------------------------------------

class Tricklers:
    """n sockets that each sent `head` and then keep sending one more byte
    of `drip` every `every` seconds, until stop()."""

    def __init__(self, port, n, head, drip, every=0.1):
        self.socks = []
        for _ in range(n):
            s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
            s.sendall(head)
            self.socks.append(s)
        self.drip = drip
        self.every = every
        self.stopping = threading.Event()
        self.sent = 0
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self):
        i = 0
        while not self.stopping.wait(self.every) and i < len(self.drip):
            for s in self.socks:
                try:
                    s.sendall(self.drip[i:i + 1])
                except OSError:
                    pass
            i += 1
            self.sent = i

    def stop(self):
        self.stopping.set()
        self.thread.join(10)
        for s in self.socks:
            s.close()


def test_clients_trickling_headers_or_body_do_not_tie_up_workers(make_proxy, stub, pg):
    proxy = make_proxy(top={"workers": 1})
    slow_keys = [new_key("slow%d" % i) for i in range(4)]

    # More sockets than workers, each a request line and headers that never end.
    heads = Tricklers(proxy.port, 4, b"POST " + PAY.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                      b"Idempotency-Key: " + slow_keys[0].encode() + b"\r\n",
                      b"X-Slow: " + b"a" * 200)
    try:
        while heads.sent < 3:
            time.sleep(0.05)
        k = new_key("meanwhile-h")
        r = pay(proxy, k, timeout=HANG)
        assert r.status_code == 201 and not is_replay(r), r.content
    finally:
        heads.stop()

    # Complete headers, then a body that arrives a byte at a time.
    bodies = Tricklers(proxy.port, 4, b"POST " + PAY.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                       b"Idempotency-Key: " + slow_keys[1].encode() + b"\r\n"
                       b"Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
                       b'"a": "' + b"b" * 300)
    try:
        while bodies.sent < 3:
            time.sleep(0.05)
        k2 = new_key("meanwhile-b")
        r = pay(proxy, k2, timeout=HANG)
        assert r.status_code == 201 and not is_replay(r), r.content
    finally:
        bodies.stop()

    assert stub.count() == 2
    assert stub.count(key=k) == 1 and stub.count(key=k2) == 1
    nothing_stored_or_sent(stub, pg, slow_keys)


# --- connections per IP ----------------------------------------------------------

def served_connection(port, n):
    """A connection the proxy serves (GET ?conn=n answered), kept open.
    Retried for a while: the readiness probe's connection may still count
    until the proxy has noticed it closed."""
    deadline = time.monotonic() + HANG
    while True:
        s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
        try:
            s.sendall(b"GET " + PAY.encode() + b"?conn=%d HTTP/1.1\r\nHost: x\r\n\r\n" % n)
            got = read_answer(s)
        except (BrokenPipeError, ConnectionResetError):
            got = b""
        if got.startswith(b"HTTP/1.1 201"):
            return s
        s.close()
        assert not got and time.monotonic() < deadline, "connection %d: %r" % (n, got[:300])
        time.sleep(0.1)


def test_max_connections_per_ip_refuses_a_third_connection(make_proxy, stub, pg):
    proxy = make_proxy(top={"max_connections_per_ip": 2})
    one = served_connection(proxy.port, 1)
    two = served_connection(proxy.port, 2)  # both stay open (keep-alive)
    try:
        three = socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT)
        try:
            try:
                three.sendall(b"GET " + PAY.encode() + b"?conn=3 HTTP/1.1\r\nHost: x\r\n\r\n")
            except (BrokenPipeError, ConnectionResetError):
                pass
            got = read_answer(three)
            assert not got.startswith(b"HTTP/"), \
                "a third connection from one IP was served: %r" % got[:200]
        finally:
            three.close()
    finally:
        one.close()
        two.close()
    assert stub.count(prefix=PAY + "?conn=3") == 0
    assert stub.count(prefix=PAY + "?conn=1") == 1 and stub.count(prefix=PAY + "?conn=2") == 1

    # Once those are closed, new connections are served again.
    def served():
        try:
            return proxy.get(PAY + "?conn=later", timeout=HANG).status_code == 201
        except requests.ConnectionError:
            return False
    deadline = time.monotonic() + HANG
    while not served():
        assert time.monotonic() < deadline, "connections never freed up"
        time.sleep(0.1)


# --- header and body sizes ------------------------------------------------------

def test_oversized_headers_are_431(make_proxy, stub, pg):
    proxy = make_proxy(top={"max_header_size": "4KiB"})
    ok_key, big_key, many_key, fine_many_key = (new_key(x) for x in ("ok", "big", "many", "fm"))

    # under the limits: served
    r = raw_request(proxy.port, "POST", PAY, [JSON, ("Idempotency-Key", ok_key),
                                              ("X-Big", "v" * 3000)], b'{"n":1}')
    assert r.status_code == 201, r.content
    r = raw_request(proxy.port, "POST", PAY,
                    [JSON, ("Idempotency-Key", fine_many_key)] +
                    [("h%d" % i, "1") for i in range(90)], b'{"n":1}')  # the stub takes 100
    assert r.status_code == 201, r.content

    # one header over max_header_size
    r = raw_request(proxy.port, "POST", PAY, [JSON, ("Idempotency-Key", big_key),
                                              ("X-Big", "v" * 5000)], b'{"n":1}')
    assert_problem(r, 431, "request_too_large")
    # more than 256 header lines, each small, all within max_header_size
    r = raw_request(proxy.port, "POST", PAY,
                    [JSON, ("Idempotency-Key", many_key)] +
                    [("h%d" % i, "1") for i in range(300)], b'{"n":1}')
    assert_problem(r, 431, "request_too_large")

    nothing_stored_or_sent(stub, pg, [big_key, many_key])
    assert stub.count() == 2


def test_a_header_block_just_inside_max_header_size_is_read_whole(make_proxy, stub, pg):
    """At the default max_header_size (32 KiB), a header block just inside
    it, as one long header or as 250 lines, is read whole by the front end
    (its connection memory holds it and the lines' bookkeeping): the
    request reaches the proxy's own checks, here the missing key, rather
    than libmicrohttpd's own refusal."""
    proxy = make_proxy()
    room = 32 * 1024 - 600  # the request line, Host and Content-Length
    one = [JSON, ("X-Big", "v" * room)]
    many = [JSON] + [("X-H%03d" % i, "v" * (room // 250 - 10)) for i in range(250)]
    for headers in (one, many):
        r = raw_request(proxy.port, "POST", PAY, headers, b'{"n":1}')
        assert_problem(r, 400, "idempotency_key_missing")
    assert stub.count() == 0


def test_oversized_bodies_are_413(make_proxy, stub, pg):
    proxy = make_proxy(top={"max_request_body": "1KiB"})
    exact, cl_key, chunked_key, unsent_key = (new_key(x) for x in ("exact", "cl", "chk", "uns"))

    r = raw_request(proxy.port, "POST", PAY, [JSON, ("Idempotency-Key", exact)], b"x" * 1024)
    assert r.status_code == 201, r.content

    # with Content-Length
    r = raw_request(proxy.port, "POST", PAY, [JSON, ("Idempotency-Key", cl_key)], b"x" * 1025)
    assert_problem(r, 413, "request_too_large")

    # chunked: no Content-Length, the limit applies while the body arrives
    chunks = b"".join(b"%x\r\n%s\r\n" % (300, b"y" * 300) for _ in range(5)) + b"0\r\n\r\n"
    r = raw_request(proxy.port, "POST", PAY, [JSON, ("Idempotency-Key", chunked_key),
                                              ("Transfer-Encoding", "chunked")], chunks)
    assert_problem(r, 413, "request_too_large")

    # a Content-Length over the limit is answered without waiting for a body
    # that never comes
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT) as s:
        s.sendall(b"POST " + PAY.encode() + b" HTTP/1.1\r\nHost: x\r\n"
                  b"Idempotency-Key: " + unsent_key.encode() + b"\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 5000000\r\n\r\n")
        got = read_answer(s)
    assert got.startswith(b"HTTP/1.1 413"), got[:300]
    assert b"request_too_large" in got

    nothing_stored_or_sent(stub, pg, [cl_key, chunked_key, unsent_key])
    assert stub.count() == 1


# --- CPU work one client can cause ------------------------------------------------

def big_json_body():
    """Just under max_request_body (1MiB): many small objects, whose
    canonical form (parse, sort, dump) takes the longest per byte."""
    items = ",".join('{"k%d": %d, "v": [%d, "x"]}' % (i % 997, i, i) for i in range(29000))
    body = ('{"amount": 100, "items": [%s]}' % items).encode()
    assert 900 * 1024 < len(body) < 1024 * 1024
    return body


def test_the_canonical_json_of_a_large_body_holds_up_no_other_client(make_proxy, stub, pg):
    """While a fresh request's large JSON body is being canonicalised for
    its fingerprint, a retry of another key is replayed from the cache:
    the replay is answered before the large request is."""
    from store_support import metrics
    proxy = make_proxy()
    done = new_key("done")
    assert pay(proxy, done).status_code == 201
    heavy_key = new_key("heavy")
    body = big_json_body()
    events = []

    def heavy():
        r = raw_request(proxy.port, "POST", PAY, [JSON, ("Idempotency-Key", heavy_key)],
                        body, timeout=60)
        events.append(("heavy", r.status_code))

    t = threading.Thread(target=heavy)
    t.start()
    # The work is a helper thread's, off the serving thread.
    wait_until(lambda: events or metrics(proxy).get("idemproxy_offload_pending", 0) >= 1,
               what="the large body's fingerprint to be in the making", interval=0.002)
    assert not events, "the large request was answered before it could be overtaken"
    again = pay(proxy, done)
    events.append("replayed")
    t.join(60)
    assert is_replay(again)
    assert events == ["replayed", ("heavy", 201)]
    assert stub.count(key=heavy_key) == 1 and stub.count(key=done) == 1
