"""Fuzzes idemproxy's HTTP front end on raw sockets: mutations of valid
requests (byte flips, inserted CR/LF/SP/HTAB/NUL, duplicated headers, odd
methods, targets and versions, obs-fold, Transfer-Encoding and
Content-Length variants, key spellings, truncations, pipelining) against the
running binary, in front of an upstream that records every request it gets.

Oracles (checker.check_fuzz and here): the process survives and exits 0 on
SIGTERM; every protected request the upstream received with a key has a
record whose operation is the route the received method and target match;
one key never reaches the upstream as two different requests; no protected
method reaches a key-required route without a key; no header reaches the
upstream that was not sent as a header line; a request with a complete
body and an odd Transfer-Encoding is answered (400/501) or closed at once.

Standalone: fuzz_http.py [--seconds 30] [--seed N] (starts its own
PostgreSQL); soak.py calls run() on its cluster.
"""
import argparse
import os
import random
import socket
import sys
import threading
import time
import uuid

import psycopg

import checker
import procs
from faulty_upstream import read_request
from procs import Pg, Proxy, describe_rc, make_tmp

THREADS = 6
READ_TIMEOUT_S = 1.0   # silence that ends reading an answer
HANG_S = 2.0          # no answer at all to a complete TE case
TE_VARIANTS = ["chunked, identity", "gzip, chunked", "identity", "Chunked", "chunked ",
               "x-chunked", "chunked;q=1", "chunked,chunked", "\tchunked"]
TARGETS = ["/v1/payments#/capture", "/v1/payments/x#/capture", "/v1/pay%6dents",
           "/v1/payments/", "/v1/./payments", "/v1/payments/../payments", "//v1/payments",
           "/v1/payments?x=1", "http://127.0.0.1/v1/payments", "*", "/V1/payments",
           "/v1/payments%2F", "/v1/payments;x", "/hooks/../v1/payments",
           "/v1/optional/../payments", "/v1/payments/%2e%2e/refunds",
           "/v1/payments/x/capture%23", "/v1/%70ayments/x/capture", "/v1/payments/x/capture/",
           "/v1/payments/%2e/capture", "/v1/optional#x", "/v1/optional/%2e%2e/payments",
           "v1/payments", "/v1/payments\t", "/v1/pay ments"]
METHODS = ["post", "Post", "PoSt", "GET", "PUT", "DELETE", "PATCH", "patch", "POSTX",
           "OPTIONS", "TRACE", "CONNECT", "PO\x00ST", "HEAD", "P\tOST"]
VERSIONS = ["HTTP/1.0", "HTTP/2.0", "HTTP/1.10", "HTTP/1.1 ", "http/1.1", "HTTP/1.", "HTTP/0.9"]


def routes_for(upstream):
    r = [{"name": "create_payment", "path": "/v1/payments"},
         {"name": "capture", "path": "/v1/payments/{id}/capture"},
         {"name": "refund", "path": "/v1/refunds"},
         {"name": "optional", "path": "/v1/optional", "key": "optional"},
         {"name": "hooks", "path": "/hooks/*", "tenant": "header:X-Tenant-Id"},
         {"name": "auth", "path": "/v1/auth/*", "tenant": "authorization"},
         {"name": "catchall", "path": "/*", "key": "optional"}]
    for x in r:
        x["upstream"] = upstream
    return r


class FuzzUpstream:
    """Records every request; answers 201, or 503 (one in five, so keys
    are released and can be forwarded again)."""

    def __init__(self, seed):
        self.got = []
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self.accept, daemon=True).start()
        procs.at_cleanup(self.sock.close)

    def accept(self):
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self.serve, args=(c,), daemon=True).start()

    def serve(self, c):
        buf = b""
        c.settimeout(30)
        try:
            while True:
                req = read_request(c, buf)
                if req is None:
                    return
                method, target, headers, body, buf = req
                with self.lock:
                    self.got.append({"method": method, "target": target, "headers": headers,
                                     "body": body, "t": time.time()})
                    st = 503 if self.rng.random() < 0.2 else 201
                b = b'{"ok": true}'
                c.sendall(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\n"
                          b"Content-Length: %d\r\n\r\n%s" % (st, len(b), b))
        except (OSError, ValueError):
            return
        finally:
            c.close()


class Fuzzer:
    def __init__(self, seed):
        self.seed = seed
        self.keys = ["fz-%d" % i for i in range(20)]   # reused: repeats, mismatches
        self.sent = []          # every raw case sent
        self.hangs = []         # (case, why) for TE cases not answered
        self.cases = 0
        self.answers = {}
        self.lock = threading.Lock()

    # --- valid requests ----------------------------------------------------

    def base(self, rng):
        key = rng.choice(self.keys) if rng.random() < 0.5 else "fz-" + uuid.uuid4().hex[:10]
        body = ('{"amount": %d, "currency": "EUR"}' % rng.randint(1, 50)).encode()
        kind = rng.choice(["pay", "pay", "capture", "hooks", "auth", "get", "optional",
                           "refund"])
        method, target = "POST", "/v1/payments"
        headers = [("Host", "127.0.0.1"), ("Content-Type", "application/json")]
        if kind == "capture":
            target = "/v1/payments/p%d/capture" % rng.randint(1, 3)
        elif kind == "hooks":
            target = "/hooks/h%d" % rng.randint(1, 3)
            headers.append(("X-Tenant-Id", "t-" + uuid.uuid4().hex[:8]))
        elif kind == "auth":
            target = "/v1/auth/a"
            headers.append(("Authorization", "Bearer tok-" + uuid.uuid4().hex[:8]))
        elif kind == "get":
            method = "GET"
        elif kind == "optional":
            target = "/v1/optional"
        elif kind == "refund":
            target = "/v1/refunds"
        if kind != "get" and (kind != "optional" or rng.random() < 0.5):
            headers.append(("Idempotency-Key", key))
        return method, target, "HTTP/1.1", headers, body

    @staticmethod
    def render(method, target, version, headers, body, te=None):
        lines = ["%s %s %s" % (method, target, version)]
        for n, v in headers:
            lines.append("%s: %s" % (n, v))
        if te is not None:
            for t in te:
                lines.append("Transfer-Encoding: %s" % t)
            half = len(body) // 2
            chunks = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in (body[:half], body[half:])
                              if p) + b"0\r\n\r\n"
            return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + chunks
        lines.append("Content-Length: %d" % len(body))
        return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body

    # --- mutations ---------------------------------------------------------

    def structured(self, rng, method, target, version, headers, body):
        """A change to the request's parts; returns (raw, te_case)."""
        op = rng.choice(["method", "target", "version", "dup", "fold", "te", "cl", "key",
                         "host", "conn", "none", "tenant2"])
        te = None
        if op == "method":
            method = rng.choice(METHODS)
        elif op == "target":
            target = rng.choice(TARGETS)
        elif op == "version":
            version = rng.choice(VERSIONS)
        elif op == "dup" and headers:
            headers = list(headers)
            i = rng.randrange(len(headers))
            n, v = headers[i]
            headers.insert(i + 1, (n if rng.random() < 0.5 else n.upper(),
                                   v if rng.random() < 0.5 else v + "x"))
        elif op == "fold":
            headers = list(headers)
            fake = "VICTIM-" + uuid.uuid4().hex[:6]
            headers.append(rng.choice([("X-Tenant-I", fake + "\r\n d"),
                                       ("Idempotency-Ke", "fz-fold\r\n\ty"),
                                       ("X-Tenant-Id", fake + "\r\n more")]))
            if rng.random() < 0.5:
                target = "/hooks/fold"
        elif op == "te":
            te = [rng.choice(TE_VARIANTS)]
            if rng.random() < 0.3:
                te.append("chunked")
        elif op == "cl":
            raw = self.render(method, target, version, headers, body)
            cl = rng.choice(["%d" % (len(body) + 1), "%d" % max(0, len(body) - 1),
                             "+%d" % len(body), " %d" % len(body), "0x%x" % len(body),
                             "%d, %d" % (len(body), len(body)), "-1", "99999999999999999999"])
            return raw.replace(b"Content-Length: %d" % len(body),
                               ("Content-Length: %s" % cl).encode()), False
        elif op == "key":
            headers = [h for h in headers if h[0] != "Idempotency-Key"]
            k = rng.choice(self.keys)
            headers += rng.choice([[("Idempotency-Key", '"%s"' % k)],
                                   [("Idempotency-Key", '"%s";retry=1' % k)],
                                   [("Idempotency-Key", k), ("Connection", "Idempotency-Key")],
                                   [("Idempotency-Key", k), ("Idempotency-Key", k + "b")],
                                   [("idempotency-key", " %s " % k)],
                                   [("Idempotency-Key", k + ", " + k)]])
        elif op == "host":
            headers = list(headers) + [("Host", "evil.example")]
        elif op == "conn":
            headers = list(headers) + [("Connection", rng.choice(
                ["close", "keep-alive", "X-Tenant-Id", "Authorization", "Content-Type"]))]
        elif op == "tenant2":
            headers = list(headers) + [rng.choice([("Authorization", "Bearer other"),
                                                   ("X-Tenant-Id", "t-second")])]
        raw = self.render(method, target, version, headers, body, te)
        return raw, te is not None and op == "te"

    @staticmethod
    def byte_level(rng, raw):
        for _ in range(rng.randint(1, 3)):
            if not raw:  # truncated to nothing: nothing left to mutate
                break
            op = rng.choice(["flip", "insert", "insert", "truncate", "delete"])
            head_end = raw.find(b"\r\n\r\n")
            limit = head_end if head_end > 0 and rng.random() < 0.8 else len(raw)
            pos = rng.randrange(max(1, limit))
            if op == "flip":
                raw = raw[:pos] + bytes([raw[pos] ^ (1 << rng.randrange(8))]) + raw[pos + 1:]
            elif op == "insert":
                ins = rng.choice([b"\r", b"\n", b" ", b"\t", b"\0", b"\r\n", b"\r\n ", b":"])
                raw = raw[:pos] + ins + raw[pos:]
            elif op == "delete":
                raw = raw[:pos] + raw[pos + 1:]
            else:
                raw = raw[:pos]
        return raw

    def case(self, rng):
        """One connection's bytes; te: a TE variant with a complete body,
        which must be answered or closed at once."""
        parts = []
        te_case = False
        n = rng.choice([1, 1, 1, 2, 3])
        for i in range(n):
            m, t, ver, h, b = self.base(rng)
            if i == n - 1 and rng.random() < 0.8:
                h.append(("Connection", "close"))
            r = rng.random()
            if r < 0.55:
                raw, te = self.structured(rng, m, t, ver, h, b)
                te_case = te_case or te
            elif r < 0.9:
                raw = self.byte_level(rng, self.render(m, t, ver, h, b))
            else:
                raw = self.render(m, t, ver, h, b)
            parts.append(raw)
        return b"".join(parts), te_case and len(parts) == 1

    # --- sending -----------------------------------------------------------

    def send(self, port, raw, te_case):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        got = b""
        try:
            s.sendall(raw)
            s.settimeout(HANG_S if te_case else READ_TIMEOUT_S)
            deadline = time.monotonic() + HANG_S
            while time.monotonic() < deadline:
                try:
                    chunk = s.recv(65536)
                except socket.timeout:
                    if te_case and not got:
                        return None
                    break
                if not chunk:
                    break
                got += chunk
                if te_case:
                    break
            return got
        except OSError:
            return got
        finally:
            s.close()

    def worker(self, n, proxy, end, dead):
        rng = random.Random(self.seed * 100 + n)
        while time.time() < end and not dead.is_set():
            raw, te_case = self.case(rng)
            with self.lock:
                self.cases += 1
                self.sent.append(raw)
            got = self.send(proxy.port, raw, te_case)
            if got is None:
                self.hangs.append(raw)
            elif got:
                st = got[9:12].decode("latin-1", "replace")
                with self.lock:
                    self.answers[st] = self.answers.get(st, 0) + 1


def run(pg, seconds, seed):
    """Fuzzes a proxy on pg's cluster; returns (violations, figure lines)."""
    tmp = make_tmp("idemproxy-fuzz-", logs=True)
    url = pg.create_db("chaos_fuzz")
    up = FuzzUpstream(seed)
    routes = routes_for("http://127.0.0.1:%d" % up.port)
    p = Proxy("fuzz", tmp, {"workers": 4, "shutdown_grace": "3s", "log_level": "warn",
                            "database": {"url": url}, "reaper": {"interval": "1h"},
                            "routes": routes})
    p.migrate()
    p.start()
    fz = Fuzzer(seed)
    violations = []
    end = time.time() + seconds
    deaths = 0
    while time.time() < end:
        dead = threading.Event()
        ts = [threading.Thread(target=fz.worker, args=(n, p, end, dead), daemon=True)
              for n in range(THREADS)]
        for t in ts:
            t.start()
        while any(t.is_alive() for t in ts):
            if not p.alive():
                dead.set()
            time.sleep(0.05)
        if not p.alive():
            deaths += 1
            with fz.lock:
                last = fz.sent[-THREADS:]
            violations.append(("fuzz_survives", "the proxy died (%s) after %d cases; the "
                               "last cases sent: %s; log tail: %s" % (
                                   describe_rc(p.proc.returncode), fz.cases,
                                   " | ".join(repr(c[:300]) for c in last),
                                   p.log_tail(500))))
            if deaths >= 3:
                break
            p.start()
    time.sleep(1.0)   # attempts the proxy still forwards
    rc = None
    if p.alive():
        p.signal(15)
        try:
            rc = p.proc.wait(15)
        except Exception:
            p.kill_quietly()
            rc = "hung"
        if rc != 0:
            violations.append(("fuzz_survives", "the proxy exited %s after SIGTERM (expected "
                               "0); log tail: %s" % (rc if rc == "hung" else describe_rc(rc),
                                                     p.log_tail(500))))
    with psycopg.connect(url) as c:
        records = {(op, k): t for t, op, k in c.execute(
            "SELECT tenant, operation, idem_key FROM idempotency_records").fetchall()}
    v = checker.check_fuzz(up.got, records, routes, checker.sent_header_set(fz.sent))
    violations += [(inv, with_case(text, fz.sent)) for inv, text in v]
    for raw in fz.hangs:
        violations.append(("fuzz_answered", "no answer within %.0f s to a complete request "
                           "with an odd Transfer-Encoding: %r" % (HANG_S, raw[:200])))
    lines = ["fuzz: seed %d, %.0f s, %d cases on %d threads, upstream received %d requests; "
             "answers: %s" % (seed, seconds, fz.cases, THREADS, len(up.got), ", ".join(
                 "%s %d" % kv for kv in sorted(fz.answers.items())))]
    return violations, lines


def with_case(text, sent):
    """Adds the first case sent that carried the key a violation names."""
    import re
    m = re.search(r"key '([^']+)'", text)
    if m:
        k = m.group(1).encode()
        first = text.split(" ", 1)[0].encode() + b" "
        hits = [raw for raw in sent if k in raw]
        hits = [raw for raw in hits if first in raw] or hits
        if hits:
            return text + " — sent as %r" % hits[0][:300]
    return text


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--seed", type=int, default=int(os.environ.get("CHAOS_SEED", "0")) or
                    int(time.time()) % 100000)
    a = ap.parse_args()
    print("fuzz-http: seed %d" % a.seed, flush=True)
    v = []
    try:
        pg = Pg(make_tmp("idemproxy-fuzz-pg-"))
        pg.start()
        v, lines = run(pg, a.seconds, a.seed)
    except BaseException:
        procs.KEEP_LOGS["on"] = True
        raise
    finally:
        procs.KEEP_LOGS["on"] = procs.KEEP_LOGS["on"] or bool(v)
        procs.cleanup_all()
    import soak
    print("\n".join(lines + soak.report("fuzz", v)))
    return 1 if v else 0


if __name__ == "__main__":
    sys.exit(main())
