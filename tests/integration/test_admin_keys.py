"""Finding and settling keys: GET /admin/keys (filters, order, keyset
paging, a bounded walk, bad parameters, and its plan on a table of a
million rows) and POST /admin/keys/{tenant}/{operation}/{key}/resolve
(a response replayed to the next retry, "executed" answered with a
problem, fenced by the attempt, audited, counted)."""
import base64
import json
import os
import subprocess

import psycopg
import pytest
import requests
from psycopg import sql as psql

from conftest import ADMIN_TOKEN
from helpers import TIMEOUT, assert_problem, is_replay, log_entries, new_key, wait_until
from store_support import insert_record, metrics, pay

AUTH = {"Authorization": "Bearer " + ADMIN_TOKEN}
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STORE_CHECK = os.path.join(ROOT, "build", "store_check")
WALK = 10000  # ADMIN_LIST_WALK


def listing(proxy, **params):
    return requests.get(proxy.admin_url + "/admin/keys", params=params, headers=AUTH,
                        timeout=TIMEOUT)


def keys_of(proxy, **params):
    r = listing(proxy, **params)
    assert r.status_code == 200, r.text
    return r.json()


def resolve_url(proxy, key, tenant="default", operation="create_payment"):
    q = requests.utils.quote
    return "%s/admin/keys/%s/%s/%s/resolve" % (proxy.admin_url, q(tenant, safe=""),
                                               q(operation, safe=""), q(key, safe=""))


def resolve(proxy, key, doc, **kw):
    data = doc if isinstance(doc, (bytes, str)) else json.dumps(doc)
    return requests.post(resolve_url(proxy, key, **kw), data=data, headers=AUTH,
                         timeout=TIMEOUT)


# --- the listing ---------------------------------------------------------------

def seed_states(pg, tenant):
    """One record of each kind, created a minute apart (oldest first)."""
    rows = [
        ("live", dict(state="processing", hold=True)),
        ("held", dict(state="processing", hold=True, lease="now() - interval '1 second'")),
        ("released", dict(state="released", lease=None)),
        ("done", dict(state="completed", status=201, body=b"{}",
                      lease="now() - interval '1 minute'")),
        ("refund", dict(state="completed", status=404, body=b"{}", operation="refund",
                        lease="now() - interval '1 minute'")),
    ]
    keys = {}
    for i, (name, kw) in enumerate(rows):
        key = "%s-%s" % (name, new_key())
        insert_record(pg, key, tenant=tenant, age="interval '%d minutes'" % (60 - i), **kw)
        keys[name] = key
    return keys


def test_list_filters_states_routes_age_and_order(proxy, pg):
    tenant = "t-" + new_key()
    k = seed_states(pg, tenant)
    insert_record(pg, "other-" + new_key(), tenant="another")

    doc = keys_of(proxy, tenant=tenant, order="oldest")
    assert [r["key"] for r in doc["keys"]] == [k[n] for n in (
        "live", "held", "released", "done", "refund")]
    assert doc["next_cursor"] is None
    newest = keys_of(proxy, tenant=tenant)  # newest first by default
    assert [r["key"] for r in newest["keys"]] == [r["key"] for r in reversed(doc["keys"])]

    by = {r["key"]: r for r in doc["keys"]}
    held = by[k["held"]]
    assert held["state"] == "held" and held["hold_on_unknown"] is True
    assert held["lease_left_ms"] == 0 and held["attempt"] == 1 and held["outcome"] is None
    assert set(held) == {"tenant", "operation", "key", "state", "attempt", "created_at",
                         "age_seconds", "lease_left_ms", "outcome", "hold_on_unknown",
                         "expired"}
    assert 3539 <= held["age_seconds"] <= 3600  # created 59 minutes ago
    live = by[k["live"]]
    assert live["state"] == "processing" and live["lease_left_ms"] > 0
    assert by[k["released"]]["lease_left_ms"] is None
    assert by[k["done"]]["outcome"] == "2xx" and by[k["refund"]]["outcome"] == "4xx"

    def only(**params):
        return [r["key"] for r in keys_of(proxy, tenant=tenant, order="oldest",
                                          **params)["keys"]]
    assert only(state="held") == [k["held"]]
    assert only(state="processing") == [k["live"]]
    assert only(state="released") == [k["released"]]
    assert only(state="completed") == [k["done"], k["refund"]]
    assert only(route="refund") == [k["refund"]]
    assert only(state="completed", route="create_payment") == [k["done"]]
    assert only(older_than="3510s") == [k["live"], k["held"]]
    assert only(older_than="2h") == []
    everyone = keys_of(proxy, order="oldest", limit=1000)["keys"]
    assert {r["tenant"] for r in everyone} == {tenant, "another"}
    text = json.dumps(everyone)
    assert "response" not in text and "owner_token" not in text and "hash" not in text


def page_all(proxy, during=None, **params):
    """Every page of a listing; during(i) runs before page i > 0."""
    seen, cursor, pages = [], None, 0
    while True:
        if cursor is not None and during:
            during(pages)
        p = dict(params, **({"cursor": cursor} if cursor else {}))
        doc = keys_of(proxy, **p)
        seen += [r["key"] for r in doc["keys"]]
        pages += 1
        cursor = doc["next_cursor"]
        if cursor is None:
            return seen, pages


@pytest.mark.parametrize("order", ["oldest", "newest"])
def test_paging_has_no_duplicates_or_gaps_while_keys_are_inserted(proxy, pg, order):
    tenant = "page-" + new_key()
    # 150 records, many sharing one created_at (a batch of first attempts
    # commits them with one now()): the cursor must order within a tie.
    pg.execute(
        "INSERT INTO idempotency_records (tenant, operation, idem_key, request_hash, "
        "state, owner_token, lease_until, created_at, updated_at, expires_at) "
        "SELECT %s, 'create_payment', 'p-' || i, sha256(i::text::bytea), 'processing', "
        "gen_random_uuid(), now() + interval '1 hour', "
        "now() - (i / 10) * interval '1 second', now(), now() + interval '1 hour' "
        "FROM generate_series(1, 150) i", (tenant,))
    before = {"p-%d" % i for i in range(1, 151)}
    added = []

    def insert_more(i):
        for j in range(3):
            key = "new-%d-%d-%s" % (i, j, new_key())
            insert_record(pg, key, tenant=tenant)
            added.append(key)

    seen, pages = page_all(proxy, during=insert_more, tenant=tenant, order=order, limit=40)
    assert pages >= 4
    assert len(seen) == len(set(seen)), "a key was listed twice"
    assert before <= set(seen), "keys missing: %r" % sorted(before - set(seen))
    assert set(seen) <= before | set(added)
    if order == "oldest":
        # keys created after the walk began come after it, in later pages
        assert set(added) - set(seen) <= set(added[-3:])


def test_the_walk_is_bounded_and_a_short_page_goes_on(proxy, pg):
    """Three held keys among more records than one walk reads: pages may
    come back short, even empty, with a cursor, and following them finds
    all three exactly once."""
    tenant = "walk-" + new_key()
    pg.execute(
        "INSERT INTO idempotency_records (tenant, operation, idem_key, request_hash, "
        "state, owner_token, lease_until, hold_on_unknown, created_at, updated_at, "
        "expires_at) SELECT %s, 'create_payment', 'w-' || i, sha256(i::text::bytea), "
        "'processing', gen_random_uuid(), "
        "CASE WHEN i IN (7, 11000, 23999) THEN now() - interval '1 second' "
        "ELSE now() + interval '1 hour' END, true, "
        "now() - interval '1 hour' + i * interval '1 millisecond', now(), "
        "now() + interval '2 hours' FROM generate_series(1, 24000) i", (tenant,))
    first = keys_of(proxy, state="held", order="oldest", limit=10)
    assert first["walked"] == WALK
    assert [r["key"] for r in first["keys"]] == ["w-7"]
    assert first["next_cursor"] is not None
    seen, pages = page_all(proxy, state="held", order="oldest", limit=10)
    assert seen == ["w-7", "w-11000", "w-23999"]
    assert pages == 3
    newest, _ = page_all(proxy, state="held", order="newest", limit=2)
    assert newest == ["w-23999", "w-11000", "w-7"]


def cursor_of(order, *parts):
    raw = "\n".join([order] + list(parts)).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


@pytest.mark.parametrize("params, what", [
    ({"state": "stuck"}, "state"),
    ({"limit": "0"}, "limit"),
    ({"limit": "1001"}, "limit"),
    ({"limit": "ten"}, "limit"),
    ({"limit": "+5"}, "limit"),
    ({"order": "sideways"}, "order"),
    ({"older_than": "5"}, "older_than"),
    ({"tenant": ""}, "tenant"),
    ({"route": ""}, "route"),
    ({"cursor": "!!!"}, "cursor"),
    ({"cursor": cursor_of("o", "2026-01-01T00:00:00.000000Z", "t", "o", "k"),
      "order": "newest"}, "cursor"),
    ({"cursor": cursor_of("n", "yesterday", "t", "o", "k")}, "cursor"),
    ({"cursor": cursor_of("n", "2026-01-01T00:00:00.000000Z", "t", "o")}, "cursor"),
    ({"colour": "blue"}, "colour"),
])
def test_bad_parameters_are_400_with_a_code(proxy, params, what):
    doc = assert_problem(listing(proxy, **params), 400, "invalid_parameter")
    assert what in doc["detail"]


def test_a_parameter_given_twice_and_other_methods(proxy):
    r = requests.get(proxy.admin_url + "/admin/keys?state=held&state=released",
                     headers=AUTH, timeout=TIMEOUT)
    assert "more than once" in assert_problem(r, 400, "invalid_parameter")["detail"]
    r = requests.post(proxy.admin_url + "/admin/keys", headers=AUTH, timeout=TIMEOUT)
    assert_problem(r, 405, "method_not_allowed")
    assert r.headers["Allow"] == "GET, HEAD"
    r = requests.get(proxy.admin_url + "/admin/keys", timeout=TIMEOUT)
    assert_problem(r, 401, "admin_unauthorized")


# --- the plan on a large table -------------------------------------------------

def list_sql(**params):
    r = subprocess.run([STORE_CHECK, "--list-sql"] + ["%s=%s" % kv for kv in params.items()],
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def plan_nodes(node, parents=()):
    yield node, parents
    for child in node.get("Plans", []):
        yield from plan_nodes(child, parents + (node,))


def assert_index_walk(plan):
    nodes = list(plan_nodes(plan))
    scans = [(n, up) for n, up in nodes if n.get("Relation Name") == "idempotency_records"]
    assert scans, plan
    for n, up in scans:
        assert n["Node Type"] in ("Index Scan", "Index Only Scan"), n
        assert n["Index Name"] == "idempotency_records_created", n
        assert up and up[-1]["Node Type"] == "Limit", "the walk is not limited: %r" % up
        # What the scan's rows flow through: from the CTE's root (an
        # InitPlan: the nodes above it do not take its rows as input) down.
        cut = max([i for i, p in enumerate(up)
                   if p.get("Parent Relationship") in ("InitPlan", "SubPlan")] or [0])
        assert not any(p["Node Type"] in ("Sort", "Incremental Sort") for p in up[cut:]), up
    assert not any(n["Node Type"] in ("Seq Scan", "Bitmap Heap Scan") for n, _ in nodes)


def test_the_listing_is_an_index_walk_on_a_million_rows(proxy, pg):
    pg.execute(
        "INSERT INTO idempotency_records (tenant, operation, idem_key, request_hash, "
        "state, owner_token, lease_until, hold_on_unknown, response_status, replayable, "
        "created_at, updated_at, expires_at) "
        "SELECT 'tenant-' || (i % 50), CASE WHEN i % 3 = 0 THEN 'refund' "
        "ELSE 'create_payment' END, 'big-' || i, '\\x00'::bytea, "
        "(CASE WHEN i % 97 = 0 THEN 'processing' ELSE 'completed' END)::idem_state, "
        "gen_random_uuid(), now() - interval '1 second', i % 2 = 0, "
        "CASE WHEN i % 97 = 0 THEN NULL ELSE 201 END, i % 97 <> 0, "
        "now() - i * interval '10 millisecond', now(), now() + interval '1 day' "
        "FROM generate_series(1, 1000000) i")
    pg.execute("ANALYZE idempotency_records")
    conn = pg.conn()
    cursors = {"oldest": cursor_of("o", "2026-01-01T00:00:00.000000Z", "tenant-1",
                                   "refund", "big-1"),
               "newest": cursor_of("n", "2099-01-01T00:00:00.000000Z", "tenant-1",
                                   "refund", "big-1")}
    n = 0
    for order in ("oldest", "newest"):
        for state in (None, "processing", "held", "released", "completed"):
            for extra in ({}, {"tenant": "tenant-7"}, {"route": "refund"},
                          {"older_than": "1h"}, {"tenant": "tenant-7", "route": "refund",
                                                 "older_than": "5m"}):
                for cursor in (None, cursors[order]):
                    params = dict(extra, order=order, limit="100")
                    if state:
                        params["state"] = state
                    if cursor:
                        params["cursor"] = cursor
                    q = list_sql(**params)
                    name = "list_%d" % n
                    n += 1
                    conn.execute("PREPARE %s AS %s" % (name, q["sql"]))
                    args = psql.SQL(", ").join(psql.Literal(v) for v in q["params"])
                    stmt = psql.SQL("EXPLAIN (FORMAT JSON) EXECUTE {}{}").format(
                        psql.Identifier(name),
                        psql.SQL("({})").format(args) if q["params"] else psql.SQL(""))
                    plan = conn.execute(stmt).fetchone()
                    plan = list(plan.values())[0][0]["Plan"]
                    try:
                        assert_index_walk(plan)
                    except AssertionError:
                        print(json.dumps(params), json.dumps(plan, indent=1))
                        raise
    assert n == 100
    # And through the proxy: one call reads at most one walk's worth.
    doc = keys_of(proxy, state="released")
    assert doc["keys"] == [] and doc["walked"] == WALK and doc["next_cursor"]


# --- settling a key --------------------------------------------------------------

HOLD = {"create_payment": {"on_unknown": "hold", "lease": "2s", "upstream_timeout": "1s"}}


def held_key(proxy, stub, pg):
    """A key whose one attempt reached the upstream, got no answer, and is
    held for an operator (lease ended)."""
    key = new_key("held")
    stub.configure({"prefix": "/v1/payments", "key": key, "action": "reset", "times": 1},
                   append=True)
    assert_problem(pay(proxy, key), 504, "upstream_outcome_unknown")
    pg.execute("UPDATE idempotency_records SET lease_until = now() - interval '1 second' "
               "WHERE idem_key = %s", (key,))
    assert_problem(pay(proxy, key), 409, "idempotency_key_in_use")
    assert stub.count(key=key) == 1
    listed = keys_of(proxy, state="held", tenant="default")["keys"]
    assert [r["key"] for r in listed] == [key]
    return key, listed[0]["attempt"]


def audit_lines(proxy, key):
    return [e["detail"] for e in log_entries(proxy)
            if e["msg"] == "admin action" and "action=resolve" in e["detail"]
            and "key=%s " % key in e["detail"]]


@pytest.mark.no_replay_cache
def test_resolve_with_the_response_then_the_retry_replays_it(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides=HOLD)
    key, attempt = held_key(proxy, stub, pg)
    r = resolve(proxy, key, {"attempt": attempt, "response": {
        "status": 201, "headers": {"Content-Type": "application/json",
                                   "Location": "/v1/payments/pay_42", "Server": "psp"},
        "body": '{"id": "pay_42"}'}})
    assert r.status_code == 200, r.text
    assert r.json() == {"tenant": "default", "operation": "create_payment", "key": key,
                        "attempt": 1, "state": "completed", "outcome": "response",
                        "status": 201, "headers_not_stored": ["Server"]}
    again = pay(proxy, key)
    assert again.status_code == 201 and is_replay(again)
    assert again.json() == {"id": "pay_42"}
    assert again.headers["Location"] == "/v1/payments/pay_42"
    assert "Server" not in again.headers or again.headers["Server"] != "psp"
    assert stub.count(key=key) == 1  # the original, and nothing since
    assert pg.record(key)["state"] == "completed"
    assert audit_lines(proxy, key) == [
        "remote=127.0.0.1 method=POST action=resolve tenant=default "
        "operation=create_payment key=%s attempt=1 outcome=response status=201 "
        "result=resolved" % key]
    assert metrics(proxy)['idemproxy_events_total{event="admin_resolved_response"}'] == 1


@pytest.mark.no_replay_cache
def test_resolve_sealed_when_encryption_is_on(make_proxy, stub, pg, tmp_path):
    keyfile = tmp_path / "keys"
    keyfile.write_text("k1 %s\nactive = k1\n" % base64.b64encode(os.urandom(32)).decode())
    os.chmod(keyfile, 0o600)
    proxy = make_proxy(route_overrides=HOLD,
                       top={"store_encryption": {"keys": str(keyfile)}})
    key, attempt = held_key(proxy, stub, pg)
    body = os.urandom(64)
    r = resolve(proxy, key, {"attempt": attempt, "response": {
        "status": 200, "body_base64": base64.b64encode(body).decode()}})
    assert r.status_code == 200, r.text
    rec = pg.record(key)
    assert rec["seal_key"] == "k1" and body not in bytes(rec["response_body"])
    again = pay(proxy, key)
    assert again.status_code == 200 and is_replay(again) and again.content == body
    assert stub.count(key=key) == 1


@pytest.mark.no_replay_cache
def test_resolve_executed_then_the_retry_is_told_it_completed(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides=HOLD)
    key, attempt = held_key(proxy, stub, pg)
    owner = pg.record(key)["owner_token"]
    r = resolve(proxy, key, {"owner_token": str(owner).upper(), "outcome": "executed"})
    assert r.status_code == 200, r.text
    assert r.json()["outcome"] == "executed"
    for _ in range(2):
        doc = assert_problem(pay(proxy, key), 422, "idempotency_operation_completed")
        assert doc["operation_state"] == "completed"
        assert doc["client_action"] == "do_not_retry"
    assert stub.count(key=key) == 1
    assert keys_of(proxy, tenant="default", state="completed")["keys"][0]["outcome"] \
        == "executed"
    assert audit_lines(proxy, key) == [
        "remote=127.0.0.1 method=POST action=resolve tenant=default "
        "operation=create_payment key=%s owner_token=%s outcome=executed "
        "result=resolved" % (key, owner)]


def test_a_stale_attempt_is_409_and_nothing_is_written(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides=HOLD)
    key, attempt = held_key(proxy, stub, pg)
    before = pg.record(key)
    for fence in ({"attempt": attempt + 1},
                  {"owner_token": "00000000-0000-0000-0000-000000000000"}):
        r = resolve(proxy, key, dict(fence, outcome="executed"))
        doc = assert_problem(r, 409, "resolve_attempt_stale")
        assert "attempt 1" in doc["detail"]
    assert pg.record(key) == before
    assert_problem(pay(proxy, key), 409, "idempotency_key_in_use")
    assert stub.count(key=key) == 1
    lines = audit_lines(proxy, key)
    assert len(lines) == 2 and all("result=stale" in l for l in lines)
    assert metrics(proxy)['idemproxy_events_total{event="admin_resolve_refused"}'] == 2


def test_resolve_refuses_keys_with_nothing_to_settle(proxy, stub, pg):
    done = new_key()
    assert pay(proxy, done).status_code == 201
    doc = assert_problem(resolve(proxy, done, {"attempt": 1, "outcome": "executed"}),
                         409, "resolve_not_pending")
    assert "completed" in doc["detail"]
    released = new_key()
    insert_record(pg, released, state="released", lease=None)
    assert_problem(resolve(proxy, released, {"attempt": 1, "outcome": "executed"}),
                   409, "resolve_not_pending")
    live = new_key()
    insert_record(pg, live)  # processing, lease alive
    assert_problem(resolve(proxy, live, {"attempt": 1, "outcome": "executed"}),
                   409, "attempt_in_flight")
    assert pg.record(live)["state"] == "processing"
    assert_problem(resolve(proxy, new_key(), {"attempt": 1, "outcome": "executed"}),
                   404, "not_found")
    assert_problem(resolve(proxy, live, {"attempt": 1, "response": {"status": 201}},
                           operation="gone"), 409, "resolve_route_unknown")
    r = requests.get(resolve_url(proxy, live), headers=AUTH, timeout=TIMEOUT)
    assert_problem(r, 405, "method_not_allowed")


@pytest.mark.parametrize("doc, code", [
    (b"not json", "resolve_invalid"),
    ([1], "resolve_invalid"),
    ({"outcome": "executed"}, "resolve_invalid"),
    ({"attempt": 1, "owner_token": "x", "outcome": "executed"}, "resolve_invalid"),
    ({"attempt": 0, "outcome": "executed"}, "resolve_invalid"),
    ({"attempt": "1", "outcome": "executed"}, "resolve_invalid"),
    ({"owner_token": "not-a-uuid", "outcome": "executed"}, "resolve_invalid"),
    ({"attempt": 1}, "resolve_invalid"),
    ({"attempt": 1, "outcome": "refunded"}, "resolve_invalid"),
    ({"attempt": 1, "outcome": "executed", "response": {"status": 201}},
     "resolve_invalid"),
    ({"attempt": 1, "outcome": "executed", "note": "x"}, "resolve_invalid"),
    ({"attempt": 1, "response": {"status": 199}}, "resolve_invalid"),
    ({"attempt": 1, "response": {"status": 600}}, "resolve_invalid"),
    ({"attempt": 1, "response": {"status": 503}}, "resolve_invalid"),
    ({"attempt": 1, "response": {"status": "201"}}, "resolve_invalid"),
    ({"attempt": 1, "response": {"status": 201, "extra": 1}}, "resolve_invalid"),
    ({"attempt": 1, "response": {"status": 201, "body": "a", "body_base64": "YQ=="}},
     "resolve_invalid"),
    ({"attempt": 1, "response": {"status": 201, "body_base64": "YQ"}}, "resolve_invalid"),
    ({"attempt": 1, "response": {"status": 201, "headers": ["a"]}}, "resolve_invalid"),
    ({"attempt": 1, "response": {"status": 201, "headers": {"Bad Name": "v"}}},
     "resolve_header_invalid"),
    ({"attempt": 1, "response": {"status": 201, "headers": {"X-A": "a\r\nX-B: b"}}},
     "resolve_header_invalid"),
    ({"attempt": 1, "response": {"status": 201, "headers": {"X-A": " padded"}}},
     "resolve_header_invalid"),
    ({"attempt": 1, "response": {"status": 201, "headers": {"X-A": 5}}},
     "resolve_header_invalid"),
    ({"attempt": 1, "response": {"status": 201, "headers": {"Connection": "close"}}},
     "resolve_header_hop_by_hop"),
    ({"attempt": 1, "response": {"status": 201, "headers": {"transfer-encoding": "x"}}},
     "resolve_header_hop_by_hop"),
    ({"attempt": 1, "response": {"status": 201, "headers": {"Content-Length": "3"}}},
     "resolve_header_hop_by_hop"),
])
def test_resolve_bodies_are_validated_strictly(make_proxy, stub, pg, doc, code):
    proxy = make_proxy(route_overrides=HOLD)
    key = new_key()
    insert_record(pg, key, hold=True, lease="now() - interval '1 second'")
    before = pg.record(key)
    assert_problem(resolve(proxy, key, doc), 400, code)
    assert pg.record(key) == before
    assert any("result=invalid" in l for l in audit_lines(proxy, key))


def test_resolve_bounds_the_body(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides=HOLD, top={"max_stored_response": "1KiB"})
    key = new_key()
    insert_record(pg, key, hold=True, lease="now() - interval '1 second'")
    big = {"attempt": 1, "response": {"status": 201, "body": "x" * 1025}}
    assert_problem(resolve(proxy, key, big), 413, "request_too_large")
    huge = {"attempt": 1, "response": {"status": 201, "body": "x" * 200000}}
    assert_problem(resolve(proxy, key, huge), 413, "request_too_large")
    assert pg.record(key)["state"] == "processing"
    lines = [e["detail"] for e in log_entries(proxy) if e["msg"] == "admin action"]
    assert any("key=%s result=too_large" % key in l for l in lines)  # not read whole
    assert any("key=%s attempt=1 outcome=- result=invalid" % key in l for l in lines)
    assert metrics(proxy)['idemproxy_events_total{event="admin_resolve_refused"}'] == 2
    ok = {"attempt": 1, "response": {"status": 201, "body": "x" * 1024}}
    assert resolve(proxy, key, ok).status_code == 200


def test_held_keys_have_their_own_gauges(make_proxy, stub, pg):
    """idemproxy_held_records and idemproxy_oldest_held_age_seconds count
    the held records apart (the processing gauges count them too)."""
    proxy = make_proxy(route_overrides=HOLD, top={"reaper": {"interval": "200ms"}})
    insert_record(pg, new_key(), age="interval '30 seconds'")  # a live attempt
    held = new_key()
    insert_record(pg, held, hold=True, lease="now() - interval '1 second'",
                  age="interval '300 seconds'")

    def gauges():
        m = metrics(proxy)
        return (m["idemproxy_processing_records"], m["idemproxy_held_records"],
                m["idemproxy_oldest_processing_age_seconds"],
                m["idemproxy_oldest_held_age_seconds"])
    wait_until(lambda: gauges()[:2] == (2, 1), what="2 processing, 1 held")
    _, _, oldest, oldest_held = gauges()
    assert 300 <= oldest < 3600 and 300 <= oldest_held < 3600
    assert resolve(proxy, held, {"attempt": 1, "outcome": "executed"}).status_code == 200
    wait_until(lambda: gauges()[:2] == (1, 0), what="1 processing, none held")
    _, _, oldest, oldest_held = gauges()
    assert 30 <= oldest < 300 and oldest_held == 0
