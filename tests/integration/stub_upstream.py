#!/usr/bin/python3
"""A scriptable upstream for the integration tests.

Runs as its own process (`stub_upstream.py [--port N] [--idle-timeout S]`),
prints the port it listens on as the first line of stdout, then serves
HTTP/1.1 with keep-alive until killed.

Every request outside /__stub/ is recorded (method, raw target, header lines
in order, body, arrival time) before the stub decides how to answer, so a
test can see a request that is still being held. The control API:

  GET  /__stub/requests   {"requests": [record, ...]} in arrival order
  POST /__stub/reset      forget requests, rules and gates
  POST /__stub/config     {"rules": [rule, ...], "append": false}
  POST /__stub/release    {"gate": NAME}  lets held requests on NAME answer

A rule is matched against each request; the first rule that matches and has
uses left decides the answer. Matching fields (all optional):
  prefix   raw target (path and query) starts with this
  method   request method
  key      raw Idempotency-Key header value
  times    how many requests the rule answers before it stops matching
What to do (all optional):
  status   status code (default 201)
  headers  [[name, value], ...] or {name: value}; a value of null removes a
           default header of that name
  replace_headers  true: do not send the default headers at all
  body / body_b64 / json   the body (default: a JSON document with a fresh id)
  size     a body of this many bytes (a repeating pattern)
  echo     true: the body is the JSON record of the request
  delay    seconds to wait before answering
  gate     wait until /__stub/release names this gate (at most 60 s)
  action   "respond" (default); "close": close without answering; "reset":
           abort the connection (RST) without answering; "half": send the
           headers and half the body, then close; "slow": send the body in
           `chunks` pieces `chunk_delay` seconds apart
  close    true: answer with Connection: close and close afterwards

The default answer is 201 with Content-Type: application/json, Location,
Set-Cookie, X-Internal and Date, and a body {"id": <unique>, "seq": n,
"method": ..., "target": ...} so that a replay can be told apart from a
second execution.
"""
import argparse
import base64
import email.utils
import json
import socket
import struct
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

GATE_MAX_WAIT = 60.0


class State:
    def __init__(self):
        self.lock = threading.Lock()
        self.requests = []
        self.rules = []
        self.gates = {}
        self.seq = 0

    def reset(self):
        with self.lock:
            self.requests = []
            self.rules = []
            for ev in self.gates.values():
                ev.set()
            self.gates = {}

    def gate(self, name):
        with self.lock:
            ev = self.gates.get(name)
            if ev is None:
                ev = threading.Event()
                self.gates[name] = ev
            return ev

    def record(self, rec):
        with self.lock:
            self.seq += 1
            rec["seq"] = self.seq
            self.requests.append(rec)
            return self.seq

    def pick_rule(self, rec):
        with self.lock:
            for rule in self.rules:
                if not rule_matches(rule, rec):
                    continue
                if "times" in rule:
                    if rule["times"] <= 0:
                        continue
                    rule["times"] -= 1
                return dict(rule)
        return {}


STATE = State()


def header_value(rec, name):
    for k, v in rec["headers"]:
        if k.lower() == name.lower():
            return v
    return None


def rule_matches(rule, rec):
    if "prefix" in rule and not rec["target"].startswith(rule["prefix"]):
        return False
    if "method" in rule and rule["method"].upper() != rec["method"]:
        return False
    if "key" in rule and header_value(rec, "Idempotency-Key") != rule["key"]:
        return False
    return True


def header_pairs(h):
    if h is None:
        return []
    if isinstance(h, dict):
        return list(h.items())
    return [tuple(p) for p in h]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "stub-upstream"
    sys_version = ""

    def log_message(self, fmt, *args):
        pass

    # BaseHTTPRequestHandler dispatches on do_<METHOD>; every method is
    # handled the same way.
    def __getattr__(self, name):
        if name.startswith("do_"):
            return self.handle_any
        raise AttributeError(name)

    def read_body(self):
        te = (self.headers.get("Transfer-Encoding") or "").lower()
        if "chunked" in te:
            chunks = []
            while True:
                line = self.rfile.readline(65537)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    # trailers up to the empty line
                    while self.rfile.readline(65537) not in (b"\r\n", b"\n", b""):
                        pass
                    break
                chunks.append(self.rfile.read(size))
                self.rfile.readline(3)
            return b"".join(chunks)
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n > 0 else b""

    def handle_any(self):
        body = self.read_body()
        if self.path.startswith("/__stub/"):
            self.control(body)
            return
        rec = {
            "method": self.command,
            "target": self.path,
            "path": self.path.split("?", 1)[0],
            "query": self.path.split("?", 1)[1] if "?" in self.path else None,
            "version": self.request_version,
            "headers": [[k, v] for k, v in self.headers.raw_items()],
            "body_b64": base64.b64encode(body).decode(),
            "body": body.decode("utf-8", "replace"),
            "time": time.time(),
            "peer": self.client_address[0],
            "peer_port": self.client_address[1],
        }
        seq = STATE.record(rec)
        self.answer(STATE.pick_rule(rec), rec, seq)

    def control(self, body):
        cmd = self.path.split("?", 1)[0][len("/__stub/"):]
        req = json.loads(body) if body else {}
        if cmd == "requests" and self.command == "GET":
            with STATE.lock:
                out = {"requests": list(STATE.requests)}
        elif cmd == "reset" and self.command == "POST":
            STATE.reset()
            out = {"ok": True}
        elif cmd == "config" and self.command == "POST":
            rules = req.get("rules", [])
            with STATE.lock:
                if req.get("append"):
                    STATE.rules.extend(rules)
                else:
                    STATE.rules = list(rules)
            out = {"ok": True}
        elif cmd == "release" and self.command == "POST":
            STATE.gate(req["gate"]).set()
            out = {"ok": True}
        elif cmd == "health":
            out = {"ok": True}
        else:
            self.send_raw(404, [("Content-Type", "text/plain")], b"no such control\n")
            return
        self.send_raw(200, [("Content-Type", "application/json")],
                      json.dumps(out).encode())

    def send_raw(self, status, headers, body, close=False):
        self.send_response_only(status)
        for k, v in headers:
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(body)))
        if close:
            self.send_header("Connection", "close")
            self.close_connection = True
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def build_body(self, rule, rec, seq, uid):
        if rule.get("echo"):
            return json.dumps(rec).encode()
        if "body_b64" in rule:
            return base64.b64decode(rule["body_b64"])
        if "body" in rule:
            return rule["body"].encode()
        if "json" in rule:
            return json.dumps(rule["json"]).encode()
        if "size" in rule:
            pattern = b"0123456789abcdefghijklmnopqrstuvwxyz\n"
            n = int(rule["size"])
            return (pattern * (n // len(pattern) + 1))[:n]
        return json.dumps({"id": uid, "seq": seq, "method": rec["method"],
                           "target": rec["target"]}).encode()

    def build_headers(self, rule, uid):
        if rule.get("replace_headers"):
            headers = []
        else:
            headers = [
                ("Content-Type", "application/json"),
                ("Location", "/v1/payments/" + uid),
                ("Set-Cookie", "session=" + uid + "; Path=/; HttpOnly"),
                ("X-Internal", "internal-" + uid),
                ("Date", email.utils.formatdate(usegmt=True)),
            ]
        for k, v in header_pairs(rule.get("headers")):
            headers = [(hk, hv) for hk, hv in headers if hk.lower() != k.lower()]
            if v is not None:
                headers.append((k, v))
        return headers

    def answer(self, rule, rec, seq):
        if rule.get("delay"):
            time.sleep(float(rule["delay"]))
        if rule.get("gate"):
            STATE.gate(rule["gate"]).wait(GATE_MAX_WAIT)
        action = rule.get("action", "respond")
        if action == "close":
            self.close_connection = True
            return
        if action == "reset":
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                                       struct.pack("ii", 1, 0))
            self.close_connection = True
            self.connection.close()
            return
        uid = uuid.uuid4().hex
        status = int(rule.get("status", 201))
        body = self.build_body(rule, rec, seq, uid)
        headers = self.build_headers(rule, uid)
        if action == "half":
            self.send_response_only(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body[: len(body) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        if action == "slow":
            self.send_response_only(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.flush()
            n = max(1, int(rule.get("chunks", 4)))
            step = max(1, (len(body) + n - 1) // n)
            for i in range(0, len(body), step):
                time.sleep(float(rule.get("chunk_delay", 0.1)))
                self.wfile.write(body[i:i + step])
                self.wfile.flush()
            return
        self.send_raw(status, headers, body, close=bool(rule.get("close")))


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256
    allow_reuse_address = True

    def handle_error(self, request, client_address):
        # Connections the proxy drops or the tests abort are expected.
        pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--idle-timeout", type=float, default=None,
                    help="close keep-alive connections idle this long")
    args = ap.parse_args()
    Handler.timeout = args.idle_timeout
    srv = Server((args.host, args.port), Handler)
    print(srv.server_address[1], flush=True)
    try:
        srv.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main())
