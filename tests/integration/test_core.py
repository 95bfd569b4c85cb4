"""The decision table (SPEC 3.2), recording and replay (3.4, 3.5), the
fingerprint (canonical JSON, operation scope), forwarding (3.3), the errors
the proxy makes itself (3.6) and the command line (1)."""
import email.utils
import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone

import pytest

from conftest import ROOT, run_binary
from helpers import (TIMEOUT, assert_problem, assert_retry_after, is_replay, new_key,
                     raw_request)

PAY = "/v1/payments"
OLD_DATE = "Sat, 01 Jan 2000 00:00:00 GMT"
DEFAULT_REPLAY_HEADERS = {"content-type", "content-language", "location", "etag",
                          "last-modified", "link", "cache-control"}


def pay(proxy, key, body=None, path=PAY, **kw):
    return proxy.post(path, key=key, json={"amount": 100, "currency": "EUR"}
                      if body is None else body, **kw)


def stored_header_names(rec):
    text = bytes(rec["response_headers"] or b"").decode("latin-1")
    return {line.split(":", 1)[0].strip().lower() for line in text.split("\r\n") if line}


def make_processing(pg, key, lease_sql):
    """Turns the key's record back into an attempt in progress whose lease
    ends at lease_sql (an SQL expression), as if the first attempt had not
    finished."""
    n = pg.execute("UPDATE idempotency_records SET state = 'processing', "
                   "lease_until = " + lease_sql + ", response_status = NULL, "
                   "response_headers = NULL, response_body = NULL, replayable = NULL "
                   "WHERE idem_key = %s", (key,))
    assert n == 1


# --- 3.2: none -> forward ----------------------------------------------------

def test_first_attempt_is_forwarded_and_recorded(proxy, stub, pg):
    key = new_key()
    r = pay(proxy, key, {"amount": 100})
    assert r.status_code == 201
    assert not is_replay(r)
    # the client gets the upstream's whole response, cookies included
    assert r.headers["X-Internal"].startswith("internal-")
    assert "session=" in r.headers["Set-Cookie"]
    assert r.headers["Location"].startswith("/v1/payments/")

    seen = stub.requests(key=key)
    assert len(seen) == 1
    assert seen[0].method == "POST"
    assert seen[0].target == PAY
    assert json.loads(seen[0].body) == {"amount": 100}
    assert seen[0].header("Idempotency-Key") == key
    assert seen[0].header("Content-Type").startswith("application/json")

    rec = pg.record(key)
    assert rec is not None
    assert rec["tenant"] == "default"
    assert rec["operation"] == "create_payment"
    assert rec["state"] == "completed"
    assert rec["attempt"] == 1
    assert rec["response_status"] == 201
    assert bytes(rec["response_body"]) == r.content
    assert rec["replayable"] is True
    assert rec["expires_at"] > rec["created_at"]


# --- 3.2: completed -> replay (3.5) ------------------------------------------

def test_replay_of_completed(proxy, stub, pg):
    stub.configure({"prefix": PAY, "headers": {"Date": OLD_DATE, "ETag": '"v1"'}})
    key = new_key()
    r1 = pay(proxy, key)
    assert r1.status_code == 201 and not is_replay(r1)

    for _ in range(2):
        r = pay(proxy, key)
        assert r.status_code == 201
        assert is_replay(r), dict(r.headers)
        assert r.content == r1.content
        assert r.headers["Content-Type"] == r1.headers["Content-Type"]
        assert r.headers["Location"] == r1.headers["Location"]
        assert r.headers["ETag"] == '"v1"'
        assert "Set-Cookie" not in r.headers
        assert "X-Internal" not in r.headers
        # a fresh Date, not the one the upstream sent
        assert "Date" in r.headers
        assert r.headers["Date"] != OLD_DATE
        when = email.utils.parsedate_to_datetime(r.headers["Date"])
        assert abs(datetime.now(timezone.utc) - when) < timedelta(days=1)

    assert stub.count(key=key) == 1
    rec = pg.record(key)
    names = stored_header_names(rec)
    assert names <= DEFAULT_REPLAY_HEADERS, names
    assert {"content-type", "location"} <= names
    assert b"session=" not in bytes(rec["response_headers"] or b"")
    assert rec["attempt"] == 1


def test_replay_headers_follow_the_route_setting(make_proxy, stub):
    proxy = make_proxy(route_overrides={
        "create_payment": {"replay_headers": ["Content-Type", "X-Internal"]}})
    key = new_key()
    r1 = pay(proxy, key)
    r2 = pay(proxy, key)
    assert is_replay(r2)
    assert r2.headers["X-Internal"] == r1.headers["X-Internal"]
    assert "Location" not in r2.headers
    assert "Set-Cookie" not in r2.headers
    assert r2.content == r1.content
    assert stub.count(key=key) == 1


def test_non_release_error_status_is_completed_and_replayed(proxy, stub, pg):
    stub.configure({"prefix": PAY, "status": 402, "json": {"error": "card_declined"}})
    key = new_key()
    r1 = pay(proxy, key)
    assert r1.status_code == 402
    r2 = pay(proxy, key)
    assert r2.status_code == 402
    assert is_replay(r2)
    assert r2.content == r1.content == b'{"error": "card_declined"}'
    assert stub.count(key=key) == 1
    assert pg.record(key)["state"] == "completed"


# --- 3.2: processing, lease alive -> 409 in use ------------------------------

def test_in_flight_request_gets_409_with_retry_after(proxy, stub, pg):
    key = new_key()
    stub.configure({"prefix": PAY, "gate": "first"})
    with ThreadPoolExecutor(1) as ex:
        try:
            first = ex.submit(pay, proxy, key)
            stub.wait_for(1, key=key)
            assert pg.record(key)["state"] == "processing"
            r = pay(proxy, key)
            assert_problem(r, 409, "idempotency_key_in_use")
            assert_retry_after(r)
        finally:
            stub.release("first")
        r1 = first.result(TIMEOUT)
    assert r1.status_code == 201 and not is_replay(r1)
    r3 = pay(proxy, key)
    assert is_replay(r3)
    assert r3.content == r1.content
    assert stub.count(key=key) == 1


@pytest.mark.no_replay_cache
def test_processing_record_with_live_lease_is_in_use(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides={"create_payment": {"retry_after": "3s"}})
    key = new_key()
    assert pay(proxy, key).status_code == 201
    make_processing(pg, key, "now() + interval '5 minutes'")
    r = pay(proxy, key)
    assert_problem(r, 409, "idempotency_key_in_use")
    assert r.headers.get("Retry-After") == "3"
    assert stub.count(key=key) == 1
    rec = pg.record(key)
    assert rec["state"] == "processing"
    assert rec["attempt"] == 1


# --- 3.2: processing, lease expired -> take over -----------------------------

@pytest.mark.no_replay_cache
def test_processing_record_with_expired_lease_is_taken_over(proxy, stub, pg):
    key = new_key()
    r1 = pay(proxy, key)
    assert r1.status_code == 201
    make_processing(pg, key, "now() - interval '1 second'")

    r2 = pay(proxy, key)
    assert r2.status_code == 201
    assert not is_replay(r2)
    assert r2.json()["id"] != r1.json()["id"]
    seen = stub.requests(key=key)
    assert len(seen) == 2
    assert seen[1].body == seen[0].body
    rec = pg.record(key)
    assert rec["state"] == "completed"
    assert rec["attempt"] == 2
    assert bytes(rec["response_body"]) == r2.content

    r3 = pay(proxy, key)
    assert is_replay(r3) and r3.content == r2.content
    assert stub.count(key=key) == 2


def test_attempt_that_lost_its_lease_cannot_overwrite_the_record(proxy, stub, pg):
    key = new_key()
    stub.configure({"prefix": PAY, "gate": "slow", "times": 1})
    with ThreadPoolExecutor(1) as ex:
        try:
            first = ex.submit(pay, proxy, key)
            stub.wait_for(1, key=key)
            assert pg.execute("UPDATE idempotency_records SET lease_until = now() - "
                              "interval '1 second' WHERE idem_key = %s AND "
                              "state = 'processing'", (key,)) == 1
            r2 = pay(proxy, key)
            assert r2.status_code == 201 and not is_replay(r2)
        finally:
            stub.release("slow")
        first.result(TIMEOUT)
    assert stub.count(key=key) == 2
    rec = pg.record(key)
    assert rec["state"] == "completed"
    assert rec["attempt"] == 2
    assert bytes(rec["response_body"]) == r2.content
    r3 = pay(proxy, key)
    assert is_replay(r3) and r3.content == r2.content
    assert stub.count(key=key) == 2


# --- 3.2: released -> take over ----------------------------------------------

def test_released_record_is_taken_over(proxy, stub, pg):
    for status in (503, 429, 500):
        key = new_key("rel%d" % status)
        stub.configure({"prefix": PAY, "key": key, "status": status, "times": 1,
                        "json": {"error": "try later"}}, append=True)
        r1 = pay(proxy, key)
        assert r1.status_code == status
        assert r1.content == b'{"error": "try later"}'
        rec = pg.record(key)
        assert rec["state"] == "released", status
        assert rec["attempt"] == 1

        r2 = pay(proxy, key)
        assert r2.status_code == 201, status
        assert not is_replay(r2)
        seen = stub.requests(key=key)
        assert len(seen) == 2
        assert seen[1].body == seen[0].body
        rec = pg.record(key)
        assert rec["state"] == "completed"
        assert rec["attempt"] == 2

        r3 = pay(proxy, key)
        assert is_replay(r3) and r3.content == r2.content
        assert stub.count(key=key) == 2


# --- 3.2: mismatch -----------------------------------------------------------

@pytest.mark.parametrize("mismatch_status", [None, 422])
def test_mismatch_with_a_different_body(make_proxy, stub, pg, mismatch_status):
    proxy = make_proxy(defaults={"mismatch_status": mismatch_status}
                       if mismatch_status else None)
    key = new_key()
    r1 = pay(proxy, key, {"amount": 100})
    assert r1.status_code == 201
    before = pg.record(key)

    r2 = pay(proxy, key, {"amount": 200})
    assert_problem(r2, mismatch_status or 409, "idempotency_key_mismatch")
    assert stub.count(key=key) == 1
    after = pg.record(key)
    assert after["request_hash"] == before["request_hash"]
    assert after["state"] == "completed"
    assert after["updated_at"] == before["updated_at"]

    r3 = pay(proxy, key, {"amount": 100})
    assert is_replay(r3) and r3.content == r1.content
    assert stub.count(key=key) == 1


def test_mismatch_wins_over_in_flight(proxy, stub, pg):
    key = new_key()
    stub.configure({"prefix": PAY, "gate": "first"})
    with ThreadPoolExecutor(1) as ex:
        try:
            first = ex.submit(pay, proxy, key, {"amount": 100})
            stub.wait_for(1, key=key)
            r = pay(proxy, key, {"amount": 999})
            assert_problem(r, 409, "idempotency_key_mismatch")
        finally:
            stub.release("first")
        assert first.result(TIMEOUT).status_code == 201
    assert stub.count(key=key) == 1


@pytest.mark.no_replay_cache
def test_mismatch_wins_over_live_lease_with_422(make_proxy, stub, pg):
    proxy = make_proxy(defaults={"mismatch_status": 422})
    key = new_key()
    assert pay(proxy, key, {"amount": 1}).status_code == 201
    make_processing(pg, key, "now() + interval '5 minutes'")
    assert_problem(pay(proxy, key, {"amount": 2}), 422, "idempotency_key_mismatch")
    assert_problem(pay(proxy, key, {"amount": 1}), 409, "idempotency_key_in_use")
    assert stub.count(key=key) == 1


# --- 3.2: expired record -> forward ------------------------------------------

@pytest.mark.no_replay_cache
def test_expired_record_is_reused(proxy, stub, pg):
    for same_body in (False, True):
        key = new_key("same" if same_body else "new")
        r1 = pay(proxy, key, {"amount": 100})
        assert r1.status_code == 201
        old = pg.record(key)
        assert pg.execute("UPDATE idempotency_records SET expires_at = now() - interval "
                          "'1 second', created_at = now() - interval '2 days' "
                          "WHERE idem_key = %s", (key,)) == 1

        body = {"amount": 100} if same_body else {"amount": 999}
        r2 = pay(proxy, key, body)
        assert r2.status_code == 201
        assert not is_replay(r2), "same_body=%s" % same_body
        assert r2.json()["id"] != r1.json()["id"]
        seen = stub.requests(key=key)
        assert len(seen) == 2
        assert json.loads(seen[1].body) == body

        rec = pg.record(key)
        assert rec["state"] == "completed"
        assert rec["attempt"] == 1
        assert bytes(rec["response_body"]) == r2.content
        assert pg.query("SELECT %s > now() AS live", (rec["expires_at"],))[0]["live"]
        if not same_body:
            assert rec["request_hash"] != old["request_hash"]

        r3 = pay(proxy, key, body)
        assert is_replay(r3) and r3.content == r2.content
        if not same_body:
            assert_problem(pay(proxy, key, {"amount": 100}), 409, "idempotency_key_mismatch")
        assert stub.count(key=key) == 2


# --- 3.2 step 3: the fingerprint ---------------------------------------------

def post_raw(proxy, key, data, content_type, path=PAY):
    return proxy.post(path, key=key, data=data, headers={"Content-Type": content_type})


SAME_PAYLOADS = [
    (b'{"a":1, "b":2}', b'{"b":2,"a":1}', "application/json"),
    (b'{\n  "x": {"b": [1, 2], "a": null},\n  "y": "s"\n}\n',
     b'{"y":"s","x":{"a":null,"b":[1,2]}}', "application/json"),
    (b'{"a": 1, "b": 2}', b'{"b":2,"a":1}', "application/vnd.payments+json"),
]


def test_canonical_json_is_the_same_payload(proxy, stub):
    for first, second, content_type in SAME_PAYLOADS:
        case = (first, second, content_type)
        key = new_key()
        r1 = post_raw(proxy, key, first, content_type)
        assert r1.status_code == 201, case
        r2 = post_raw(proxy, key, second, content_type)
        assert r2.status_code == 201, (case, r2.content)
        assert is_replay(r2), case
        assert r2.content == r1.content
        seen = stub.requests(key=key)
        assert len(seen) == 1, case
        assert seen[0].body == first  # the upstream gets the body as sent


DIFFERENT_PAYLOADS = [
    (b'{"a":[1,2]}', b'{"a":[2,1]}', "application/json"),
    (b'{"a":1}', b'{"a":"1"}', "application/json"),
    (b'{"a":1, "b":2}', b'{"b":2,"a":1}', "text/plain"),
    (b'{"a":1,', b'{"a":1, ', "application/json"),
]


def test_different_payloads_mismatch(proxy, stub):
    for first, second, content_type in DIFFERENT_PAYLOADS:
        key = new_key()
        assert post_raw(proxy, key, first, content_type).status_code == 201
        r = post_raw(proxy, key, second, content_type)
        assert r.status_code == 409, ((first, second, content_type), r.content)
        assert_problem(r, 409, "idempotency_key_mismatch")
        assert stub.count(key=key) == 1


def test_unparsable_json_is_hashed_raw(proxy, stub):
    key = new_key()
    r1 = post_raw(proxy, key, b'{"a":1,', "application/json")
    assert r1.status_code == 201
    r2 = post_raw(proxy, key, b'{"a":1,', "application/json")
    assert is_replay(r2) and r2.content == r1.content
    assert stub.count(key=key) == 1


def test_media_type_is_part_of_the_payload(proxy, stub):
    key = new_key()
    body = b'{"a":1}'
    r1 = post_raw(proxy, key, body, "application/json")
    assert r1.status_code == 201
    # parameters are not the media type
    r2 = post_raw(proxy, key, body, "application/json; charset=utf-8")
    assert is_replay(r2) and r2.content == r1.content
    assert_problem(post_raw(proxy, key, body, "text/plain"), 409, "idempotency_key_mismatch")
    assert stub.count(key=key) == 1


def test_same_key_on_another_route_is_another_operation(proxy, stub, pg):
    key = new_key()
    r1 = pay(proxy, key)
    r2 = pay(proxy, key, path="/v1/refunds")
    assert r1.status_code == 201 and r2.status_code == 201
    assert not is_replay(r2)
    assert r2.json()["id"] != r1.json()["id"]
    assert [s.target for s in stub.requests(key=key)] == [PAY, "/v1/refunds"]
    assert sorted(r["operation"] for r in pg.records(key)) == ["create_payment", "refund"]
    assert is_replay(pay(proxy, key, path="/v1/refunds"))
    assert stub.count(key=key) == 2


def test_same_key_on_another_path_of_a_route_is_a_mismatch(proxy, stub):
    for path1, path2 in [("/v1/payments/pay_1/capture", "/v1/payments/pay_2/capture"),
                         ("/v1/payments?merchant=1", "/v1/payments?merchant=2")]:
        key = new_key()
        assert pay(proxy, key, path=path1).status_code == 201
        r = pay(proxy, key, path=path2)
        assert r.status_code == 409, (path1, path2, r.content)
        assert_problem(r, 409, "idempotency_key_mismatch")
        assert is_replay(pay(proxy, key, path=path1))
        assert [s.target for s in stub.requests(key=key)] == [path1]


# --- 3.3: forwarding and pass-through ----------------------------------------

def test_get_is_passed_through_without_a_record(proxy, stub, pg):
    r = proxy.get(PAY + "?limit=10")
    assert r.status_code == 201
    assert not is_replay(r)
    key = new_key()
    for _ in range(2):  # a key on a GET protects nothing: forwarded each time
        assert proxy.get(PAY, key=key).status_code == 201
    seen = stub.requests(method="GET")
    assert [s.target for s in seen] == [PAY + "?limit=10", PAY, PAY]
    assert pg.records() == []


def test_methods_setting_decides_what_needs_a_key(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides={"create_payment": {"methods": ["POST"]}})
    r = proxy.request("PATCH", PAY, json={"x": 1})
    assert r.status_code == 201
    assert proxy.request("PUT", PAY, json={"x": 1}).status_code == 201
    assert proxy.request("DELETE", PAY).status_code == 201
    assert [s.method for s in stub.requests()] == ["PATCH", "PUT", "DELETE"]
    assert pg.records() == []
    assert_problem(proxy.post(PAY, json={"x": 1}), 400, "idempotency_key_missing")
    assert stub.count() == 3


def test_raw_path_and_query_are_preserved(proxy, stub):
    target = PAY + "?b=2&a=1&x=%2F&y=a+b&z=%7e&empty="
    for method in ("POST", "GET"):
        key = new_key()
        body = b'{"q":1}' if method == "POST" else b""
        r = raw_request(proxy.port, method, target,
                        [("Idempotency-Key", key), ("Content-Type", "application/json")], body)
        assert r.status_code == 201, method
        seen = stub.requests(key=key)
        assert len(seen) == 1
        assert seen[0].method == method
        assert seen[0].target == target
        assert seen[0].body == body


HOP_BY_HOP = [
    ("Connection", "keep-alive, X-Foo"),
    ("X-Foo", "bar"),
    ("Keep-Alive", "timeout=5"),
    ("TE", "trailers"),
    ("Upgrade", "websocket"),
    ("Proxy-Connection", "keep-alive"),
    ("Trailer", "X-Checksum"),
]


def test_hop_by_hop_headers_are_not_forwarded(proxy, stub):
    for method in ("POST", "GET"):
        key = new_key()
        r = raw_request(proxy.port, method, PAY,
                        [("Idempotency-Key", key), ("Content-Type", "application/json")] +
                        HOP_BY_HOP + [("X-End-To-End", "kept")],
                        b'{"amount":1}' if method == "POST" else b"")
        assert r.status_code == 201, method
        seen = stub.requests(key=key)
        assert len(seen) == 1
        up = seen[0]
        for name in ("X-Foo", "Keep-Alive", "TE", "Upgrade", "Proxy-Connection", "Trailer"):
            assert up.headers(name) == [], "%s %s was forwarded: %r" % (
                method, name, up.header_list)
        for v in up.headers("Connection"):
            assert "x-foo" not in v.lower()
        assert up.header("X-End-To-End") == "kept"
        assert up.header("Idempotency-Key") == key


def test_forwarding_headers_are_added(proxy, stub):
    key = new_key()
    assert pay(proxy, key).status_code == 201
    up = stub.requests(key=key)[0]
    assert up.header("X-Forwarded-For") == "127.0.0.1"
    assert up.header("X-Forwarded-Proto") == "http"
    assert up.header("X-Forwarded-Host") == "127.0.0.1:%d" % proxy.port
    rid = up.header("X-Request-Id")
    assert rid and rid.strip()

    key2 = new_key()
    assert pay(proxy, key2).status_code == 201
    assert stub.requests(key=key2)[0].header("X-Request-Id") != rid


def test_existing_request_id_is_preserved(proxy, stub):
    key = new_key()
    r = pay(proxy, key, headers={"X-Request-Id": "req-from-client-42"})
    assert r.status_code == 201
    assert stub.requests(key=key)[0].headers("X-Request-Id") == ["req-from-client-42"]
    proxy.get(PAY + "?rid", headers={"X-Request-Id": "req-get-7"})
    assert stub.requests(prefix=PAY + "?rid")[0].headers("X-Request-Id") == ["req-get-7"]


# --- 3.6: errors the proxy makes itself --------------------------------------

def test_unmatched_path_is_404_route_not_found(proxy, stub, pg):
    for method, path in [("POST", "/nope"), ("GET", "/v1/unknown"),
                         ("POST", "/v1/payments/pay_1"),
                         ("POST", "/v1/payments/pay_1/capture/extra"),
                         ("POST", "/v1/paymentsX"), ("POST", "/")]:
        r = proxy.request(method, path, key=new_key(),
                          json={"a": 1} if method == "POST" else None)
        assert r.status_code == 404, (method, path, r.status_code)
        assert_problem(r, 404, "route_not_found")
    assert stub.count() == 0
    assert pg.records() == []


@pytest.fixture
def small_proxy(make_proxy):
    return make_proxy(top={"max_request_body": "1KiB"})


def test_body_over_max_request_body_is_413(small_proxy, stub, pg):
    key = new_key()
    r = small_proxy.post(PAY, key=key, data=b"x" * 1025,
                         headers={"Content-Type": "application/octet-stream"})
    assert_problem(r, 413, "request_too_large")
    assert stub.count() == 0
    assert pg.records() == []


def test_body_of_exactly_max_request_body_is_forwarded(small_proxy, stub, pg):
    key = new_key()
    body = b'{"p":"' + b"x" * 1016 + b'"}'
    assert len(body) == 1024
    r = small_proxy.post(PAY, key=key, data=body,
                         headers={"Content-Type": "application/json"})
    assert r.status_code == 201
    assert stub.requests(key=key)[0].body == body
    assert pg.record(key)["state"] == "completed"


def test_chunked_upload_over_max_request_body_is_413(small_proxy, stub, pg):
    def chunks():
        for _ in range(3):
            yield b"y" * 700

    key = new_key()
    r = small_proxy.post(PAY, key=key, data=chunks(),
                         headers={"Content-Type": "application/octet-stream"})
    assert_problem(r, 413, "request_too_large")
    assert stub.count() == 0
    assert pg.records() == []


def test_chunked_upload_under_the_limit_is_forwarded_whole(small_proxy, stub, pg):
    def chunks():
        for part in (b'{"a":', b'"' + b"z" * 300 + b'"', b"}"):
            yield part

    key = new_key()
    r = small_proxy.post(PAY, key=key, data=chunks(),
                         headers={"Content-Type": "application/json"})
    assert r.status_code == 201
    up = stub.requests(key=key)
    assert len(up) == 1
    assert up[0].body == b'{"a":"' + b"z" * 300 + b'"}'
    assert is_replay(small_proxy.post(PAY, key=key, data=up[0].body,
                                      headers={"Content-Type": "application/json"}))
    assert stub.count(key=key) == 1


# --- 1: the command line -----------------------------------------------------

def test_check_accepts_a_valid_conf_and_prints_routes(make_proxy):
    p = make_proxy(migrate=False, start=False,
                   top={"database": {"url": "postgresql://nobody@127.0.0.1:1/nothing"}})
    r = run_binary(["-c", p.conf_path, "--check"])
    assert r.returncode == 0, r.stdout + r.stderr
    for name, path in [("create_payment", "/v1/payments"),
                       ("capture", "/v1/payments/{id}/capture"),
                       ("refund", "/v1/refunds"), ("optional", "/v1/optional"),
                       ("hooks", "/hooks/*"), ("auth", "/v1/auth/*")]:
        assert name in r.stdout, r.stdout
        assert path in r.stdout, r.stdout


GOOD_HEAD = [
    'listen = "127.0.0.1:18080";',
    'admin_listen = "";',
    'database = { url = "postgresql://nobody@127.0.0.1:1/nothing"; };',
]
ROUTE_A = '{ name = "a"; path = "/v1/a"; upstream = "http://127.0.0.1:9"; }'
ROUTE_B = '{ name = "b"; path = "/v1/b/{id}"; upstream = "http://127.0.0.1:9"; }'


def conf_lines(extra, routes=(ROUTE_A, ROUTE_B)):
    """The conf as lines; extra lines come right after the head, so the
    line of the first extra line is len(GOOD_HEAD) + 1."""
    return GOOD_HEAD + list(extra) + ["routes = ("] + \
        [r + ("," if i < len(routes) - 1 else "") for i, r in enumerate(routes)] + [");"]


@pytest.mark.parametrize("what,extra,routes,line", [
    ("unknown setting", ["frobnicate = 1;"], None, 4),
    ("wrong type", ['workers = "four";'], None, 4),
    ("bad duration", ['shutdown_grace = "10 parsecs";'], None, 4),
    ("bad size", ['max_request_body = "1 lightyear";'], None, 4),
    ("bad duration in defaults", ['defaults = { ttl = "24x"; };'], None, 4),
    ("lease <= upstream_timeout",
     ['defaults = { lease = "10s"; upstream_timeout = "20s"; };'], None, 4),
    ("ttl <= lease", ['defaults = { ttl = "30s"; lease = "1m"; upstream_timeout = "5s"; };'],
     None, 4),
    ("bad mismatch_status", ['defaults = { mismatch_status = 418; };'], None, 4),
    ("malformed upstream",
     [], [ROUTE_A, '{ name = "b"; path = "/v1/b"; upstream = "ftp://127.0.0.1:9"; }'], 6),
    ("unknown route setting",
     [], [ROUTE_A, '{ name = "b"; path = "/v1/b"; upstream = "http://127.0.0.1:9"; '
                   'colour = "blue"; }'], 6),
    ("syntax error", ['workers == 4;'], None, 4),
])
def test_check_reports_errors_with_file_and_line(tmp_path, binary, what, extra, routes, line):
    path = str(tmp_path / "bad.conf")
    with open(path, "w") as f:
        f.write("\n".join(conf_lines(extra, routes or (ROUTE_A, ROUTE_B))) + "\n")
    r = run_binary(["-c", path, "--check"])
    out = r.stdout + r.stderr
    assert r.returncode == 1, "%s: exit %d\n%s" % (what, r.returncode, out)
    m = re.search(re.escape(path) + r":(\d+):", out)
    assert m, "%s: no FILE:LINE in %r" % (what, out)
    if line is not None:
        assert int(m.group(1)) == line, "%s: %r" % (what, out)


def test_check_reports_duplicate_route_name_at_a_route_line(tmp_path, binary):
    path = str(tmp_path / "dup.conf")
    lines = conf_lines([], [ROUTE_A,
                            '{ name = "a"; path = "/v1/x"; upstream = "http://127.0.0.1:9"; }'])
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    r = run_binary(["-c", path, "--check"])
    assert r.returncode == 1
    m = re.search(re.escape(path) + r":(\d+):", r.stdout + r.stderr)
    assert m and int(m.group(1)) in (5, 6), r.stdout + r.stderr


def test_migrate_twice_is_a_no_op(make_proxy, pg):
    p = make_proxy(migrate=False, start=False)
    r = run_binary(["-c", p.conf_path, "--migrate"])
    assert r.returncode == 0, r.stdout + r.stderr
    first = pg.query("SELECT * FROM schema_migrations ORDER BY 1")
    n_sql = len([f for f in os.listdir(os.path.join(ROOT, "sql")) if f.endswith(".sql")])
    assert len(first) == n_sql
    assert pg.query("SELECT to_regclass('idempotency_records') IS NOT NULL AS ok")[0]["ok"]

    r = run_binary(["-c", p.conf_path, "--migrate"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert pg.query("SELECT * FROM schema_migrations ORDER BY 1") == first


def test_refuses_to_start_on_an_unmigrated_database(make_proxy, pg):
    p = make_proxy(migrate=False, wait_ready=False)
    rc = p.wait_exit(20)
    assert rc == 1, p.log()
    assert "--migrate" in p.log()
    # it did not migrate by itself
    assert pg.query("SELECT to_regclass('idempotency_records') IS NULL AS absent")[0]["absent"]


def test_version_and_help(binary):
    r = run_binary(["--version"])
    assert r.returncode == 0
    assert r.stdout.strip() or r.stderr.strip()
    r = run_binary(["--help"])
    assert r.returncode == 0
    out = r.stdout + r.stderr
    for opt in ("-c", "--check", "--migrate"):
        assert opt in out
