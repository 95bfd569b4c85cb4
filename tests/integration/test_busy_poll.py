"""busy_poll: while at most one request is with a worker, the thread serving
it polls its sockets instead of sleeping, and a worker that has just finished
polls the queue. It changes how the proxy waits, never what it does: the
upstream still sees each key once, no request is lost between the polling
worker and the others, the store's and the upstream's timeouts still hold,
polling stops when the proxy is idle, and a reload turns it on and off.
(`make check-busy-poll` runs other suites with it on, too.)"""
import os
import re
import signal
import threading
import time

import psycopg

from helpers import (TIMEOUT, assert_problem, fire_together, is_replay, new_key,
                     wait_until)
from store_support import metric, pay

BUSY = {"busy_poll": "5ms"}
COUNTER = "idemproxy_busy_poll_seconds_total"


def busy_seconds(proxy):
    return metric(proxy, COUNTER)


def cpu_seconds(pid):
    """User + system CPU time of a process, from /proc."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_first_attempts_and_store_replays_with_busy_polling(make_proxy, stub, pg):
    # Without the replay cache every replay is a store call too.
    proxy = make_proxy(top=dict(BUSY, replay_cache_size=0))
    assert busy_seconds(proxy) < 0.1  # at most one idle poll since start
    keys = [new_key() for _ in range(20)]
    for k in keys:
        first = pay(proxy, k)
        assert first.status_code == 201 and not is_replay(first)
        again = pay(proxy, k)
        assert again.status_code == 201 and is_replay(again)
        assert again.content == first.content
        mismatch = pay(proxy, k, body={"amount": 999})
        assert_problem(mismatch, 409, "idempotency_key_mismatch")
    for k in keys:
        assert stub.count(key=k) == 1
        assert pg.record(k)["state"] == "completed"
    assert busy_seconds(proxy) > 0


def test_no_request_is_lost_or_doubled_between_pollers_and_sleepers(make_proxy, stub, pg):
    proxy = make_proxy(top=BUSY)  # 4 workers
    # Sequential traffic first: one worker polls the queue when the burst
    # comes, the others sleep; the first queued request is left to the
    # poller, the rest must wake sleepers.
    for _ in range(5):
        assert pay(proxy, new_key()).status_code == 201
    keys = [new_key() for _ in range(96)]
    results = fire_together(16, lambda i: [pay(proxy, k) for k in keys[i::16]])
    errors = [r for r in results if isinstance(r, Exception)]
    assert not errors, errors[:3]
    statuses = [r.status_code for batch in results for r in batch]
    assert statuses == [201] * len(keys)
    for k in keys:
        assert stub.count(key=k) == 1, k
    # And one key from many clients at once still runs upstream once.
    key = new_key()
    stub.configure({"prefix": "/v1/payments", "delay": 0.5})
    same = fire_together(20, lambda i: pay(proxy, key))
    assert not [r for r in same if isinstance(r, Exception)]
    assert sorted({r.status_code for r in same}) in ([201], [201, 409])
    assert len([r for r in same if r.status_code == 201 and not is_replay(r)]) == 1
    assert stub.count(key=key) == 1


def test_requests_arriving_while_a_worker_polls_run_in_parallel(make_proxy, stub, pg):
    """The polling worker takes the first queued request itself; the others
    must wake sleeping workers, not wait for the poller: all four reach the
    upstream while none has been answered."""
    proxy = make_proxy(top=BUSY)  # 4 workers
    for _ in range(3):  # leaves a worker polling the queue
        assert pay(proxy, new_key()).status_code == 201
    stub.configure({"prefix": "/v1/payments", "gate": "held"})
    keys = [new_key() for _ in range(4)]
    done = []

    def release_when_all_arrived():
        try:
            wait_until(lambda: all(stub.count(key=k) == 1 for k in keys),
                       timeout=10, what="the four requests at the upstream")
            done.append(True)
        finally:
            stub.release("held")

    waiter = threading.Thread(target=release_when_all_arrived)
    waiter.start()
    results = fire_together(4, lambda i: pay(proxy, keys[i]))
    waiter.join(TIMEOUT)
    assert done == [True], "the four requests did not reach the upstream together"
    assert [getattr(r, "status_code", r) for r in results] == [201] * 4


def test_polling_stops_when_the_proxy_is_idle(make_proxy, stub, pg):
    proxy = make_proxy(top=BUSY)
    for _ in range(10):
        assert pay(proxy, new_key()).status_code == 201
    time.sleep(0.3)  # well past the 5 ms budget
    counter, cpu = busy_seconds(proxy), cpu_seconds(proxy.proc.pid)
    time.sleep(2.0)
    assert busy_seconds(proxy) - counter < 0.001
    # Not polling shows in the CPU time too (one /metrics answer costs
    # little): far below the 2 s a spinning thread would burn.
    assert cpu_seconds(proxy.proc.pid) - cpu < 0.2


def test_upstream_timeout_holds_while_busy_polling(make_proxy, stub, pg):
    proxy = make_proxy(top=BUSY, route_overrides={
        "create_payment": {"upstream_timeout": "1s", "lease": "30s"}})
    stub.configure({"prefix": "/v1/payments", "delay": 5.0})
    key = new_key()
    t0 = time.monotonic()
    r = pay(proxy, key)
    took = time.monotonic() - t0
    assert_problem(r, 504, "upstream_outcome_unknown")
    # the 1 s timeout, not the upstream's 5 s (with room for TSan)
    assert 0.9 < took < 4.0, took
    assert stub.count(key=key) == 1
    assert pg.record(key)["state"] == "processing"


def test_store_timeout_holds_while_busy_polling(make_proxy, stub, pg):
    proxy = make_proxy(top=dict(BUSY, database={"url": pg.url,
                                                "statement_timeout": "300ms"}))
    lock = psycopg.connect(pg.url)
    lock.execute("BEGIN")
    lock.execute("LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE")
    key = new_key()
    try:
        t0 = time.monotonic()
        r = pay(proxy, key)
        took = time.monotonic() - t0
    finally:
        lock.rollback()
        lock.close()
    assert_problem(r, 503, "idempotency_store_unavailable")
    assert took < 3, took
    assert stub.count(key=key) == 0
    # The worker's connection is still good afterwards.
    assert pay(proxy, key).status_code == 201
    assert stub.count(key=key) == 1


def test_reload_turns_busy_polling_on_and_off(make_proxy, stub, pg):
    proxy = make_proxy(top={"busy_poll": "0ms"})  # off even under check-busy-poll
    for _ in range(5):
        assert pay(proxy, new_key()).status_code == 201
    assert busy_seconds(proxy) == 0

    def reload_with(extra):
        with open(proxy.conf_path) as f:
            text = f.read()
        line = 'busy_poll = "%s";' % extra
        text, n = re.subn(r'(?m)^busy_poll = .*$', line, text)
        assert n == 1, "one busy_poll line in the conf"
        with open(proxy.conf_path + ".new", "w") as f:
            f.write(text)
        os.replace(proxy.conf_path + ".new", proxy.conf_path)
        before = proxy.log().count("configuration reloaded")
        proxy.proc.send_signal(signal.SIGHUP)
        wait_until(lambda: proxy.log().count("configuration reloaded") > before,
                   what="the reload")

    reload_with("5ms")
    for _ in range(5):
        assert pay(proxy, new_key()).status_code == 201
    on = busy_seconds(proxy)
    assert on > 0
    reload_with("0ms")
    time.sleep(0.1)
    for _ in range(5):
        assert pay(proxy, new_key()).status_code == 201
    assert busy_seconds(proxy) - on < 0.01
