"""SIGHUP and the settings: each one is either applied by a reload or named
in a warning as needing a restart, and a reload at any moment of start-up
is safe."""
import http.client
import json
import os
import signal
import socket
import threading

import psycopg
import requests

from conftest import ADMIN_TOKEN, default_routes, run_binary
from helpers import (TIMEOUT, assert_problem, is_replay, log_entries, new_key,
                     render_conf, wait_until)
from store_support import PAY, insert_record, metrics, pay, wait_state

HITS = 'idemproxy_events_total{event="replay_cache_hit"}'


def settings(proxy, pg, stub, **top):
    """The conf make_proxy writes (same listeners, routes and the rest),
    with top-level settings replaced."""
    s = {
        "listen": "127.0.0.1:%d" % proxy.port,
        "admin_listen": "127.0.0.1:%d" % proxy.admin_port,
        "admin_token": ADMIN_TOKEN,
        "workers": 4,
        "shutdown_grace": "3s",
        "log_level": "info",
        "database": {"url": pg.url},
        "reaper": {"interval": "10m"},
    }
    if os.environ.get("IDEMPROXY_TEST_BUSY_POLL"):
        s["busy_poll"] = os.environ["IDEMPROXY_TEST_BUSY_POLL"]
    s.update(top)
    s["routes"] = default_routes(stub.url)
    return s


def reload(proxy, conf):
    """Writes conf over the proxy's file, sends SIGHUP, and returns once the
    proxy says it reloaded."""
    done = proxy.log().count("configuration reloaded")
    tmp = proxy.conf_path + ".new"
    with open(tmp, "w") as f:
        f.write(render_conf(conf))
    os.replace(tmp, proxy.conf_path)
    proxy.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: proxy.log().count("configuration reloaded") > done,
               what="the reload")


def log_lines(proxy):
    return log_entries(proxy)


def lock_table(pg):
    """Holds an ACCESS EXCLUSIVE lock on the records from another session:
    any store statement blocks until its statement_timeout cuts it."""
    conn = psycopg.connect(pg.url)
    conn.execute("BEGIN")
    conn.execute("LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE")
    return conn


def in_thread(fn):
    box = {}

    def run():
        try:
            box["r"] = fn()
        except Exception as e:  # reported by the caller
            box["r"] = e
    t = threading.Thread(target=run)
    t.start()
    return t, box


def send_payment(proxy, key):
    """Sends a payment on a socket of its own and returns the socket once
    every byte is out, without waiting for the answer (read_status)."""
    body = json.dumps({"amount": 100, "currency": "EUR"}).encode()
    head = ("POST %s HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nIdempotency-Key: %s\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n"
            "Connection: close\r\n\r\n" % (PAY, proxy.port, key, len(body)))
    sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=TIMEOUT * 2)
    sock.sendall(head.encode() + body)
    return sock


def read_status(sock):
    try:
        resp = http.client.HTTPResponse(sock, method="POST")
        resp.begin()
        resp.read()
        return resp.status
    finally:
        sock.close()


def wait_queued(proxy, n):
    wait_until(lambda: metrics(proxy)["idemproxy_requests_queued"] == n,
               what="%d requests queued" % n)


def sighup_once_blocked(proc):
    """SIGHUP terminates a process that has not blocked it yet: wait until
    the main thread blocks it, then send it at once, so the reload runs as
    soon as start-up reaches its signal loop. Blocked shows in SigBlk until
    the thread reaches sigwait; while it sleeps there the kernel takes the
    awaited signals out of SigBlk again, so a thread in sigwait counts too
    (a poll that missed the window between the two would wait forever)."""
    def blocked():
        try:
            with open("/proc/%d/wchan" % proc.pid) as f:
                if "sigtimedwait" in f.read():
                    return True
            with open("/proc/%d/status" % proc.pid) as f:
                for line in f:
                    if line.startswith("SigBlk:"):
                        return int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1))
        except OSError:
            return False
        return False
    wait_until(blocked, interval=0.0005, what="the proxy to block SIGHUP")
    proc.send_signal(signal.SIGHUP)


def test_sighup_once_blocked_sees_a_proxy_already_in_its_signal_loop(make_proxy, stub, pg):
    """A proxy past start-up sleeps in sigwait, where SigBlk no longer shows
    SIGHUP: the helper must still see it as ready and reload it."""
    proxy = make_proxy()
    sighup_once_blocked(proxy.proc)
    wait_until(lambda: "configuration reloaded" in proxy.log(), what="the reload")
    assert pay(proxy, new_key()).status_code == 201


def test_reload_during_start_up_leaves_workers_a_valid_database_url(make_proxy, stub, pg):
    """The first reload frees the start-up configuration; workers that had
    not initialised yet must not read their database URL from it (run under
    the ASan build, a read of freed memory aborts the proxy)."""
    for _ in range(3):
        # the last proxy's 200 backends gone, or this one finds no room
        wait_until(lambda: pg.query("SELECT count(*) AS n FROM pg_stat_activity "
                                    "WHERE datname = current_database() "
                                    "AND pid <> pg_backend_pid()")[0]["n"] == 0,
                   what="the last proxy's connections to close")
        proxy = make_proxy(top={"workers": 200}, wait_ready=False)
        sighup_once_blocked(proxy.proc)
        proxy.wait_ready()
        wait_until(lambda: "configuration reloaded" in proxy.log(),
                   what="the reload")
        for _ in range(8):
            assert pay(proxy, new_key()).status_code == 201
        assert proxy.stop() == 0, proxy.log()[-4000:]
        log = proxy.log()
        assert "store connect failed" not in log, log[-4000:]
        assert "AddressSanitizer" not in log, log[-8000:]


def test_reload_resizes_the_replay_cache(make_proxy, stub, pg):
    proxy = make_proxy(top={"replay_cache_size": 0})
    key = new_key()
    assert pay(proxy, key).status_code == 201
    hits = metrics(proxy).get(HITS, 0)
    assert is_replay(pay(proxy, key)) and is_replay(pay(proxy, key))
    assert metrics(proxy).get(HITS, 0) == hits  # off

    reload(proxy, settings(proxy, pg, stub, replay_cache_size="1MiB"))
    assert is_replay(pay(proxy, key))  # from the store, now cached
    assert is_replay(pay(proxy, key))
    assert metrics(proxy)[HITS] == hits + 1

    reload(proxy, settings(proxy, pg, stub, replay_cache_size=0))
    assert is_replay(pay(proxy, key))  # the store again: the cache is empty
    assert metrics(proxy)[HITS] == hits + 1
    assert len(stub.requests(key=key)) == 1


def test_the_queue_gauges_show_waiting_requests_and_busy_workers(make_proxy, stub, pg):
    """idemproxy_requests_queued counts requests waiting for a worker,
    idemproxy_workers_busy the workers handling one; both fall back to 0."""
    proxy = make_proxy(top={"workers": 1, "queue_size": 2})
    assert metrics(proxy)["idemproxy_requests_queued"] == 0
    assert metrics(proxy)["idemproxy_workers_busy"] == 0
    stub.configure({"prefix": PAY, "gate": "hold"})
    keys = [new_key() for _ in range(4)]
    first = in_thread(lambda: pay(proxy, keys[0]))
    stub.wait_for(1, key=keys[0])
    assert metrics(proxy)["idemproxy_workers_busy"] == 1
    queued = []
    for i, k in enumerate(keys[1:3]):
        queued.append(send_payment(proxy, k))
        wait_queued(proxy, i + 1)
    assert_problem(pay(proxy, keys[3]), 503, "overloaded")
    m = metrics(proxy)
    assert (m["idemproxy_requests_queued"], m["idemproxy_workers_busy"]) == (2, 1)
    stub.release("hold")
    first[0].join(TIMEOUT * 2)
    assert first[1]["r"].status_code == 201
    assert [read_status(c) for c in queued] == [201, 201]
    wait_until(lambda: metrics(proxy)["idemproxy_workers_busy"] == 0, what="workers idle")
    assert metrics(proxy)["idemproxy_requests_queued"] == 0
    assert [stub.count(key=k) for k in keys] == [1, 1, 1, 0]


def test_reload_changes_the_queue_bound(make_proxy, stub, pg):
    proxy = make_proxy(top={"workers": 1, "queue_size": 1})
    stub.configure({"prefix": PAY, "gate": "hold"})
    keys = [new_key() for _ in range(5)]
    first = in_thread(lambda: pay(proxy, keys[0]))
    stub.wait_for(1, key=keys[0])  # the one worker is busy
    reload(proxy, settings(proxy, pg, stub, workers=1, queue_size=3))
    queued = []
    for i, k in enumerate(keys[1:4]):
        queued.append(send_payment(proxy, k))
        wait_queued(proxy, i + 1)
    assert metrics(proxy)["idemproxy_workers_busy"] == 1
    # three wait: the fourth is over the new bound
    assert_problem(pay(proxy, keys[4]), 503, "overloaded")
    stub.release("hold")
    first[0].join(TIMEOUT * 2)
    assert not isinstance(first[1]["r"], Exception), first[1]["r"]
    assert first[1]["r"].status_code == 201
    assert [read_status(s) for s in queued] == [201, 201, 201]
    assert [stub.count(key=k) for k in keys] == [1, 1, 1, 1, 0]


def test_reload_applies_statement_timeout_on_each_connections_next_use(
        make_proxy, stub, pg):
    proxy = make_proxy(top={"database": {"url": pg.url, "statement_timeout": "1h"}})
    for _ in range(8):  # every worker has connected with the old value
        assert pay(proxy, new_key()).status_code == 201
    reload(proxy, settings(proxy, pg, stub,
                           database={"url": pg.url, "statement_timeout": "300ms"}))
    key = new_key()
    lock = lock_table(pg)
    try:
        r = pay(proxy, key)
        rec = requests.get("%s/admin/keys/default/create_payment/%s"
                           % (proxy.admin_url, key),
                           headers={"Authorization": "Bearer " + ADMIN_TOKEN},
                           timeout=TIMEOUT)
    finally:
        lock.rollback()
        lock.close()
    assert_problem(r, 503, "idempotency_store_unavailable")
    assert_problem(rec, 503, "idempotency_store_unavailable")
    assert stub.count(key=key) == 0
    assert pay(proxy, key).status_code == 201  # and the link still works


def test_reload_applies_the_reaper_interval(make_proxy, stub, pg):
    proxy = make_proxy(top={"reaper": {"interval": "1h"}}, start=False)
    canary = new_key("canary")
    insert_record(pg, canary, lease="now() - interval '1 second'", tenant="canary")
    proxy.start()
    try:
        wait_state(pg, canary, "released")  # the pass at start-up is done
        key = new_key()
        insert_record(pg, key, lease="now() - interval '1 second'")
        reload(proxy, settings(proxy, pg, stub, reaper={"interval": "100ms"}))
        wait_state(pg, key, "released")  # not an hour later
    finally:
        assert proxy.stop() == 0


def test_reload_names_each_changed_restart_only_setting(make_proxy, stub, pg):
    proxy = make_proxy()
    reload(proxy, settings(proxy, pg, stub, workers=5, max_connections=512,
                           max_connections_per_ip=7, queue_size=100,
                           log_level="debug"))
    warned = [l for l in log_lines(proxy)
              if l.get("level") == "warn" and "restart" in l.get("msg", "")]
    assert len(warned) == 1, warned
    names = warned[0]["detail"].split("settings=", 1)[1].split(",")
    assert sorted(names) == ["max_connections", "max_connections_per_ip", "workers"]
    assert pay(proxy, new_key()).status_code == 201

    # Compared with what runs, not with the last file: the same file again
    # warns again; a file back at the running values does not.
    reload(proxy, settings(proxy, pg, stub, workers=5, max_connections=512,
                           max_connections_per_ip=7, queue_size=100))
    reload(proxy, settings(proxy, pg, stub, queue_size=10))
    warned = [l for l in log_lines(proxy)
              if l.get("level") == "warn" and "restart" in l.get("msg", "")]
    assert len(warned) == 2, warned
    assert warned[1]["detail"] == warned[0]["detail"]


def test_a_conf_from_before_worker_model_was_removed(make_proxy, stub, pg):
    """worker_model is gone: "fibers", the one model left, still loads;
    "threads" is refused at --check and on reload, naming the setting, and
    the running configuration keeps serving."""
    proxy = make_proxy(top={"worker_model": "fibers"})
    key = new_key()
    assert pay(proxy, key).status_code == 201

    conf = settings(proxy, pg, stub, worker_model="threads")
    with open(proxy.conf_path + ".threads", "w") as f:
        f.write(render_conf(conf))
    r = run_binary(["-c", proxy.conf_path + ".threads", "--check"])
    assert r.returncode != 0
    assert "worker_model was removed: workers are fibers" in r.stdout + r.stderr

    with open(proxy.conf_path, "w") as f:
        f.write(render_conf(conf))
    proxy.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "worker_model was removed" in proxy.log(),
               what="the refused reload in the log")
    assert proxy.proc.poll() is None
    assert is_replay(pay(proxy, key))
    fresh = new_key()
    assert pay(proxy, fresh).status_code == 201
    assert stub.count(key=key) == 1
    assert stub.count(key=fresh) == 1
