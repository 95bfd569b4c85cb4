"""Operations (SPEC 5): /metrics (every metric, valid exposition, counters
that move), /healthz and /readyz, the admin API (/admin/keys/...), and the
logs (one line per request with its fields, level filtering, and never a
body, an Authorization value or a cookie)."""
import base64
import hashlib
import json
import os
import re
import signal
import subprocess
import threading
import time
from datetime import datetime, timezone

import psycopg
import pytest
import requests

from conftest import ADMIN_TOKEN
from helpers import (TIMEOUT, assert_problem, free_port, is_replay, new_key, raw_request,
                     wait_until)
from store_support import insert_record

PAY = "/v1/payments"
AUTH = {"Authorization": "Bearer " + ADMIN_TOKEN}


def pay(proxy, key, body=None, path=PAY, **kw):
    return proxy.post(path, key=key, json={"amount": 100, "currency": "EUR"}
                      if body is None else body, **kw)


# --- the Prometheus exposition -----------------------------------------------

SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)$')
LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"(,|$)')


class Exposition:
    def __init__(self, text):
        self.text = text
        self.types = {}
        self.samples = []  # (name, {label: value}, float)
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, fam, typ = line.split(" ", 3)
                self.types[fam] = typ
                continue
            if not line or line.startswith("#"):
                continue
            m = SAMPLE.match(line)
            assert m, "unparseable exposition line %r" % line
            labels = {}
            if m.group(2):
                pos = 0
                for lm in LABEL.finditer(m.group(2)):
                    assert lm.start() == pos, "bad labels in %r" % line
                    labels[lm.group(1)] = lm.group(2)
                    pos = lm.end()
                assert pos == len(m.group(2)), "bad labels in %r" % line
            self.samples.append((m.group(1), labels, float(m.group(3))))

    def series(self, name):
        return [(l, v) for n, l, v in self.samples if n == name]

    def value(self, name, **labels):
        """The sum of name's samples whose labels include the given ones
        (0 when none: a labelled counter appears on first use)."""
        return sum(v for l, v in self.series(name)
                   if all(l.get(k) == x for k, x in labels.items()))

    def buckets(self, name):
        return [(float(l["le"]), v) for l, v in self.series(name + "_bucket")]


def scrape(proxy):
    r = requests.get(proxy.admin_url + "/metrics", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain")
    return Exposition(r.text)


def promtool_check(text):
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0, "promtool check metrics failed:\n%s%s" % (r.stdout, r.stderr)
    return r


SPEC_METRICS = {
    "idemproxy_requests_total": ("counter", {"route", "outcome"}),
    "idemproxy_upstream_responses_total": ("counter", {"route", "class"}),
    "idemproxy_request_duration_seconds": ("histogram", None),
    "idemproxy_store_duration_seconds": ("histogram", None),
    "idemproxy_takeovers_total": ("counter", {"route"}),
    "idemproxy_reaper_released_total": ("counter", set()),
    "idemproxy_reaper_purged_total": ("counter", set()),
    "idemproxy_processing_records": ("gauge", set()),
    "idemproxy_oldest_processing_age_seconds": ("gauge", set()),
    "idemproxy_held_records": ("gauge", set()),
    "idemproxy_oldest_held_age_seconds": ("gauge", set()),
    "idemproxy_store_up": ("gauge", set()),
}


def hold_in_flight(proxy, stub, key, gate):
    """Starts an attempt that the stub holds until gate is released;
    returns the thread and the list its response lands in."""
    stub.configure({"prefix": PAY, "key": key, "gate": gate}, append=True)
    out = []
    t = threading.Thread(target=lambda: out.append(pay(proxy, key)))
    t.start()
    stub.wait_for(key=key)
    return t, out


def test_metrics_cover_the_spec_and_pass_promtool(make_proxy, stub):
    dead = "http://127.0.0.1:%d" % free_port()
    proxy = make_proxy(routes=[
        {"name": "create_payment", "path": PAY},
        {"name": "dead", "path": "/v1/dead", "upstream": dead},
    ], top={"reaper": {"interval": "200ms"}})
    before = scrape(proxy)
    promtool_check(before.text)
    # every outcome a request can have without a store outage
    key = new_key()
    assert pay(proxy, key).status_code == 201                        # forwarded
    assert is_replay(pay(proxy, key))                                # replayed
    assert pay(proxy, key, {"amount": 1}).status_code == 409         # mismatch
    assert pay(proxy, None).status_code == 400                       # key_missing
    assert proxy.post(PAY, headers={"Idempotency-Key": ""},
                      json={}).status_code == 400                    # key_invalid
    assert proxy.get(PAY).status_code == 201                         # passthrough
    assert proxy.get("/nowhere").status_code == 404                  # rejected
    assert pay(proxy, new_key(), path="/v1/dead").status_code == 502  # upstream_unavailable
    lost = new_key()
    stub.configure({"prefix": PAY, "key": lost, "action": "reset"})
    assert pay(proxy, lost).status_code == 504                       # outcome_unknown
    busy = new_key()
    t, out = hold_in_flight(proxy, stub, busy, "busy")
    assert pay(proxy, busy).status_code == 409                       # in_flight
    stub.release("busy")
    t.join(TIMEOUT)
    assert out and out[0].status_code == 201
    again = new_key()
    stub.configure({"prefix": PAY, "key": again, "status": 503, "times": 1})
    assert pay(proxy, again).status_code == 503                      # forwarded, released
    assert pay(proxy, again).status_code == 201                      # taken over

    m = wait_until(lambda: (lambda e: e if e.value("idemproxy_store_up") == 1 else None)(
        scrape(proxy)), what="idemproxy_store_up to be 1")
    promtool_check(m.text)
    for name, (typ, labels) in SPEC_METRICS.items():
        assert m.types.get(name) == typ, "%s: TYPE %r, want %r" % (name, m.types.get(name), typ)
        if labels is not None:
            assert m.series(name), "%s has no sample" % name
            for lab, _ in m.series(name):
                assert set(lab) == labels, "%s labels %r" % (name, lab)
    for outcome in ("forwarded", "replayed", "in_flight", "mismatch", "key_missing",
                    "key_invalid", "passthrough", "upstream_unavailable",
                    "outcome_unknown", "rejected"):
        assert m.value("idemproxy_requests_total", outcome=outcome) >= 1, outcome
    assert m.value("idemproxy_requests_total", route="create_payment", outcome="forwarded") == 4
    assert m.value("idemproxy_takeovers_total", route="create_payment") == 1
    assert m.value("idemproxy_requests_total", route="dead",
                   outcome="upstream_unavailable") == 1
    assert m.value("idemproxy_requests_total", route="", outcome="rejected") == 1
    assert m.value("idemproxy_upstream_responses_total", route="create_payment",
                   **{"class": "2xx"}) == 4
    assert m.value("idemproxy_upstream_responses_total", route="create_payment",
                   **{"class": "5xx"}) == 1
    assert m.value("idemproxy_upstream_responses_total", route="dead",
                   **{"class": "error"}) == 1
    # the buckets resolve a sub-millisecond store call and a multi-second
    # upstream call
    for h in ("idemproxy_request_duration_seconds", "idemproxy_store_duration_seconds"):
        les = [le for le, _ in m.buckets(h)]
        assert les == sorted(les) and les[-1] == float("inf"), les
        assert les[0] <= 0.0005 and max(x for x in les if x != float("inf")) >= 10, les
        counts = [v for _, v in m.buckets(h)]
        assert counts == sorted(counts), "%s buckets not cumulative: %r" % (h, counts)
        assert counts[-1] == m.value(h + "_count") > 0
        assert m.value(h + "_sum") > 0


@pytest.mark.no_replay_cache
def test_counters_move_with_each_kind_of_request(make_proxy, stub):
    proxy = make_proxy()
    key = new_key()
    cases = [
        ("forward", lambda: pay(proxy, key), 201,
         {("create_payment", "forwarded"): 1}, 1, 2),
        ("replay", lambda: pay(proxy, key), 201,
         {("create_payment", "replayed"): 1}, 0, 1),
        ("mismatch", lambda: pay(proxy, key, {"amount": 2}), 409,
         {("create_payment", "mismatch"): 1}, 0, 1),
        ("no key", lambda: pay(proxy, None), 400,
         {("create_payment", "key_missing"): 1}, 0, 0),
        ("passthrough", lambda: proxy.get(PAY), 201,
         {("create_payment", "passthrough"): 1}, 1, 0),
        ("no route", lambda: proxy.get("/nowhere"), 404, {("", "rejected"): 1}, 0, 0),
    ]
    for what, send, status, want, upstream, store_calls in cases:
        a = scrape(proxy)
        assert send().status_code == status, what
        b = scrape(proxy)
        moved = {}
        for lab, v in b.series("idemproxy_requests_total"):
            d = v - a.value("idemproxy_requests_total", **lab)
            if d:
                moved[(lab["route"], lab["outcome"])] = d
        assert moved == want, "%s: requests_total moved %r" % (what, moved)
        ups = (b.value("idemproxy_upstream_responses_total")
               - a.value("idemproxy_upstream_responses_total"))
        assert ups == upstream, "%s: %d upstream responses counted" % (what, ups)
        req_h = (b.value("idemproxy_request_duration_seconds_count")
                 - a.value("idemproxy_request_duration_seconds_count"))
        assert req_h == 1, what
        st = (b.value("idemproxy_store_duration_seconds_count")
              - a.value("idemproxy_store_duration_seconds_count"))
        assert st == store_calls, "%s: %d store calls observed" % (what, st)


def test_takeover_and_upstream_class_counters(make_proxy, stub):
    proxy = make_proxy()
    key = new_key()
    stub.configure({"prefix": PAY, "key": key, "status": 503, "times": 1})
    a = scrape(proxy)
    assert pay(proxy, key).status_code == 503   # released
    assert pay(proxy, key).status_code == 201   # taken over
    b = scrape(proxy)
    assert (b.value("idemproxy_takeovers_total", route="create_payment")
            - a.value("idemproxy_takeovers_total", route="create_payment")) == 1
    for cls, n in (("5xx", 1), ("2xx", 1)):
        assert (b.value("idemproxy_upstream_responses_total", route="create_payment",
                        **{"class": cls})
                - a.value("idemproxy_upstream_responses_total", route="create_payment",
                          **{"class": cls})) == n, cls
    assert (b.value("idemproxy_requests_total", outcome="forwarded")
            - a.value("idemproxy_requests_total", outcome="forwarded")) == 2


def test_reaper_counters_and_processing_gauges(make_proxy, stub, pg):
    proxy = make_proxy(top={"reaper": {"interval": "200ms"}})
    a = scrape(proxy)
    insert_record(pg, new_key(), state="processing", lease="now() - interval '1 second'",
                  tenant="gauge")
    insert_record(pg, new_key(), state="completed", lease=None, status=201, body=b"{}",
                  expires="now() - interval '1 second'", tenant="gauge")
    insert_record(pg, new_key(), state="processing", lease="now() + interval '1 hour'",
                  age="interval '120 seconds'", tenant="gauge")

    def moved():
        b = scrape(proxy)
        rel = b.value("idemproxy_reaper_released_total") - a.value(
            "idemproxy_reaper_released_total")
        pur = b.value("idemproxy_reaper_purged_total") - a.value(
            "idemproxy_reaper_purged_total")
        return b if rel >= 1 and pur >= 1 and b.value("idemproxy_processing_records") else None
    b = wait_until(moved, what="the reaper counters to move")
    assert b.value("idemproxy_reaper_released_total") - a.value(
        "idemproxy_reaper_released_total") == 1
    assert b.value("idemproxy_reaper_purged_total") - a.value(
        "idemproxy_reaper_purged_total") == 1
    assert b.value("idemproxy_processing_records") == 1
    assert b.value("idemproxy_oldest_processing_age_seconds") >= 120
    assert b.value("idemproxy_store_up") == 1
    promtool_check(b.text)


def set_connections(pg, allowed):
    with pg.cluster.admin() as c:
        c.execute("ALTER DATABASE %s ALLOW_CONNECTIONS %s" % (pg.name,
                                                              "true" if allowed else "false"))
        if not allowed:
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s AND pid <> pg_backend_pid()", (pg.name,))


def test_store_outage_shows_in_metrics_and_readyz(make_proxy, stub, pg):
    proxy = make_proxy()
    assert requests.get(proxy.admin_url + "/readyz", timeout=TIMEOUT).status_code == 200
    a = scrape(proxy)
    pg.close()
    set_connections(pg, False)
    try:
        r = pay(proxy, new_key())
        assert_problem(r, 503, "idempotency_store_unavailable")
        b = scrape(proxy)
        assert b.value("idemproxy_store_up") == 0
        assert (b.value("idemproxy_requests_total", outcome="store_unavailable")
                - a.value("idemproxy_requests_total", outcome="store_unavailable")) == 1
        promtool_check(b.text)
        r = requests.get(proxy.admin_url + "/readyz", timeout=TIMEOUT)
        assert r.status_code == 503, r.text
        assert requests.get(proxy.admin_url + "/healthz", timeout=TIMEOUT).status_code == 200
    finally:
        set_connections(pg, True)
    assert pay(proxy, new_key()).status_code == 201
    assert scrape(proxy).value("idemproxy_store_up") == 1
    assert requests.get(proxy.admin_url + "/readyz", timeout=TIMEOUT).status_code == 200


# --- /healthz and /readyz ----------------------------------------------------

def admin_backends(pg):
    return pg.query("SELECT pid, backend_start FROM pg_stat_activity "
                    "WHERE datname = %s AND application_name = 'idemproxy-admin'",
                    (pg.name,))


def test_readyz_uses_one_persistent_connection(proxy, pg):
    for _ in range(5):
        r = requests.get(proxy.admin_url + "/readyz", timeout=TIMEOUT)
        assert r.status_code == 200, r.text
        assert r.text == "ready\n"
    first = admin_backends(pg)
    assert len(first) == 1, first
    for _ in range(5):
        assert requests.get(proxy.admin_url + "/readyz", timeout=TIMEOUT).status_code == 200
    assert admin_backends(pg) == first
    # a connection that broke while idle is replaced on the next probe
    pg.execute("SELECT pg_terminate_backend(%s::int)", (first[0]["pid"],))
    r = requests.get(proxy.admin_url + "/readyz", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    again = admin_backends(pg)
    assert len(again) == 1 and again[0]["pid"] != first[0]["pid"], again


def test_readyz_wants_the_current_schema(proxy, pg):
    assert requests.get(proxy.admin_url + "/readyz", timeout=TIMEOUT).status_code == 200
    newest = pg.query("SELECT max(version) AS v FROM schema_migrations")[0]["v"]
    pg.execute("UPDATE schema_migrations SET version = version + 1000 WHERE version = %s",
               (newest,))
    # a newer schema (a newer instance migrated during a rolling deploy) is fine
    assert requests.get(proxy.admin_url + "/readyz", timeout=TIMEOUT).status_code == 200
    pg.execute("DELETE FROM schema_migrations WHERE version = %s", (newest + 1000,))
    r = requests.get(proxy.admin_url + "/readyz", timeout=TIMEOUT)
    assert r.status_code == 503
    assert "migrate" in r.text
    pg.execute("INSERT INTO schema_migrations (version, name) VALUES (%s, 'back')", (newest,))
    assert requests.get(proxy.admin_url + "/readyz", timeout=TIMEOUT).status_code == 200


def test_healthz_and_metrics_do_not_wait_for_the_database(make_proxy, pg):
    proxy = make_proxy(top={"database": {"url": pg.url, "statement_timeout": "20s"}})
    base = proxy.admin_url
    assert requests.get(base + "/readyz", timeout=TIMEOUT).status_code == 200
    locker = psycopg.connect(pg.url)
    try:
        locker.execute("LOCK TABLE schema_migrations IN ACCESS EXCLUSIVE MODE")
        got = []
        t = threading.Thread(target=lambda: got.append(
            requests.get(base + "/readyz", timeout=30)))
        t.start()
        wait_until(lambda: pg.query(
            "SELECT 1 FROM pg_stat_activity WHERE application_name = 'idemproxy-admin' "
            "AND wait_event_type = 'Lock'"), what="/readyz to wait on the lock")
        assert requests.get(base + "/healthz", timeout=TIMEOUT).status_code == 200
        assert requests.get(base + "/metrics", timeout=TIMEOUT).status_code == 200
        assert t.is_alive() and not got
    finally:
        locker.rollback()
        locker.close()
    t.join(30)
    assert got and got[0].status_code == 200, got


def test_admin_endpoints_reject_other_methods(proxy):
    for path in ("/healthz", "/readyz", "/metrics"):
        r = requests.post(proxy.admin_url + path, timeout=TIMEOUT)
        assert_problem(r, 405, "method_not_allowed")
        assert "GET" in r.headers["Allow"]
    assert_problem(requests.get(proxy.admin_url + "/nope", timeout=TIMEOUT), 404, "not_found")


# --- the admin API -----------------------------------------------------------

def admin_url(proxy, tenant, operation, key):
    q = requests.utils.quote
    return "%s/admin/keys/%s/%s/%s" % (proxy.admin_url, q(tenant, safe=""),
                                      q(operation, safe=""), q(key, safe=""))


def admin(proxy, method, tenant, operation, key, headers=AUTH):
    return requests.request(method, admin_url(proxy, tenant, operation, key),
                            headers=headers, timeout=TIMEOUT)


def rfc3339(s):
    assert s.endswith("Z"), s
    return datetime.strptime(s, "%Y-%m-%dT%H:%M:%S.%fZ")


def test_get_a_completed_record(proxy, stub, pg):
    key = new_key()
    r = pay(proxy, key)
    assert r.status_code == 201
    g = admin(proxy, "GET", "default", "create_payment", key)
    assert g.status_code == 200, g.text
    assert g.headers["Content-Type"].startswith("application/json")
    doc = g.json()
    rec = pg.record(key)
    assert list(doc) == ["tenant", "operation", "key", "state", "attempt", "request_hash",
                         "owner_token", "lease_until", "created_at", "updated_at",
                         "expires_at", "expired", "hold_on_unknown", "response_status",
                         "response_headers", "response_body", "replayable", "trace_id",
                         "sealed_with", "response_expires_at", "tombstone"]
    assert doc["tenant"] == "default"
    assert doc["operation"] == "create_payment"
    assert doc["key"] == key
    assert doc["state"] == "completed"
    assert doc["attempt"] == 1
    assert doc["request_hash"] == bytes(rec["request_hash"]).hex()
    assert doc["owner_token"] == str(rec["owner_token"])
    assert doc["lease_until"] is None
    assert rfc3339(doc["created_at"]) <= rfc3339(doc["updated_at"]) < rfc3339(doc["expires_at"])
    assert doc["expired"] is False
    assert doc["hold_on_unknown"] is False
    assert doc["response_status"] == 201
    names = [n.lower() for n, _ in doc["response_headers"]]
    assert "content-type" in names and "location" in names
    assert "set-cookie" not in names and "date" not in names
    assert dict((n.lower(), v) for n, v in doc["response_headers"])["location"] \
        == r.headers["Location"]
    assert base64.b64decode(doc["response_body"]) == r.content
    assert doc["replayable"] is True
    assert doc["trace_id"] is None  # the request sent no traceparent
    assert doc["sealed_with"] is None  # store_encryption is off
    assert admin(proxy, "HEAD", "default", "create_payment", key).status_code == 200


def test_get_a_large_body_and_keys_with_reserved_characters(proxy, stub, pg):
    # '/', '+', '%' and '?' are legal in a bare key; the path carries them
    # percent-encoded
    key = "ord/1001+x%y?z=" + new_key()
    stub.configure({"prefix": PAY, "size": 300000})
    r = pay(proxy, key)
    assert r.status_code == 201 and len(r.content) == 300000
    doc = admin(proxy, "GET", "default", "create_payment", key).json()
    assert doc["key"] == key
    assert base64.b64decode(doc["response_body"]) == r.content
    # an unencoded '/' splits the path differently: no such record
    raw = "/admin/keys/default/create_payment/" + key.replace("%", "%25").replace("?", "%3F")
    assert raw.count("/") == 6
    assert_problem(raw_request(proxy.admin_port, "GET", raw, list(AUTH.items())), 404,
                   "not_found")
    ok = raw_request(proxy.admin_port, "GET", raw.replace("ord/", "ord%2F"), list(AUTH.items()))
    assert ok.status_code == 200 and ok.json()["key"] == key


def test_tenants_other_than_static(proxy, stub):
    key = new_key()
    r = proxy.post("/hooks/x", key=key, json={"a": 1}, headers={"X-Tenant-Id": "acme"})
    assert r.status_code == 201
    assert admin(proxy, "GET", "header:acme", "hooks", key).json()["state"] == "completed"
    assert_problem(admin(proxy, "GET", "header:other", "hooks", key), 404, "not_found")
    assert_problem(admin(proxy, "GET", "acme", "hooks", key), 404, "not_found")
    cred = "Bearer client-credential-1"
    r = proxy.post("/v1/auth/pay", key=key, json={"a": 1}, headers={"Authorization": cred})
    assert r.status_code == 201
    tenant = "authorization:" + hashlib.sha256(cred.encode()).hexdigest()
    assert admin(proxy, "GET", tenant, "auth", key).json()["tenant"] == tenant


def test_unknown_record_is_404(proxy):
    r = admin(proxy, "GET", "default", "create_payment", new_key())
    assert_problem(r, 404, "not_found")
    r = admin(proxy, "DELETE", "default", "create_payment", new_key())
    assert_problem(r, 404, "not_found")


def test_release_a_held_key_then_the_retry_goes_through(make_proxy, stub, pg):
    proxy = make_proxy(route_overrides={"create_payment": {
        "on_unknown": "hold", "lease": "2s", "upstream_timeout": "1s"}})
    key = new_key()
    stub.configure({"prefix": PAY, "key": key, "action": "reset", "times": 1})
    assert_problem(pay(proxy, key), 504, "upstream_outcome_unknown")
    pg.execute("UPDATE idempotency_records SET lease_until = now() - interval '1 second' "
               "WHERE idem_key = %s", (key,))
    held = pay(proxy, key)
    assert_problem(held, 409, "idempotency_key_in_use")
    assert "operator" in held.json()["detail"]
    doc = admin(proxy, "GET", "default", "create_payment", key).json()
    assert doc["state"] == "processing" and doc["hold_on_unknown"] is True
    assert doc["response_status"] is None and doc["response_body"] is None
    assert doc["replayable"] is None
    assert stub.count(key=key) == 1

    d = admin(proxy, "DELETE", "default", "create_payment", key)
    assert d.status_code == 200, d.text
    assert d.json() == {"tenant": "default", "operation": "create_payment", "key": key,
                        "action": "released", "previous_state": "processing"}
    rec = pg.record(key)
    assert rec["state"] == "released" and rec["lease_until"] is None

    r = pay(proxy, key)
    assert r.status_code == 201 and not is_replay(r)
    assert stub.count(key=key) == 2
    assert pg.record(key)["attempt"] == 2
    assert "key=%s result=released" % key in proxy.log()


def test_delete_refuses_an_attempt_whose_lease_is_alive_unless_forced(proxy, stub, pg):
    """Releasing an attempt that still holds its lease lets a retry run
    beside it: the upstream would execute the request twice."""
    key = new_key()
    t, out = hold_in_flight(proxy, stub, key, "slow-" + key)
    try:
        lease_until = pg.record(key)["lease_until"]
        d = admin(proxy, "DELETE", "default", "create_payment", key)
        assert_problem(d, 409, "attempt_in_flight")
        assert "lease" in d.json()["detail"] and "force=true" in d.json()["detail"]
        assert rfc3339(d.json()["lease_until"]) == \
            lease_until.astimezone(timezone.utc).replace(tzinfo=None)
        rec = pg.record(key)
        assert rec["state"] == "processing" and rec["lease_until"] == lease_until
        assert_problem(pay(proxy, key), 409, "idempotency_key_in_use")
        assert stub.count(key=key) == 1
        assert "key=%s result=refused_in_flight" % key in proxy.log()
        # forced: released as before, and the retry runs beside it
        f = requests.delete(admin_url(proxy, "default", "create_payment", key),
                            params={"force": "true"}, headers=AUTH, timeout=TIMEOUT)
        assert f.status_code == 200, f.text
        assert f.json()["action"] == "released"
        assert "key=%s result=released_forced" % key in proxy.log()
        t2 = threading.Thread(target=lambda: out.append(pay(proxy, key)))
        t2.start()
        stub.wait_for(2, key=key)  # the second execution, beside the first
        stub.release("slow-" + key)
        t2.join(TIMEOUT)
    finally:
        stub.release("slow-" + key)
        t.join(TIMEOUT)
    assert stub.count(key=key) == 2


@pytest.mark.parametrize("state", ["completed", "released"])
def test_delete_purges_a_finished_record(proxy, stub, pg, state):
    key = new_key()
    if state == "released":
        stub.configure({"prefix": PAY, "key": key, "status": 503, "times": 1})
    r = pay(proxy, key)
    assert pg.record(key)["state"] == state
    d = admin(proxy, "DELETE", "default", "create_payment", key)
    assert d.status_code == 200, d.text
    assert d.json()["action"] == "purged" and d.json()["previous_state"] == state
    assert pg.record(key) is None
    assert_problem(admin(proxy, "GET", "default", "create_payment", key), 404, "not_found")
    # the key is new again: forwarded, attempt 1
    r = pay(proxy, key, {"amount": 7})
    assert r.status_code == 201 and not is_replay(r)
    assert stub.count(key=key) == 2
    assert pg.record(key)["attempt"] == 1


def test_delete_only_touches_its_own_record(proxy, stub, pg):
    key = new_key()
    for tenant in ("t1", "t2"):
        assert proxy.post("/hooks/a", key=key, json={}, headers={"X-Tenant-Id": tenant}) \
            .status_code == 201
    assert pay(proxy, key).status_code == 201
    assert admin(proxy, "DELETE", "header:t1", "hooks", key).json()["action"] == "purged"
    left = {(r["tenant"], r["operation"]) for r in pg.records(key)}
    assert left == {("header:t2", "hooks"), ("default", "create_payment")}


def test_admin_requires_the_bearer_token(proxy, stub):
    key = new_key()
    assert pay(proxy, key).status_code == 201
    bad = [
        {},
        {"Authorization": "Bearer wrong-token"},
        {"Authorization": "Bearer " + ADMIN_TOKEN[:-1]},
        {"Authorization": "Bearer " + ADMIN_TOKEN + "x"},
        {"Authorization": "Basic " + base64.b64encode(b"admin:" + ADMIN_TOKEN.encode()).decode()},
        {"Authorization": ADMIN_TOKEN},
        {"Authorization": "Bearer"},
    ]
    for h in bad:
        for method in ("GET", "DELETE", "POST"):
            r = admin(proxy, method, "default", "create_payment", key, headers=h)
            assert_problem(r, 401, "admin_unauthorized")
            assert r.headers["WWW-Authenticate"].startswith("Bearer"), h
    # unauthenticated requests learn nothing, not even whether a path exists
    r = requests.get(proxy.admin_url + "/admin/anything", timeout=TIMEOUT)
    assert_problem(r, 401, "admin_unauthorized")
    assert admin(proxy, "GET", "default", "create_payment", key).status_code == 200
    # the scheme is case-insensitive
    r = admin(proxy, "GET", "default", "create_payment", key,
              headers={"Authorization": "bearer  " + ADMIN_TOKEN})
    assert r.status_code == 200
    assert stub.count(key=key) == 1


def test_admin_paths_and_methods(proxy):
    u = proxy.admin_url
    # /admin/keys itself lists keys (test_admin_keys.py)
    for path in ("/admin", "/admin/", "/admin/keys/", "/admin/keys/a/b",
                 "/admin/keys/a/b/c/d", "/admin/keys/a//c", "/admin/keys/a/b/c/",
                 "/admin/other/a/b/c"):
        assert_problem(requests.get(u + path, headers=AUTH, timeout=TIMEOUT), 404,
                       "not_found")
    for seg in ("%zz", "%4", "%00", "%0A", "%C3%A9", "%7F", "%"):
        r = raw_request(proxy.admin_port, "GET", "/admin/keys/default/create_payment/k" + seg,
                        list(AUTH.items()))
        assert_problem(r, 400, "bad_request")
    for method in ("POST", "PUT", "PATCH"):
        r = requests.request(method, u + "/admin/keys/default/create_payment/k",
                             headers=AUTH, timeout=TIMEOUT)
        assert_problem(r, 405, "method_not_allowed")
        assert set(x.strip() for x in r.headers["Allow"].split(",")) == {"GET", "HEAD",
                                                                         "DELETE"}


def test_admin_disabled_by_an_empty_token(make_proxy, stub):
    proxy = make_proxy(top={"admin_token": ""})
    key = new_key()
    assert pay(proxy, key).status_code == 201
    for h in ({}, AUTH, {"Authorization": "Bearer "}):
        for method in ("GET", "DELETE"):
            r = admin(proxy, method, "default", "create_payment", key, headers=h)
            assert_problem(r, 404, "not_found")
            assert "disabled" in r.json()["detail"]
            assert "WWW-Authenticate" not in r.headers
    assert requests.get(proxy.admin_url + "/healthz", timeout=TIMEOUT).status_code == 200
    assert requests.get(proxy.admin_url + "/metrics", timeout=TIMEOUT).status_code == 200


def test_reload_changes_the_admin_token(proxy, stub):
    key = new_key()
    assert pay(proxy, key).status_code == 201
    assert admin(proxy, "GET", "default", "create_payment", key).status_code == 200
    with open(proxy.conf_path) as f:
        conf = f.read()
    assert conf.count(ADMIN_TOKEN) == 1
    with open(proxy.conf_path, "w") as f:
        f.write(conf.replace(ADMIN_TOKEN, "rotated-token"))
    proxy.proc.send_signal(signal.SIGHUP)
    new = {"Authorization": "Bearer rotated-token"}
    wait_until(lambda: admin(proxy, "GET", "default", "create_payment", key,
                             headers=new).status_code == 200, what="the new token")
    assert_problem(admin(proxy, "GET", "default", "create_payment", key), 401,
                   "admin_unauthorized")
    with open(proxy.conf_path, "w") as f:
        f.write(conf.replace(ADMIN_TOKEN, ""))
    proxy.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: admin(proxy, "GET", "default", "create_payment", key,
                             headers=new).status_code == 404, what="the admin API to close")


def test_admin_actions_are_logged_without_the_token(proxy, stub):
    key = "log/" + new_key()
    assert pay(proxy, key).status_code == 201
    assert admin(proxy, "GET", "default", "create_payment", key).status_code == 200
    assert admin(proxy, "DELETE", "default", "create_payment", key).status_code == 200
    assert admin(proxy, "GET", "default", "create_payment", key).status_code == 404
    wrong = "Bearer wrong-secret-" + new_key()
    assert admin(proxy, "DELETE", "default", "create_payment", key,
                 headers={"Authorization": wrong}).status_code == 401
    lines = [json.loads(l) for l in proxy.log().splitlines() if l.startswith("{")]
    acts = [l["detail"] for l in lines if l["msg"] == "admin action"]
    want = ["remote=127.0.0.1 method=%s tenant=default operation=create_payment key=%s "
            "result=%s" % (m, key, res)
            for m, res in (("GET", "found"), ("DELETE", "purged"), ("GET", "not_found"))]
    assert acts == want
    refused = [l for l in lines if l["msg"] == "admin request refused"]
    assert len(refused) == 1 and refused[0]["level"] == "warn"
    assert "remote=127.0.0.1 method=DELETE" in refused[0]["detail"]
    assert "result=unauthorized" in refused[0]["detail"]
    log = proxy.log()
    assert ADMIN_TOKEN not in log
    assert wrong.split(" ")[1] not in log


# --- logs --------------------------------------------------------------------

REQUEST_FIELDS = ["time", "level", "msg", "request_id", "trace_id", "route", "method", "path",
                  "tenant", "key", "outcome", "status", "attempt", "upstream_ms", "store_ms",
                  "total_ms"]


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_no_body_authorization_or_cookie_reaches_the_log(make_proxy, stub, fmt):
    proxy = make_proxy(top={"log_format": fmt, "log_level": "debug"})
    tag = new_key("m").replace("-", "")
    mk = {w: "%s%s%s" % (w, tag, w) for w in ("REQBODY", "AUTHZ", "COOKIE", "SETCOOKIE",
                                             "RESPBODY", "ADMINAUTH")}
    stub.configure({"headers": {"Set-Cookie": "sid=%s; Path=/" % mk["SETCOOKIE"]},
                    "body": '{"secret": "%s"}' % mk["RESPBODY"]})
    hdrs = {"Authorization": "Bearer " + mk["AUTHZ"], "Cookie": "sid=" + mk["COOKIE"],
            "Content-Type": "application/json"}
    body = '{"card": "%s"}' % mk["REQBODY"]
    key = new_key()
    sent = [
        ("forwarded", proxy.post(PAY, key=key, data=body, headers=hdrs), 201),
        ("replayed", proxy.post(PAY, key=key, data=body, headers=hdrs), 201),
        ("mismatch", proxy.post(PAY, key=key, data=body + " ", headers=dict(
            hdrs, **{"Content-Type": "text/plain"})), 409),
        ("key_missing", proxy.post(PAY, data=body, headers=hdrs), 400),
        ("key_invalid", proxy.post(PAY, key="", data=body, headers=hdrs), 400),
        ("passthrough", proxy.request("PUT", PAY, data=body, headers=hdrs), 201),
        ("passthrough", proxy.post("/v1/optional", data=body, headers=hdrs), 201),
        ("forwarded", proxy.post("/v1/auth/pay", key=key, data=body, headers=hdrs), 201),
        ("rejected", proxy.post("/nowhere", key=key, data=body, headers=hdrs), 404),
    ]
    for outcome, r, status in sent:
        assert r.status_code == status, (outcome, r.status_code, r.text)
    # the markers did travel: upstream saw them, clients got them back
    seen = stub.requests(prefix=PAY)[0]
    assert mk["REQBODY"].encode() in seen.body
    assert seen.header("Authorization") == hdrs["Authorization"]
    assert mk["COOKIE"] in seen.header("Cookie")
    assert mk["SETCOOKIE"] in sent[0][1].headers["Set-Cookie"]
    assert mk["RESPBODY"].encode() in sent[1][1].content
    r = requests.get(admin_url(proxy, "default", "create_payment", key), timeout=TIMEOUT,
                     headers={"Authorization": "Bearer " + mk["ADMINAUTH"]})
    assert r.status_code == 401

    log = proxy.log()
    leaked = [w for w, m in mk.items() if m in log]
    assert not leaked, "%s reached the log:\n%s" % (leaked, log)
    assert tag not in log
    outcomes = request_outcomes(log, fmt)
    assert outcomes == [o for o, _, _ in sent], outcomes


def request_outcomes(log, fmt):
    if fmt == "json":
        return [json.loads(l)["outcome"] for l in log.splitlines()
                if l.startswith("{") and json.loads(l)["msg"] == "request"]
    return [re.search(r" outcome=(\S+)", l).group(1) for l in log.splitlines()
            if re.match(r"\S+ info  request ", l)]


@pytest.mark.no_replay_cache
def test_request_line_has_the_spec_fields_json(proxy, stub):
    key = new_key()
    assert pay(proxy, key, path=PAY + "?expand=1").status_code == 201
    assert is_replay(pay(proxy, key, path=PAY + "?expand=1"))
    rid = stub.requests(key=key)[0].header("X-Request-Id")
    lines = [json.loads(l) for l in proxy.log().splitlines() if l.startswith("{")]
    reqs = [l for l in lines if l["msg"] == "request"]
    assert len(reqs) == 2
    first, second = reqs
    assert list(first) == REQUEST_FIELDS
    assert first["request_id"] == rid
    assert second["request_id"] != rid
    assert (first["route"], first["method"], first["path"], first["tenant"], first["key"]) \
        == ("create_payment", "POST", PAY, "default", key)
    assert (first["outcome"], first["status"], first["attempt"]) == ("forwarded", 201, 1)
    assert (second["outcome"], second["status"], second["attempt"]) == ("replayed", 201, 1)
    assert first["level"] == "info"
    datetime.strptime(first["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
    for f in ("upstream_ms", "store_ms", "total_ms"):
        assert isinstance(first[f], (int, float)) and first[f] >= 0
    assert first["upstream_ms"] > 0 and first["store_ms"] > 0
    assert first["total_ms"] >= first["upstream_ms"]
    assert second["upstream_ms"] == 0 and second["store_ms"] > 0


def test_request_line_has_the_spec_fields_text(make_proxy, stub):
    proxy = make_proxy(top={"log_format": "text"})
    key = new_key()
    assert pay(proxy, key).status_code == 201
    rid = stub.requests(key=key)[0].header("X-Request-Id")
    lines = [l for l in proxy.log().splitlines() if re.match(r"\S+ info  request ", l)]
    assert len(lines) == 1, proxy.log()
    fields = dict(kv.split("=", 1) for kv in lines[0].split()[3:])
    assert list(fields) == ["id", "trace_id", "route", "method", "path", "tenant", "key",
                            "outcome", "status", "attempt", "upstream_ms", "store_ms",
                            "total_ms"]
    assert fields["trace_id"] == "-"  # no traceparent
    assert fields["id"] == rid
    assert (fields["route"], fields["method"], fields["path"], fields["tenant"],
            fields["key"], fields["outcome"], fields["status"], fields["attempt"]) == \
        ("create_payment", "POST", PAY, "default", key, "forwarded", "201", "1")
    for f in ("upstream_ms", "store_ms", "total_ms"):
        assert float(fields[f]) >= 0
    datetime.strptime(lines[0].split(" ")[0], "%Y-%m-%dT%H:%M:%S.%fZ")
    assert not any(l.startswith("{") for l in proxy.log().splitlines())


@pytest.mark.parametrize("fmt", ["json", "text"])
def test_log_level_warn_drops_request_lines(make_proxy, stub, fmt):
    proxy = make_proxy(top={"log_level": "warn", "log_format": fmt})
    key = new_key()
    assert pay(proxy, key).status_code == 201
    assert pay(proxy, key).status_code == 201
    assert pay(proxy, None).status_code == 400
    lost = new_key()
    stub.configure({"prefix": PAY, "key": lost, "action": "reset"})
    assert pay(proxy, lost).status_code == 504
    log = proxy.log()
    assert "upstream outcome unknown" in log    # a warning still gets through
    assert key not in log
    assert request_outcomes(log, fmt) == []
    if fmt == "json":
        levels = {json.loads(l)["level"] for l in log.splitlines() if l.startswith("{")}
        assert levels <= {"warn", "error"} and "warn" in levels, levels
    else:
        assert not re.search(r"^\S+ (info|debug) ", log, re.M), log
        assert re.search(r"^\S+ warn  upstream outcome unknown", log, re.M), log
