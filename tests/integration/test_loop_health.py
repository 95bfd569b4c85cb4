"""The serving loop's heartbeat (doc/operations.md "Topology", a stalled serving loop): one thread (ip-serve)
runs libmicrohttpd's loop, the worker fibers and the batch lanes, so a stall
there stalls every client. The admin listener has threads of its own; it
sees the stall through the heartbeat the loop keeps: /readyz fails with the
reason and idemproxy_loop_lag_seconds shows how late the loop is. The stall
is made with ptrace on that one thread (freeze.py)."""
import time

import requests

from freeze import freeze_thread
from helpers import TIMEOUT, new_key, wait_until
from test_ops import pay, scrape

LAG = "idemproxy_loop_lag_seconds"


def readyz(proxy):
    return requests.get(proxy.admin_url + "/readyz", timeout=TIMEOUT)


def lag(proxy):
    return scrape(proxy).value(LAG)


def test_a_frozen_serving_loop_is_not_ready_and_shows_its_lag(make_proxy, stub):
    proxy = make_proxy(top={"loop_stall_max": "300ms"})
    assert scrape(proxy).types.get(LAG) == "gauge"
    assert pay(proxy, new_key("before")).status_code == 201
    wait_until(lambda: readyz(proxy).status_code == 200, what="ready before the freeze")
    assert lag(proxy) < 0.3
    with freeze_thread(proxy.proc.pid, "ip-serve"):
        # (a tuple: a 503 Response is false)
        r, = wait_until(lambda: (lambda r: (r,) if r.status_code == 503 else None)(readyz(proxy)),
                        what="/readyz to see the frozen loop")
        assert "serving loop" in r.text, r.text
        # The gauge shows at least the stall that made it not ready.
        assert lag(proxy) >= 0.3
        # Liveness stays: the process answers, the loop is late (doc/operations.md).
        assert requests.get(proxy.admin_url + "/healthz", timeout=TIMEOUT).status_code == 200
        grown = lag(proxy)
        wait_until(lambda: lag(proxy) > grown, what="the lag to keep growing while frozen")
    wait_until(lambda: readyz(proxy).status_code == 200, what="ready again after the thaw")
    assert lag(proxy) < 0.3
    key = new_key("after")
    assert pay(proxy, key).status_code == 201
    assert stub.count(key=key) == 1


def test_an_idle_loop_is_ready(make_proxy):
    """No traffic at all: the loop sleeps in epoll_wait, and that is not a
    stall (it wakes at least every heartbeat period)."""
    proxy = make_proxy(top={"loop_stall_max": "300ms"})
    first = readyz(proxy)
    assert first.status_code == 200, first.text
    # Several stall bounds of idleness, each looked at.
    for _ in range(5):
        time.sleep(0.3)
        r = readyz(proxy)
        assert r.status_code == 200, r.text
        assert lag(proxy) < 0.3


def test_a_request_whose_time_ran_out_in_a_stall_before_its_write_is_never_sent(
        make_proxy, stub, tmp_path):
    """The proxy checks the lease right before the upstream call, but the
    request is written a moment later, by libcurl. A stall of the serving
    thread in between (here: a preloaded shim, tests/shim/stall_transfer.c,
    sleeps in curl_multi_add_handle) that outlasts the call's time must not
    end in a write after the thaw: by then the lease may have ended and
    another attempt may hold the key. The chaos soak saw exactly that once,
    a freeze landing between the check and the transfer's start."""
    import os
    import subprocess
    from conftest import ROOT
    subprocess.run(["make", "-s", "build/stall_transfer.so"], cwd=ROOT, check=True,
                   timeout=120)
    gate = str(tmp_path / "stall.gate")
    proxy = make_proxy(
        env={"LD_PRELOAD": os.path.join(ROOT, "build", "stall_transfer.so"),
             "IDEMPROXY_SHIM_STALL_GATE": gate, "IDEMPROXY_SHIM_STALL_MS": "4500"},
        route_overrides={"create_payment": {"lease": "3s", "upstream_timeout": "1s"}})
    open(gate, "w").close()
    key = new_key("stalled")
    r = pay(proxy, key, timeout=30)
    assert not os.path.exists(gate), "the stall did not happen"
    # Not sent: answered as nothing executed, and the upstream saw nothing.
    assert r.status_code == 502, r.text
    assert r.json()["code"] == "upstream_unavailable"
    assert r.json()["operation_state"] == "not_executed"
    # Released: a retry with the same key executes, once.
    assert pay(proxy, key).status_code == 201
    assert stub.count(key=key) == 1
