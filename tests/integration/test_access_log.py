"""The access log is buffered (doc/operations.md "Logs"): request lines are written
in large writes, on a short timer or when the buffer fills; warnings and
errors are written at once, after what is buffered; and no line of an
answered request is lost at exit."""
import json
import signal
import threading

import requests

from conftest import TIMEOUT
from helpers import new_key, wait_until

PAY = "/v1/payments"
BODY = {"amount": 100, "currency": "EUR"}


def log_docs(proxy):
    out = []
    for line in proxy.log().splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def request_ids(proxy):
    """The (key, request_id) pairs of the request lines: a request refused
    before its key is read (503 shutting down) is logged with key null."""
    return [(d["key"], d["request_id"]) for d in log_docs(proxy) if d["msg"] == "request"]


def answer_id(key, r):
    """What the log line of an answer is found by: its key, or for a
    problem+json answer its request_id."""
    if r.status_code == 201:
        return key
    return r.json()["request_id"]


def test_sigterm_under_keep_alive_load_leaves_every_answered_request_in_the_log(
        make_proxy, stub):
    # A flush interval far longer than the test: only the buffer filling
    # and the flush at exit can write these lines.
    proxy = make_proxy(top={"shutdown_grace": "20s", "log_flush_interval": "60s"})
    answered = []
    stop = threading.Event()

    def client(i):
        s = requests.Session()  # one keep-alive connection per thread
        n = 0
        while not stop.is_set():
            k = new_key("load%d-%d" % (i, n))
            n += 1
            try:
                r = s.post(proxy.url + PAY, headers={"Idempotency-Key": k}, json=BODY,
                           timeout=30)
            except requests.RequestException:
                return  # the proxy stopped taking requests
            answered.append((answer_id(k, r), r.status_code))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    try:
        wait_until(lambda: len(answered) >= 400, timeout=60, what="400 answers")
        proxy.proc.send_signal(signal.SIGTERM)
        rc = proxy.wait_exit(timeout=40)
    finally:
        stop.set()
        for t in threads:
            t.join(60)
    assert rc == 0, proxy.log()[-3000:]
    # Answers after SIGTERM may be 503s (shutting down): logged all the same.
    assert set(s for _, s in answered) <= {201, 503}, set(s for _, s in answered)
    logged = set(k for pair in request_ids(proxy) for k in pair if k)
    missing = [(k, s) for k, s in answered if k not in logged]
    assert not missing, "%d of %d answered requests have no log line, e.g. %s" % (
        len(missing), len(answered), missing[:3])
    assert stub.count(prefix=PAY) == sum(1 for _, s in answered if s == 201)


def test_a_request_line_is_written_without_further_traffic(make_proxy, stub):
    proxy = make_proxy(top={"log_flush_interval": None})  # the default, 100ms
    key = new_key("idle")
    r = proxy.post(PAY, key=key, json=BODY)
    assert r.status_code == 201
    # Nothing else happens: the flush timer writes it (the bound is generous).
    wait_until(lambda: key in [k for k, _ in request_ids(proxy)], timeout=10,
               what="the request line, without further traffic")
    assert stub.count(key=key) == 1


def test_a_warning_is_written_at_once_after_the_lines_buffered_before_it(make_proxy, stub):
    # The timer would write the buffered lines only after a minute.
    proxy = make_proxy(top={"log_flush_interval": "60s"})
    # The reaper's first pass warns that this store has no synchronous
    # standby: that warning comes first, so that it flushes nothing of
    # what follows.
    wait_until(lambda: "store durability" in proxy.log(), what="the durability line")
    keys = [new_key("before%d" % i) for i in range(5)]
    for k in keys:
        assert proxy.post(PAY, key=k, json=BODY).status_code == 201
    assert stub.count(prefix=PAY) == len(keys)
    # Buffered: a few lines are far below the 64 KiB that would write them.
    assert not [k for k, _ in request_ids(proxy) if k in keys], proxy.log()
    # A refused admin request logs a warning ("admin request refused").
    r = requests.get(proxy.admin_url + "/admin/keys/default/create_payment/" + keys[0],
                     headers={"Authorization": "Bearer wrong-token"}, timeout=TIMEOUT)
    assert r.status_code == 401
    docs = wait_until(lambda: [d for d in log_docs(proxy)
                               if d["msg"] in ("request", "admin request refused")
                               and (d["msg"] != "request" or d["key"] in keys)]
                      if "admin request refused" in proxy.log() else None,
                      timeout=10, what="the warning")
    # The buffered lines came out with it, in order, before it.
    assert [d.get("key") for d in docs] == keys + [None], docs
    assert docs[-1]["level"] == "warn"
