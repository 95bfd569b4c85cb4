import pytest
"""The reaper (SPEC 4): it releases processing records whose lease ended
unless they are held, deletes expired records in batches without waiting
for rows someone else has locked, keeps the processing gauges current, and
never touches a live attempt. And a proxy killed while an attempt is
upstream: after a restart the key stays in use for the rest of the dead
attempt's lease, then the retry takes it over (3.2, 3.4)."""
from concurrent.futures import ThreadPoolExecutor

import psycopg
import requests

from conftest import CITUS
from helpers import TIMEOUT, assert_problem, assert_retry_after, is_replay, new_key, wait_until
from store_support import (PAY, insert_record, metric, metrics, pay, reaper_pass, row_version,
                           wait_state)

FAST_REAPER = {"reaper": {"interval": "200ms"}}


def released_total(proxy):
    return metric(proxy, "idemproxy_reaper_released_total")


@pytest.mark.no_replay_cache
def test_reaper_releases_records_whose_lease_ended(make_proxy, stub, pg):
    proxy = make_proxy(top=FAST_REAPER)
    # a record left by a real attempt, its lease then ended
    key = new_key()
    r1 = pay(proxy, key)
    assert r1.status_code == 201
    assert pg.execute("UPDATE idempotency_records SET state = 'processing', lease_until = "
                      "now() - interval '1 second', response_status = NULL, "
                      "response_headers = NULL, response_body = NULL, replayable = NULL "
                      "WHERE idem_key = %s", (key,)) == 1
    rec = wait_state(pg, key, "released")
    assert rec["attempt"] == 1 and rec["lease_until"] is None
    # The walk of ended leases has passed that lease. Rows whose lease
    # ended before it, written after: a claim whose commit waited longer
    # than its lease, or rows written by hand. The reaper releases them too.
    others = [new_key("sql") for _ in range(3)]
    for k in others:
        insert_record(pg, k, lease="now() - interval '1 minute'")

    for k in others:
        rec = wait_state(pg, k, "released")
        assert rec["attempt"] == 1
        assert rec["lease_until"] is None
    wait_until(lambda: released_total(proxy) >= 4, what="idemproxy_reaper_released_total >= 4")

    r2 = pay(proxy, key)
    assert r2.status_code == 201 and not is_replay(r2)
    assert stub.count(key=key) == 2
    rec = pg.record(key)
    assert rec["state"] == "completed"
    assert rec["attempt"] == 2


def test_the_walk_gets_past_more_ended_leases_than_a_batch_at_one_instant(make_proxy, stub, pg):
    """Completed records keep the end of their last lease, the walk's
    index. More of them than a batch at one instant (an operator's UPDATE)
    must not stop the walk there: the processing record after them is
    released within a few passes."""
    batch = 5
    proxy = make_proxy(top={"reaper": {"interval": "200ms", "batch": batch}}, start=False)
    # Released rows (out of the walk's index) before the rest fill 200
    # pages: the sweep that also reads the table (batch / 10 pages, one page
    # a pass here) reaches the last rows only after 40 s.
    assert pg.execute(
        "INSERT INTO idempotency_records (tenant, operation, idem_key, request_hash, state, "
        "owner_token, attempt, created_at, updated_at, expires_at) "
        "SELECT 'default', 'create_payment', 'fill-' || i, sha256(i::text::bytea), 'released', "
        "gen_random_uuid(), 1, now(), now(), now() + interval '1 hour' "
        "FROM generate_series(1, 8000) i") == 8000
    if not CITUS:  # (the shards each hold a part)
        assert pg.query("SELECT pg_relation_size('idempotency_records') / 8192 AS n")[0]["n"] >= 200
    same = [new_key("same") for _ in range(3 * batch)]
    for k in same:
        insert_record(pg, k, state="completed", status=201, body=b"{}")
    later = new_key("later")
    insert_record(pg, later)
    assert pg.execute("UPDATE idempotency_records SET lease_until = "
                      "date_trunc('second', now()) - interval '1 minute' "
                      "WHERE idem_key = ANY (%s)", (same,)) == len(same)
    assert pg.execute("UPDATE idempotency_records SET lease_until = now() - interval '1 second' "
                      "WHERE idem_key = %s", (later,)) == 1
    proxy.start()
    wait_state(pg, later, "released")
    assert all(pg.record(k)["state"] == "completed" for k in same)


def test_reaper_honours_hold(make_proxy, stub, pg):
    proxy = make_proxy(top=FAST_REAPER)
    held = new_key("held")
    insert_record(pg, held, lease="now() - interval '1 minute'", hold=True)
    before = row_version(pg, held)
    for _ in range(3):
        reaper_pass(pg)
    rec = pg.record(held)
    assert rec["state"] == "processing"
    assert rec["hold_on_unknown"] is True
    assert row_version(pg, held) == before
    # the canaries, not the held record; counted once each pass has ended
    wait_until(lambda: released_total(proxy) >= 3, what="idemproxy_reaper_released_total >= 3")


def test_reaper_purges_expired_records_in_batches(make_proxy, stub, pg):
    proxy = make_proxy(top={"reaper": {"interval": "200ms", "batch": 1000}}, start=False)
    # Every DELETE statement on the table logs how many rows it removed.
    # (bigserial, a count into a variable: the forms Citus runs on a worker)
    pg.execute("CREATE TABLE purge_log (id bigserial PRIMARY KEY, n integer NOT NULL)")
    if CITUS:
        # The DELETEs run on the workers' shards: the trigger goes on each
        # shard and logs into a table every node can write.
        pg.execute("SELECT create_reference_table('purge_log')")
        pg.execute("SET citus.enable_unsafe_triggers = on")
    pg.execute("CREATE FUNCTION log_purge() RETURNS trigger LANGUAGE plpgsql AS $$ "
               "DECLARE k integer; BEGIN SELECT count(*) INTO k FROM gone; "
               "IF k > 0 THEN INSERT INTO purge_log (n) VALUES (k); END IF; "
               "RETURN NULL; END $$")
    pg.execute("CREATE TRIGGER log_purge AFTER DELETE ON idempotency_records "
               "REFERENCING OLD TABLE AS gone FOR EACH STATEMENT EXECUTE FUNCTION log_purge()")
    pg.execute("INSERT INTO idempotency_records (tenant, operation, idem_key, request_hash, "
               "state, owner_token, attempt, response_status, response_headers, response_body, "
               "replayable, created_at, updated_at, expires_at) "
               "SELECT 'default', 'create_payment', 'old-' || g, sha256(g::text::bytea), "
               "'completed', gen_random_uuid(), 1, 201, '', '{}'::bytea, true, "
               "now() - interval '2 days', now() - interval '2 days', "
               "now() - interval '1 minute' FROM generate_series(1, 2500) g")
    live = new_key("live")
    insert_record(pg, live, state="completed", lease=None, status=201, body=b"{}")
    live_before = row_version(pg, live)

    # Another session holds ten expired rows: the reaper skips them.
    locker = psycopg.connect(pg.url)
    try:
        locked = locker.execute("SELECT idem_key FROM idempotency_records "
                                "WHERE tenant = 'default' AND idem_key IN "
                                "('old-1', 'old-500', 'old-1000', 'old-1001', 'old-1500', "
                                "'old-2000', 'old-2001', 'old-2200', 'old-2499', 'old-2500') "
                                "FOR UPDATE").fetchall()
        assert len(locked) == 10
        proxy.start()
        try:
            wait_until(lambda: pg.query("SELECT count(*) AS n FROM idempotency_records "
                                        "WHERE idem_key LIKE 'old-%'")[0]["n"] == 10,
                       timeout=20, what="the unlocked expired rows to be purged")
        finally:
            locker.rollback()
        wait_until(lambda: pg.query("SELECT count(*) AS n FROM idempotency_records "
                                    "WHERE idem_key LIKE 'old-%'")[0]["n"] == 0,
                   timeout=20, what="the formerly locked rows to be purged")
        wait_until(lambda: metric(proxy, "idemproxy_reaper_purged_total") == 2500,
                   timeout=20, what="idemproxy_reaper_purged_total == 2500")

        batches = [row["n"] for row in pg.query("SELECT n FROM purge_log ORDER BY id")
                   if row["n"] > 0]
        assert sum(batches) == 2500, batches
        assert max(batches) <= 1000, batches
        assert len(batches) >= 4, batches  # 2490 in batches of 1000, then the 10
        assert pg.record(live)["state"] == "completed"
        assert row_version(pg, live) == live_before
    finally:
        locker.close()
        assert proxy.stop() == 0, proxy.log()[-4000:]


def test_reaper_keeps_processing_gauges_current(make_proxy, stub, pg):
    proxy = make_proxy(top=FAST_REAPER)
    old, newer = new_key("old"), new_key("newer")
    insert_record(pg, old, age="interval '100 seconds'")
    insert_record(pg, newer, age="interval '40 seconds'")

    def gauges():
        m = metrics(proxy)
        return (m["idemproxy_processing_records"],
                m["idemproxy_oldest_processing_age_seconds"])

    wait_until(lambda: gauges()[0] == 2, what="idemproxy_processing_records == 2")
    count, age = gauges()
    assert count == 2
    assert 100 <= age < 3600, age

    assert pg.execute("UPDATE idempotency_records SET state = 'completed', lease_until = NULL "
                      "WHERE idem_key = %s", (old,)) == 1
    wait_until(lambda: gauges()[0] == 1, what="idemproxy_processing_records == 1")
    count, age = gauges()
    assert 40 <= age < 100, age

    assert pg.execute("DELETE FROM idempotency_records WHERE idem_key = %s", (newer,)) == 1
    wait_until(lambda: gauges() == (0, 0), what="the gauges to drop to 0")


def test_a_held_record_behind_the_walk_is_counted_not_released(make_proxy, stub, pg):
    proxy = make_proxy(top=FAST_REAPER)
    ended = new_key("ended")
    insert_record(pg, ended, lease="now() - interval '1 second'")
    wait_state(pg, ended, "released")
    # behind the walk's place: only the sweep of the table meets it
    held = new_key("held")
    insert_record(pg, held, lease="now() - interval '1 minute'", hold=True,
                  age="interval '90 seconds'")
    before = row_version(pg, held)
    wait_until(lambda: metrics(proxy)["idemproxy_processing_records"] == 1,
               what="idemproxy_processing_records == 1")
    assert metrics(proxy)["idemproxy_oldest_processing_age_seconds"] >= 90
    rec = pg.record(held)
    assert rec["state"] == "processing" and rec["hold_on_unknown"] is True
    assert row_version(pg, held) == before


def test_reaper_never_touches_a_live_attempt(make_proxy, stub, pg):
    proxy = make_proxy(top=FAST_REAPER)
    key = new_key()
    stub.configure({"key": key, "gate": "live"})
    with ThreadPoolExecutor(1) as ex:
        try:
            first = ex.submit(pay, proxy, key)
            stub.wait_for(1, key=key)
            before = pg.record(key)
            version = row_version(pg, key)
            assert before["state"] == "processing"
            for _ in range(3):
                reaper_pass(pg)
            assert pg.record(key) == before
            assert row_version(pg, key) == version
            assert_problem(pay(proxy, key), 409, "idempotency_key_in_use")
        finally:
            stub.release("live")
        r1 = first.result(TIMEOUT)
    assert r1.status_code == 201 and not is_replay(r1)
    rec = pg.record(key)
    assert rec["state"] == "completed"
    assert rec["attempt"] == 1
    assert rec["owner_token"] == before["owner_token"]
    assert stub.count(key=key) == 1


def test_crash_while_upstream_then_restart(make_proxy, stub, pg):
    """SIGKILL while an attempt is upstream: its outcome is unknown. The
    restarted proxy keeps the key in use for the rest of the dead attempt's
    lease, then forwards the retry (release_after_lease: the upstream sees
    the key twice, which it can deduplicate since the key is the same).
    The lease outlasts a restart of the proxy under ASan on a loaded
    machine, so the retry inside it is always made."""
    routes = [{"name": "create_payment", "path": PAY, "upstream": stub.url,
               "lease": "8s", "upstream_timeout": "2s"}]
    first_proxy = make_proxy(routes=routes)
    key = new_key()
    stub.configure({"key": key, "gate": "crash", "times": 1})
    with ThreadPoolExecutor(1) as ex:
        lost = ex.submit(pay, first_proxy, key)
        try:
            stub.wait_for(1, key=key)
            first_proxy.proc.kill()
            first_proxy.proc.wait(10)
            first_proxy.acknowledged_exit = True
        finally:
            stub.release("crash")
        try:
            lost.result(TIMEOUT)
            raise AssertionError("the client of the killed proxy got an answer")
        except requests.RequestException:
            pass
    rec = pg.record(key)
    assert rec["state"] == "processing"
    assert rec["attempt"] == 1

    proxy = make_proxy(routes=routes)
    r = pay(proxy, key)
    lease_live = pg.query("SELECT lease_until > now() AS live FROM idempotency_records "
                          "WHERE idem_key = %s", (key,))[0]["live"]
    # Only judged when the dead attempt's lease had not ended by the time
    # the retry was answered (then it was alive at the claim too).
    assert lease_live, "the restart outlasted the 8s lease; no in-lease retry was made"
    assert_problem(r, 409, "idempotency_key_in_use")
    assert_retry_after(r)
    assert stub.count(key=key) == 1

    answers = []

    def retry_until_forwarded():
        resp = pay(proxy, key)
        answers.append(resp)
        return resp if resp.status_code != 409 else None

    final = wait_until(retry_until_forwarded, timeout=30, interval=0.1,
                       what="the retry to be forwarded once the lease ended")
    for resp in answers[:-1]:
        assert_problem(resp, 409, "idempotency_key_in_use")
    assert final.status_code == 201 and not is_replay(final)

    rows = pg.records(key)
    assert len(rows) == 1
    assert rows[0]["state"] == "completed"
    assert rows[0]["attempt"] == 2
    assert bytes(rows[0]["response_body"]) == final.content
    assert is_replay(pay(proxy, key))
    assert stub.count(key=key) == 2
