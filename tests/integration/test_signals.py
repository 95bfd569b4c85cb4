"""Signals (SPEC 1): SIGTERM stops accepting, lets the attempts in flight
finish and be recorded for up to shutdown_grace, then exits 0; SIGHUP
reloads the conf file, and a file that fails validation is logged with
FILE:LINE while the old configuration keeps serving."""
import os
import signal
import socket
import threading
import time

import requests

from conftest import ADMIN_TOKEN
from helpers import assert_problem, is_replay, new_key, render_conf, wait_until

PAY = "/v1/payments"


def refused(port):
    """True when a new connection is not accepted (refused, or reset by a
    listen socket closing while the connection waited in its backlog)."""
    try:
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
    except (ConnectionRefusedError, ConnectionResetError):
        return True
    return False


def send_in_threads(proxy, keys):
    """One POST per key, each in its own thread; returns (threads, out),
    out mapping key -> response or exception."""
    out = {}

    def run(k):
        try:
            out[k] = proxy.post(PAY, key=k, json={"amount": 100, "currency": "EUR"},
                                timeout=60)
        except requests.RequestException as e:
            out[k] = e

    threads = [threading.Thread(target=run, args=(k,)) for k in keys]
    for t in threads:
        t.start()
    return threads, out


# --- SIGTERM -------------------------------------------------------------------

def test_sigterm_lets_attempts_in_flight_finish_and_record_then_exits_0(make_proxy, stub, pg):
    # A grace far longer than the test waits: the exit must follow the last
    # answer, not the end of the grace.
    proxy = make_proxy(top={"shutdown_grace": "30s"})
    keys = [new_key("term%d" % i) for i in range(3)]
    stub.configure({"prefix": PAY, "gate": "upstream"})
    threads, out = send_in_threads(proxy, keys)
    try:
        stub.wait_for(n=len(keys), prefix=PAY)
        proxy.proc.send_signal(signal.SIGTERM)
        # Stops accepting: new connections are refused ...
        wait_until(lambda: refused(proxy.port), timeout=10,
                   what="new connections to be refused after SIGTERM")
        # ... while it waits for the attempts still upstream.
        assert proxy.proc.poll() is None, "exited with attempts in flight"
        assert not out, "answered before the upstream did: %r" % out
    finally:
        stub.release("upstream")
        for t in threads:
            t.join(60)
    rc = proxy.wait_exit(timeout=20)
    assert rc == 0, proxy.log()[-3000:]

    sent = {s.key: s for s in stub.requests(prefix=PAY)}
    assert set(sent) == set(keys) and stub.count(prefix=PAY) == len(keys)
    for k in keys:
        r = out[k]
        assert not isinstance(r, Exception), "%s: %r" % (k, r)
        assert r.status_code == 201 and not is_replay(r), r.content
        assert r.json()["seq"] == sent[k].seq
        rec = pg.record(k)
        assert rec["state"] == "completed", rec
        assert bytes(rec["response_body"]) == r.content
    assert refused(proxy.port)


def test_sigterm_exits_0_when_the_grace_ends_before_the_upstream_answers(make_proxy, stub, pg):
    proxy = make_proxy(top={"shutdown_grace": "2s"})
    key = new_key("grace")
    stub.configure({"prefix": PAY, "gate": "never"})
    threads, out = send_in_threads(proxy, [key])
    try:
        stub.wait_for(key=key)
        t0 = time.monotonic()
        proxy.proc.send_signal(signal.SIGTERM)
        rc = proxy.wait_exit(timeout=20)
        waited = time.monotonic() - t0
        assert rc == 0, proxy.log()[-3000:]
        # A lower bound cannot be flaky: the grace starts after the signal.
        assert waited >= 1.9, "exited %.2fs after SIGTERM, before the 2s grace" % waited
        for t in threads:
            t.join(30)
        assert isinstance(out[key], requests.RequestException), \
            "the client got an answer the upstream never gave: %r" % out[key]
    finally:
        stub.release("never")
    # Nothing recorded: the lease rules decide what a retry gets.
    rec = pg.record(key)
    assert rec["state"] == "processing" and rec["attempt"] == 1, rec
    assert stub.count(key=key) == 1


# --- SIGHUP --------------------------------------------------------------------

def settings_of(proxy, pg, routes):
    """The conf make_proxy wrote, with other routes: listen, workers and
    database.url unchanged (they would need a restart)."""
    return {
        "listen": "127.0.0.1:%d" % proxy.port,
        "admin_listen": "127.0.0.1:%d" % proxy.admin_port,
        "admin_token": ADMIN_TOKEN,
        "workers": 4,
        "shutdown_grace": "3s",
        "log_level": "info",
        "database": {"url": pg.url},
        "reaper": {"interval": "10m"},
        "routes": routes,
    }


def initial_routes(upstream):
    return [
        {"name": "create_payment", "path": PAY, "upstream": upstream},
        {"name": "refund", "path": "/v1/refunds", "upstream": upstream},
    ]


def changed_routes(upstream):
    """refund removed, payout added, create_payment's mismatch_status 409 -> 422."""
    return [
        {"name": "create_payment", "path": PAY, "upstream": upstream, "mismatch_status": 422},
        {"name": "payout", "path": "/v1/payouts", "upstream": upstream},
    ]


def write_conf(path, text):
    tmp = path + ".new"
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)  # the proxy never reads half a file


def mismatch_status(proxy):
    key = new_key("mm")
    assert proxy.post(PAY, key=key, json={"amount": 1}).status_code == 201
    r = proxy.post(PAY, key=key, json={"amount": 2})
    assert_problem(r, r.status_code, "idempotency_key_mismatch")
    return r.status_code


def assert_initial_conf_serves(proxy):
    assert proxy.post("/v1/refunds", key=new_key(), json={"n": 1}).status_code == 201
    assert_problem(proxy.post("/v1/payouts", key=new_key(), json={"n": 1}), 404,
                   "route_not_found")
    assert mismatch_status(proxy) == 409


def test_sighup_applies_added_removed_and_changed_routes(make_proxy, stub, pg):
    proxy = make_proxy(routes=initial_routes("{stub}"))
    assert_initial_conf_serves(proxy)

    write_conf(proxy.conf_path, render_conf(settings_of(proxy, pg, changed_routes(stub.url))))
    proxy.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: proxy.post("/v1/payouts", key=new_key(), json={"n": 0}).status_code
               != 404, what="the reloaded conf to add /v1/payouts")

    key = new_key("payout")
    r = proxy.post("/v1/payouts", key=key, json={"n": 1})
    assert r.status_code == 201 and not is_replay(r)
    assert is_replay(proxy.post("/v1/payouts", key=key, json={"n": 1}))
    assert pg.record(key)["operation"] == "payout"
    before = stub.count(prefix="/v1/refunds")
    assert_problem(proxy.post("/v1/refunds", key=new_key(), json={"n": 1}), 404,
                   "route_not_found")
    assert stub.count(prefix="/v1/refunds") == before
    assert mismatch_status(proxy) == 422
    assert proxy.proc.poll() is None


def test_sighup_with_an_invalid_conf_logs_file_line_and_keeps_the_old_one(make_proxy, stub, pg):
    proxy = make_proxy(routes=initial_routes("{stub}"))
    assert_initial_conf_serves(proxy)

    # Every change of the valid reload, plus one error: none may apply.
    routes = changed_routes(stub.url)
    routes[1]["colour"] = "blue"
    text = render_conf(settings_of(proxy, pg, routes))
    line = next(i for i, l in enumerate(text.splitlines(), 1) if "colour" in l)
    write_conf(proxy.conf_path, text)
    proxy.proc.send_signal(signal.SIGHUP)
    where = "%s:%d:" % (proxy.conf_path, line)
    wait_until(lambda: where in proxy.log(), what="%s in the log" % where)
    assert proxy.proc.poll() is None

    assert_initial_conf_serves(proxy)
    # and a later valid file still reloads
    write_conf(proxy.conf_path, render_conf(settings_of(proxy, pg, changed_routes(stub.url))))
    proxy.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: proxy.post("/v1/payouts", key=new_key(), json={"n": 0}).status_code
               != 404, what="the fixed conf to be applied")
    assert mismatch_status(proxy) == 422
