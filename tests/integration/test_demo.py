"""The demo (`make run`: demo/run.sh, demo/upstream.py, conf/idemproxy.conf)
serves every route its conf shows: for each route a request through the
proxy reaches the demo API, which executes it once and answers 2xx, and a
retry is replayed. The walk-through the demo prints has a curl command for
every route."""
import json
import os
import re
import signal
import subprocess
import sys

import pytest
import requests

from conftest import ROOT, Proxy, _die_with_parent, run_binary
from helpers import TIMEOUT, free_port, is_replay, new_key, wait_until

CONF = os.path.join(ROOT, "conf", "idemproxy.conf")
DEMO_API = "http://127.0.0.1:9000"
JSON = {"Content-Type": "application/json"}


@pytest.fixture
def demo_api(tmp_path):
    port = free_port()
    log = open(str(tmp_path / "upstream.log"), "wb")
    proc = subprocess.Popen([sys.executable, os.path.join(ROOT, "demo", "upstream.py"),
                             "--port", str(port)], stdout=log, stderr=log,
                            stdin=subprocess.DEVNULL, preexec_fn=_die_with_parent)
    log.close()
    url = "http://127.0.0.1:%d" % port

    def up():
        try:
            return requests.get(url + "/__demo/stats", timeout=TIMEOUT).ok
        except requests.RequestException:
            return proc.poll() is not None  # ends the wait; asserted below
    wait_until(up, what="the demo API to listen")
    assert proc.poll() is None, open(str(tmp_path / "upstream.log")).read()
    yield url
    proc.terminate()
    proc.wait(10)


@pytest.fixture
def demo(tmp_path, pg, demo_api):
    """The proxy with the demo's own conf, moved to free ports and this
    test's database and demo API."""
    text = open(CONF).read()
    assert DEMO_API in text
    port, admin_port = free_port(), free_port()
    text = text.replace(DEMO_API, demo_api)
    text = re.sub(r'^admin_listen\s*=\s*"[^"]*";', 'admin_listen = "127.0.0.1:%d";' % admin_port,
                  text, count=1, flags=re.M)
    conf = str(tmp_path / "demo.conf")
    with open(conf, "w") as f:
        f.write(text)
    env = dict(os.environ, IDEMPROXY_DATABASE_URL=pg.url, IDEMPROXY_LISTEN="127.0.0.1:%d" % port)
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
        env.pop(name, None)
    r = run_binary(["-c", conf, "--migrate"], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    p = Proxy(conf, str(tmp_path / "demo.log"), port, admin_port, env).start()
    yield p
    assert p.stop() == 0, p.log()[-3000:]


def routes_of(conf, env=None):
    """(name, path) of every route, as `idemproxy --check` prints them."""
    r = run_binary(["-c", conf, "--check"], env=env)
    assert r.returncode == 0, r.stdout + r.stderr
    return [tuple(line.split()[:2]) for line in r.stdout.splitlines()[1:]
            if " -> " in line]


def stats(demo_api):
    return requests.get(demo_api + "/__demo/stats", timeout=TIMEOUT).json()


def example(name, n, pay):
    """A request for the demo route name: (path, headers, body, body of a
    retry that must be replayed)."""
    if name == "create_payment":
        body = {"amount": 2000, "currency": "usd"}
        return "/v1/payments", {"Idempotency-Key": "pay-" + n}, body, body
    if name == "capture_payment":
        return "/v1/payments/%s/capture" % pay, {"Idempotency-Key": "cap-" + n}, {}, {}
    if name == "create_refund":
        body = {"payment": pay, "amount": 500}
        return "/v1/refunds", {"Idempotency-Key": "ref-" + n}, body, body
    if name == "psp_webhook":
        body = {"event": {"id": "evt_" + n, "type": "payment.succeeded"}}
        return "/hooks/psp", {}, body, body
    if name == "bank_webhook":
        body = {"status": "settled"}
        return "/hooks/bank", {"X-Delivery-Id": "dlv-" + n}, body, body
    if name == "order_transition":
        body = {"order_id": "ord_" + n, "status": "shipped", "sent_at": "2026-01-01T10:00:00Z"}
        # sent_at is left out of the fingerprint: a resend is a replay.
        return ("/v1/orders/ord_%s/transitions" % n, {}, body,
                dict(body, sent_at="2026-01-01T10:05:00Z"))
    return None


def test_every_route_of_the_demo_conf_is_served_by_the_demo_api(demo, demo_api):
    names = [name for name, _ in routes_of(demo.conf_path, demo.env)]
    missing = [name for name in names if example(name, "x", "pay_x") is None]
    assert not missing, "demo routes with no example here: %r" % missing
    n = new_key("demo")
    created = demo.post("/v1/payments", headers=dict(JSON, **{"Idempotency-Key": "seed-" + n}),
                        data=json.dumps({"amount": 3000, "currency": "usd"}))
    assert created.status_code == 201, created.text
    pay = created.json()["id"]
    for name in names:
        path, headers, body, again = example(name, n, pay)
        h = dict(JSON, **headers)
        before = stats(demo_api)["by_path"].get(path, 0)
        first = demo.post(path, headers=h, data=json.dumps(body))
        assert 200 <= first.status_code < 300 and not is_replay(first), \
            "%s: %d %s" % (name, first.status_code, first.text)
        retry = demo.post(path, headers=h, data=json.dumps(again))
        assert is_replay(retry) and retry.content == first.content, \
            "%s: %d %s" % (name, retry.status_code, retry.text)
        # The demo API executed it once.
        assert stats(demo_api)["by_path"].get(path, 0) - before == 1, (name, stats(demo_api))


def test_the_printed_walk_through_has_a_curl_command_for_every_route(tmp_path):
    env = dict(os.environ, IDEMPROXY_CONF=CONF)
    env.pop("IDEMPROXY_LISTEN", None)
    # In a session of its own: a run.sh that did not know --curl would start
    # the whole demo, and all of it must go at the end.
    p = subprocess.Popen([os.path.join(ROOT, "demo", "run.sh"), "--curl"], env=env,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL, start_new_session=True)
    try:
        out, err = p.communicate(timeout=30)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
            p.communicate()
    assert p.returncode == 0, out + err
    curls = [line for line in out.splitlines() if line.strip().startswith("curl ")]
    for name, path in routes_of(CONF):
        target = re.compile(r"http://127\.0\.0\.1:8080" +
                            re.sub(r"\\\{[a-z_]+\\\}", r"[^/\\s]+", re.escape(path)) +
                            r"(?=[\s'\"]|$)")
        assert any(target.search(c) for c in curls), "%s (%s): no curl line" % (name, path)
