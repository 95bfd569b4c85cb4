"""What the proxy makes of an upstream's answer when the upstream misbehaves
on the wire: bytes nobody asked for on a kept-alive connection, trailers,
connection-scoped headers, long header names, and answers too large to
hold. Every upstream here is a raw socket (misbehaving.py), so
what it received is counted at the socket level."""
import json

import pytest

from helpers import assert_problem, is_replay, new_key, raw_request, wait_until
from misbehaving import Chunked, RawUpstream, Respond, Wire, response_head
from store_support import PAY, metrics, pay


@pytest.fixture
def raw():
    started = []

    def factory(*args, **kw):
        u = RawUpstream(*args, **kw)
        started.append(u)
        return u

    yield factory
    for u in started:
        u.stop()


def answer_for(req):
    """The body that belongs to req alone: its key and tenant."""
    return json.dumps({"key": req.key, "tenant": (req.headers("X-Tenant-Id") or [None])[0],
                       "conn": req.conn_id}).encode()


def post_raw(proxy, key, accept_encoding):
    hdrs = [("Content-Type", "application/json"), ("Idempotency-Key", key)]
    if accept_encoding is not None:
        hdrs.append(("Accept-Encoding", accept_encoding))
    return raw_request(proxy.port, "POST", PAY, hdrs, b'{"amount": 100, "currency": "EUR"}')


def stored_headers(rec):
    h = rec["response_headers"]
    if isinstance(h, (bytes, memoryview)):
        h = bytes(h).decode("latin-1")
    return h or ""


# --- B7: an upstream that desynchronises its connection ----------------------

def _second_response(req):
    # A copy of the answer, as an upstream that "sends it again" would.
    body = answer_for(req)
    return response_head(201, [("Content-Type", "application/json")], len(body), False) + body


# name -> (extra bytes for the first answer, delay before they are written
# (None: in the same write as the answer))
DESYNC = {
    "second_response": (_second_response, 0.05),
    "second_response_same_write": (_second_response, None),
    "late_response": (_second_response, 0.3),
    "body_longer_than_content_length": (lambda req: b"trailing junk past the length", 0.05),
    "body_longer_same_write": (lambda req: b"trailing junk past the length", None),
}


@pytest.mark.parametrize("how", sorted(DESYNC))
def test_bytes_nobody_asked_for_never_reach_another_client(make_proxy, raw, pg, how):
    extra, delay = DESYNC[how]
    first = []

    def handler(req):
        body = answer_for(req)
        hdrs = [("Content-Type", "application/json")]
        if not first:
            first.append(req)
            return Respond(201, body, hdrs, extra=extra(req), extra_delay=delay)
        return Respond(201, body, hdrs)

    up = raw(handler)
    proxy = make_proxy(routes=[{"name": "create_payment", "path": PAY, "upstream": up.url,
                                "tenant": "header:X-Tenant-Id"}],
                       top={"workers": 1})
    tenants = ["V1", "V2", "V3", "V4"]
    keys = {t: new_key(t) for t in tenants}
    answers = {}
    for i, t in enumerate(tenants):
        answers[t] = pay(proxy, keys[t], headers={"X-Tenant-Id": t})
        if i == 0:
            # the unsolicited bytes are on the wire before the next request
            wait_until(lambda: up.extra_sent == 1, what="the extra bytes to be written")
    for t in tenants:
        r = answers[t]
        assert r.status_code == 201, (t, r.status_code, r.content[:300])
        assert r.json()["key"] == keys[t] and r.json()["tenant"] == t, (t, r.content)
        assert not is_replay(r)
        seen = up.seen(keys[t])
        assert len(seen) == 1, "%s reached the upstream %d times" % (t, len(seen))
        rows = pg.query("SELECT * FROM idempotency_records WHERE tenant = %s AND idem_key = %s",
                        ("header:" + t, keys[t]))
        assert len(rows) == 1 and rows[0]["state"] == "completed"
        assert json.loads(bytes(rows[0]["response_body"]))["key"] == keys[t]
    # V2 was not written into the connection that carried the extra bytes
    assert up.seen(keys["V2"])[0].conn_id != up.seen(keys["V1"])[0].conn_id
    for t in tenants:
        r = pay(proxy, keys[t], headers={"X-Tenant-Id": t})
        assert is_replay(r) and r.json()["key"] == keys[t] and r.json()["tenant"] == t
    assert up.count() == 4
    if delay is not None:
        # the proxy refused the stale connection itself (in the same write,
        # libcurl sees the excess while reading and closes it)
        assert metrics(proxy).get(
            'idemproxy_events_total{event="upstream_connection_desync"}', 0) >= 1


# --- B9: trailers ------------------------------------------------------------

def test_trailers_are_never_headers(make_proxy, raw, pg):
    def handler(req):
        body = answer_for(req)
        return Chunked(201, [body[:10], body[10:]], [("Content-Type", "application/json")],
                       trailers=[("X-Trailer-Secret", "s3cr3t"),
                                 ("Content-Type", "text/evil")])

    up = raw(handler)
    proxy = make_proxy(routes=[{"name": "create_payment", "path": PAY, "upstream": up.url,
                                "replay_headers": ["Content-Type", "X-Trailer-Secret"]}])
    key = new_key()
    for replay in (False, True):
        r = post_raw(proxy, key, None)
        assert r.status_code == 201 and is_replay(r) == replay
        assert json.loads(r.content)["key"] == key
        names = [n.lower() for n, _ in r.header_list]
        assert "x-trailer-secret" not in names, r.header_list
        assert names.count("content-type") == 1, r.header_list
        assert r.header("Content-Type") == "application/json"
    h = stored_headers(pg.record(key)).lower()
    assert "x-trailer-secret" not in h and "text/evil" not in h, h
    assert up.count(key) == 1


# --- B10: connection-scoped headers and long names ---------------------------

def test_headers_named_in_connection_are_stripped(make_proxy, raw, pg):
    up = raw(lambda req: Respond(201, answer_for(req), [
        ("Content-Type", "application/json"), ("Connection", "X-Hop, keep-alive"),
        ("X-Hop", "for this connection only"), ("X-Kept", "yes")]))
    proxy = make_proxy(routes=[{"name": "create_payment", "path": PAY, "upstream": up.url,
                                "replay_headers": ["Content-Type", "X-Hop", "X-Kept"]}])
    key = new_key()
    for replay in (False, True):
        r = post_raw(proxy, key, None)
        assert r.status_code == 201 and is_replay(r) == replay
        assert r.header("X-Hop") is None, r.header_list
        assert r.header("X-Kept") == "yes"
    h = stored_headers(pg.record(key)).lower()
    assert "x-hop" not in h and "x-kept: yes" in h


def test_long_header_names_are_passed_and_stored(make_proxy, raw, pg):
    names = ["X-" + "n" * 126, "X-" + "l" * 300]  # 128 and 302 bytes
    up = raw(lambda req: Respond(201, answer_for(req), [("Content-Type", "application/json")]
                                 + [(n, "v%d" % i) for i, n in enumerate(names)]))
    proxy = make_proxy(routes=[{"name": "create_payment", "path": PAY, "upstream": up.url,
                                "replay_headers": ["Content-Type"] + names}])
    key = new_key()
    for replay in (False, True):
        r = post_raw(proxy, key, None)
        assert r.status_code == 201 and is_replay(r) == replay
        for i, n in enumerate(names):
            assert r.header(n) == "v%d" % i, (replay, n)
    h = stored_headers(pg.record(key))
    for i, n in enumerate(names):
        assert "%s: v%d" % (n, i) in h


# --- A5: an answer beyond the in-memory cap ----------------------------------

@pytest.mark.parametrize("status,state", [(201, "completed"), (503, "released")])
def test_answer_beyond_the_memory_cap_is_recorded(make_proxy, raw, pg, status, state):
    big = b"x" * (256 * 1024)
    up = raw(lambda req: Wire(response_head(status, [("Content-Type", "text/plain")],
                                            len(big), True) + big, close=True)
             if req.headers("X-Big") else Respond(201))
    # the cap is max(max_response, 16 x max_stored_response) = 64 KiB
    proxy = make_proxy(routes=[{"name": "create_payment", "path": PAY, "upstream": up.url}],
                       top={"max_stored_response": "4KiB", "max_response": "16KiB"})
    key = new_key()
    r = pay(proxy, key, headers={"X-Big": "1"})
    assert_problem(r, 502, "upstream_response_too_large")
    rec = pg.record(key)
    assert rec["state"] == state
    if state == "completed":
        assert rec["response_status"] == status
        assert rec["replayable"] is False
        assert not rec["response_body"]  # nothing of it is stored
        for _ in range(2):
            assert_problem(pay(proxy, key), 409, "idempotency_response_not_replayable")
        assert up.count(key) == 1
    else:
        r2 = pay(proxy, key)
        assert r2.status_code == 201
        assert up.count(key) == 2
        assert pg.record(key)["attempt"] == 2
    # an unprotected request beyond the cap gets the same problem
    r3 = proxy.get(PAY, headers={"X-Big": "1"})
    assert_problem(r3, 502, "upstream_response_too_large")
