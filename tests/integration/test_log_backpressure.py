"""A log reader that stops reading (journald, a container runtime) must not
stall the proxy (doc/operations.md "Logs"): the proxy's stderr is a pipe the test
stops reading, filled, and a flood of log lines follows. Requests keep
being answered (the upstream sees each forwarded one once), the lines that
do not fit are dropped and counted (idemproxy_log_lines_dropped_total),
and once the pipe is read again a line says how many were dropped."""
import fcntl
import os
import re
import subprocess
import threading
from collections import Counter

import requests

from conftest import BINARY, _die_with_parent
from helpers import TIMEOUT, new_key, wait_until
from test_ops import scrape, set_connections

PAY = "/v1/payments"
DROPPED = "idemproxy_log_lines_dropped_total"
F_SETPIPE_SZ = 1031


class PipedProxy:
    """The proxy of make_proxy(start=False), started with stderr (and
    stdout) on a pipe of one page that nobody reads until drain()."""

    def __init__(self, proxy):
        self.p = proxy
        r, w = os.pipe()
        fcntl.fcntl(w, F_SETPIPE_SZ, 4096)
        self.r = r
        proxy.proc = subprocess.Popen([BINARY, "-c", proxy.conf_path],
                                      stdin=subprocess.DEVNULL, stdout=w, stderr=w,
                                      env=proxy.env, preexec_fn=_die_with_parent)
        os.close(w)
        self.text = ""
        self.mu = threading.Lock()
        self.reader = None

    def drain(self):
        """Reads the pipe from now on, in a thread."""
        def run():
            while True:
                b = os.read(self.r, 65536)
                if not b:
                    return
                with self.mu:
                    self.text += b.decode(errors="replace")
        self.reader = threading.Thread(target=run, daemon=True)
        self.reader.start()

    def log(self):
        with self.mu:
            return self.text

    def stop(self):
        if self.reader is None:
            self.drain()
        rc = self.p.stop()
        self.reader.join(TIMEOUT)
        os.close(self.r)
        return rc


def dropped_counts(text):
    return [int(m) for m in re.findall(r"log lines dropped.*?count=(\d+)", text)]


def post(s, proxy, key=None, path=PAY):
    h = {"Content-Type": "application/json"}
    if key is not None:
        h["Idempotency-Key"] = key
    return s.post(proxy.url + path, data=b'{"amount":1}', headers=h, timeout=TIMEOUT)


def test_a_stalled_log_reader_stalls_no_request(make_proxy, stub, pg):
    proxy = make_proxy(start=False, top={
        "workers": 2, "log_flush_interval": "100ms",
        "database": {"url": pg.url, "unavailable": "forward"}})
    piped = PipedProxy(proxy)
    try:
        proxy.wait_ready()
        s = requests.Session()
        forwarded = []
        # Requests for no route (404; their long path makes long lines) and
        # forwarded ones: far more lines than the pipe and the proxy's
        # buffer hold.
        long_path = "/nowhere/" + "x" * 3000
        for i in range(600):
            if i % 4 == 0:
                k = new_key("piped")
                assert post(s, proxy, k).status_code == 201
                forwarded.append(k)
            else:
                assert post(s, proxy, path=long_path).status_code == 404
        # A store outage: every request warns, and is forwarded unprotected.
        pg.close()
        set_connections(pg, False)
        try:
            for _ in range(30):
                k = new_key("outage")
                assert post(s, proxy, k).status_code == 201
                forwarded.append(k)
        finally:
            set_connections(pg, True)
        seen = Counter(r.key for r in stub.requests(prefix=PAY))
        assert [k for k in forwarded if seen[k] != 1] == []
        dropped = scrape(proxy).value(DROPPED)
        assert dropped > 0
        # Reading again: the lines come, and one says how many were lost;
        # the counts those lines give add up to the counter.
        piped.drain()
        wait_until(lambda: dropped_counts(piped.log()), what="a 'log lines dropped' line")
        wait_until(lambda: sum(dropped_counts(piped.log())) == scrape(proxy).value(DROPPED),
                   what="the dropped lines' counts to add up to %s" % DROPPED)
        k = new_key("after")
        assert post(s, proxy, k).status_code == 201
        wait_until(lambda: k in piped.log(), what="the request line of a request after")
    finally:
        rc = piped.stop()
    assert rc == 0
