"""First attempts claimed and recorded together (database.batch,
src/store_batch.c): what arrives while a statement of its kind is with the
database goes out as one statement, and every request still gets exactly
what it would have got alone.

The tests make batches deterministic with a transaction of their own that
holds rows: the first claim (or record) goes alone on its worker's
connection and waits for a held row; the next goes to the batch connection
and waits too; everything after it queues (idemproxy_store_batch_queued),
and goes out as one statement when the test lets go."""
import threading

import pytest

from conftest import CITUS
from helpers import TIMEOUT, assert_problem, is_replay, new_key, wait_until
from store_support import PAY, HeldRows, lock_waits, pay
from test_ops import scrape

pytestmark = pytest.mark.skipif(
    CITUS, reason="on Citus a claim is the tenant's delegated call, never batched")

FIBERS = {"workers": 16}


def fibers(pg, **database):
    """FIBERS, with calls left to wait behind a held batch for as long as a
    test holds it (database.batch_stall: normally they stop waiting once
    it has been out 250 ms; test_store_waits.py covers that)."""
    return dict(FIBERS, database=dict({"url": pg.url, "batch_stall": "1h"}, **database))


def queued(proxy, kind):
    return scrape(proxy).value("idemproxy_store_batch_queued", kind=kind)


def batched(proxy, kind):
    """(statements, attempts they carried) of this kind so far."""
    m = scrape(proxy)
    return (m.value("idemproxy_store_batches_total", kind=kind),
            m.value("idemproxy_store_batched_total", kind=kind))


class Requests:
    """Requests sent from threads; .answers[key] lists each one's answer."""

    def __init__(self):
        self.threads = []
        self.answers = {}
        self.lock = threading.Lock()

    def send(self, proxy, key, **kw):
        def run():
            r = pay(proxy, key, **kw)
            with self.lock:
                self.answers.setdefault(key, []).append(r)
        t = threading.Thread(target=run)
        t.start()
        self.threads.append(t)

    def join(self):
        for t in self.threads:
            t.join(TIMEOUT + 5)
            assert not t.is_alive(), "a request did not finish"


def claims_queued_behind_held_rows(proxy, pg, reqs, keys):
    """Sends two requests whose claims wait for held rows (one alone, one
    as the batch connection's statement), then one request per key of
    keys, whose claims queue behind them. Returns the HeldRows."""
    held = HeldRows(pg)
    first, second = new_key("held-alone"), new_key("held-batch")
    held.insert(first)
    held.insert(second)
    reqs.send(proxy, first)
    wait_until(lambda: lock_waits(pg) == 1, what="the first claim waiting")
    reqs.send(proxy, second)
    wait_until(lambda: lock_waits(pg) == 2, what="the batch's claim waiting")
    for k in keys:
        reqs.send(proxy, k)
    wait_until(lambda: queued(proxy, "claim") == len(keys),
               what="%d claims queued" % len(keys))
    return held, [first, second]


def test_fresh_keys_that_arrive_together_are_claimed_in_one_statement(
        make_proxy, stub, pg):
    proxy = make_proxy(top=fibers(pg))
    reqs = Requests()
    keys = [new_key("together") for _ in range(6)]
    held, waited = claims_queued_behind_held_rows(proxy, pg, reqs, keys)
    stmts0, carried0 = batched(proxy, "claim")
    held.release()
    reqs.join()
    for k in keys + waited:
        (r,) = reqs.answers[k]
        assert r.status_code == 201 and not is_replay(r), (k, r.content)
        assert stub.count(key=k) == 1, k
        assert pg.record(k)["state"] == "completed", k
    stmts, carried = batched(proxy, "claim")
    # The held one's statement, then one for the six that queued.
    assert (stmts - stmts0, carried - carried0) == (2, 7)
    assert queued(proxy, "claim") == 0


def test_the_same_key_twice_in_one_batch_is_forwarded_once(make_proxy, stub, pg):
    proxy = make_proxy(top=fibers(pg))
    reqs = Requests()
    dup = new_key("dup")
    others = [new_key("other") for _ in range(3)]
    held, _ = claims_queued_behind_held_rows(proxy, pg, reqs,
                                             others + [dup, dup, dup])
    held.release()
    reqs.join()
    answers = reqs.answers[dup]
    fresh = [r for r in answers if r.status_code == 201 and not is_replay(r)]
    assert len(fresh) == 1, [(r.status_code, r.content) for r in answers]
    for r in answers:
        if r is fresh[0]:
            continue
        if r.status_code == 201:
            assert is_replay(r) and r.content == fresh[0].content
        else:
            assert_problem(r, 409, "idempotency_key_in_use")
    assert stub.count(key=dup) == 1
    for k in others:
        (r,) = reqs.answers[k]
        assert r.status_code == 201 and stub.count(key=k) == 1


def refuse_keys(pg, event, prefix):
    """A trigger that fails any insert (or update) of a record whose key
    starts with prefix: an element the database refuses."""
    pg.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS "
               "$$BEGIN RAISE EXCEPTION 'refused: %', NEW.idem_key; END$$")
    pg.execute("CREATE TRIGGER refuse BEFORE %s ON idempotency_records FOR EACH ROW "
               "WHEN (NEW.idem_key LIKE '%s%%') EXECUTE FUNCTION refuse()"
               % (event, prefix))


def test_a_claim_the_database_refuses_fails_only_its_own_request(
        make_proxy, stub, pg):
    proxy = make_proxy(top=fibers(pg))
    refuse_keys(pg, "INSERT", "refused-")
    reqs = Requests()
    bad = new_key("refused")
    good = [new_key("good") for _ in range(5)]
    held, waited = claims_queued_behind_held_rows(proxy, pg, reqs, good + [bad])
    failed0 = scrape(proxy).value("idemproxy_events_total", event="store_batch_failed")
    held.release()
    reqs.join()
    # Refused as one statement, then each alone: only the refused one fails.
    (r,) = reqs.answers[bad]
    assert_problem(r, 503, "idempotency_store_unavailable")
    assert stub.count(key=bad) == 0 and pg.record(bad) is None
    for k in good + waited:
        (r,) = reqs.answers[k]
        assert r.status_code == 201 and not is_replay(r), (k, r.content)
        assert stub.count(key=k) == 1
        assert pg.record(k)["state"] == "completed"
    m = scrape(proxy)
    assert m.value("idemproxy_events_total", event="store_batch_failed") - failed0 == 1


def records_queued_behind_held_rows(proxy, stub, pg, reqs, keys):
    """Two requests whose records wait for rows the test locks (one alone,
    one as the batch connection's statement), then one request per key of
    keys, whose records queue behind them. Returns the HeldRows and the two
    held keys."""
    first, second = new_key("held-alone"), new_key("held-batch")
    stub.configure({"prefix": PAY, "key": first, "gate": "held"},
                   {"prefix": PAY, "key": second, "gate": "held"})
    reqs.send(proxy, first)
    reqs.send(proxy, second)
    stub.wait_for(key=first)
    stub.wait_for(key=second)
    held = HeldRows(pg)
    held.lock(first, second)
    stub.release("held")
    wait_until(lambda: lock_waits(pg) == 2, what="both records waiting")
    for k in keys:
        reqs.send(proxy, k)
    wait_until(lambda: queued(proxy, "record") == len(keys),
               what="%d records queued" % len(keys))
    return held, [first, second]


def test_answers_that_arrive_together_are_recorded_in_one_statement(
        make_proxy, stub, pg):
    proxy = make_proxy(top=fibers(pg))
    reqs = Requests()
    keys = [new_key("together") for _ in range(6)]
    held, waited = records_queued_behind_held_rows(proxy, stub, pg, reqs, keys)
    stmts0, carried0 = batched(proxy, "record")
    held.release()
    reqs.join()
    for k in keys + waited:
        (r,) = reqs.answers[k]
        assert r.status_code == 201 and not is_replay(r), (k, r.content)
        rec = pg.record(k)
        assert rec["state"] == "completed" and rec["response_status"] == 201, k
        again = pay(proxy, k)
        assert is_replay(again) and again.content == r.content
        assert stub.count(key=k) == 1
    stmts, carried = batched(proxy, "record")
    assert (stmts - stmts0, carried - carried0) == (2, 7)


def test_a_record_the_database_refuses_fails_only_its_own(make_proxy, stub, pg):
    proxy = make_proxy(top=fibers(pg))
    refuse_keys(pg, "UPDATE", "refused-")
    reqs = Requests()
    bad = new_key("refused")
    good = [new_key("good") for _ in range(5)]
    held, waited = records_queued_behind_held_rows(proxy, stub, pg, reqs,
                                                   good + [bad])
    failed0 = scrape(proxy).value("idemproxy_events_total", event="store_batch_failed")
    held.release()
    for k in good + waited:
        wait_until(lambda k=k: k in reqs.answers, what="the answer for " + k)
        (r,) = reqs.answers[k]
        assert r.status_code == 201 and stub.count(key=k) == 1
        assert pg.record(k)["state"] == "completed"
    wait_until(lambda: "trying again while the client waits" in proxy.log(),
               what="the refused record to be tried again")
    # Its record could not be written: its client waits while the worker
    # tries again, and is answered once the database takes it.
    assert bad not in reqs.answers, reqs.answers[bad][0].content
    assert pg.record(bad)["state"] == "processing"
    pg.execute("DROP TRIGGER refuse ON idempotency_records")
    reqs.join()
    (r,) = reqs.answers[bad]
    assert r.status_code == 201 and stub.count(key=bad) == 1
    assert pg.record(bad)["state"] == "completed"
    m = scrape(proxy)
    assert m.value("idemproxy_events_total", event="store_batch_failed") - failed0 == 1
    assert m.value("idemproxy_events_total", event="record_deferred") == 0
    assert m.value("idemproxy_events_total", event="record_retried") == 1


def fire(proxy, n, threads=16):
    """n fresh keys from `threads` clients at once; all must be 201."""
    keys = [new_key("load") for _ in range(n)]
    bad = []

    def run(chunk):
        for k in chunk:
            r = pay(proxy, k)
            if r.status_code != 201:
                bad.append((k, r.status_code, r.content))
    ts = [threading.Thread(target=run, args=(keys[i::threads],))
          for i in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(120)
    assert not bad, bad[:3]
    return keys


def idemproxy_backends(pg):
    return pg.query("SELECT count(*) AS n FROM pg_stat_activity "
                    "WHERE datname = current_database() "
                    "AND application_name = 'idemproxy'")[0]["n"]


def test_batched_records_find_their_rows_by_key_however_large_the_table_grew(
        make_proxy, stub, pg):
    """complete_many joins its arrays to the table; a plan cached while the
    table was small would scan the whole table for every batch once it is
    large. On the batch connection only the per-element index lookup is
    left to choose (whole-table scans and the joins that need them priced
    out), whatever the table held when the plan was made: no batch reads
    the table through."""
    proxy = make_proxy(top=fibers(pg))
    fire(proxy, 200)
    stmts0 = batched(proxy, "record")[0]
    assert stmts0 >= 10, "too few batches to have cached a plan"
    bulk = 40000
    pg.execute("INSERT INTO idempotency_records (tenant, operation, idem_key, "
               "request_hash, state, owner_token, expires_at) "
               "SELECT 'default', 'create_payment', 'bulk-' || g, '\\x00', "
               "'completed', gen_random_uuid(), now() + interval '1 hour' "
               "FROM generate_series(1, %d) g" % bulk)

    def seq_read():
        return pg.query("SELECT seq_tup_read AS n FROM pg_stat_user_tables "
                        "WHERE relname = 'idempotency_records'")[0]["n"]
    before = seq_read()
    keys = fire(proxy, 300)
    assert batched(proxy, "record")[0] - stmts0 >= 10, "too few batches to tell"
    # Backends report their statistics when they end (otherwise up to
    # seconds later).
    assert proxy.stop() == 0
    wait_until(lambda: idemproxy_backends(pg) == 0, what="the backends gone")
    read = seq_read() - before
    assert read < bulk, "batches read %d rows in sequential scans" % read
    for k in keys:
        assert stub.count(key=k) == 1


def test_with_batch_1_every_first_attempt_goes_alone(make_proxy, stub, pg):
    proxy = make_proxy(top=fibers(pg, batch=1))
    keys = fire(proxy, 100)
    assert batched(proxy, "claim") == (0, 0)
    assert batched(proxy, "record") == (0, 0)
    for k in keys:
        assert stub.count(key=k) == 1
