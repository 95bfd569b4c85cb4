"""Keys and payloads that follow the domain: key_from (header, query and
body parts, joined so no two lists of values make one key) and
fingerprint_ignore / fingerprint_only. Every rejection reaches neither the
upstream nor the store; every replay is checked against what the upstream
actually received."""
import json

import pytest

from conftest import run_binary
from helpers import assert_problem, is_replay, new_key, raw_request

JSON = {"Content-Type": "application/json"}


def routes(stub_url):
    return [
        {"name": "psp_events", "path": "/hooks/psp", "upstream": stub_url,
         "key_from": ["body:/event/id"]},
        {"name": "psp_deliveries", "path": "/hooks/deliveries", "upstream": stub_url,
         "key_from": ["header:X-Delivery-Id"]},
        {"name": "order_transition", "path": "/v1/orders/{id}/transitions",
         "upstream": stub_url, "key_from": ["body:/order_id", "body:/status"],
         "fingerprint_ignore": ["/sent_at"]},
        {"name": "parts", "path": "/v1/parts", "upstream": stub_url,
         "key_from": ["header:Idempotency-Key", "query:v", "body:/id"]},
        {"name": "pair", "path": "/v1/pair", "upstream": stub_url,
         "key_from": ["body:/a", "body:/b"]},
        {"name": "charges", "path": "/v1/charges", "upstream": stub_url,
         "fingerprint_only": ["/amount", "/currency"]},
        {"name": "optional_parts", "path": "/v1/optional-parts", "upstream": stub_url,
         "key": "optional", "key_from": ["header:X-Op-Id"]},
    ]


@pytest.fixture
def kproxy(make_proxy, stub):
    return make_proxy(routes=routes(stub.url))


def post(proxy, path, body=None, headers=None, raw=None):
    h = dict(JSON)
    h.update(headers or {})
    data = raw if raw is not None else json.dumps(body)
    return proxy.post(path, data=data, headers=h)


def request_lines(proxy):
    return [json.loads(l) for l in proxy.log().splitlines()
            if l.startswith("{") and json.loads(l).get("msg") == "request"]


def test_webhook_deduplicated_by_the_event_id_in_its_body(kproxy, stub, pg):
    ev = new_key("evt")
    body = {"event": {"id": ev, "type": "payment.succeeded"}, "data": {"n": 1}}
    first = post(kproxy, "/hooks/psp", body)
    again = post(kproxy, "/hooks/psp", body)
    assert first.status_code == 201 and not is_replay(first)
    assert is_replay(again) and again.content == first.content
    seen = stub.requests(prefix="/hooks/psp")
    assert len(seen) == 1
    # No key header was sent, and none is made up for the upstream.
    assert seen[0].headers("Idempotency-Key") == []
    joined = "%d:%s," % (len(ev), ev)
    rec = pg.record(joined)
    assert rec["operation"] == "psp_events" and rec["state"] == "completed"
    assert [l["key"] for l in request_lines(kproxy)][-2:] == [joined, joined]


def test_webhook_deduplicated_by_a_delivery_id_header(kproxy, stub, pg):
    d = new_key("dlv")
    first = post(kproxy, "/hooks/deliveries", {"n": 1}, {"X-Delivery-Id": d})
    again = post(kproxy, "/hooks/deliveries", {"n": 1}, {"x-delivery-id": d})
    other = post(kproxy, "/hooks/deliveries", {"n": 1}, {"X-Delivery-Id": d + "x"})
    assert first.status_code == 201 and is_replay(again)
    assert other.status_code == 201 and not is_replay(other)
    assert stub.count(prefix="/hooks/deliveries") == 2
    assert [s.header("X-Delivery-Id") for s in stub.requests(prefix="/hooks/deliveries")] \
        == [d, d + "x"]
    assert pg.record("%d:%s," % (len(d), d))["operation"] == "psp_deliveries"


def test_a_client_key_header_is_not_the_key_where_key_from_does_not_name_it(kproxy, stub):
    ev = new_key("evt")
    body = {"event": {"id": ev}}
    first = post(kproxy, "/hooks/psp", body, {"Idempotency-Key": "one"})
    again = post(kproxy, "/hooks/psp", body, {"Idempotency-Key": "two"})
    assert first.status_code == 201 and is_replay(again)
    seen = stub.requests(prefix="/hooks/psp")
    assert len(seen) == 1 and seen[0].headers("Idempotency-Key") == ["one"]


def test_order_transitions_are_keyed_by_order_and_status(kproxy, stub, pg):
    order = new_key("ord")
    path = "/v1/orders/%s/transitions" % order
    paid = post(kproxy, path, {"order_id": order, "status": "paid", "sent_at": "10:00"})
    shipped = post(kproxy, path, {"order_id": order, "status": "shipped", "sent_at": "10:01"})
    assert paid.status_code == 201 and shipped.status_code == 201
    assert not is_replay(shipped) and paid.json()["id"] != shipped.json()["id"]
    # A retry whose only difference is the ignored sent_at is a replay...
    retry = post(kproxy, path, {"sent_at": "10:07", "status": "paid", "order_id": order})
    assert is_replay(retry) and retry.content == paid.content
    # ...one that changes a kept field is a mismatch.
    changed = post(kproxy, path, {"order_id": order, "status": "paid", "sent_at": "10:00",
                                  "note": "x"})
    assert_problem(changed, 409, "idempotency_key_mismatch")
    sent = [json.loads(s.body) for s in stub.requests(prefix=path)]
    assert [s["status"] for s in sent] == ["paid", "shipped"]
    keys = sorted(r["idem_key"] for r in pg.records() if r["operation"] == "order_transition")
    assert keys == sorted(["%d:%s,4:paid," % (len(order), order),
                           "%d:%s,7:shipped," % (len(order), order)])


def test_numbers_are_keys_by_their_exact_text(kproxy, stub):
    a = post(kproxy, "/v1/orders/1/transitions", raw='{"order_id": 1.50, "status": "paid"}')
    b = post(kproxy, "/v1/orders/1/transitions", raw='{"order_id": 1.5, "status": "paid"}')
    assert a.status_code == 201 and b.status_code == 201 and not is_replay(b)
    assert stub.count(prefix="/v1/orders/1/") == 2


def test_no_two_lists_of_values_make_one_key(kproxy, stub, pg):
    n = new_key("n")
    x = post(kproxy, "/v1/pair", {"a": n + "a", "b": "bc"})
    y = post(kproxy, "/v1/pair", {"a": n + "ab", "b": "c"})
    assert x.status_code == 201 and y.status_code == 201 and not is_replay(y)
    assert stub.count(prefix="/v1/pair") == 2
    ka = "%d:%sa,2:bc," % (len(n) + 1, n)
    kb = "%d:%sab,1:c," % (len(n) + 2, n)
    assert pg.record(ka) is not None and pg.record(kb) is not None
    assert [l["key"] for l in request_lines(kproxy)][-2:] == [ka, kb]


def test_header_query_and_body_parts_together(kproxy, stub, pg):
    k = new_key()
    path = "/v1/parts?v=2&x=%20"
    first = post(kproxy, path, {"id": 7, "n": 1}, {"Idempotency-Key": '"%s"' % k})
    again = post(kproxy, path, {"n": 1, "id": 7}, {"Idempotency-Key": k})
    other_q = post(kproxy, "/v1/parts?v=3&x=%20", {"id": 7, "n": 1}, {"Idempotency-Key": k})
    other_b = post(kproxy, path, {"id": 8, "n": 1}, {"Idempotency-Key": k})
    assert first.status_code == 201 and is_replay(again)
    assert not is_replay(other_q) and not is_replay(other_b)
    seen = stub.requests(prefix="/v1/parts")
    assert len(seen) == 3
    # The key header, a part here, reaches the upstream in one spelling.
    assert [s.key for s in seen] == [k, k, k]
    assert pg.record("%d:%s,1:2,1:7," % (len(k), k))["operation"] == "parts"


MISSING = [
    ("no body part", "/hooks/psp", {"event": {}}, {}, "body:/event/id is not in the body"),
    ("not JSON", "/hooks/psp", None, {"Content-Type": "text/plain"}, "needs a JSON body"),
    ("broken JSON", "/hooks/psp", None, {}, "not valid JSON"),
    ("no header part", "/hooks/deliveries", {"n": 1}, {}, "header:X-Delivery-Id is missing"),
    ("no query part", "/v1/parts", {"id": 1}, {"Idempotency-Key": "k"}, "query:v is missing"),
    ("no key header", "/v1/parts?v=1", {"id": 1}, {}, "header:Idempotency-Key is missing"),
]

INVALID = [
    ("object", "/hooks/psp", {"event": {"id": {"x": 1}}}, {}, "is an object"),
    ("array", "/hooks/psp", {"event": {"id": [1]}}, {}, "is an array"),
    ("null", "/hooks/psp", {"event": {"id": None}}, {}, "is null"),
    ("boolean", "/hooks/psp", {"event": {"id": True}}, {}, "is a boolean"),
    ("empty", "/hooks/psp", {"event": {"id": ""}}, {}, "is empty"),
    ("too long", "/hooks/psp", {"event": {"id": "e" * 256}}, {}, "longer than 255"),
    ("non-ASCII", "/hooks/psp", {"event": {"id": "caf\u00e9"}}, {}, "non-ASCII"),
    ("two query values", "/v1/parts?v=1&v=2", {"id": 1}, {"Idempotency-Key": "k"},
     "more than once"),
    ("bad key header", "/v1/parts?v=1", {"id": 1}, {"Idempotency-Key": "a b"},
     "send it as a quoted string"),
]


def test_missing_and_invalid_parts_are_400_and_touch_nothing(kproxy, stub, pg):
    failures = []
    for code, cases in (("idempotency_key_missing", MISSING),
                        ("idempotency_key_invalid", INVALID)):
        for what, path, body, headers, detail in cases:
            raw = "{not json" if body is None else None
            r = post(kproxy, path, body, headers, raw=raw)
            try:
                assert_problem(r, 400, code)
                assert detail in r.json()["detail"], r.json()["detail"]
            except AssertionError as e:
                failures.append("%s: %s" % (what, e))
    assert not failures, "\n".join(failures)
    assert stub.count() == 0, stub.requests()
    assert pg.records() == []


def test_an_optional_key_from_passes_through_only_without_any_part(kproxy, stub, pg):
    r1 = post(kproxy, "/v1/optional-parts", {"n": 1})
    r2 = post(kproxy, "/v1/optional-parts", {"n": 1})
    assert r1.status_code == 201 and r2.status_code == 201 and not is_replay(r2)
    op = new_key("op")
    r3 = post(kproxy, "/v1/optional-parts", {"n": 1}, {"X-Op-Id": op})
    r4 = post(kproxy, "/v1/optional-parts", {"n": 1}, {"X-Op-Id": op})
    assert not is_replay(r3) and is_replay(r4)
    assert stub.count(prefix="/v1/optional-parts") == 3
    assert len(pg.records()) == 1


def test_fingerprint_only_keeps_only_the_named_values(kproxy, stub):
    k = new_key()
    first = post(kproxy, "/v1/charges", {"amount": 5, "currency": "EUR", "note": "a"},
                 {"Idempotency-Key": k})
    again = post(kproxy, "/v1/charges", {"note": "b", "currency": "EUR", "amount": 5},
                 {"Idempotency-Key": k})
    changed = post(kproxy, "/v1/charges", {"amount": 6, "currency": "EUR", "note": "a"},
                   {"Idempotency-Key": k})
    assert first.status_code == 201 and is_replay(again)
    assert_problem(changed, 409, "idempotency_key_mismatch")
    assert stub.count(key=k) == 1


def test_a_part_header_named_in_connection_still_reaches_the_upstream(kproxy, stub):
    d = new_key("dlv")
    r = raw_request(kproxy.port, "POST", "/hooks/deliveries",
                    [("Content-Type", "application/json"), ("X-Delivery-Id", d),
                     ("Connection", "keep-alive, X-Delivery-Id")], b'{"n":1}')
    assert r.status_code == 201
    assert stub.requests(prefix="/hooks/deliveries")[0].header("X-Delivery-Id") == d


def test_the_replay_cache_never_answers_for_other_key_parts(make_proxy, stub, pg):
    proxy = make_proxy(routes=routes(stub.url))
    order = new_key("ord")
    path = "/v1/orders/%s/transitions" % order
    paid = {"order_id": order, "status": "paid", "sent_at": "1"}
    shipped = {"order_id": order, "status": "shipped", "sent_at": "1"}
    a1 = post(proxy, path, paid)
    # The first answer is cached now; the other status must not get it.
    b1 = post(proxy, path, shipped)
    a2 = post(proxy, path, dict(paid, sent_at="2"))
    b2 = post(proxy, path, dict(shipped, sent_at="3"))
    assert not is_replay(a1) and not is_replay(b1)
    assert is_replay(a2) and a2.content == a1.content
    assert is_replay(b2) and b2.content == b1.content
    assert a1.content != b1.content
    assert [json.loads(s.body)["status"] for s in stub.requests(prefix=path)] == \
        ["paid", "shipped"]


def test_key_from_may_be_one_part_written_as_a_string(make_proxy, stub, pg):
    """key_from = "header:PayPal-Request-Id" is the list of that one part
    (PayPal's own header, as a client of a PayPal-like API sends it)."""
    p = make_proxy(routes=[{"name": "paypal_orders", "path": "/v2/orders",
                            "upstream": stub.url,
                            "key_from": "header:PayPal-Request-Id"}])
    rid = new_key("pp")
    first = post(p, "/v2/orders", {"n": 1}, {"PayPal-Request-Id": rid})
    again = post(p, "/v2/orders", {"n": 1}, {"PayPal-Request-Id": rid})
    assert first.status_code == 201 and not is_replay(first)
    assert is_replay(again) and again.content == first.content
    seen = stub.requests(prefix="/v2/orders")
    assert [s.header("PayPal-Request-Id") for s in seen] == [rid]
    rec = pg.record("%d:%s," % (len(rid), rid))
    assert rec["operation"] == "paypal_orders" and rec["state"] == "completed"
    # Without the header the key is missing: nothing reaches the upstream.
    assert_problem(post(p, "/v2/orders", {"n": 1}), 400, "idempotency_key_missing")
    assert stub.count(prefix="/v2/orders") == 1


def test_a_bad_single_key_from_string_is_refused_by_name(make_proxy):
    p = make_proxy(routes=[{"name": "paypal_orders", "path": "/v2/orders",
                            "key_from": "cookie:PayPal-Request-Id"}],
                   migrate=False, start=False)
    r = run_binary(["-c", p.conf_path, "--check"])
    assert r.returncode == 1, r.stdout + r.stderr
    assert 'key_from: "cookie:PayPal-Request-Id" must be "header:NAME"' in r.stderr, r.stderr
