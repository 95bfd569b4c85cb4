"""Database and metrics support for the failure, reaper and crash tests:
records written straight into the table, waiting for a record's state,
proof that the reaper has run, and reading the admin /metrics endpoint."""
import psycopg
import requests

from helpers import TIMEOUT, new_key, wait_until

PAY = "/v1/payments"


def pay(proxy, key, body=None, path=PAY, **kw):
    return proxy.post(path, key=key, json={"amount": 100, "currency": "EUR"}
                      if body is None else body, **kw)


def insert_record(pg, key, state="processing", lease="now() + interval '1 hour'",
                  expires="now() + interval '1 hour'", hold=False, tenant="default",
                  operation="create_payment", age="interval '0'", status=None, body=None):
    """A valid row, as an attempt of the proxy would leave it. lease,
    expires and age are SQL expressions; age moves created_at and
    updated_at into the past."""
    n = pg.execute(
        "INSERT INTO idempotency_records (tenant, operation, idem_key, request_hash, "
        "state, owner_token, attempt, lease_until, hold_on_unknown, response_status, "
        "response_headers, response_body, replayable, created_at, updated_at, expires_at) "
        "VALUES (%s, %s, %s, sha256(%s::bytea), %s, gen_random_uuid(), 1, "
        + ("NULL" if lease is None else lease) + ", %s, %s, %s, %s, %s, "
        "now() - " + age + ", now() - " + age + ", " + expires + ")",
        (tenant, operation, key, key.encode(), state, hold, status,
         "Content-Type: application/json\r\n" if status is not None else None,
         body, (True if status is not None else None)))
    assert n == 1


def wait_state(pg, key, state, timeout=10.0):
    def check():
        rec = pg.record(key)
        return rec if rec is not None and rec["state"] == state else None
    return wait_until(check, timeout=timeout,
                      what="record %s to become %s (now %r)" % (
                          key, state, (pg.record(key) or {}).get("state")))


def row_version(pg, key):
    """The physical identity of a record's row: any write to it (an
    UPDATE, even one that changes nothing, or a row lock) changes one of
    these."""
    rows = pg.query("SELECT xmin::text AS xmin, xmax::text AS xmax, ctid::text AS ctid "
                    "FROM idempotency_records WHERE idem_key = %s", (key,))
    assert len(rows) == 1, rows
    return rows[0]


def reaper_pass(pg, timeout=10.0):
    """Returns once the reaper has completed a pass that started after this
    call: a canary record whose lease already ended is released only by a
    pass that can see it. Its tenant keeps it apart from the test's rows."""
    key = new_key("canary")
    insert_record(pg, key, lease="now() - interval '1 second'", tenant="canary")
    wait_state(pg, key, "released", timeout=timeout)
    return key


def metrics(proxy):
    r = requests.get(proxy.admin_url + "/metrics", timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    out = {}
    for line in r.text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            out[name] = float(value)
    return out


def metric(proxy, name):
    m = metrics(proxy)
    assert name in m, "no %s on /metrics" % name
    return m[name]


def undo_migration_008(pg):
    """Takes a migrated store back to schema version 7: the state text
    again, checked by the table's CHECK constraint as 001 made it."""
    pg.execute("ALTER TABLE idempotency_records ALTER COLUMN state TYPE text")
    pg.execute("DROP DOMAIN idem_state")
    pg.execute("ALTER TABLE idempotency_records ADD CONSTRAINT "
               "idempotency_records_state_check CHECK (state = ANY "
               "(ARRAY['processing'::text, 'completed'::text, 'released'::text]))")
    assert pg.execute("DELETE FROM schema_migrations WHERE version = 8") == 1


class HeldRows:
    """A transaction of the test's: insert() leaves a record uncommitted
    (the proxy's insert of that key waits for it), lock() locks a record's
    row (the proxy's update of it waits). release() rolls back: the
    inserts never happened, the locks are gone."""

    def __init__(self, pg):
        self.pg = pg
        self.conn = psycopg.connect(pg.url)

    def insert(self, key):
        self.conn.execute(
            "INSERT INTO idempotency_records (tenant, operation, idem_key, "
            "request_hash, state, owner_token, lease_until, expires_at) "
            "VALUES ('default', 'create_payment', %s, '\\x00', 'processing', "
            "gen_random_uuid(), now() + interval '1 hour', "
            "now() + interval '1 hour')", (key,))

    def lock(self, *keys):
        n = len(self.conn.execute(
            "SELECT 1 FROM idempotency_records WHERE idem_key = ANY(%s) "
            "FOR UPDATE", (list(keys),)).fetchall())
        assert n == len(keys)

    def release(self):
        self.conn.rollback()
        self.conn.close()


def lock_waits(pg):
    return pg.query("SELECT count(*) AS n FROM pg_stat_activity "
                    "WHERE datname = current_database() "
                    "AND wait_event_type = 'Lock'")[0]["n"]
