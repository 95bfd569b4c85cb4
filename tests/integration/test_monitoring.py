"""What operators load next to the proxy (README "Runbook"): the Prometheus
alert rules in conf/prometheus (checked and unit-tested with promtool), the
Grafana dashboard in conf/grafana, and the metrics they need. Every
expression in both must parse as PromQL and name only metrics, and label
values, that a running proxy actually exports after it served traffic of
every kind."""
import json
import os
import re
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

import pytest
import requests

from conftest import ADMIN_TOKEN, ROOT
from helpers import TIMEOUT, assert_problem, free_port, is_replay, new_key, wait_until
from store_support import insert_record
from test_ops import hold_in_flight, pay, scrape, set_connections

PAY = "/v1/payments"
RULES = os.path.join(ROOT, "conf", "prometheus", "idemproxy-alerts.yml")
RULE_TESTS = os.path.join(ROOT, "conf", "prometheus", "idemproxy-alerts.test.yml")
DASHBOARD = os.path.join(ROOT, "conf", "grafana", "idemproxy-dashboard.json")
README = os.path.join(ROOT, "README.md")

# Events the proxy exports at 0 from the start, so that increase() sees the
# first one (a counter that appears at 1 has no increase yet).
EVENTS = ("record_failed", "record_fenced", "forwarded_unprotected", "replay_cache_hit",
          "overloaded")


# --- the metrics the alerts need ----------------------------------------------

def test_reaper_success_timestamp_advances_and_stops_while_the_store_is_down(
        make_proxy, stub, pg):
    proxy = make_proxy(top={"reaper": {"interval": "200ms"}})
    name = "idemproxy_reaper_last_success_timestamp_seconds"
    assert scrape(proxy).types.get(name) == "gauge"
    t0 = wait_until(lambda: scrape(proxy).value(name), what="the reaper's first pass")
    assert abs(t0 - time.time()) < 3600, "%s is not a Unix time: %r" % (name, t0)
    later = wait_until(lambda: (lambda v: v if v > t0 else None)(scrape(proxy).value(name)),
                       what="the reaper's next pass")
    assert later <= time.time() + 1
    # A pass that cannot reach the store does not count: the timestamp
    # stays where the last good pass left it.
    pg.close()
    set_connections(pg, False)
    try:
        down = wait_until(lambda: (lambda e: e if e.value("idemproxy_store_up") == 0
                                   else None)(scrape(proxy)),
                          what="the reaper to find the store gone")
        stuck = down.value(name)
        time.sleep(1.0)  # five reaper intervals, each a failing pass
        assert scrape(proxy).value(name) == stuck
    finally:
        set_connections(pg, True)
    wait_until(lambda: scrape(proxy).value(name) > stuck, what="a good pass again")


def test_events_are_exported_at_zero_before_they_happen(proxy):
    m = scrape(proxy)
    for event in EVENTS:
        series = [v for lab, v in m.series("idemproxy_events_total")
                  if lab == {"event": event}]
        assert series == [0], "%s: %r" % (event, series)


def test_overloaded_requests_are_counted(make_proxy, stub, pg):
    proxy = make_proxy(top={"workers": 1, "queue_size": 1})
    stub.configure({"prefix": PAY, "gate": "busy"})
    before = scrape(proxy).value("idemproxy_events_total", event="overloaded")
    keys = [new_key("more%d" % i) for i in range(3)]
    with ThreadPoolExecutor(1 + len(keys)) as ex:
        try:
            held = ex.submit(pay, proxy, new_key("busy"), timeout=60)
            stub.wait_for(prefix=PAY)  # the only worker is busy upstream
            futs = [ex.submit(pay, proxy, k, timeout=60) for k in keys]
            shed = []
            for f in as_completed(futs, timeout=TIMEOUT * 2):
                shed.append(f.result())
                if len(shed) == len(keys) - 1:  # one waits in the queue
                    break
        finally:
            stub.release("busy")
        for r in shed:
            assert_problem(r, 503, "overloaded")
        assert held.result(timeout=60).status_code == 201
        for f in futs:
            f.result(timeout=60)
    m = scrape(proxy)
    assert m.value("idemproxy_events_total", event="overloaded") - before == len(shed)
    assert m.value("idemproxy_requests_total", outcome="rejected") == len(shed)


def test_replay_cache_size_is_exported(proxy, stub):
    m = scrape(proxy)
    for name in ("idemproxy_replay_cache_entries", "idemproxy_replay_cache_bytes"):
        assert m.types.get(name) == "gauge", name
        assert m.value(name) == 0, name
    keys = [new_key() for _ in range(2)]
    for k in keys:
        assert pay(proxy, k).status_code == 201
    m = wait_until(lambda: (lambda e: e if e.value("idemproxy_replay_cache_entries") == 2
                            else None)(scrape(proxy)), what="two cached responses")
    size = m.value("idemproxy_replay_cache_bytes")
    assert size > 2 * len(pay(proxy, keys[0]).content)
    # a replay does not add an entry; a DELETE removes one
    assert is_replay(pay(proxy, keys[0]))
    r = requests.delete("%s/admin/keys/default/create_payment/%s" % (proxy.admin_url, keys[1]),
                        headers={"Authorization": "Bearer " + ADMIN_TOKEN}, timeout=TIMEOUT)
    assert r.status_code == 200, r.text
    m = scrape(proxy)
    assert m.value("idemproxy_replay_cache_entries") == 1
    assert 0 < m.value("idemproxy_replay_cache_bytes") < size
