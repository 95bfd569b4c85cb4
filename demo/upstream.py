#!/usr/bin/env python3
"""A small mock payments API to put behind idemproxy in the demo.

It keeps everything in memory and prints one line per request it executes,
so a retry that the proxy replays visibly never reaches it:

    executed POST /v1/payments key=order-1 -> 201 pay_3f9a1c0e7b2d4a56

Endpoints:
    POST /v1/payments               {"amount": 2000, "currency": "usd", ...} -> 201
                                    amount 4000402 is declined -> 402 card_declined
    GET  /v1/payments               the list of payments -> 200
    GET  /v1/payments/{id}          -> 200 or 404
    POST /v1/payments/{id}/capture  -> 200 (400 when already captured)
    POST /v1/refunds                {"payment": "pay_...", "amount": 500} -> 201
    POST /hooks/psp                 a PSP's event {"event": {"id": "evt_...", ...}} -> 200
    POST /hooks/bank                a bank's notice, X-Delivery-Id header -> 200
    POST /v1/orders/{id}/transitions {"order_id": id, "status": "shipped"} -> 201
    GET  /__demo/stats              counters of what was executed (not proxied)

A request header `Slow: <seconds>` (at most 10) delays the answer, to show a
retry arriving while the first attempt is still in flight.

Usage: demo/upstream.py [--host HOST] [--port PORT] [PORT]
       (or DEMO_UPSTREAM_HOST / DEMO_UPSTREAM_PORT; default 127.0.0.1:9000)
Only the Python standard library is used.
"""

import argparse
import json
import os
import re
import secrets
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qsl, urlsplit

DECLINED_AMOUNT = 4000402
MAX_SLOW = 10.0
MAX_BODY = 1 << 20
# Idle keep-alive connections are closed after this long; a proxy must stop
# reusing its connections before that (curl's MAXAGE_CONN).
KEEPALIVE_IDLE = float(os.environ.get("DEMO_UPSTREAM_KEEPALIVE", "75"))

PAYMENT_ID = re.compile(r"^/v1/payments/([A-Za-z0-9_]+)$")
CAPTURE = re.compile(r"^/v1/payments/([A-Za-z0-9_]+)/capture$")
TRANSITIONS = re.compile(r"^/v1/orders/([A-Za-z0-9_-]+)/transitions$")


class Store:
    """The payments, refunds and counters, shared by all request threads."""

    def __init__(self):
        self.lock = threading.Lock()
        self.payments = {}
        self.order = []
        self.refunds = {}
        self.orders = {}
        self.stats = {"requests": 0, "charges": 0, "declines": 0,
                      "captures": 0, "refunds": 0, "events": 0, "transitions": 0,
                      "by_key": {}, "by_path": {}}

    def count(self, what, key, path):
        with self.lock:
            self.stats["requests"] += 1
            if what:
                self.stats[what] += 1
            for table, name in (("by_key", key), ("by_path", path)):
                if name is not None:
                    counts = self.stats[table]
                    counts[name] = counts.get(name, 0) + 1

    def snapshot(self):
        with self.lock:
            return json.loads(json.dumps(self.stats))


STORE = Store()
OUT_LOCK = threading.Lock()


def say(line):
    # One write per line under a lock, so lines from concurrent requests
    # never interleave.
    with OUT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def new_id(prefix):
    return prefix + "_" + secrets.token_hex(8)


def error(status, etype, code, message, param=None):
    err = {"type": etype, "code": code, "message": message}
    if param:
        err["param"] = param
    return status, {"error": err}


def invalid(code, message, param=None):
    return error(400, "invalid_request_error", code, message, param)


def parse_amount(value, param="amount"):
    """A positive integer amount in the currency's smallest unit, or None."""
    if isinstance(value, bool):
        return None
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if not isinstance(value, int) or value <= 0 or value > 99999999:
        return None
    return value


def create_payment(params):
    if "amount" not in params:
        return invalid("parameter_missing", "Missing required param: amount.", "amount")
    amount = parse_amount(params["amount"])
    if amount is None:
        return invalid("parameter_invalid_integer",
                       "amount must be a positive integer (smallest currency unit).",
                       "amount")
    currency = params.get("currency")
    if not currency:
        return invalid("parameter_missing", "Missing required param: currency.", "currency")
    if not isinstance(currency, str) or not re.fullmatch(r"[A-Za-z]{3}", currency):
        return invalid("parameter_invalid", "currency must be a three-letter ISO code.",
                       "currency")
    if amount == DECLINED_AMOUNT:
        return error(402, "card_error", "card_declined", "Your card was declined.")
    payment = {
        "id": new_id("pay"),
        "object": "payment",
        "status": "succeeded",
        "amount": amount,
        "currency": currency.lower(),
        "captured": False,
        "amount_refunded": 0,
        "created": int(time.time()),
    }
    for extra in ("description", "metadata", "customer"):
        if extra in params:
            payment[extra] = params[extra]
    with STORE.lock:
        STORE.payments[payment["id"]] = payment
        STORE.order.append(payment["id"])
    return 201, payment


def capture_payment(pid):
    with STORE.lock:
        payment = STORE.payments.get(pid)
        if payment is None:
            return error(404, "invalid_request_error", "resource_missing",
                         "No such payment: %s" % pid)
        if payment["captured"]:
            return invalid("payment_already_captured",
                           "Payment %s has already been captured." % pid)
        payment["captured"] = True
        return 200, dict(payment)


def create_refund(params):
    pid = params.get("payment")
    if not pid:
        return invalid("parameter_missing", "Missing required param: payment.", "payment")
    with STORE.lock:
        payment = STORE.payments.get(pid) if isinstance(pid, str) else None
        if payment is None:
            return error(404, "invalid_request_error", "resource_missing",
                         "No such payment: %s" % pid, "payment")
        left = payment["amount"] - payment["amount_refunded"]
        amount = left
        if "amount" in params:
            amount = parse_amount(params["amount"])
            if amount is None:
                return invalid("parameter_invalid_integer",
                               "amount must be a positive integer.", "amount")
        if amount > left:
            return invalid("amount_too_large",
                           "Refund amount %d is greater than the %d left on %s."
                           % (amount, left, pid), "amount")
        payment["amount_refunded"] += amount
        refund = {"id": new_id("re"), "object": "refund", "payment": pid,
                  "amount": amount, "currency": payment["currency"],
                  "status": "succeeded", "created": int(time.time())}
        STORE.refunds[refund["id"]] = refund
    return 201, refund


def receive_event(params):
    """A PSP's webhook: the event's id is what the proxy keys it by."""
    event = params.get("event")
    eid = event.get("id") if isinstance(event, dict) else None
    if not isinstance(eid, str) or not eid:
        return invalid("parameter_missing", "Missing required param: event.id.", "event.id")
    return 200, {"object": "event_receipt", "received": True, "event": eid,
                 "type": event.get("type")}


def receive_notice(delivery, params):
    """A bank's webhook: the X-Delivery-Id header is what the proxy keys it by."""
    if not delivery:
        return invalid("header_missing", "Missing required header: X-Delivery-Id.")
    return 200, {"object": "notice_receipt", "received": True, "delivery": delivery,
                 "status": params.get("status")}


def transition_order(oid, params):
    """A state change of an order: the proxy keys it by order and status."""
    status = params.get("status")
    if params.get("order_id") != oid:
        return invalid("parameter_invalid", "order_id must be the order of the URL (%s)." % oid,
                       "order_id")
    if not isinstance(status, str) or not status:
        return invalid("parameter_missing", "Missing required param: status.", "status")
    with STORE.lock:
        history = STORE.orders.setdefault(oid, [])
        history.append(status)
        trail = list(history)
    return 201, {"id": new_id("tr"), "object": "order_transition", "order": oid,
                 "status": status, "history": trail}


def list_payments():
    with STORE.lock:
        data = [STORE.payments[p] for p in reversed(STORE.order)]
    return 200, {"object": "list", "data": data[:100], "has_more": len(data) > 100}


def get_payment(pid):
    with STORE.lock:
        payment = STORE.payments.get(pid)
        payment = dict(payment) if payment else None
    if payment is None:
        return error(404, "invalid_request_error", "resource_missing",
                     "No such payment: %s" % pid)
    return 200, payment


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "demo-payments/1.0"
    timeout = KEEPALIVE_IDLE

    def log_message(self, fmt, *args):
        # One line per executed request goes to stdout instead (see executed()).
        pass

    def do_GET(self):
        path = urlsplit(self.path).path
        if path == "/__demo/stats":
            return self.send_json(200, STORE.snapshot())
        self.delay()
        if path == "/v1/payments":
            status, body = list_payments()
        elif PAYMENT_ID.match(path):
            status, body = get_payment(PAYMENT_ID.match(path).group(1))
        elif (path in ("/v1/refunds", "/hooks/psp", "/hooks/bank") or CAPTURE.match(path)
              or TRANSITIONS.match(path)):
            return self.not_allowed("POST")
        else:
            status, body = self.not_found(path)
        self.executed(None, status, body)
        self.send_json(status, body)

    def do_POST(self):
        path = urlsplit(self.path).path
        params, problem = self.read_params()
        if problem:
            self.executed(None, problem[0], problem[1])
            return self.send_json(*problem)
        self.delay()
        location = None
        counter = None
        if path == "/v1/payments":
            status, body = create_payment(params)
            counter = {201: "charges", 402: "declines"}.get(status)
            if status == 201:
                location = "/v1/payments/" + body["id"]
        elif CAPTURE.match(path):
            status, body = capture_payment(CAPTURE.match(path).group(1))
            counter = "captures" if status == 200 else None
        elif path == "/v1/refunds":
            status, body = create_refund(params)
            counter = "refunds" if status == 201 else None
        elif path == "/hooks/psp":
            status, body = receive_event(params)
            counter = "events" if status == 200 else None
        elif path == "/hooks/bank":
            status, body = receive_notice(self.headers.get("X-Delivery-Id"), params)
            counter = "events" if status == 200 else None
        elif TRANSITIONS.match(path):
            status, body = transition_order(TRANSITIONS.match(path).group(1), params)
            counter = "transitions" if status == 201 else None
        elif PAYMENT_ID.match(path):
            return self.not_allowed("GET")
        else:
            status, body = self.not_found(path)
        self.executed(counter, status, body)
        self.send_json(status, body, location)

    def do_PUT(self):
        self.unsupported()

    def do_PATCH(self):
        self.unsupported()

    def do_DELETE(self):
        self.unsupported()

    def unsupported(self):
        self.read_body()
        self.send_json(*error(405, "invalid_request_error", "method_not_allowed",
                              "%s is not supported here." % self.command))

    def not_found(self, path):
        return error(404, "invalid_request_error", "not_found",
                     "Unrecognized request URL (%s %s)." % (self.command, path))

    def not_allowed(self, allow):
        self.read_body()
        status, body = error(405, "invalid_request_error", "method_not_allowed",
                             "%s is not supported here; use %s." % (self.command, allow))
        self.send_json(status, body, extra={"Allow": allow})

    def read_body(self):
        """The request body, or None when it is too large or malformed."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            return self.read_chunked()
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            return None
        if length < 0 or length > MAX_BODY:
            return None
        return self.rfile.read(length)

    def read_chunked(self):
        body = b""
        while True:
            line = self.rfile.readline(1024)
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                return None
            if size == 0:
                while self.rfile.readline(1024) not in (b"\r\n", b"\n", b""):
                    pass
                return body
            if len(body) + size > MAX_BODY:
                return None
            body += self.rfile.read(size)
            self.rfile.readline(1024)

    def read_params(self):
        """(params, None) or (None, (status, error body))."""
        raw = self.read_body()
        if raw is None:
            self.close_connection = True
            return None, error(413, "invalid_request_error", "body_too_large",
                               "The request body is missing a valid length or is too large.")
        if not raw.strip():
            return {}, None
        ctype = self.headers.get("Content-Type", "").split(";")[0].strip().lower()
        if ctype == "application/x-www-form-urlencoded":
            return dict(parse_qsl(raw.decode("utf-8", "replace"))), None
        try:
            params = json.loads(raw)
        except ValueError:
            return None, invalid("invalid_json", "The request body is not valid JSON.")
        if not isinstance(params, dict):
            return None, invalid("invalid_json", "The request body must be a JSON object.")
        return params, None

    def delay(self):
        value = self.headers.get("Slow")
        if value is None:
            return
        try:
            seconds = min(max(float(value), 0.0), MAX_SLOW)
        except ValueError:
            return
        if seconds != seconds:  # NaN
            return
        say("holding  %s %s key=%s for %gs" % (self.command, urlsplit(self.path).path,
                                               self.headers.get("Idempotency-Key", "-"),
                                               seconds))
        time.sleep(seconds)

    def executed(self, counter, status, body):
        key = self.headers.get("Idempotency-Key")
        STORE.count(counter, key, urlsplit(self.path).path)
        oid = body.get("id") or body.get("object")
        if "error" in body:
            oid = body["error"].get("code")
        say("executed %s %s key=%s -> %d %s" % (self.command, urlsplit(self.path).path,
                                                key or "-", status, oid or ""))

    def send_json(self, status, body, location=None, extra=None):
        data = (json.dumps(body, indent=2) + "\n").encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-store")
        if location:
            self.send_header("Location", location)
        request_id = self.headers.get("X-Request-Id")
        if request_id:
            self.send_header("X-Request-Id", request_id)
        for name, value in (extra or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        self.wfile.write(data)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True


def main():
    parser = argparse.ArgumentParser(description="mock payments API for the idemproxy demo")
    parser.add_argument("pos_port", nargs="?", type=int, metavar="PORT")
    parser.add_argument("--port", type=int,
                        default=int(os.environ.get("DEMO_UPSTREAM_PORT", "9000")))
    parser.add_argument("--host", default=os.environ.get("DEMO_UPSTREAM_HOST", "127.0.0.1"))
    args = parser.parse_args()
    port = args.pos_port if args.pos_port is not None else args.port
    try:
        server = Server((args.host, port), Handler)
    except OSError as e:
        print("demo upstream: cannot listen on %s:%d: %s" % (args.host, port, e.strerror),
              file=sys.stderr)
        return 1
    say("demo payments API listening on http://%s:%d" % (args.host, port))
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
