"""The chaos soak's payments API: an HTTP/1.1 server on raw sockets that
misbehaves on purpose and records every request it receives.

It listens on one port per proxy instance (so the record says which
instance sent a request) and prints the ports as one JSON line on stdout.
Every request gets a "start" line in the log file when its body has been
read and an "end" line when its handling is over; the soak merges them by
seq. Each request to /v1/ is answered with a behaviour drawn at random with
fixed weights (KINDS):

  ok        201, body {"id": <unique id of this execution>, "key": ...}
  gzip      as ok, gzip-encoded when the request accepts gzip
  trailer   as ok, chunked, with trailer fields (one a second Content-Type)
  extra     as ok, with an unsolicited second response in the same write
  slow      the effect happens, the answer comes after --slow seconds
            (beyond the proxy's upstream_timeout)
            (every answer takes 20-300 ms first)
  e503      503, no effect
  drop      the effect happens, then the connection is closed unanswered
  e402      402 decline, body {"id": <decline id>, ...} (an effect)

With --dedup it behaves as payment providers do: the first effect for an
Idempotency-Key is stored and every later request with that key gets that
first result (503 and drop still happen as drawn, and make no effect).
Without it every request is executed anew.

Run as: faulty_upstream.py --log FILE [--dedup] [--seed N] [--ports 2]
"""
import argparse
import base64
import gzip
import json
import random
import signal
import socket
import sys
import threading
import time
import uuid

KINDS = [("ok", 52), ("gzip", 5), ("trailer", 4), ("extra", 3), ("slow", 8),
         ("e503", 10), ("drop", 9), ("e402", 9)]
MAX_HEAD = 64 * 1024
REASONS = {200: "OK", 201: "Created", 402: "Payment Required",
           503: "Service Unavailable"}


class Upstream:
    def __init__(self, log_path, dedup, seed, slow):
        self.log = open(log_path, "a", buffering=1)
        self.lock = threading.Lock()
        self.rng = random.Random(seed)
        self.dedup = dedup
        self.slow = slow
        self.seq = 0
        self.results = {}   # key -> (status, body) of its first effect
        self.lat_rng = random.Random(seed + 1)

    def latency(self):
        with self.lock:
            return self.lat_rng.uniform(0.02, 0.3)

    def write(self, rec):
        line = json.dumps(rec, separators=(",", ":"))
        with self.lock:
            self.log.write(line + "\n")

    def draw(self):
        with self.lock:
            self.seq += 1
            names = [k for k, _ in KINDS]
            weights = [w for _, w in KINDS]
            return self.seq, self.rng.choices(names, weights)[0]

    def effect(self, key, status, label):
        """Executes the payment (or its decline) unless --dedup already has
        a result for key. Returns (status, body, new_effect)."""
        with self.lock:
            if self.dedup and key is not None and key in self.results:
                st, body = self.results[key]
                return st, body, False
            rid = "%s_%s" % (label, uuid.uuid4().hex)
            body = json.dumps({"id": rid, "key": key, "status": status}).encode()
            st = 201 if status == "succeeded" else 402
            if self.dedup and key is not None:
                self.results[key] = (st, body)
            return st, body, True


def head_value(headers, name):
    for k, v in headers:
        if k.lower() == name:
            return v
    return None


def read_request(conn, buf):
    """Reads one request: (method, target, headers, body, rest) or None
    when the peer closed."""
    while b"\r\n\r\n" not in buf:
        if len(buf) > MAX_HEAD:
            return None
        chunk = conn.recv(65536)
        if not chunk:
            return None
        buf += chunk
    head, buf = buf.split(b"\r\n\r\n", 1)
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        return None
    method, target, _ = parts
    headers = []
    for ln in lines[1:]:
        name, _, value = ln.partition(":")
        headers.append((name, value.strip(" \t")))
    te = (head_value(headers, "transfer-encoding") or "").lower()
    if te == "chunked":
        body = b""
        while True:
            while b"\r\n" not in buf:
                chunk = conn.recv(65536)
                if not chunk:
                    return None
                buf += chunk
            size_line, buf = buf.split(b"\r\n", 1)
            size = int(size_line.split(b";")[0], 16)
            while len(buf) < size + 2:
                chunk = conn.recv(65536)
                if not chunk:
                    return None
                buf += chunk
            if size == 0:
                # no request trailers are expected from the proxy
                buf = buf[2:]
                break
            body += buf[:size]
            buf = buf[size + 2:]
    else:
        n = int(head_value(headers, "content-length") or 0)
        while len(buf) < n:
            chunk = conn.recv(65536)
            if not chunk:
                return None
            buf += chunk
        body, buf = buf[:n], buf[n:]
    return method, target, headers, body, buf


def response(status, body, extra=(), close=False):
    h = ["HTTP/1.1 %d %s" % (status, REASONS.get(status, "X")),
         "Content-Type: application/json",
         "Content-Length: %d" % len(body)]
    h += ["%s: %s" % kv for kv in extra]
    if close:
        h.append("Connection: close")
    return ("\r\n".join(h) + "\r\n\r\n").encode() + body


def chunked_with_trailers(status, body):
    h = ["HTTP/1.1 %d %s" % (status, REASONS.get(status, "X")),
         "Content-Type: application/json", "Transfer-Encoding: chunked",
         "Trailer: X-Chaos-Trailer, Content-Type"]
    out = ("\r\n".join(h) + "\r\n\r\n").encode()
    half = len(body) // 2
    for part in (body[:half], body[half:]):
        out += b"%x\r\n" % len(part) + part + b"\r\n"
    return out + b"0\r\nX-Chaos-Trailer: secret\r\nContent-Type: text/plain\r\n\r\n"


def serve(up, conn, port):
    buf = b""
    conn.settimeout(60)
    try:
        while True:
            req = read_request(conn, buf)
            if req is None:
                return
            method, target, headers, body, buf = req
            if not handle(up, conn, port, method, target, headers, body):
                return
    except (OSError, ValueError):
        return
    finally:
        try:
            conn.close()
        except OSError:
            pass


def handle(up, conn, port, method, target, headers, body):
    """Answers one request; False when the connection is to be closed."""
    seq, kind = up.draw()
    key = head_value(headers, "idempotency-key")
    start = time.time()
    up.write({"ev": "start", "seq": seq, "port": port, "method": method,
              "target": target, "key": key,
              "rid": head_value(headers, "x-request-id"),
              "body_b64": base64.b64encode(body).decode(), "start": start})
    end = {"ev": "end", "seq": seq, "kind": kind, "effect": False,
           "result_id": None, "status": None, "answered": False}
    keep = (head_value(headers, "connection") or "").lower() != "close"
    try:
        if not target.startswith("/v1/"):
            conn.sendall(response(200, b"{}"))
            end.update(status=200, answered=True)
            return keep
        # an answer takes a moment, as a real one does: a PostgreSQL crash
        # then finds attempts between their claim and their record
        time.sleep(up.latency())
        if kind == "e503":
            conn.sendall(response(503, b'{"error": "unavailable"}'))
            end.update(status=503, answered=True)
            return keep
        label = "decl" if kind == "e402" else "pay"
        st, rbody, new = up.effect(key, "declined" if kind == "e402" else "succeeded",
                                   label)
        end.update(effect=new, result_id=json.loads(rbody)["id"], status=st)
        if kind == "drop":
            conn.shutdown(socket.SHUT_RDWR)
            end["status"] = None
            return False
        if kind == "slow":
            time.sleep(up.slow)
            conn.sendall(response(st, rbody))
            return keep
        if kind == "gzip" and "gzip" in (head_value(headers, "accept-encoding") or ""):
            conn.sendall(response(st, gzip.compress(rbody), [("Content-Encoding", "gzip")]))
        elif kind == "trailer":
            conn.sendall(chunked_with_trailers(st, rbody))
        elif kind == "extra":
            stray = json.dumps({"id": "stray_" + uuid.uuid4().hex, "key": None,
                                "status": "stray"}).encode()
            # In the same write as the answer: the stray response is on
            # the connection before the proxy can use it again. (One that
            # lands only after the proxy wrote its next request on the
            # connection cannot be told from that request's answer in
            # HTTP/1.1, and a second write from this threaded server can
            # come that late under load; doc/design.md says so ("When things fail"), and the soak
            # does not pretend otherwise by sending one.)
            conn.sendall(response(st, rbody) + response(201, stray))
        else:
            conn.sendall(response(st, rbody))
        end["answered"] = True
        return keep
    finally:
        end["end"] = time.time()
        up.write(end)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--dedup", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--slow", type=float, default=1.6)
    ap.add_argument("--ports", type=int, default=2)
    a = ap.parse_args()
    up = Upstream(a.log, a.dedup, a.seed, a.slow)
    socks = []
    for _ in range(a.ports):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        s.listen(512)
        socks.append(s)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    def accept_loop(s):
        port = s.getsockname()[1]
        while True:
            conn, _ = s.accept()
            threading.Thread(target=serve, args=(up, conn, port), daemon=True).start()

    for s in socks:
        threading.Thread(target=accept_loop, args=(s,), daemon=True).start()
    print(json.dumps([s.getsockname()[1] for s in socks]), flush=True)
    while True:
        time.sleep(3600)


if __name__ == "__main__":
    main()
