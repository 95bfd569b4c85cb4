"""The store on Citus (distributed PostgreSQL): records distributed by
tenant over two workers, the claim delegated to the tenant's worker, two
proxies, a worker stopped under them, the start-up check of the layout and
the conversion of a store migrated plain.

Collected only under `make test-citus` (IDEMPROXY_TEST_CITUS=1), where the
session's cluster is a coordinator and two workers (citus_cluster.py).
"""
import threading
import time

import psycopg
import pytest
import requests
from psycopg.rows import dict_row

from conftest import ADMIN_TOKEN, run_binary
from helpers import assert_problem, is_replay, new_key, wait_until
from store_support import metrics, undo_migration_008

HOOKS = "/hooks/charge"


def stored(tenant):
    """The tenant as the hooks route stores it (it names its source): the
    distribution column's value, which decides the shard."""
    return "header:" + tenant


def worker_port(pg, tenant):
    """The port of the worker that holds tenant's shard."""
    return pg.query(
        "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = "
        "get_shard_id_for_distribution_column('idempotency_records', %s::text)",
        (stored(tenant),))[0]["nodeport"]


def shard_of(pg, tenant):
    return pg.query("SELECT get_shard_id_for_distribution_column("
                    "'idempotency_records', %s::text) AS s", (stored(tenant),))[0]["s"]


def tenants_on_each_worker(pg, cluster):
    """One tenant name per worker: {worker port: tenant}."""
    found = {}
    for i in range(200):
        t = "tenant-%d" % i
        found.setdefault(worker_port(pg, t), t)
        if len(found) == len(cluster.workers):
            return found
    raise AssertionError("no tenant found on every worker: %r" % found)


def on_node(node, dbname, sql, params=None):
    with psycopg.connect(node.conninfo(dbname), autocommit=True, row_factory=dict_row) as c:
        cur = c.execute(sql, params)
        return cur.fetchall() if cur.description else []


def node_by_port(cluster, port):
    return next(n for n in cluster.nodes if n.port == port)


def shard_rows(cluster, pg, tenant):
    """The records of tenant as the worker's shard table holds them."""
    node = node_by_port(cluster, worker_port(pg, tenant))
    return on_node(node, pg.name, "SELECT idem_key, state FROM idempotency_records_%d "
                   "WHERE tenant = %%s" % shard_of(pg, tenant), (stored(tenant),))


def claim_calls(node, dbname):
    rows = on_node(node, dbname, "SELECT coalesce(sum(calls), 0) AS n FROM "
                   "pg_stat_user_functions WHERE funcname = 'idem_claim'")
    return rows[0]["n"]


def hook(proxy, tenant, key, amount=100):
    return proxy.post(HOOKS, key=key, json={"amount": amount},
                      headers={"X-Tenant-Id": tenant})


def test_migrate_distributes_the_records_and_the_claim(make_proxy, pg):
    make_proxy(start=False)
    tables = pg.query("SELECT distribution_column, citus_table_type, shard_count "
                      "FROM citus_tables WHERE table_name = 'idempotency_records'::regclass")
    assert tables == [{"distribution_column": "tenant", "citus_table_type": "distributed",
                       "shard_count": 32}]
    # Every overload: the one the proxy calls (013's), and 009's and 012's,
    # which instances of earlier versions call during a rolling upgrade.
    funcs = pg.query("SELECT f.pronargs AS nargs, o.distribution_argument_index AS arg, "
                     "o.colocationid = p.colocationid AS colocated "
                     "FROM pg_proc f JOIN pg_dist_object o "
                     "ON o.classid = 'pg_proc'::regclass AND o.objid = f.oid, "
                     "pg_dist_partition p WHERE f.proname = 'idem_claim' "
                     "AND p.logicalrelid = 'idempotency_records'::regclass ORDER BY 1")
    assert funcs == [{"nargs": 8, "arg": 0, "colocated": True},
                     {"nargs": 9, "arg": 0, "colocated": True},
                     {"nargs": 10, "arg": 0, "colocated": True}]


def test_migrate_twice_changes_nothing(make_proxy, pg):
    p = make_proxy(start=False)
    before = pg.query("SELECT shardid, nodeport FROM pg_dist_shard_placement ORDER BY 1")
    r = run_binary(["-c", p.conf_path, "--migrate"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "migrations applied: 0" in r.stdout
    assert pg.query("SELECT shardid, nodeport FROM pg_dist_shard_placement ORDER BY 1") == before


@pytest.mark.no_replay_cache  # the replay too is a claim
def test_the_claim_is_delegated_to_the_tenants_worker(make_proxy, stub, pg, pg_cluster):
    proxy = make_proxy()
    tenant = "acme"
    port = worker_port(pg, tenant)
    # The statement the proxy prepares, with bound parameters.
    plan = "\n".join(r["QUERY PLAN"] for r in pg.query(
        "EXPLAIN SELECT o_decision, o_owner, o_attempt, o_lease_ms, o_status, o_headers, "
        "o_body, o_replayable, o_expires_ms FROM idem_claim(%s, %s, %s, %s, %s, %s, %s, %s)",
        (stored(tenant), "hooks", "k", b"\0" * 32, 1000, 60000, False,
         "4f9c0f3e-6f0d-4a59-9c55-7c1b1d0e5a11")))
    assert "Task Count: 1" in plan, plan
    assert "port=%d" % port in plan, plan
    assert "Function Scan on idem_claim" in plan, plan

    # The proxy's own claims ran on that worker, never on the coordinator.
    keys = [new_key("deleg") for _ in range(3)]
    for k in keys:
        assert hook(proxy, tenant, k).status_code == 201
    assert is_replay(hook(proxy, tenant, keys[0]))
    worker = node_by_port(pg_cluster, port)
    # (a backend's function statistics reach the view within 10 s of idling)
    wait_until(lambda: claim_calls(worker, pg.name) >= 4, timeout=30,
               what="idem_claim calls counted on the worker")
    assert claim_calls(pg_cluster.coordinator, pg.name) == 0
    assert sorted(r["idem_key"] for r in shard_rows(pg_cluster, pg, tenant)) == sorted(keys)
    assert stub.count(prefix=HOOKS) == 3


def test_two_proxies_two_tenants_on_different_workers(make_proxy, stub, pg, pg_cluster):
    a = make_proxy()
    b = make_proxy()
    tenants = tenants_on_each_worker(pg, pg_cluster)
    # The same key for both tenants: two records, one on each worker.
    key = new_key("two")
    for tenant in tenants.values():
        first = hook(a, tenant, key, amount=len(tenant))
        assert first.status_code == 201, first.text
        again = hook(b, tenant, key, amount=len(tenant))
        assert again.status_code == 201 and is_replay(again)
        assert again.content == first.content
    sent = stub.requests(prefix=HOOKS, key=key)
    assert sorted(r.header("X-Tenant-Id") for r in sent) == sorted(tenants.values())
    for port, tenant in tenants.items():
        assert shard_rows(pg_cluster, pg, tenant) == [{"idem_key": key, "state": "completed"}]
        other = next(w for w in pg_cluster.workers if w.port != port)
        assert on_node(other, pg.name, "SELECT to_regclass('idempotency_records_%d') IS NULL "
                       "AS absent" % shard_of(pg, tenant))[0]["absent"]


@pytest.mark.no_replay_cache  # every replay asks the store
def test_a_worker_down_fails_only_its_tenants(make_proxy, stub, pg, pg_cluster):
    # unavailable = "forward" too: a worker down is an error from a working
    # coordinator, not an outage, so it is never forwarded unprotected.
    proxy = make_proxy(top={"database": {"url": pg.url, "unavailable": "forward",
                                         "statement_timeout": "5s"}})
    tenants = tenants_on_each_worker(pg, pg_cluster)
    up_port, down_port = pg_cluster.workers[0].port, pg_cluster.workers[1].port
    up, down = tenants[up_port], tenants[down_port]
    done = {t: new_key("before") for t in (up, down)}
    for t, k in done.items():
        assert hook(proxy, t, k).status_code == 201
    first = {t: hook(proxy, t, k).content for t, k in done.items()}

    worker = node_by_port(pg_cluster, down_port)
    worker.pause()
    try:
        during = new_key("during")
        r = hook(proxy, down, during)
        assert_problem(r, 503, "idempotency_store_unavailable")
        assert_problem(hook(proxy, down, done[down]), 503, "idempotency_store_unavailable")
        assert stub.count(key=during) == 0

        served = new_key("served")
        assert hook(proxy, up, served).status_code == 201
        assert is_replay(hook(proxy, up, served))
        assert is_replay(hook(proxy, up, done[up]))
        assert stub.count(key=served) == 1
    finally:
        worker.resume()

    # Back: nothing lost, nothing sent twice.
    again = wait_until(lambda: (lambda r: r if r.status_code != 503 else None)(
        hook(proxy, down, done[down])), timeout=30, what="the worker's tenant served again")
    assert is_replay(again) and again.content == first[down]
    assert hook(proxy, down, during).status_code == 201
    assert stub.count(key=during) == 1
    assert stub.count(key=done[down]) == 1
    assert {r["idem_key"] for r in shard_rows(pg_cluster, pg, down)} == {done[down], during}


def test_refuses_to_start_when_the_setting_and_the_store_disagree(make_proxy, pg):
    # Distributed store, plain setting: neither the proxy nor --migrate.
    make_proxy(start=False)
    p = make_proxy(top={"database": {"url": pg.url, "distributed": "none"}}, migrate=False,
                   wait_ready=False)
    assert p.wait_exit(20) == 1
    lines = [ln for ln in p.log().splitlines() if ln.strip()]
    assert lines == ['idemproxy: idempotency_records is distributed (Citus) but '
                     'database.distributed = "none": set database.distributed = "citus"'], lines
    r = run_binary(["-c", p.conf_path, "--migrate"])
    assert r.returncode == 1 and 'database.distributed = "none"' in r.stderr, r.stderr


def test_refuses_the_citus_setting_on_a_plain_table(make_proxy, pg):
    plain = make_proxy(top={"database": {"url": pg.url, "distributed": "none"}}, start=False)
    assert pg.query("SELECT count(*) AS n FROM pg_dist_partition")[0]["n"] == 0
    p = make_proxy(migrate=False, wait_ready=False)
    assert p.wait_exit(20) == 1
    assert ('database.distributed = "citus" but idempotency_records is not distributed: '
            'run --migrate on the coordinator') in p.log()
    assert plain.proc is None  # migrated, never started


def test_refuses_the_citus_setting_without_the_extension(make_proxy, pg, pg_cluster):
    name = pg.name + "_plain"
    with pg_cluster.admin() as c:
        c.execute("CREATE DATABASE %s" % name)  # template1: no citus
    try:
        url = pg_cluster.conninfo(name)
        p = make_proxy(top={"database": {"url": url}}, migrate=False, start=False)
        r = run_binary(["-c", p.conf_path, "--migrate"])
        assert r.returncode == 1
        assert 'database.distributed = "citus" but the database has no citus extension' \
            in r.stderr, r.stderr
        # nothing was created
        with psycopg.connect(url, autocommit=True) as c:
            assert c.execute("SELECT to_regclass('idempotency_records')").fetchone()[0] is None
    finally:
        with pg_cluster.admin() as c:
            c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)


def test_a_store_migrated_plain_is_converted_by_migrate(make_proxy, stub, pg, pg_cluster):
    plain = make_proxy(top={"database": {"url": pg.url, "distributed": "none"}})
    # Which worker a tenant lands on is known only once distributed: ten
    # tenants land on both.
    keys = {"tenant-%d" % i: new_key("conv") for i in range(10)}
    first = {}
    for t, k in keys.items():
        r = hook(plain, t, k)
        assert r.status_code == 201
        first[t] = r.content
    assert plain.stop() == 0

    conv = make_proxy(migrate=False, start=False)
    r = run_binary(["-c", conv.conf_path, "--migrate"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "moved to the shards" in r.stdout
    conv.start()
    for t, k in keys.items():
        again = hook(conv, t, k)
        assert is_replay(again) and again.content == first[t]
        assert shard_rows(pg_cluster, pg, t) == [{"idem_key": k, "state": "completed"}]
        assert stub.count(key=k) == 1
    assert {worker_port(pg, t) for t in keys} == {w.port for w in pg_cluster.workers}
    # The coordinator kept no local copy of the rows.
    assert pg.query("SELECT pg_relation_size('idempotency_records') AS n")[0]["n"] == 0


def test_reaper_releases_and_purges_on_every_shard(make_proxy, stub, pg, pg_cluster):
    proxy = make_proxy(top={"reaper": {"interval": "200ms", "batch": 3}}, start=False)
    tenants = list(tenants_on_each_worker(pg, pg_cluster).values())
    for t in tenants:
        pg.execute(
            "INSERT INTO idempotency_records (tenant, operation, idem_key, request_hash, "
            "state, owner_token, attempt, lease_until, created_at, updated_at, expires_at) "
            "SELECT %s, 'hooks', 'dead-' || g, sha256(g::text::bytea), 'processing', "
            "gen_random_uuid(), 1, now() - interval '1 minute', now() - interval '1 hour', "
            "now() - interval '1 hour', now() + interval '1 hour' "
            "FROM generate_series(1, 10) g", (stored(t),))
        pg.execute(
            "INSERT INTO idempotency_records (tenant, operation, idem_key, request_hash, "
            "state, owner_token, attempt, created_at, updated_at, expires_at) "
            "SELECT %s, 'hooks', 'old-' || g, sha256(g::text::bytea), 'completed', "
            "gen_random_uuid(), 1, now() - interval '2 days', now() - interval '2 days', "
            "now() - interval '1 minute' FROM generate_series(1, 10) g", (stored(t),))
    proxy.start()
    wait_until(lambda: pg.query("SELECT count(*) AS n FROM idempotency_records "
                                "WHERE idem_key LIKE 'old-%%'")[0]["n"] == 0,
               timeout=30, what="the expired records purged")
    wait_until(lambda: pg.query("SELECT count(*) AS n FROM idempotency_records "
                                "WHERE state = 'processing'")[0]["n"] == 0,
               timeout=30, what="the dead leases released")
    for t in tenants:
        rows = shard_rows(pg_cluster, pg, t)
        assert sorted(r["idem_key"] for r in rows) == sorted("dead-%d" % g for g in range(1, 11))
        assert {r["state"] for r in rows} == {"released"}


@pytest.mark.no_replay_cache  # the waiter's answer comes from the store
def test_a_waiter_is_woken_by_a_completion_through_another_proxy(make_proxy, stub, pg,
                                                                pg_cluster):
    # The waiter marks the record on the tenant's worker; the completion
    # through the other proxy reads the mark there and sends the NOTIFY from
    # its coordinator session, where the waiter's instance LISTENs.
    wait = {"hooks": {"in_flight": "wait", "wait_max": "30s", "lease": "60s"}}
    a = make_proxy(route_overrides=wait)
    b = make_proxy(route_overrides=wait)
    tenant = tenants_on_each_worker(pg, pg_cluster)[pg_cluster.workers[1].port]
    key = new_key("wake")
    stub.configure({"prefix": HOOKS, "key": key, "gate": "orig", "times": 1}, append=True)
    results = {}

    def send(name, proxy):
        results[name] = proxy.post(HOOKS, key=key, json={"amount": 100},
                                   headers={"X-Tenant-Id": tenant}, timeout=60)
    orig = threading.Thread(target=send, args=("orig", a))
    orig.start()
    stub.wait_for(1, key=key)
    dup = threading.Thread(target=send, args=("dup", b))
    dup.start()
    wait_until(lambda: metrics(b).get("idemproxy_waiters", 0) == 1, timeout=30,
               what="the duplicate waiting on the other proxy")
    assert on_node(node_by_port(pg_cluster, worker_port(pg, tenant)), pg.name,
                   "SELECT wait_notify FROM idempotency_records_%d WHERE tenant = %%s "
                   "AND idem_key = %%s" % shard_of(pg, tenant),
                   (stored(tenant), key)) == [{"wait_notify": True}]
    stub.release("orig")
    orig.join(70)
    dup.join(70)
    first, second = results["orig"], results["dup"]
    assert first.status_code == 201 and not is_replay(first)
    assert second.status_code == 201 and is_replay(second), second.text
    assert second.content == first.content
    assert stub.count(key=key) == 1
    assert metrics(b).get('idemproxy_wait_outcomes_total{route="hooks",outcome="replayed"}',
                          0) == 1


def insert_rows(pg, tenant, prefix, n, state, lease_until, expires_at, hold=False):
    pg.execute(
        "INSERT INTO idempotency_records (tenant, operation, idem_key, request_hash, "
        "state, owner_token, attempt, lease_until, hold_on_unknown, created_at, updated_at, "
        "expires_at) SELECT %s, 'hooks', %s || g, sha256(g::text::bytea), %s, "
        "gen_random_uuid(), 1, " + lease_until + ", %s, now() - interval '2 hours', "
        "now() - interval '2 hours', " + expires_at + " FROM generate_series(1, %s) g",
        (stored(tenant), prefix, state, hold, n))


def state_of(pg, tenant, key):
    rows = pg.query("SELECT state FROM idempotency_records WHERE tenant = %s "
                    "AND operation = 'hooks' AND idem_key = %s", (stored(tenant), key))
    return rows[0]["state"] if rows else None


def lease_ending_soon(pg, tenant, key):
    """A processing row whose lease ends just after now; returns once the
    reaper released it (a pass walked past it)."""
    insert_rows(pg, tenant, key, 1, "processing", "now() + interval '300 milliseconds'",
                "now() + interval '1 hour'")
    wait_until(lambda: state_of(pg, tenant, key + "1") == "released", timeout=30,
               what="the lease %s released" % key)


def rows_read(node, dbname, shard):
    """Entries of the shard's lease_until index its scans read so far (the
    sweep of the table, a bounded TID range scan a pass, does not use it):
    pg_stat_user_indexes hides shards, the functions do not."""
    return on_node(node, dbname, "SELECT pg_stat_get_tuples_returned(%s::regclass) AS n",
                   ("idempotency_records_lease_end_%d" % shard,))[0]["n"]


def test_the_reaper_reads_only_the_leases_that_ended_since_its_last_pass(make_proxy, pg,
                                                                         pg_cluster):
    # Many leases that ended long ago (completed rows keep the end of their
    # last lease): the first pass walks them once; later passes and the
    # gauges read only what ended since, on the shard's lease_until index.
    proxy = make_proxy(top={"reaper": {"interval": "200ms", "batch": 500}}, start=False)
    tenant = "acme"
    node = node_by_port(pg_cluster, worker_port(pg, tenant))
    shard = shard_of(pg, tenant)
    old = 3000
    insert_rows(pg, tenant, "old-", old, "completed",
                "now() - interval '2 hours' + g * interval '1 ms'", "now() + interval '1 hour'")
    on_node(node, pg.name, "ANALYZE idempotency_records_%d" % shard)
    proxy.start()
    lease_ending_soon(pg, tenant, "first-")
    lease_ending_soon(pg, tenant, "second-")
    # A backend writes its index statistics at most once a second: wait
    # until the first walk's reads are all counted before taking `before`.
    time.sleep(1.5)
    lease_ending_soon(pg, tenant, "third-")
    before = rows_read(node, pg.name, shard)
    for i in range(5):
        lease_ending_soon(pg, tenant, "pass%d-" % i)
    read = rows_read(node, pg.name, shard) - before
    # Each of those passes read every old row twice before (the release
    # and the gauges): at least 5 x 6000 rows.
    assert read < old, "%d rows read in 5 passes or more" % read
    assert pg.query("SELECT count(*) AS n FROM idempotency_records WHERE state = 'completed'"
                    )[0]["n"] == old


def test_the_reaper_releases_and_purges_what_ended_while_it_was_down(make_proxy, pg,
                                                                     pg_cluster):
    reaper = {"reaper": {"interval": "200ms", "batch": 4}}
    first = make_proxy(top=reaper)
    tenants = list(tenants_on_each_worker(pg, pg_cluster).values())
    for t in tenants:
        lease_ending_soon(pg, t, "walked-")  # the walk is past now on each shard
    assert first.stop() == 0
    for t in tenants:
        # Ended an hour ago, before where the last walk stopped.
        insert_rows(pg, t, "dead-", 10, "processing", "now() - interval '1 hour'",
                    "now() + interval '1 hour'")
        insert_rows(pg, t, "held-", 3, "processing", "now() - interval '1 hour'",
                    "now() + interval '1 hour'", hold=True)
        insert_rows(pg, t, "live-", 2, "processing", "now() + interval '1 hour'",
                    "now() + interval '2 hours'")
        insert_rows(pg, t, "old-", 10, "completed", "now() - interval '2 days'",
                    "now() - interval '1 minute'")
    second = make_proxy(top=reaper)

    def count(where):
        return pg.query("SELECT count(*) AS n FROM idempotency_records WHERE " + where)[0]["n"]
    wait_until(lambda: count("idem_key LIKE 'dead-%%' AND state = 'released'") == 20,
               timeout=30, what="every dead lease released")
    wait_until(lambda: count("idem_key LIKE 'old-%%'") == 0, timeout=30,
               what="every expired record purged")
    assert count("state = 'processing'") == len(tenants) * 5  # held and live stay
    # The gauges count the held rows the walk passed and the live leases.
    wait_until(lambda: metrics(second).get("idemproxy_processing_records") == len(tenants) * 5,
               timeout=30, what="the processing gauge at the held and live rows")
    for t in tenants:
        assert {r["idem_key"][:5] for r in shard_rows(pg_cluster, pg, t)
                if r["state"] == "processing"} == {"held-", "live-"}


def test_migration_008_on_a_distributed_store(make_proxy, stub, pg, pg_cluster):
    """A store distributed at schema version 7 (the state text, checked by
    the table's CHECK constraint) is brought to 8 by --migrate: every shard's
    state is the domain, the records answer as before and a value outside
    the three is refused on the workers too."""
    proxy = make_proxy()
    tenants = tenants_on_each_worker(pg, pg_cluster)
    keys = {t: new_key("v7") for t in tenants.values()}
    first = {}
    for t, k in keys.items():
        r = hook(proxy, t, k)
        assert r.status_code == 201
        first[t] = r.content
    assert proxy.stop() == 0
    undo_migration_008(pg)

    r = run_binary(["-c", proxy.conf_path, "--migrate"])
    assert r.returncode == 0, r.stdout + r.stderr
    assert "migrations applied: 1" in r.stdout
    proxy.start()
    for t, k in keys.items():
        again = hook(proxy, t, k)
        assert is_replay(again) and again.content == first[t]
        assert stub.count(key=k) == 1
        node = node_by_port(pg_cluster, worker_port(pg, t))
        shard = "idempotency_records_%d" % shard_of(pg, t)
        assert on_node(node, pg.name, "SELECT format_type(atttypid, atttypmod) AS t "
                       "FROM pg_attribute WHERE attrelid = %s::regclass "
                       "AND attname = 'state'", (shard,)) == [{"t": "idem_state"}]
        with pytest.raises(psycopg.errors.CheckViolation):
            on_node(node, pg.name, "UPDATE %s SET state = 'gone' WHERE tenant = %%s" % shard,
                    (stored(t),))
    fresh = hook(proxy, tenants[pg_cluster.workers[0].port], new_key("v8"))
    assert fresh.status_code == 201


def test_the_key_listing_and_resolve_on_a_distributed_store(make_proxy, stub, pg,
                                                             pg_cluster):
    """GET /admin/keys merges the shards' walks in one order and pages
    across them; the reaper counts every shard's held rows apart; a held
    key on a worker is settled with its response and replayed from there."""
    hold = {"hooks": {"on_unknown": "hold", "lease": "2s", "upstream_timeout": "1s"}}
    proxy = make_proxy(route_overrides=hold, top={"reaper": {"interval": "200ms"}})
    auth = {"Authorization": "Bearer " + ADMIN_TOKEN}
    tenants = list(tenants_on_each_worker(pg, pg_cluster).values())
    want = set()
    for i, t in enumerate(tenants):
        # one statement: the rows of a tenant share created_at, so the
        # order inside a tie (tenant, operation, key) decides
        insert_rows(pg, t, "held-%d-" % i, 3, "processing", "now() - interval '1 second'",
                    "now() + interval '1 hour'", hold=True)
        insert_rows(pg, t, "live-%d-" % i, 3, "processing", "now() + interval '1 hour'",
                    "now() + interval '1 hour'")
        want |= {(stored(t), "held-%d-%d" % (i, g)) for g in range(1, 4)}

    def page_all(order):
        seen, cursor = [], None
        while True:
            params = {"state": "held", "order": order, "limit": 2}
            if cursor:
                params["cursor"] = cursor
            r = requests.get(proxy.admin_url + "/admin/keys", params=params, headers=auth,
                             timeout=10)
            assert r.status_code == 200, r.text
            seen += [(k["tenant"], k["key"]) for k in r.json()["keys"]]
            cursor = r.json()["next_cursor"]
            if not cursor:
                return seen
    # every shard's held rows, counted apart in the reaper's gauges
    wait_until(lambda: (metrics(proxy).get("idemproxy_held_records"),
                        metrics(proxy).get("idemproxy_processing_records"))
               == (len(want), 2 * len(want)), what="the held gauges of every shard")
    assert metrics(proxy)["idemproxy_oldest_held_age_seconds"] >= 7200
    oldest = page_all("oldest")
    assert len(oldest) == len(set(oldest)) and set(oldest) == want
    assert oldest == sorted(oldest)  # one created_at: by tenant, then key
    assert page_all("newest") == list(reversed(oldest))

    t = tenants[-1]
    key = new_key("held")
    stub.configure({"prefix": HOOKS, "key": key, "action": "reset", "times": 1})
    assert_problem(hook(proxy, t, key), 504, "upstream_outcome_unknown")
    pg.execute("UPDATE idempotency_records SET lease_until = now() - interval '1 second' "
               "WHERE tenant = %s AND operation = 'hooks' AND idem_key = %s",
               (stored(t), key))
    url = "%s/admin/keys/%s/hooks/%s/resolve" % (
        proxy.admin_url, requests.utils.quote(stored(t), safe=""), key)
    r = requests.post(url, json={"attempt": 1, "response": {
        "status": 201, "headers": {"Content-Type": "application/json"},
        "body": '{"id": "ch_1"}'}}, headers=auth, timeout=10)
    assert r.status_code == 200, r.text
    again = hook(proxy, t, key)
    assert again.status_code == 201 and is_replay(again) and again.json() == {"id": "ch_1"}
    assert stub.count(key=key) == 1
    assert [r["state"] for r in shard_rows(pg_cluster, pg, t)
            if r["idem_key"] == key] == ["completed"]
