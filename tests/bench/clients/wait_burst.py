#!/usr/bin/python3
"""Bursts of duplicates with in_flight = "wait", for `make bench`.

  wait_burst.py BINARY DB_URL BURSTS SIZE OUT_MD

Starts its own upstream (held: the first request of each key is answered
only once SIZE - 1 duplicates wait, as the waiters gauge shows) and its own
idemproxy (two workers, one route with in_flight = "wait"), sends BURSTS
bursts of SIZE concurrent requests under one fresh key each, and checks that
the upstream saw every key exactly once and every duplicate got the
original's body, replayed. Measures, per burst, the time from the moment the
upstream finished writing the original's answer to the last waiter's
answer. Writes one markdown table row to OUT_MD; exits 1 on a failed check."""
import http.client
import http.server
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter

BODY = b'{"amount": 1000, "currency": "eur", "description": "bench"}'


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


class Upstream(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, port, ready):
        super().__init__(("127.0.0.1", port), Handler)
        self.counts = Counter()
        self.lock = threading.Lock()
        self.ready = ready        # waits until the duplicates are parked
        self.answered = {}        # key -> time the answer was written


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_POST(self):
        key = self.headers.get("Idempotency-Key", "")
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        with self.server.lock:
            self.server.counts[key] += 1
        self.server.ready(key)
        body = b'{"id": "%s"}' % key.encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        self.wfile.flush()
        self.server.answered[key] = time.monotonic()


def waiters(admin_port):
    c = http.client.HTTPConnection("127.0.0.1", admin_port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    for line in text.splitlines():
        if line.startswith("idemproxy_waiters "):
            return float(line.split()[1])
    return 0.0


def post(port, key, out, i):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    c.request("POST", "/v1/payments", body=BODY, headers={
        "Content-Type": "application/json", "Idempotency-Key": key})
    r = c.getresponse()
    body = r.read()
    out[i] = (r.status, r.getheader("Idempotent-Replayed") == "true", body,
              time.monotonic())
    c.close()


def pct(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def main():
    binary, db_url, bursts, size, out_md = sys.argv[1], sys.argv[2], \
        int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    port, admin, up_port = free_port(), free_port(), free_port()

    def ready(key):
        deadline = time.monotonic() + 30
        while waiters(admin) < size - 1 and time.monotonic() < deadline:
            time.sleep(0.002)

    up = Upstream(up_port, ready)
    threading.Thread(target=up.serve_forever, daemon=True).start()
    tmp = tempfile.mkdtemp(prefix="idemproxy-wait-")
    conf = os.path.join(tmp, "wait.conf")
    with open(conf, "w") as f:
        f.write('listen = "127.0.0.1:%d";\nadmin_listen = "127.0.0.1:%d";\n'
                'workers = 2;\nlog_level = "warn";\nmax_waiters = %d;\n'
                'replay_cache_size = 0;\n'
                'database = { url = "%s"; };\nroutes = ({ name = "create_payment"; '
                'path = "/v1/payments"; upstream = "http://127.0.0.1:%d"; '
                'in_flight = "wait"; wait_max = "20s"; });\n'
                % (port, admin, size * 2, db_url, up_port))
    log = open(os.path.join(tmp, "idemproxy.log"), "wb")
    proc = subprocess.Popen([binary, "-c", conf], stdout=log, stderr=log)
    failures, lat = [], []
    try:
        for _ in range(200):
            try:
                socket.create_connection(("127.0.0.1", port), 1).close()
                break
            except OSError:
                time.sleep(0.05)
        tag = "wait-%d" % os.getpid()
        for b in range(bursts):
            key = "%s-%d" % (tag, b)
            res = [None] * size
            first = threading.Thread(target=post, args=(port, key, res, 0))
            first.start()
            while up.counts[key] == 0:
                time.sleep(0.001)
            ts = [threading.Thread(target=post, args=(port, key, res, i))
                  for i in range(1, size)]
            for t in ts:
                t.start()
            for t in [first] + ts:
                t.join(90)
            if any(r is None for r in res):
                failures.append("%s: a request got no answer" % key)
                continue
            orig = res[0]
            bad = [r for r in res[1:] if r[0] != orig[0] or not r[1] or r[2] != orig[2]]
            if orig[0] != 201 or orig[1] or bad:
                failures.append("%s: %d duplicates not replayed (%r)" % (
                    key, len(bad), bad[:1]))
            lat.append((max(r[3] for r in res[1:]) - up.answered[key]) * 1000)
        many = {k: n for k, n in up.counts.items() if n != 1}
        if many:
            failures.append("keys upstream more than once: %r" % list(many.items())[:3])
        per_key = max(up.counts.values()) if up.counts else 0
    finally:
        proc.terminate()
        proc.wait(30)
        up.shutdown()
    row = ("| bursts of %d duplicates, in_flight = \"wait\" (%d bursts, 2 workers) "
           "| upstream requests per key: %d | original's answer → last waiter's "
           "answer: p50 %.2f ms, p99 %.2f ms, max %.2f ms |\n"
           % (size, bursts, per_key, pct(lat, 50) if lat else -1,
              pct(lat, 99) if lat else -1, max(lat) if lat else -1))
    with open(out_md, "w") as f:
        f.write(row)
    sys.stdout.write(row)
    if failures:
        sys.exit("wait_burst: " + "; ".join(failures[:3]))


if __name__ == "__main__":
    main()
