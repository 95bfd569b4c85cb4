"""What the store keeps, and for whom: response headers as raw bytes (a
non-UTF-8 header value is recorded and replayed exactly), leases that never
outlive their record (no second attempt while one is alive), the owner token
made by the proxy (a claim repeated after its connection broke carries on as
the same attempt), and store errors that are not outages (never forwarded
unprotected, whatever `database.unavailable` says)."""
import json
import os
import threading
import uuid

import psycopg
import pytest
import requests

from conftest import ADMIN_TOKEN, CITUS, ROOT, run_binary
from helpers import TIMEOUT, assert_problem, is_replay, new_key, raw_request, wait_until
from misbehaving import RawUpstream, Respond
from pg_relay import PgRelay
from store_support import (PAY, HeldRows, insert_record, lock_waits, pay, reaper_pass,
                           undo_migration_008)
from test_ops import scrape

BODY = b'{"amount":100,"currency":"EUR"}'


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


def pay_route(upstream, **settings):
    return [dict({"name": "create_payment", "path": PAY, "upstream": upstream}, **settings)]


def raw_pay(proxy, key):
    return raw_request(proxy.port, "POST", PAY,
                       [("Idempotency-Key", key), ("Content-Type", "application/json")],
                       BODY)


def admin_get(proxy, key):
    return requests.get("%s/admin/keys/default/create_payment/%s" % (proxy.admin_url, key),
                        headers={"Authorization": "Bearer " + ADMIN_TOKEN}, timeout=TIMEOUT)


# --- A2: header bytes that are not UTF-8 ----------------------------------------

@pytest.mark.no_replay_cache
def test_non_utf8_header_value_is_recorded_and_replayed_byte_for_byte(make_proxy, raw, pg):
    location = b"/v1/payments/caf\xe9"
    up = raw(lambda req: Respond(201, body=b'{"id":"p1"}',
                                 headers=[("Content-Type", "application/json"),
                                          ("Location", location.decode("latin-1"))]))
    proxy = make_proxy(routes=pay_route(up.url))
    key = new_key("latin1")
    first = raw_pay(proxy, key)
    assert first.status_code == 201, first.content
    assert first.header("Location").encode("latin-1") == location
    rec = wait_until(lambda: (pg.record(key) or {}).get("state") == "completed" and pg.record(key),
                     what="the record to be completed")
    assert b"Location: " + location + b"\r\n" in bytes(rec["response_headers"])

    again = raw_pay(proxy, key)
    assert again.status_code == 201 and is_replay(again), again.content
    assert again.header("Location").encode("latin-1") == location
    assert again.content == b'{"id":"p1"}'
    assert up.count(key) == 1

    # The admin API still answers valid JSON; bytes that are not UTF-8 come
    # as {"base64": ...}, valid UTF-8 as a string.
    g = admin_get(proxy, key)
    assert g.status_code == 200, g.text
    doc = json.loads(g.content.decode("utf-8"))
    hdrs = dict((n.lower(), v) for n, v in doc["response_headers"])
    assert hdrs["content-type"] == "application/json"
    assert hdrs["location"] == {"base64": "L3YxL3BheW1lbnRzL2NhZuk="}


# --- A3: a lease never outlives its record ------------------------------------

def test_no_second_attempt_while_a_taken_over_attempt_is_alive(make_proxy, raw, pg):
    """lease 1 s, ttl 1.5 s: attempt 1 gets no answer, is taken over once
    its lease ended (attempt 2, which hangs); once the first ttl has passed,
    a third request must still find attempt 2 in flight."""
    gate = threading.Event()

    def handler(req):
        gate.wait(30)
        return Respond(201)

    up = raw(handler)
    short = make_proxy(routes=pay_route(up.url, lease="1s", ttl="1500ms",
                                       upstream_timeout="500ms"))
    # The same route on a second instance with a long lease, so that
    # attempt 2 stays alive well past the first ttl on a slow machine.
    long_lease = make_proxy(routes=pay_route(up.url, lease="20s", ttl="30s",
                                            upstream_timeout="15s"))
    key = new_key("lease")
    answers = []
    threads = []

    def send(p):
        t = threading.Thread(target=lambda: answers.append(pay(p, key, timeout=40)))
        t.start()
        threads.append(t)

    try:
        send(short)
        up.wait_for(1, key=key)
        wait_until(lambda: pg.query("SELECT lease_until <= now() AS dead FROM "
                                    "idempotency_records WHERE idem_key = %s",
                                    (key,))[0]["dead"],
                   what="attempt 1's lease to end")
        send(long_lease)
        up.wait_for(2, key=key)
        rec = pg.record(key)
        assert rec["attempt"] == 2 and rec["state"] == "processing", rec
        wait_until(lambda: pg.query("SELECT now() > created_at + interval '1500 ms' AS past "
                                    "FROM idempotency_records WHERE idem_key = %s",
                                    (key,))[0]["past"],
                   what="the first ttl to pass")
        r = pay(short, key)
        assert_problem(r, 409, "idempotency_key_in_use")
        assert up.count(key) == 2, "a third attempt ran while attempt 2 was alive: %r" % (
            up.seen(key),)
        rec = pg.record(key)
        assert rec["attempt"] == 2 and rec["expires_at"] >= rec["lease_until"], rec
    finally:
        gate.set()
        for t in threads:
            t.join(40)


def test_reaper_never_purges_or_reuses_a_record_with_a_live_lease(make_proxy, stub, pg):
    proxy = make_proxy(top={"reaper": {"interval": "100ms"}})
    key = new_key("live-expired")
    # As a takeover before migration 002 could leave it: lease beyond expiry.
    insert_record(pg, key, lease="now() + interval '1 hour'",
                  expires="now() - interval '1 second'")
    reaper_pass(pg)
    reaper_pass(pg)
    assert pg.record(key) is not None, "the reaper purged a record whose lease is alive"
    r = pay(proxy, key, body={"k": key})
    assert r.status_code in (409, 422), r.content
    assert stub.count(key=key) == 0
    assert pg.record(key)["state"] == "processing"


# --- A4: a claim repeated after its connection broke ---------------------------

# A fresh key's claim is one insert: claim_many when it goes with others
# (database.batch > 1, the default with fiber workers, and a claim already
# with the database), claim_new when it goes alone; a key that exists then
# goes through idem_claim, which finds its own token. A record is
# complete_many or complete likewise.
ALONE_OR_BATCHED = [pytest.param(1, "claim_new", "complete", id="alone"),
                    pytest.param(64, "claim_many", "complete_many", id="batched")]


class Busy:
    """For the batched variants: one request whose claim (claim=True) or
    record waits on its worker's own connection for a row the test holds,
    so that the next of its kind goes to the batch connection. A no-op
    when batch is 1."""

    def __init__(self, proxy, stub, pg, batch, claim):
        self.held = self.thread = None
        if batch == 1:
            return
        key = new_key("busy")
        self.key, self.out = key, []
        self.held = HeldRows(pg)
        if claim:
            self.held.insert(key)
        else:
            stub.configure({"prefix": PAY, "key": key, "gate": "busy"}, append=True)
        self.thread = threading.Thread(target=lambda: self.out.append(pay(proxy, key)))
        self.thread.start()
        if not claim:
            stub.wait_for(key=key)
            self.held.lock(key)
            stub.release("busy")
        wait_until(lambda: lock_waits(pg) == 1, what="the busy request waiting")

    def release(self):
        if self.held is None:
            return
        self.held.release()
        self.thread.join(TIMEOUT)
        assert self.out and self.out[0].status_code == 201


@pytest.mark.no_replay_cache
@pytest.mark.parametrize("batch,claim,_record", ALONE_OR_BATCHED)
def test_claim_repeated_after_its_answer_was_lost_is_the_same_attempt(
        make_proxy, stub, pg, batch, claim, _record):
    relay = PgRelay(pg.cluster.port)
    try:
        proxy = make_proxy(top={"workers": 2,
                                "database": {"url": relay.url(pg.name),
                                             "batch": batch}})
        warm = new_key("warm")
        assert pay(proxy, warm).status_code == 201
        key = new_key("lost-answer")
        busy = Busy(proxy, stub, pg, batch, claim=True)
        relay.arm(claim)
        r = pay(proxy, key)
        busy.release()
        assert relay.tripped == 1, "the relay did not lose the claim's answer"
        assert r.status_code == 201 and not is_replay(r), r.content
        assert stub.count(key=key) == 1
        rec = pg.record(key)
        assert rec["state"] == "completed" and rec["attempt"] == 1, rec
        again = pay(proxy, key)
        assert again.status_code == 201 and is_replay(again)
        assert again.content == r.content
        assert stub.count(key=key) == 1
    finally:
        relay.stop()


@pytest.mark.no_replay_cache
@pytest.mark.parametrize("batch,_claim,record", ALONE_OR_BATCHED)
def test_record_repeated_after_its_answer_was_lost_is_recorded_once(
        make_proxy, stub, pg, batch, _claim, record):
    """The record committed, its answer was lost with the connection: the
    write goes out again on a fresh one, finds the record already completed
    under its own owner token, and counts that as done (not fenced, not
    deferred): the client gets its 201 and every retry the replay."""
    relay = PgRelay(pg.cluster.port)
    try:
        proxy = make_proxy(top={"workers": 2,
                                "database": {"url": relay.url(pg.name),
                                             "batch": batch}})
        assert pay(proxy, new_key("warm")).status_code == 201
        key = new_key("lost-record")
        busy = Busy(proxy, stub, pg, batch, claim=False)
        relay.arm(record)
        r = pay(proxy, key)
        busy.release()
        assert relay.tripped == 1, "the relay did not lose the record's answer"
        assert r.status_code == 201 and not is_replay(r), r.content
        rec = pg.record(key)
        assert rec["state"] == "completed" and rec["attempt"] == 1, rec
        assert rec["response_status"] == 201
        again = pay(proxy, key)
        assert again.status_code == 201 and is_replay(again)
        assert again.content == r.content
        assert stub.count(key=key) == 1
        m = scrape(proxy)
        assert m.value("idemproxy_events_total", event="record_fenced") == 0
        assert m.value("idemproxy_events_total", event="record_deferred") == 0
    finally:
        relay.stop()


# --- A5: a claim repeated with its own token never outlives its lease ----------

SENDS = ("forward", "takeover")


def claim_sql(pg, key, owner, lease_ms):
    """idem_claim as the proxy calls it, for the default tenant's payment."""
    return pg.query("SELECT o_decision AS d, o_attempt AS attempt, o_lease_ms AS lease_ms "
                    "FROM idem_claim(%s, %s, %s, %s, %s, %s, %s, %s)",
                    ("default", "create_payment", key, b"\x01" * 32, lease_ms, 60000,
                     False, owner))[0]


def lease_ended(pg, key):
    rows = pg.query("SELECT lease_until <= now() AS dead FROM idempotency_records "
                    "WHERE idem_key = %s", (key,))
    return bool(rows) and rows[0]["dead"]


def test_own_token_repeat_after_its_lease_ended_renews_it_or_loses_the_key(make_proxy, pg):
    """Before migration 009 the repeat answered forward with a lease of 0
    and wrote nothing; another attempt then took the key over, and both
    believed they owned it."""
    make_proxy(start=False)  # the schema
    key = new_key("own-late")
    mine, other = uuid.uuid4(), uuid.uuid4()
    first = claim_sql(pg, key, mine, 200)
    assert (first["d"], first["lease_ms"]) == ("forward", 200), first
    wait_until(lambda: lease_ended(pg, key), what="the lease to end")
    again = claim_sql(pg, key, mine, 30000)
    then = claim_sql(pg, key, other, 30000)
    assert not (again["d"] in SENDS and then["d"] in SENDS), \
        "two owners of one key: %r then %r" % (again, then)
    # Nobody else had the key: the repeat renewed its lease, under its token.
    assert (again["d"], again["attempt"], again["lease_ms"]) == ("forward", 1, 30000), again
    assert then["d"] == "in_flight", then
    rec = pg.record(key)
    assert rec["owner_token"] == mine and rec["attempt"] == 1, rec
    assert not lease_ended(pg, key)


def test_own_token_repeat_while_its_lease_lives_carries_on_with_what_is_left(make_proxy, pg):
    make_proxy(start=False)
    key = new_key("own-live")
    mine = uuid.uuid4()
    assert claim_sql(pg, key, mine, 30000)["d"] == "forward"
    before = pg.record(key)
    again = claim_sql(pg, key, mine, 30000)
    assert again["d"] == "forward" and again["attempt"] == 1, again
    assert 0 < again["lease_ms"] <= 30000, again
    assert pg.record(key) == before, "a repeat within its lease wrote the record"


def test_own_token_repeat_after_a_takeover_has_lost_the_key(make_proxy, pg):
    make_proxy(start=False)
    key = new_key("own-lost")
    mine, other = uuid.uuid4(), uuid.uuid4()
    assert claim_sql(pg, key, mine, 200)["d"] == "forward"
    wait_until(lambda: lease_ended(pg, key), what="the lease to end")
    taken = claim_sql(pg, key, other, 30000)
    assert (taken["d"], taken["attempt"]) == ("takeover", 2), taken
    again = claim_sql(pg, key, mine, 30000)
    assert again["d"] == "in_flight", again
    assert pg.record(key)["owner_token"] == other


@pytest.mark.no_replay_cache
@pytest.mark.parametrize("batch,claim,_record", ALONE_OR_BATCHED)
def test_claim_answer_held_past_its_lease_is_never_a_second_execution(
        make_proxy, stub, pg, batch, claim, _record):
    """The claim commits, its answer is held until the lease has ended, then
    the connection is cut: the proxy repeats the claim with its token on a
    fresh connection while the client's retry arrives. Before the fix the
    repeat was told "forward" with no lease left and went upstream, the
    retry took the key over and went too: two executions of one key."""
    relay = PgRelay(pg.cluster.port)
    try:
        # Three workers: the busy claim, the first attempt and the retry.
        top = {"workers": 3, "database": {"url": relay.url(pg.name), "batch": batch}}
        proxy = make_proxy(routes=pay_route(stub.url, lease="2s", upstream_timeout="1s"),
                           top=top)
        assert pay(proxy, new_key("warm")).status_code == 201
        key = new_key("late-claim")
        busy = Busy(proxy, stub, pg, batch, claim=True)
        # The first request of the key to reach the upstream waits there.
        stub.configure({"prefix": PAY, "key": key, "gate": "late", "times": 1}, append=True)
        relay.hold("claim" if CITUS else claim, then="cut")
        first, second = [], []
        t1 = threading.Thread(target=lambda: first.append(pay(proxy, key)))
        t1.start()
        wait_until(lambda: relay.held == 1, what="the claim's answer held")
        busy.release()  # (its claim may wait no longer: its lease would end)
        wait_until(lambda: lease_ended(pg, key), what="the lease to end")
        relay.release()
        wait_until(lambda: first or stub.count(key=key) >= 1,
                   what="the first attempt sent upstream or answered")
        t2 = threading.Thread(target=lambda: second.append(pay(proxy, key)))
        t2.start()
        wait_until(lambda: second or pg.record(key)["attempt"] >= 2,
                   what="the retry's claim")
        stub.release("late")
        t1.join(TIMEOUT)
        t2.join(TIMEOUT)
        assert relay.cuts == 1
        assert first and second
        assert stub.count(key=key) == 1, "two executions of one key: %r, %r" % (
            first[0].content, second[0].content)
        again = pay(proxy, key)
        assert again.status_code == 201 and is_replay(again), again.content
        assert stub.count(key=key) == 1
    finally:
        relay.stop()


# --- A6: an attempt sends only with enough lease left for the whole call ------

@pytest.mark.no_replay_cache
def test_claim_answered_with_too_little_lease_left_is_released_unsent(make_proxy, stub, pg):
    """lease 3 s, upstream_timeout 1 s, so a margin of 300 ms: the claim's
    answer is held 2.5 s, which leaves less than 1.3 s of the lease. Before
    the fix the request went upstream anyway, with a call that could end
    after the lease (when a retry may take the key over)."""
    relay = PgRelay(pg.cluster.port)
    try:
        proxy = make_proxy(routes=pay_route(stub.url, lease="3s", upstream_timeout="1s"),
                           top={"workers": 2, "database": {"url": relay.url(pg.name),
                                                           "batch": 1}})
        assert pay(proxy, new_key("warm")).status_code == 201
        key = new_key("late-answer")
        relay.hold("claim" if CITUS else "claim_new", seconds=2.5)
        r = pay(proxy, key)
        assert relay.held == 1 and relay.cuts == 0
        assert stub.count(key=key) == 0, "sent upstream with too little of its lease left"
        assert_problem(r, 503, "idempotency_lease_expired")
        assert int(r.headers["Retry-After"]) >= 1
        rec = pg.record(key)
        assert rec["state"] == "released" and rec["attempt"] == 1, rec
        assert scrape(proxy).value("idemproxy_events_total", event="lease_expired") == 1
        again = pay(proxy, key)
        assert again.status_code == 201 and not is_replay(again), again.content
        assert stub.count(key=key) == 1
        assert pg.record(key)["attempt"] == 2
        assert is_replay(pay(proxy, key)) and stub.count(key=key) == 1
    finally:
        relay.stop()


@pytest.mark.parametrize("lease,timeout,margin", [
    ("10s", "9500ms", "1s"),     # a tenth of the lease
    ("1s", "950ms", "100ms"),    # at least 100 ms
    ("1m", "59s", "2s"),         # at most 2 s
])
def test_check_refuses_a_lease_without_room_for_the_call_and_its_margin(
        make_proxy, lease, timeout, margin):
    p = make_proxy(migrate=False, start=False,
                   routes=pay_route("http://127.0.0.1:9", lease=lease,
                                    upstream_timeout=timeout),
                   top={"database": {"url": "postgresql://nobody@127.0.0.1:1/nothing"}})
    r = run_binary(["-c", p.conf_path, "--check"])
    out = r.stdout + r.stderr
    assert r.returncode == 1, out
    assert ("lease (%s) must be longer than upstream_timeout (%s) plus the lease "
            "margin (%s" % (lease, timeout, margin)) in out, out


# --- D26: an SQL error is not an outage -----------------------------------------

FAILURES = {
    "serialization_failure": "RAISE EXCEPTION 'idem_claim: key kept changing' "
                             "USING ERRCODE = '40001';",
    "statement_timeout": "PERFORM pg_sleep(30);",
    "other_error": "RAISE EXCEPTION 'boom';",
}


def break_idem_claim(pg, body):
    """Makes every claim run body: idem_claim (whatever its arguments) is
    replaced, and on a plain store a trigger runs it before any insert of a
    record (a fresh key's claim is a plain insert there; on Citus, which has
    no triggers on distributed tables, the claim is idem_claim alone)."""
    if not CITUS:
        pg.execute("CREATE FUNCTION break_claim() RETURNS trigger LANGUAGE plpgsql "
                   "AS $f$ BEGIN %s RETURN NEW; END $f$" % body)
        pg.execute("CREATE TRIGGER break_claim BEFORE INSERT ON idempotency_records "
                   "FOR EACH ROW EXECUTE FUNCTION break_claim()")
    rows = pg.query("SELECT pg_get_function_identity_arguments(oid) AS args, "
                    "pg_get_function_result(oid) AS result FROM pg_proc "
                    "WHERE proname = 'idem_claim'")
    # The one the proxy calls, and 009's and 012's, which earlier versions
    # called (kept for rolling upgrades).
    assert len(rows) == 3, rows
    for row in rows:
        pg.execute("CREATE OR REPLACE FUNCTION idem_claim(%s) RETURNS %s LANGUAGE plpgsql "
                   "VOLATILE AS $f$ BEGIN %s END $f$" % (row["args"], row["result"], body))


@pytest.mark.parametrize("failure", sorted(FAILURES))
def test_store_error_on_a_working_connection_is_never_forwarded(make_proxy, stub, pg,
                                                                failure):
    proxy = make_proxy(top={"workers": 1, "database": {
        "url": pg.url, "unavailable": "forward", "statement_timeout": "300ms"}})
    assert pay(proxy, new_key("before")).status_code == 201
    seen = stub.count()
    break_idem_claim(pg, FAILURES[failure])
    key = new_key("sqlerr")
    r = pay(proxy, key)
    assert_problem(r, 503, "idempotency_store_unavailable")
    assert stub.count() == seen, "forwarded unprotected: %r" % (stub.requests()[seen:],)
    assert stub.count(key=key) == 0


# --- migration 002 on a database that has records -------------------------------

@pytest.mark.no_replay_cache
def test_migration_002_converts_existing_records(make_proxy, stub, pg):
    """A database at schema version 1 with a completed record (text headers)
    and a taken-over one whose lease outlives its expiry: after --migrate,
    the first replays with the same header bytes, the second is repaired."""
    with open(os.path.join(ROOT, "sql", "001_records.sql")) as f:
        pg.execute(f.read())
    pg.execute("CREATE TABLE schema_migrations (version integer PRIMARY KEY, "
               "name text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())")
    pg.execute("INSERT INTO schema_migrations (version, name) VALUES (1, '001_records')")
    old = new_key("old")
    taken = new_key("taken")
    insert_record(pg, taken, lease="now() + interval '2 hours'",
                  expires="now() + interval '1 hour'")
    pg.execute("INSERT INTO idempotency_records (tenant, operation, idem_key, request_hash, "
               "state, owner_token, attempt, response_status, response_headers, "
               "response_body, replayable, expires_at) VALUES ('default', 'create_payment', "
               "%s, '\\x00'::bytea, 'completed', gen_random_uuid(), 1, 201, "
               "E'Content-Type: application/json\\r\\nLocation: /v1/payments/caf\\u00e9\\r\\n', "
               "'{\"id\":\"old\"}'::bytea, true, now() + interval '1 hour')", (old,))
    conf = make_proxy(migrate=False, start=False)
    r = run_binary(["-c", conf.conf_path, "--migrate"], env=conf.env)
    assert r.returncode == 0, r.stdout + r.stderr
    rec_headers = pg.record(old)["response_headers"]
    assert bytes(rec_headers) == (
        b"Content-Type: application/json\r\nLocation: /v1/payments/caf\xc3\xa9\r\n")
    rec = pg.record(taken)
    assert rec["expires_at"] >= rec["lease_until"], rec
    # The new idem_claim replays it with those bytes.
    got = pg.query("SELECT o_decision, o_headers FROM idem_claim('default', 'create_payment', "
                   "%s, '\\x00'::bytea, 1000, 60000, false, gen_random_uuid())", (old,))
    assert len(got) == 1 and got[0]["o_decision"] == "replay", got
    assert bytes(got[0]["o_headers"]) == bytes(rec_headers)
    assert stub.count() == 0


# --- a fresh key's claim is one plain insert ------------------------------------

@pytest.mark.no_replay_cache
def test_fresh_key_is_claimed_without_calling_idem_claim(make_proxy, stub, pg):
    """A first attempt's claim is the claim_new insert; idem_claim runs only
    for a key that exists (here: a repeat, replayed from the store)."""
    pg.execute("ALTER DATABASE %s SET track_functions = 'pl'" % pg.name)
    proxy = make_proxy(top={"workers": 1})
    keys = [new_key("fresh%d" % i) for i in range(4)]
    for key in keys:
        r = pay(proxy, key)
        assert r.status_code == 201 and not is_replay(r)
    again = pay(proxy, keys[0])
    assert again.status_code == 201 and is_replay(again)
    assert [stub.count(key=k) for k in keys] == [1, 1, 1, 1]

    # A backend reports its function calls when it ends (otherwise when it
    # has been idle for up to ten seconds).
    assert proxy.stop() == 0
    wait_until(lambda: pg.query("SELECT count(*) AS n FROM pg_stat_activity "
                                "WHERE datname = current_database() "
                                "AND application_name = 'idemproxy'")[0]["n"] == 0,
               what="the proxy's backends gone")
    pg.execute("SELECT pg_stat_clear_snapshot()")
    calls = pg.query("SELECT coalesce(sum(calls), 0)::int AS n FROM "
                     "pg_stat_user_functions WHERE funcname = 'idem_claim'")[0]["n"]
    assert calls == 1, "fresh keys went through idem_claim (%d calls)" % calls


# --- the state's three values: a domain, not a table constraint ----------------

def test_a_state_outside_the_three_is_refused(make_proxy, stub, pg):
    """The state column is the idem_state domain: a write of any other value
    fails, whether a new row or a change of one (the table itself has no
    CHECK constraint, which PostgreSQL would rebuild from its text at the
    start of every claim and every record)."""
    proxy = make_proxy()
    key = new_key("state")
    assert pay(proxy, key).status_code == 201
    rows = pg.query("SELECT format_type(atttypid, atttypmod) AS t FROM pg_attribute "
                    "WHERE attrelid = 'idempotency_records'::regclass AND attname = 'state'")
    assert rows == [{"t": "idem_state"}], rows
    checks = pg.query("SELECT conname FROM pg_constraint WHERE contype = 'c' "
                      "AND conrelid = 'idempotency_records'::regclass")
    assert checks == [], checks
    with pytest.raises(psycopg.errors.CheckViolation):
        pg.execute("UPDATE idempotency_records SET state = 'done' WHERE idem_key = %s",
                   (key,))
    pg.close()
    with pytest.raises(psycopg.errors.CheckViolation):
        insert_record(pg, new_key("bogus"), state="Processing")
    pg.close()
    assert pg.record(key)["state"] == "completed"
    again = pay(proxy, key)
    assert again.status_code == 201 and is_replay(again)
    assert stub.count(key=key) == 1


def _store_at_version_7(make_proxy, pg):
    """The store as migration 007 left it: migrated by the proxy, then 008
    undone (the state back to text with the table's CHECK constraint)."""
    conf = make_proxy(start=False)
    undo_migration_008(pg)
    return conf


@pytest.mark.no_replay_cache
def test_migration_008_makes_the_state_a_domain_without_rewriting_the_records(
        make_proxy, stub, pg):
    """A store at schema version 7 with a completed, a released and an
    in-flight record: after --migrate the table is the same file (nothing
    rewritten), its CHECK constraint is gone, the state is the domain, and
    each record's claim answers as before: a replay, in flight, a takeover."""
    conf = _store_at_version_7(make_proxy, pg)
    done, released, busy = new_key("done"), new_key("released"), new_key("busy")
    insert_record(pg, done, state="completed", lease=None, status=201,
                  body=b'{"id":"old"}')
    insert_record(pg, released, state="released", lease=None)
    insert_record(pg, busy)
    file_before = pg.query("SELECT pg_relation_filenode('idempotency_records') AS f")[0]["f"]
    r = run_binary(["-c", conf.conf_path, "--migrate"], env=conf.env)
    assert r.returncode == 0, r.stdout + r.stderr
    pg.close()
    assert pg.query("SELECT pg_relation_filenode('idempotency_records') AS f")[0]["f"] \
        == file_before, "migration 008 rewrote the table"
    assert pg.query("SELECT conname FROM pg_constraint WHERE contype = 'c' "
                    "AND conrelid = 'idempotency_records'::regclass") == []
    assert pg.query("SELECT format_type(atttypid, atttypmod) AS t FROM pg_attribute "
                    "WHERE attrelid = 'idempotency_records'::regclass "
                    "AND attname = 'state'") == [{"t": "idem_state"}]
    # Each record answers as before (the claim of a key that exists).
    def claim(key):
        got = pg.query("SELECT o_decision, o_body FROM idem_claim('default', "
                       "'create_payment', %s, sha256(%s::bytea), 1000, 60000, false, "
                       "gen_random_uuid())", (key, key.encode()))
        assert len(got) == 1, got
        return got[0]["o_decision"], got[0]["o_body"]

    assert claim(done) == ("replay", b'{"id":"old"}')
    assert claim(busy)[0] == "in_flight"
    assert claim(released)[0] == "takeover"
    assert pg.record(released)["state"] == "processing"
    assert stub.count() == 0
    with pytest.raises(psycopg.errors.CheckViolation):
        pg.execute("UPDATE idempotency_records SET state = 'gone' WHERE idem_key = %s",
                   (released,))
