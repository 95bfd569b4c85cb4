"""A failover of the store under load (doc/operations.md#failover): two
proxy instances with `database.url` in libpq's multi-host form in front of
a primary and a synchronous standby of their own (pg_standby.py); the
primary's postmaster and backends are killed with SIGKILL while clients
send requests, and the standby is promoted.

One failover serves the whole module (the scenario fixture): it is set up
once, with what must be in flight when the primary dies (a held attempt
with a waiter on the other instance, a held attempt whose record will fail,
a few seconds of load on both instances), and each test then checks one
promise against what the stub upstream received and what the new primary
holds."""
import os
import random
import threading
import time
import types

import pytest
import requests

from conftest import (ADMIN_TOKEN, PgDb, Proxy, default_routes, run_binary, start_stub,
                      stop_stub)
from helpers import (TIMEOUT, free_port, is_replay, log_entries, new_key, render_conf,
                     wait_until)
from pg_standby import running_pair
from store_support import PAY, insert_record, pay, wait_state
from test_batch import Requests, batched, claims_queued_behind_held_rows
from test_outage import counter

AUTH = {"Authorization": "Bearer " + ADMIN_TOKEN}
LOAD_THREADS = 4
LOAD_BEFORE_KILL = 1.0     # seconds of load before the primary dies
LOAD_AFTER_PROMOTE = 1.5   # and after the standby took over
RETRY_FOR = 25.0           # a load client retries one key this long at most


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    with running_pair(str(tmp_path_factory.mktemp("pair"))) as p:
        yield p


@pytest.fixture(scope="module")
def fo_stub(tmp_path_factory):
    s = start_stub(str(tmp_path_factory.mktemp("stub")))
    yield s
    stop_stub(s)


def start_proxy(tmp, name, stub, pair, url=None):
    port, admin_port = free_port(), free_port()
    routes = default_routes(stub.url)
    for r in routes:
        if r["name"] == "create_payment":
            r.update(in_flight="wait", wait_max="20s")
    settings = {
        "listen": "127.0.0.1:%d" % port,
        "admin_listen": "127.0.0.1:%d" % admin_port,
        "admin_token": ADMIN_TOKEN,
        "workers": 8,
        "shutdown_grace": "3s",
        "log_level": "info",
        "log_flush_interval": "0s",
        # a batch held by the test's rows is waited for (test_batch.py)
        "database": {"url": url or pair.url, "batch_stall": "1h"},
        "reaper": {"interval": "200ms"},
        # every replay comes from the store, so from the new primary
        "replay_cache_size": 0,
        "routes": routes,
    }
    if os.environ.get("IDEMPROXY_TEST_BUSY_POLL"):   # as make_proxy does
        settings["busy_poll"] = os.environ["IDEMPROXY_TEST_BUSY_POLL"]
    conf = os.path.join(tmp, "%s.conf" % name)
    with open(conf, "w") as f:
        f.write(render_conf(settings))
    env = dict(os.environ)
    env.pop("IDEMPROXY_DATABASE_URL", None)
    env.pop("IDEMPROXY_LISTEN", None)
    r = run_binary(["-c", conf, "--check"], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return Proxy(conf, os.path.join(tmp, "%s.log" % name), port, admin_port, env).start()


@pytest.fixture(scope="module")
def proxies(tmp_path_factory, fo_stub, pair):
    tmp = str(tmp_path_factory.mktemp("proxies"))
    started = []
    try:
        for name in ("one", "two"):
            started.append(start_proxy(tmp, name, fo_stub, pair))
        yield started
    finally:
        problems = [p.teardown_problem() for p in started]
        for p, why in zip(started, problems):
            if why:
                print("--- %s ---\n%s" % (p.log_path, p.log()[-4000:]))
        assert not any(problems), problems


class Load:
    """Clients sending fresh keys to both instances, each retrying its key
    (as a client would, after a 503 or a 409) until it gets a 2xx."""

    def __init__(self, proxies):
        self.proxies = proxies
        self.stop = threading.Event()
        self.answers = {}       # key -> (instance index, response)
        self.unanswered = []    # keys no retry got a 2xx for
        self.threads = [threading.Thread(target=self.client, args=(i,), daemon=True)
                        for i in range(LOAD_THREADS)]

    def client(self, i):
        rnd = random.Random(i)
        while not self.stop.is_set():
            key = new_key("load%d" % i)
            deadline = time.monotonic() + RETRY_FOR
            while time.monotonic() < deadline:
                at = rnd.randrange(len(self.proxies))
                try:
                    r = pay(self.proxies[at], key, timeout=TIMEOUT)
                except requests.RequestException:
                    r = None
                if r is not None and 200 <= r.status_code < 300:
                    self.answers[key] = (at, r)
                    break
                time.sleep(0.05)
            else:
                self.unanswered.append(key)

    def __enter__(self):
        for t in self.threads:
            t.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        for t in self.threads:
            t.join(RETRY_FOR + TIMEOUT)


def in_background(fn, *args):
    out = []
    t = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    t.start()
    return t, out


def joined(t, out, what):
    t.join(RETRY_FOR + TIMEOUT)
    assert out, "no answer for " + what
    return out[0]


@pytest.fixture(scope="module")
def scenario(pair, fo_stub, proxies):
    one, two = proxies
    for p in proxies:   # every instance connected to the primary
        assert pay(p, new_key("warm")).status_code == 201
    db = PgDb(types.SimpleNamespace(conninfo=pair.url_for), pair.db)
    s = types.SimpleNamespace(db=db)
    # an attempt held at the upstream on instance one, and a duplicate
    # waiting for it on instance two
    s.wait_key = new_key("waited")
    fo_stub.configure({"prefix": PAY, "key": s.wait_key, "gate": "w", "times": 1},
                      append=True)
    s.original = in_background(pay, one, s.wait_key)
    fo_stub.wait_for(key=s.wait_key)
    s.waiter = in_background(pay, two, s.wait_key)
    wait_until(lambda: db.record(s.wait_key)["wait_notify"], what="the waiter to park")
    # an attempt whose answer comes while there is no primary
    s.late_key = new_key("late")
    fo_stub.configure({"prefix": PAY, "key": s.late_key, "gate": "late", "times": 1},
                      append=True)
    s.late = in_background(pay, one, s.late_key)
    fo_stub.wait_for(key=s.late_key)
    db.close()
    with Load(proxies) as s.load:
        time.sleep(LOAD_BEFORE_KILL)
        pair.kill_primary()
        fo_stub.release("late")
        # answered while there is no primary: the client waits while the
        # worker tries its record again, until the new primary takes it
        wait_until(lambda: any(e.get("msg", "").startswith("could not record")
                               and s.late_key in e.get("detail", "")
                               for e in log_entries(one)),
                   what="the late answer's record to fail")
        pair.promote()
        s.late_answer = joined(*s.late, what=s.late_key)
        fo_stub.release("w")
        time.sleep(LOAD_AFTER_PROMOTE)
    s.original_answer = joined(*s.original, what="the original")
    s.waiter_answer = joined(*s.waiter, what="the waiter")
    yield s
    db.close()


def executions(stub):
    out = {}
    for r in stub.requests(prefix=PAY):
        out.setdefault(r.key, []).append(r)
    return out


def test_no_key_executed_twice(scenario, fo_stub):
    assert len(scenario.load.answers) > LOAD_THREADS, "the load made too few requests"
    assert not scenario.load.unanswered, scenario.load.unanswered
    twice = {k: len(v) for k, v in executions(fo_stub).items() if len(v) > 1}
    assert not twice, twice
    ran = executions(fo_stub)
    for key in scenario.load.answers:
        assert len(ran.get(key, [])) == 1, key


def test_completed_records_replay_from_the_new_primary_on_both_instances(
        scenario, fo_stub, proxies, pair):
    before = fo_stub.count(prefix=PAY)
    for key, (_, first) in scenario.load.answers.items():
        for p in proxies:
            again = pay(p, key)
            assert again.status_code == first.status_code and is_replay(again), key
            assert again.content == first.content, key
    assert fo_stub.count(prefix=PAY) == before
    stored = pair.query("SELECT count(*) FROM idempotency_records WHERE state = 'completed' "
                        "AND idem_key = ANY(%s)", (list(scenario.load.answers),))[0][0]
    assert stored == len(scenario.load.answers)


def test_fresh_keys_are_served_after_the_promotion_on_both_instances(scenario, fo_stub,
                                                                     proxies):
    for p in proxies:
        key = new_key("fresh")
        r = pay(p, key)
        assert r.status_code == 201 and not is_replay(r), r.content
        assert fo_stub.count(key=key) == 1


def test_a_waiter_on_the_other_instance_gets_the_originals_answer(scenario, fo_stub):
    # The waiter parked on instance two before the primary died; its
    # wake-up comes by NOTIFY from the new primary (its wait_max, 20 s,
    # is far below the lease, 30 s: without the wake-up it would get a 409).
    orig, waited = scenario.original_answer, scenario.waiter_answer
    assert orig.status_code == 201 and not is_replay(orig), orig.content
    assert waited.status_code == 201 and is_replay(waited), waited.content
    assert waited.content == orig.content
    assert fo_stub.count(key=scenario.wait_key) == 1


def test_batch_lanes_keep_working(scenario, fo_stub, proxies):
    # claims queued behind held rows on the new primary go out together
    # (as in test_batch.py), on each instance's batch connection
    for p in proxies:
        reqs = Requests()
        keys = [new_key("batch") for _ in range(4)]
        held, waited = claims_queued_behind_held_rows(p, scenario.db, reqs, keys)
        stmts0, carried0 = batched(p, "claim")
        held.release()
        reqs.join()
        for k in keys + waited:
            (r,) = reqs.answers[k]
            assert r.status_code == 201 and not is_replay(r), (k, r.content)
            assert fo_stub.count(key=k) == 1, k
        stmts, carried = batched(p, "claim")
        assert (stmts - stmts0, carried - carried0) == (2, 5)


def test_the_reaper_frees_a_dead_attempt_after_the_failover(scenario, fo_stub, proxies):
    # an attempt made on the new primary whose instance died with it: its
    # record is made processing again with its lease ended, as it would be
    key = new_key("dead")
    assert pay(proxies[0], key).status_code == 201
    assert scenario.db.execute(
        "UPDATE idempotency_records SET state = 'processing', lease_until = "
        "now() - interval '1 second', response_status = NULL, response_headers = NULL, "
        "response_body = NULL, replayable = NULL WHERE idem_key = %s", (key,)) == 1
    rec = wait_state(scenario.db, key, "released")
    assert rec["attempt"] == 1 and rec["lease_until"] is None
    r = pay(proxies[1], key)
    assert r.status_code == 201 and not is_replay(r), r.content
    assert fo_stub.count(key=key) == 2
    assert scenario.db.record(key)["attempt"] == 2


def test_the_admin_listener_answers_from_the_new_primary(scenario, proxies):
    # a record that exists only on the new primary
    key = new_key("admin")
    insert_record(scenario.db, key, state="completed", lease=None, status=201, body=b"{}")
    for p in proxies:
        g = requests.get("%s/admin/keys/default/create_payment/%s" % (p.admin_url, key),
                         headers=AUTH, timeout=TIMEOUT)
        assert g.status_code == 200, g.text
        assert g.json()["state"] == "completed", g.text


def test_a_record_that_failed_during_the_failover_is_written_before_the_answer(
        scenario, fo_stub, proxies):
    # answered by the upstream while there was no primary: the worker kept
    # the client waiting and wrote the record to the new one, then answered
    late = scenario.late_answer
    assert late.status_code == 201 and not is_replay(late), late.content
    rec = wait_state(scenario.db, scenario.late_key, "completed", timeout=20)
    assert bytes(rec["response_body"]) == late.content
    assert counter(proxies[0], "idemproxy_events_total", event="record_retried") >= 1
    for p in proxies:
        again = pay(p, scenario.late_key)
        assert is_replay(again) and again.content == late.content
    assert fo_stub.count(key=scenario.late_key) == 1


def test_the_failover_is_logged_once_per_instance(scenario, pair, proxies):
    # one event per instance, naming the server before and after; the
    # connections that found the old primary gone say so at debug level
    for p in proxies:
        lines = log_entries(p)
        events = [e for e in lines if e.get("msg") == "store failover"]
        assert len(events) == 1, events
        (e,) = events
        fields = dict(w.split("=", 1) for w in e["detail"].split() if "=" in w)
        assert e["level"] == "warn"
        assert fields["from"] == "127.0.0.1:%d" % pair.primary_port, e
        assert fields["to"] == "127.0.0.1:%d" % pair.standby_port, e
        lost = [e for e in lines if e.get("msg") == "store connection lost"]
        assert len(lost) <= 1 and all(e["level"] == "warn" for e in lost), lost
        back = [e for e in lines if e.get("msg") == "store connection re-established"]
        assert not back, back
        assert counter(p, "idemproxy_store_failovers_total") == 1


def sockets_to(pid, port):
    """The TCP sockets of process pid whose remote port is port: local and
    remote address, state, and the timer running (from /proc/<pid>/fd and
    /proc/<pid>/net/tcp; timer 02 is the keepalive timer)."""
    inodes = set()
    fd_dir = "/proc/%d/fd" % pid
    for fd in os.listdir(fd_dir):
        try:
            target = os.readlink(os.path.join(fd_dir, fd))
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    with open("/proc/%d/net/tcp" % pid) as f:
        next(f)
        for line in f:
            cols = line.split()
            remote_port = int(cols[2].split(":")[1], 16)
            if cols[9] in inodes and remote_port == port:
                found.append((cols[1], cols[2], cols[3], cols[5].split(":")[0]))
    return found


def test_no_connection_of_the_proxy_stays_on_the_dead_primary(scenario, pair, proxies):
    # Idle connections (the admin listener's, the record retrier's, idle
    # workers' and batch lanes') were left half-closed on the dead primary
    # until their next use.
    for p in proxies:
        assert sockets_to(p.proc.pid, pair.primary_port) == [], p.log_path


ESTABLISHED = "01"
KEEPALIVE_TIMER = "02"


def keepalive_timers(pid, port, samples=10):
    """{local address: whether its keepalive timer was seen} for the
    process's established connections to port. A connection that just
    sent shows its retransmission timer instead for a moment (the reaper
    runs every 200 ms), so a few looks are taken."""
    seen = {}
    for _ in range(samples):
        for local, _, state, timer in sockets_to(pid, port):
            if state == ESTABLISHED:
                seen[local] = seen.get(local, False) or timer == KEEPALIVE_TIMER
        time.sleep(0.03)
    return seen


def test_store_connections_keep_alive_unless_the_url_says_otherwise(
        scenario, pair, proxies, fo_stub, tmp_path):
    # every connection to the new primary runs TCP keepalives
    for p in proxies:
        seen = keepalive_timers(p.proc.pid, pair.standby_port)
        assert seen and all(seen.values()), seen
    # database.url's own setting wins
    p = start_proxy(str(tmp_path), "nokeepalive", fo_stub, pair,
                    url=pair.url + "&keepalives=0")
    try:
        assert pay(p, new_key("nokeepalive")).status_code == 201
        seen = keepalive_timers(p.proc.pid, pair.standby_port)
        assert seen and not any(seen.values()), seen
    finally:
        assert p.stop() == 0
