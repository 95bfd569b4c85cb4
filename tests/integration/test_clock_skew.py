"""A proxy whose wall clock is off by more than a lease (libfaketime, ahead
and behind) beside one whose clock is right, on the same database: leases
and expiry follow the database's clock, so neither proxy takes a key in
flight over early nor replays a record the database has expired; each
proxy measures its offset from the database's clock, exports it, and the
skewed ones say so in their logs."""
import datetime
import json
import math
import os
import re
import subprocess
import threading
import time

import psycopg
import pytest

from conftest import ROOT
from helpers import is_replay, new_key, wait_until
from store_support import metrics, pay, wait_state

LIBFAKETIME = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
# The skewed proxies are this tree's objects linked with glibc's malloc:
# libfaketime 0.9.10 and jemalloc call into each other at start until
# libfaketime gives up (mk/shim.mk). The clock code under test is the same.
GLIBC_MALLOC_BIN = os.path.join(ROOT, "build", "idemproxy-glibc-malloc")
SKEW = 10  # seconds: more than LEASE and more than TTL
LEASE = "3s"
TTL = "4s"
ROUTES = {"create_payment": {"lease": LEASE, "ttl": TTL,
                             "upstream_timeout": "2s"}}
# A cached replay would be trusted this long if its deadline were not the
# record's expiry.
TOP = {"replay_cache_ttl": "1m"}
OFFSET = "idemproxy_store_clock_offset_seconds"


def faketime_env(seconds):
    """The proxy's clocks moved by seconds: its wall clock (CLOCK_REALTIME,
    gettimeofday, time) as a clock set wrong leaves it, and its monotonic
    clock by as much, which changes no duration. (Leaving the monotonic
    clock alone, FAKETIME_DONT_FAKE_MONOTONIC=1, makes libfaketime 0.9.10
    end every wait on a monotonic condition variable at once.)"""
    return {"LD_PRELOAD": LIBFAKETIME, "FAKETIME": "%+ds" % seconds}


@pytest.fixture(scope="module")
def skewable():
    subprocess.run(["make", "-s", "build/idemproxy-glibc-malloc"], cwd=ROOT,
                   check=True, timeout=300)
    return GLIBC_MALLOC_BIN


def clock_of(proxy):
    """How far the proxy's wall clock is from ours, by the time on its
    first log line (written at start, a moment ago)."""
    first = json.loads(proxy.log().splitlines()[0])
    logged = datetime.datetime.strptime(first["time"], "%Y-%m-%dT%H:%M:%S.%fZ")
    logged = logged.replace(tzinfo=datetime.timezone.utc).timestamp()
    return logged - time.time()


def three_proxies(make_proxy, binary, top=TOP):
    """Right, ahead by SKEW, behind by SKEW."""
    plain = make_proxy(route_overrides=ROUTES, top=top)
    ahead, behind = (make_proxy(route_overrides=ROUTES, top=top, migrate=False,
                                env=faketime_env(s), binary=binary)
                     for s in (SKEW, -SKEW))
    # libfaketime took: each clock is off by about its skew (the few
    # seconds allowed are start-up, far less than SKEW)
    for p, s in ((plain, 0), (ahead, SKEW), (behind, -SKEW)):
        assert abs(clock_of(p) - s) < SKEW / 2, (p.log_path, clock_of(p))
    return plain, ahead, behind


def warnings(proxy, msg):
    """(level, offset_s) of each log line msg."""
    out = []
    for line in proxy.log().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("msg") == msg:
            m = re.search(r'offset_s[=":\s]*(-?[0-9.]+)', line)
            out.append((rec.get("level"), float(m.group(1)) if m else None))
    return out


def test_a_key_in_flight_is_not_taken_over_by_a_skewed_proxy(make_proxy, stub, skewable):
    """The first attempt holds the key on one proxy while a duplicate goes
    to another whose clock differs by more than the lease: the lease is
    the database's, so the duplicate is refused, not forwarded."""
    proxies = three_proxies(make_proxy, skewable)
    pairs = [(a, b) for a in proxies for b in proxies if a is not b]
    for first, second in pairs:
        key = new_key()
        stub.configure({"key": key, "gate": key, "times": 1}, append=True)
        sent = {}

        def send(p=first, k=key):
            sent["r"] = pay(p, k)
        t = threading.Thread(target=send)
        t.start()
        stub.wait_for(1, key=key)
        dup = pay(second, key)
        stub.release(key)
        t.join()
        assert sent["r"].status_code == 201 and not is_replay(sent["r"])
        assert dup.status_code == 409, (dup.status_code, dup.text)
        assert dup.json()["code"] == "idempotency_key_in_use"
        assert stub.count(key=key) == 1


def test_expiry_is_the_databases_on_a_skewed_proxy(make_proxy, stub, pg, skewable):
    """Inside its ttl a key is replayed by every proxy (from the store, then
    from memory); once the database has expired it, the first proxy asked,
    right, ahead or behind, executes it anew instead of replaying the
    answer its replay cache holds, and the others replay the new one."""
    proxies = three_proxies(make_proxy, skewable)
    keys = []
    for i, p in enumerate(proxies):
        key = new_key()
        first = pay(p, key)
        assert first.status_code == 201 and not is_replay(first)
        for q in proxies + proxies:
            again = pay(q, key)
            assert again.status_code == 201 and is_replay(again)
            assert again.content == first.content
        assert stub.count(key=key) == 1
        keys.append((key, first))
    # (a record the reaper purged counts as expired too)
    wait_until(lambda: not pg.query(
        "SELECT 1 FROM idempotency_records WHERE idem_key = ANY(%s) "
        "AND expires_at > now()", ([k for k, _ in keys],)),
        timeout=15, what="the records to expire")
    # The proxies' deadlines were set before their claims were sent, so
    # they end before the database's expiry; the margin only keeps the
    # two clocks' readings from being compared within a millisecond.
    time.sleep(0.2)
    for i, (key, first) in enumerate(keys):
        order = proxies[i + 1:] + proxies[:i + 1]  # not the one that executed it
        fresh = pay(order[0], key)
        assert fresh.status_code == 201 and not is_replay(fresh), \
            "%s replayed a record the database had expired" % order[0].log_path
        assert fresh.content != first.content
        for q in order[1:]:
            again = pay(q, key)
            assert again.status_code == 201 and is_replay(again)
            assert again.content == fresh.content
        assert stub.count(key=key) == 2


def test_the_offset_is_exported_and_warned_of(make_proxy, stub, skewable):
    """Each reaper pass (the first at start) measures the proxy's offset
    from the database's clock: exported, and beyond a second warned of
    once, not at every pass. Nothing is refused for it."""
    top = dict(TOP, reaper={"interval": "300ms"})
    plain, ahead, behind = three_proxies(make_proxy, skewable, top)
    msg = "clock differs from the database's"
    passes = "idemproxy_reaper_last_success_timestamp_seconds"
    for p, skew in ((ahead, SKEW), (behind, -SKEW)):
        wait_until(lambda p=p: warnings(p, msg), what="the warning")
        # two more passes, each measuring again
        for _ in range(2):
            last = metrics(p)[passes]
            wait_until(lambda p=p, last=last: metrics(p)[passes] != last,
                       what="a reaper pass")
        assert abs(metrics(p)[OFFSET] - skew) < 1, metrics(p)[OFFSET]
        w = warnings(p, msg)
        assert len(w) == 1 and w[0][0] == "warn", w
        assert abs(w[0][1] - skew) < 1, w
    # NaN until the first pass has measured it
    offset = wait_until(lambda: not math.isnan(metrics(plain)[OFFSET]) and
                        [metrics(plain)[OFFSET]], what="the offset")[0]
    assert abs(offset) < 1, offset
    assert warnings(plain, msg) == []
    for p in (plain, ahead, behind):
        key = new_key()
        assert pay(p, key).status_code == 201
        assert stub.count(key=key) == 1


@pytest.fixture(scope="module")
def clock_step():
    subprocess.run(["make", "-s", "build/clock_step.so"], cwd=ROOT, check=True,
                   timeout=120)
    return os.path.join(ROOT, "build", "clock_step.so")


def test_the_reaper_keeps_its_interval_when_the_clock_steps(make_proxy, clock_step):
    """The wall clock stepped back by an hour between the reaper's reading
    it and its wait for the next pass (tests/shim/clock_step.c): the next
    passes still come at the interval, not an hour later."""
    proxy = make_proxy(top={"reaper": {"interval": "200ms"}}, env={
        "LD_PRELOAD": clock_step, "IDEMPROXY_SHIM_CLOCK_STEP_S": "3600"})
    passes = "idemproxy_reaper_last_success_timestamp_seconds"
    for _ in range(3):
        last = metrics(proxy).get(passes, 0)
        wait_until(lambda last=last: metrics(proxy)[passes] != last,
                   timeout=10, what="a reaper pass")
    # the shim took: the pass's time is on the stepped clock
    assert metrics(proxy)[passes] - time.time() > 3000


def test_a_record_tried_again_is_written_when_the_clock_steps(make_proxy, stub, pg,
                                                              clock_step):
    """An answer the store could not take at once is written again by the
    worker while the client waits; the wall clock stepped back by an hour
    (tests/shim/clock_step.c): the record is still written within the
    attempt's lease, once the store takes it, and only then answered."""
    proxy = make_proxy(
        top={"workers": 1, "database": {"url": pg.url, "statement_timeout": "300ms"}},
        env={"LD_PRELOAD": clock_step, "IDEMPROXY_SHIM_CLOCK_STEP_S": "3600"})
    key = new_key()
    stub.configure({"key": key, "gate": key, "times": 1})
    answers = []
    t = threading.Thread(target=lambda: answers.append(pay(proxy, key)))
    t.start()
    stub.wait_for(key=key)
    lock = psycopg.connect(pg.url)
    try:
        lock.execute("BEGIN")
        lock.execute("LOCK TABLE idempotency_records IN ACCESS EXCLUSIVE MODE")
        stub.release(key)
        wait_until(lambda: "trying again while the client waits" in proxy.log(),
                   what="the worker to try the record again")
        assert not answers, answers[0].content
    finally:
        lock.rollback()
        lock.close()
    t.join()
    assert answers[0].status_code == 201 and not is_replay(answers[0])
    rec = wait_state(pg, key, "completed", timeout=20)
    assert bytes(rec["response_body"]) == answers[0].content
    assert stub.count(key=key) == 1
    m = metrics(proxy)
    assert m['idemproxy_events_total{event="record_retried"}'] == 1
    assert m['idemproxy_events_total{event="record_failed"}'] == 0
