"""Host-name lookups never block the serving thread (doc/operations.md "Topology":
a database behind a DNS name). libpq resolves `host` with a blocking
getaddrinfo inside PQconnectStartParams; the proxy resolves the names of
database.url elsewhere and connects by address (`hostaddr`), keeping the
name for TLS and the logs.

A made-up name in database.url is answered by an LD_PRELOAD shim
(tests/shim/slow_resolver.c) that holds every lookup of it while a gate
file exists and writes a line per lookup (thread id and name)."""
import os
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from conftest import ROOT
from helpers import TIMEOUT, is_replay, new_key, wait_until
from test_ops import pay

NAME = "db.idemproxy-shim.test"
SHIM = os.path.join(ROOT, "build", "slow_resolver.so")
# Threads that connect on their own, as plain threads (not the loop's).
PLAIN = {"idemproxy", "ip-reaper", "ip-retry", "ip-listen", "ip-waiters"}


@pytest.fixture(scope="module")
def shim():
    subprocess.run(["make", "-s", "build/slow_resolver.so"], cwd=ROOT, check=True,
                   timeout=120)
    return SHIM


class Lookups:
    def __init__(self, tmp_path):
        self.gate = os.path.join(str(tmp_path), "resolver.gate")
        self.count = os.path.join(str(tmp_path), "resolver.count")

    def env(self):
        return {"LD_PRELOAD": SHIM, "IDEMPROXY_SHIM_HOST": NAME,
                "IDEMPROXY_SHIM_ADDR": "127.0.0.1", "IDEMPROXY_SHIM_GATE": self.gate,
                "IDEMPROXY_SHIM_COUNT": self.count}

    def hold(self):
        open(self.gate, "w").close()

    def release(self):
        os.unlink(self.gate)

    def held(self):
        return os.path.exists(self.gate)

    def threads(self):
        """The names of the threads that looked NAME up, one per lookup."""
        try:
            with open(self.count) as f:
                return [l.split(" ", 1)[1].strip() for l in f if " " in l]
        except FileNotFoundError:
            return []


def url_by_name(pg, hosts=None):
    port = pg.url.rsplit(":", 1)[1].split("/", 1)[0]
    hosts = hosts or "%s:%s" % (NAME, port)
    # connect_timeout bounds the lookup too: long enough that a held
    # lookup outlasts the test's steps.
    return "postgresql://postgres@%s/%s?connect_timeout=60" % (hosts, pg.name)


def terminate_workers(pg):
    pg.query("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
             "WHERE datname = current_database() AND application_name = 'idemproxy' "
             "AND pid <> pg_backend_pid()")


def test_a_held_lookup_stalls_only_the_request_that_needs_it(
        shim, make_proxy, stub, pg, tmp_path):
    lk = Lookups(tmp_path)
    proxy = make_proxy(env=lk.env(), top={
        "workers": 4, "replay_cache_ttl": "10m",
        "database": {"url": url_by_name(pg)}})
    cached = new_key("cached")
    assert pay(proxy, cached).status_code == 201
    lk.hold()
    terminate_workers(pg)
    before = len(lk.threads())
    with ThreadPoolExecutor(1) as ex:
        fresh = new_key("fresh")
        slow = ex.submit(pay, proxy, fresh, timeout=120)
        # Its store connection is gone: the reconnect looks the name up,
        # and the lookup is held.
        wait_until(lambda: len(lk.threads()) > before, what="the reconnect's lookup")
        # Meanwhile the serving loop answers a replay from the cache and a
        # request for no route...
        r = pay(proxy, cached)
        assert r.status_code == 201 and is_replay(r)
        assert requests.post(proxy.url + "/nowhere", timeout=TIMEOUT).status_code == 404
        # ...while the lookup is still held and the request that needs it
        # still waits.
        assert lk.held() and not slow.done()
        assert "ip-serve" not in lk.threads()[before:]
        lk.release()
        assert slow.result(timeout=120).status_code == 201
    assert stub.count(key=fresh) == 1
    assert stub.count(key=cached) == 1


def test_start_up_resolves_the_workers_connections_at_once(
        shim, make_proxy, stub, pg, tmp_path):
    """Start-up with the name held: every worker's connection looks it up,
    none of them on the serving loop, all at the same time (so start-up
    costs one lookup's time, not one per worker)."""
    lk = Lookups(tmp_path)
    # The main thread checks the schema before the workers start: its
    # lookups go through.
    env = dict(lk.env(), IDEMPROXY_SHIM_FREE="idemproxy")
    proxy = make_proxy(start=False, env=env, top={
        "workers": 4, "database": {"url": url_by_name(pg)}})
    lk.hold()
    proxy.start(wait_ready=False)
    try:
        try:
            wait_until(lambda: len([t for t in lk.threads() if t not in PLAIN]) >= 4,
                       timeout=30, what="four lookups in progress at once")
            assert lk.held()
            assert "ip-serve" not in lk.threads()
        finally:
            if lk.held():
                lk.release()
        proxy.wait_ready()
        k = new_key("started")
        assert pay(proxy, k).status_code == 201
        assert stub.count(key=k) == 1
    finally:
        assert proxy.stop() == 0


def test_a_multi_host_url_skips_a_dead_host_and_connects_by_name(
        shim, make_proxy, stub, pg, tmp_path):
    """libpq's multi-host form: the first host refuses, the second is the
    made-up name; both are passed as addresses, with their own ports."""
    lk = Lookups(tmp_path)
    port = pg.url.rsplit(":", 1)[1].split("/", 1)[0]
    proxy = make_proxy(env=lk.env(), top={
        "workers": 2, "database": {"url": url_by_name(pg, "127.0.0.1:1,%s:%s" % (NAME, port))}})
    k = new_key("multi")
    assert pay(proxy, k).status_code == 201
    assert stub.count(key=k) == 1
    rows = pg.query("SELECT count(*) AS n FROM pg_stat_activity "
                    "WHERE datname = current_database() AND application_name = 'idemproxy'")
    assert rows[0]["n"] >= 1
    assert "ip-serve" not in lk.threads()
