"""Hostile input: keys, header bytes aimed at the upstream's parser, bodies
that are not what they claim, absurd sizes and lengths, paths that try to
leave their route, and broken conf files. Every case gets a clear answer;
a rejected request writes no record and reaches no upstream; the proxy is
still serving afterwards (and exits 0 at teardown: the fixture checks).

Each test runs one proxy through a whole table of cases and reports every
failing case, not only the first."""
import http.client
import json
import re
import socket

import pytest

from helpers import assert_problem, is_replay, new_key
from conftest import run_binary

PAY = "/v1/payments"
HANG = 10.0  # a hang detector, not a timing expectation


def exchange(port, data, method="POST"):
    """Sends raw bytes on a new connection and reads the first response:
    (status, headers dict, body). status None: closed without answering."""
    with socket.create_connection(("127.0.0.1", port), timeout=HANG) as s:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        resp = http.client.HTTPResponse(s, method=method)
        try:
            resp.begin()
        except (http.client.RemoteDisconnected, ConnectionResetError):
            return None, {}, b""
        except socket.timeout:
            pytest.fail("no answer within %.0fs to %r" % (HANG, data[:200]))
        try:
            body = resp.read()
        except (http.client.IncompleteRead, ConnectionResetError, socket.timeout) as e:
            body = getattr(e, "partial", b"")
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body


def problem_code(headers, body):
    if not (headers.get("content-type") or "").startswith("application/problem+json"):
        return None
    try:
        return json.loads(body).get("code")
    except ValueError:
        return "<unparsable problem body>"


def request_bytes(method, target, headers, body=b""):
    """A request as raw bytes: headers is a list of raw b"Name: value"
    lines (anything goes); Content-Length is the caller's business."""
    return (method.encode() + b" " + target + b" HTTP/1.1\r\n" +
            b"".join(h + b"\r\n" for h in headers) + b"\r\n" + body)


def assert_alive(proxy, stub):
    key = new_key("alive")
    r = proxy.post(PAY, key=key, json={"alive": True})
    assert r.status_code == 201 and not is_replay(r), r.content
    assert stub.count(key=key) == 1


# --- keys ---------------------------------------------------------------------

HOSTILE_KEYS = [
    # (what, Idempotency-Key header lines)
    ("SOH", [b"ab\x01cd"]),
    ("ESC", [b"ab\x1bcd"]),
    ("DEL", [b"ab\x7fcd"]),
    ("TAB inside", [b"ab\tcd"]),
    ("control char quoted", [b'"ab\x02cd"']),
    ("256 chars", [b"a" * 256]),
    ("1000 chars", [b"k" * 1000]),
    ("20000 chars", [b"k" * 20000]),
    ("256 chars quoted", [b'"' + b"q" * 256 + b'"']),
    ("256 after unescaping", [b'"' + b"q" * 254 + b'\\"\\\\"']),
    ("UTF-8", [b"caf\xc3\xa9"]),
    ("UTF-8 quoted", [b'"\xe2\x82\xac"']),
    ("high byte", [b"\x80"]),
    ("Latin-1 bytes", [b"\xff\xfe\xfd"]),
    ("stray quote inside", [b'ab"cd']),
    ("opening quote only", [b'"abc']),
    ("closing quote only", [b'abc"']),
    ("quote inside quoted", [b'"ab"cd"']),
    ("doubled quotes", [b'""abc""']),
    ("text after quoted", [b'"abc"def']),
    ("escape of a letter", [b'"a\\qb"']),
    ("escaped newline", [b'"a\\nb"']),
    ("unicode escape", [b'"\\u0041"']),
    ("dangling backslash", [b'"abc\\"']),
    ("lone backslash bare", [b"ab\\cd"]),
    ("list", [b"a, b"]),
    ("sf list", [b'"a", "b"']),
    ("semicolon bare", [b"a;b"]),
    ("comma bare", [b"a,b"]),
    ("space inside bare", [b"a b"]),
    ("empty", [b""]),
    ("blank", [b"   "]),
    ("empty quoted", [b'""']),
    ("two identical lines", [b"same", b"same"]),
    ("two different lines", [b"one", b"two"]),
    ("three lines", [b"x", b"x", b"x"]),
]


def test_hostile_keys_are_400_and_write_nothing(proxy, stub, pg):
    failures = []
    for what, values in HOSTILE_KEYS:
        body = b'{"amount":1}'
        lines = [b"Host: x", b"Content-Type: application/json",
                 b"Content-Length: %d" % len(body)]
        names = [b"Idempotency-Key", b"idempotency-key", b"IDEMPOTENCY-KEY"]
        lines += [names[i % 3] + b": " + v for i, v in enumerate(values)]
        status, headers, rbody = exchange(proxy.port, request_bytes("POST", PAY.encode(),
                                                                     lines, body))
        code = problem_code(headers, rbody)
        if status != 400 or code != "idempotency_key_invalid":
            failures.append("%s %r: got %s %s %r" % (what, values, status, code, rbody[:200]))
    assert not failures, "\n".join(failures)
    assert stub.count() == 0, stub.requests()
    assert pg.records() == []
    assert_alive(proxy, stub)


# --- bytes aimed at the upstream's header parser ------------------------------

SMUGGLED = b"GET /v1/payments?smuggled=1 HTTP/1.1\r\nHost: x\r\n\r\n"

# (what, header lines, body, Content-Length lines or None for the right one).
# b"{key}" in a line stands for the request's Idempotency-Key; without one,
# a plain Idempotency-Key line is added.
CONTROL_BYTES = [
    ("bare CR in a value", [b"X-Note: a\rInjected: 1"], b"{}", None),
    ("DEL in a value", [b"X-Note: a\x7fb"], b"{}", None),
    ("SOH in a value", [b"X-Note: a\x01b"], b"{}", None),
]
MALFORMED_LINES = [
    ("obs-fold with SP", [b"X-Note: a", b" Injected: 1"], b"{}", None),
    ("obs-fold with HTAB", [b"X-Tenant: a", b"\t-Id: victim"], b"{}", None),
    ("space in a header name", [b"X Note: 1"], SMUGGLED, None),
    ("space before the colon", [b"X-Note : 1"], SMUGGLED, None),
    ("quote in a header name", [b'X"Note: 1'], SMUGGLED, None),
]
CONFLICTING_LENGTHS = [
    ("two different Content-Lengths", [], b"{}" + SMUGGLED,
     [b"Content-Length: 2", b"Content-Length: %d" % (2 + len(SMUGGLED))]),
    ("a list of Content-Lengths", [], b"{}" + SMUGGLED,
     [b"Content-Length: 2, %d" % (2 + len(SMUGGLED))]),
    ("Content-Length beside chunked", [], b"2\r\n{}\r\n0\r\n\r\n" + SMUGGLED,
     [b"Content-Length: 2", b"Transfer-Encoding: chunked"]),
]


def hostile_lines(key, extra):
    """The header lines of a hostile request: extra with b"{key}" filled in,
    plus an Idempotency-Key line unless extra carries the key itself."""
    extra = [l.replace(b"{key}", key.encode()) for l in extra]
    lines = [b"Host: x", b"Content-Type: application/json"] + extra
    if not any(key.encode() in l for l in extra):
        lines.append(b"Idempotency-Key: " + key.encode())
    return lines


def injection_failures(proxy, stub, pg, cases):
    """Sends each case; returns what went wrong. A case must be answered 400
    (our bad_request problem, or the HTTP parser's own 400) and reach
    neither the upstream nor the store. Afterwards one ordinary request
    must arrive upstream exactly as sent: nothing was left on the shared
    upstream connection."""
    failures = []
    for what, extra, body, cls in cases:
        key = new_key("inj")
        before = stub.count()
        lines = hostile_lines(key, extra)
        lines += cls if cls is not None else [b"Content-Length: %d" % len(body)]
        status, headers, rbody = exchange(proxy.port, request_bytes("POST", PAY.encode(),
                                                                     lines, body))
        code = problem_code(headers, rbody)
        new = stub.requests()[before:]
        if status != 400 or code not in ("bad_request", None) or new:
            failures.append("%s: got %s %s; the upstream received %r" % (
                what, status, code, [(r.method, r.target, r.header_list) for r in new]))
        if pg.records(key):
            failures.append("%s: a record was written" % what)
    probe = new_key("probe")
    r = proxy.post(PAY + "?probe=1", key=probe, json={"probe": 1})
    last = stub.requests()[-1]
    if r.status_code != 201 or (last.method, last.target, last.key) != (
            "POST", PAY + "?probe=1", probe):
        failures.append("the next request arrived as %r %r (proxy answered %d)" % (
            last.method, last.target, r.status_code))
    smuggled = stub.requests(prefix=PAY + "?smuggled")
    if smuggled:
        failures.append("smuggled requests reached the upstream: %r" % smuggled)
    return failures


# One worker in these tests: every forwarded request shares one upstream
# connection, so bytes left on it would show up in the next request.

@pytest.mark.parametrize("cases", [CONTROL_BYTES, MALFORMED_LINES, CONFLICTING_LENGTHS],
                         ids=["control_bytes", "malformed_lines", "conflicting_lengths"])
def test_injection_attempts_are_400_and_never_reach_the_upstream(make_proxy, stub, pg,
                                                                  cases):
    proxy = make_proxy(top={"workers": 1})
    failures = injection_failures(proxy, stub, pg, cases)
    assert not failures, "\n".join(failures)
    assert_alive(proxy, stub)


# Bytes libmicrohttpd's parser normalises before the proxy sees the request:
# a bare LF ends a header line (RFC 9112 2.2 lets a recipient accept it), a
# NUL ends a value, an empty header name drops the rest of the header block.
# They cannot be refused (the proxy never sees them), but they cannot desync
# the upstream either: the proxy writes every header upstream itself, so the
# upstream receives exactly the request the proxy parsed, claimed and
# recorded. (what, header lines, headers the upstream must see, must not see)
NORMALISED = [
    ("bare LF in a value", [b"X-Note: a\nInjected: 1"],
     {"X-Note": "a", "Injected": "1"}, []),
    ("NUL in a value", [b"X-Note: a\x00Injected: 1"], {"X-Note": "a"}, ["Injected"]),
    ("NUL in the key", [b"Idempotency-Key: {key}\x00other"], {}, []),
    ("empty header name", [b"Idempotency-Key: {key}", b": 1", b"X-After: 1"], {},
     ["X-After"]),
]


def test_bytes_the_parser_normalises_reach_the_upstream_as_the_proxy_saw_them(
        make_proxy, stub, pg):
    proxy = make_proxy(top={"workers": 1})
    failures = []
    for what, extra, must, must_not in NORMALISED:
        key = new_key("norm")
        before = stub.count()
        lines = hostile_lines(key, extra)
        status, _, _ = exchange(proxy.port, request_bytes("POST", PAY.encode(), lines,
                                                          b""))
        new = stub.requests()[before:]
        if status != 201 or len(new) != 1:
            failures.append("%s: got %s, upstream saw %d requests" % (what, status, len(new)))
            continue
        seen = dict(new[0].header_list)
        for name, value in must.items():
            if seen.get(name) != value:
                failures.append("%s: upstream %s=%r" % (what, name, seen.get(name)))
        for name in must_not:
            if name in seen:
                failures.append("%s: upstream received %s" % (what, name))
        # the key the proxy claimed is the key the upstream received
        rec = pg.records(seen.get("Idempotency-Key", ""))
        if len(rec) != 1 or rec[0]["idem_key"] != key:
            failures.append("%s: record %r, upstream key %r" % (
                what, [r["idem_key"] for r in rec], seen.get("Idempotency-Key")))
    assert not failures, "\n".join(failures)
    assert_alive(proxy, stub)


# --- bodies that are not what they claim ----------------------------------------

ODD_BODIES = [
    ("invalid UTF-8 in a string", "application/json", b'{"amount": "\xff\xfe\xfd"}'),
    ("invalid UTF-8 alone", "application/json", b"\xc3\x28"),
    ("overlong UTF-8", "application/json", b'{"a": "\xc0\xaf"}'),
    ("truncated JSON", "application/json", b'{"amount": 1,'),
    ("single quotes", "application/json", b"{'amount': 1}"),
    ("duplicate keys", "application/json", b'{"a": 1, "a": 2}'),
    ("NUL between documents", "application/json", b'{"a": 1}\x00{"b": 2}'),
    ("trailing garbage", "application/json", b"[1, 2, 3]]"),
    ("NaN", "application/json", b"NaN"),
    ("number out of range", "application/json", b'{"n": 1e999999}'),
    ("lone surrogate escape", "application/json", b'{"s": "\\ud800"}'),
    ("empty", "application/json", b""),
    ("vendor JSON, broken", "application/vnd.api+json", b'{"data": [}'),
    ("binary", "application/octet-stream", bytes(range(256)) * 16),
]


def test_unparsable_bodies_are_hashed_raw_forwarded_and_replayed(proxy, stub, pg):
    failures = []
    for what, ctype, body in ODD_BODIES:
        key = new_key("body")
        h = {"Content-Type": ctype}
        first = proxy.post(PAY, key=key, data=body, headers=h)
        again = proxy.post(PAY, key=key, data=body, headers=h)
        # raw hashing: one more byte is another payload
        other = proxy.post(PAY, key=key, data=body + b" ", headers=h)
        seen = stub.requests(key=key)
        problems = []
        if first.status_code != 201 or is_replay(first):
            problems.append("first attempt got %d %r" % (first.status_code, first.content[:200]))
        if len(seen) != 1 or seen[0].body != body:
            problems.append("the upstream received %r" % [s.body[:80] for s in seen])
        if not (again.status_code == 201 and is_replay(again) and again.content == first.content):
            problems.append("retry got %d replayed=%s" % (again.status_code, is_replay(again)))
        if other.status_code != 409 or b"idempotency_key_mismatch" not in other.content:
            problems.append("one byte more got %d %r" % (other.status_code, other.content[:200]))
        if problems:
            failures.append("%s: %s" % (what, "; ".join(problems)))
    assert not failures, "\n".join(failures)
    assert_alive(proxy, stub)


def test_json_nested_100000_deep_is_forwarded_and_replayed(make_proxy, stub, pg):
    proxy = make_proxy(top={"max_request_body": "4MiB"})
    depth = 100000
    bodies = {
        "arrays": b"[" * depth + b"]" * depth,
        "objects": b'{"a":' * depth + b"1" + b"}" * depth,
        "unclosed": b"[" * depth,
    }
    failures = []
    for what, body in bodies.items():
        key = new_key("deep")
        h = {"Content-Type": "application/json"}
        first = proxy.post(PAY, key=key, data=body, headers=h)
        again = proxy.post(PAY, key=key, data=body, headers=h)
        seen = stub.requests(key=key)
        if first.status_code != 201 or is_replay(first):
            failures.append("%s: first attempt got %d" % (what, first.status_code))
        elif len(seen) != 1 or seen[0].body != body:
            failures.append("%s: the upstream received %d requests" % (what, len(seen)))
        elif not (is_replay(again) and again.content == first.content):
            failures.append("%s: retry got %d, not the replay" % (what, again.status_code))
    assert not failures, "\n".join(failures)
    assert_alive(proxy, stub)


# --- absurd sizes and lengths ---------------------------------------------------

def test_thousands_of_headers_are_431(proxy, stub, pg):
    for n in (3000, 20000):
        key = new_key("hdrs")
        lines = [b"Host: x", b"Idempotency-Key: " + key.encode(), b"Content-Length: 2"]
        lines += [b"X-H%d: v" % i for i in range(n)]
        status, headers, body = exchange(proxy.port, request_bytes("POST", PAY.encode(),
                                                                    lines, b"{}"))
        assert status == 431, "%d header lines: got %s %r" % (n, status, body[:200])
        assert stub.count(key=key) == 0
    assert stub.count() == 0
    assert pg.records() == []
    assert_alive(proxy, stub)


ABSURD_LENGTHS = [b"99999999999999999999", b"18446744073709551616", b"18446744073709551615",
                  b"9223372036854775808", b"9223372036854775807", b"4294967296", b"-1",
                  b"1e9", b"0x10", b"12 34", b"+2"]


def test_absurd_content_length_is_413_or_400_never_a_hang(proxy, stub, pg):
    failures = []
    for cl in ABSURD_LENGTHS:
        key = new_key("cl")
        # The announced body never comes: an answer must not wait for it.
        data = request_bytes("POST", PAY.encode(), [
            b"Host: x", b"Idempotency-Key: " + key.encode(),
            b"Content-Type: application/json", b"Content-Length: " + cl])
        status, headers, body = exchange(proxy.port, data)
        if status not in (400, 413):
            failures.append("Content-Length %r: got %s %r" % (cl, status, body[:200]))
        if stub.count(key=key) or pg.record(key) is not None:
            failures.append("Content-Length %r: forwarded or recorded" % cl)
    assert not failures, "\n".join(failures)
    assert stub.count() == 0
    assert_alive(proxy, stub)


# --- paths that try to leave their route ---------------------------------------

NOT_A_ROUTE = [
    b"/v1/payments%00",
    b"/v1/payments%00/capture",
    b"/%00/v1/payments",
    b"/v1/payments/../refunds",
    b"/v1/refunds/..",
    b"/hooks/../v1/payments",
    b"/hooks/a/../../v1/payments",
    b"/hooks/%2e%2e/v1/payments",
    b"/hooks/%2E%2E/v1/payments",
    b"/hooks/.%2e/v1/payments",
    b"/hooks/%2e./admin",
    b"/hooks/./x",
    b"/hooks/%2e",
    b"/v1/payments/%2e%2e/capture",
    b"/v1/payments/./capture",
    b"//v1/payments",
    b"/v1//payments",
    b"http://127.0.0.1:1/v1/payments",
    b"v1/payments",
    b"*",
]


def test_paths_outside_every_route_are_refused_and_never_forwarded(proxy, stub, pg):
    failures = []
    for target in NOT_A_ROUTE:
        for method in ("POST", "GET"):
            key = new_key("path")
            body = b"{}" if method == "POST" else b""
            lines = [b"Host: x", b"X-Tenant-Id: t1", b"Idempotency-Key: " + key.encode(),
                     b"Content-Type: application/json", b"Content-Length: %d" % len(body)]
            status, headers, rbody = exchange(proxy.port,
                                              request_bytes(method, target, lines, body),
                                              method=method)
            code = problem_code(headers, rbody)
            # MHD may refuse a malformed request line itself (400); a dot
            # or empty segment is refused before routing (400 bad_request),
            # and so is a target that is not origin-form.
            if not (status == 404 and code == "route_not_found") and \
                    not (status == 400 and code in (None, "bad_request")):
                failures.append("%s %r: got %s %s %r" % (method, target, status, code,
                                                         rbody[:200]))
    assert not failures, "\n".join(failures)
    assert stub.count() == 0, [(r.method, r.target) for r in stub.requests()]
    assert pg.records() == []
    assert_alive(proxy, stub)


def test_percent_00_inside_a_route_keeps_the_routes_rules(proxy, stub, pg):
    # {id} matches any one segment, %00 included, but the route's rules
    # still apply: a key is required and the raw path goes upstream as is.
    target = "/v1/payments/%00/capture"
    r = proxy.post(target, json={"n": 1})
    assert_problem(r, 400, "idempotency_key_missing")
    assert stub.count() == 0
    key = new_key("pct00")
    r = proxy.post(target, key=key, json={"n": 1})
    assert r.status_code == 201
    assert [s.target for s in stub.requests(key=key)] == [target]
    assert pg.record(key)["operation"] == "capture"


def test_over_long_paths_are_414_or_431(proxy, stub, pg):
    for path in (b"/v1/payments/" + b"a" * 100 * 1024 + b"/capture",
                 b"/hooks/" + b"b/" * 50 * 1024,
                 b"/v1/payments?" + b"q=1&" * 25 * 1024):
        key = new_key("long")
        lines = [b"Host: x", b"X-Tenant-Id: t1", b"Idempotency-Key: " + key.encode(),
                 b"Content-Length: 2"]
        status, headers, body = exchange(proxy.port, request_bytes("POST", path, lines, b"{}"))
        assert status in (414, 431), "%d-byte path: got %s %r" % (len(path), status, body[:200])
        if status == 431 and problem_code(headers, body) is not None:
            assert problem_code(headers, body) == "request_too_large"
    assert stub.count() == 0
    assert pg.records() == []
    assert_alive(proxy, stub)


# --- broken conf files ----------------------------------------------------------

HEAD = [
    'listen = "127.0.0.1:18080";',
    'admin_listen = "127.0.0.1:18081";',
    'database = {',
    '  url = "postgresql://nobody@127.0.0.1:1/nothing";',
    '};',
]
ROUTE = '  { name = "a"; path = "/v1/a"; upstream = "http://127.0.0.1:9"; }'
BAD = "  # <- wrong"


def conf(extra=(), routes=(ROUTE,), head=HEAD):
    return list(head) + list(extra) + ["routes = ("] + list(routes) + [");"]


def route(*lines):
    """A route group over several lines: '  {', the lines, '  }'."""
    return ["  {"] + ["    " + l for l in lines] + ["  }"]


# (what, conf lines); the line marked BAD is where the error must be reported.
BROKEN_CONFS = [
    ("workers 0", conf(["workers = 0;" + BAD])),
    ("negative queue_size", conf(["queue_size = -5;" + BAD])),
    ("workers as a float", conf(["workers = 4.5;" + BAD])),
    ("listen without a port", conf(head=['listen = "localhost";' + BAD] + HEAD[1:])),
    ("admin_listen equal to listen",
     conf(head=HEAD[:1] + ['admin_listen = "127.0.0.1:18080";' + BAD] + HEAD[2:])),
    ("max_header_size too small", conf(['max_header_size = "100";' + BAD])),
    ("max_request_body too large", conf(['max_request_body = "3GiB";' + BAD])),
    ("negative duration", conf(['shutdown_grace = "-1s";' + BAD])),
    ("log_level unknown", conf(['log_level = "verbose";' + BAD])),
    ("log_format unknown", conf(['log_format = "xml";' + BAD])),
    ("database as a string", conf(head=HEAD[:2] + ['database = "postgresql:///x";' + BAD])),
    ("database.unavailable unknown",
     conf(head=HEAD[:4] + ['  unavailable = "maybe";' + BAD, "};"])),
    ("database.statement_timeout 0", conf(head=HEAD[:4] + ['  statement_timeout = "0ms";' + BAD,
                                                           "};"])),
    ("reaper batch 0", conf(["reaper = {", "  batch = 0;" + BAD, "};"])),
    ("reaper unknown setting", conf(["reaper = {", "  colour = 1;" + BAD, "};"])),
    ("defaults tenant scheme", conf(["defaults = {", '  tenant = "bogus:x";' + BAD, "};"])),
    ("defaults tenant from the Authorization header",
     conf(["defaults = {", '  tenant = "header:Authorization";' + BAD, "};"])),
    ("defaults replay Set-Cookie",
     conf(["defaults = {", '  replay_headers = ["Set-Cookie"];' + BAD, "};"])),
    ("defaults without methods", conf(["defaults = {", "  methods = [];" + BAD, "};"])),
    ("defaults unknown method", conf(["defaults = {", '  methods = ["FETCH"];' + BAD, "};"])),
    ("defaults status 99",
     conf(["defaults = {", "  release_statuses = [500, 99];" + BAD, "};"])),
    ("defaults key mode", conf(["defaults = {", '  key = "sometimes";' + BAD, "};"])),
    ("defaults on_unknown", conf(["defaults = {", '  on_unknown = "panic";' + BAD, "};"])),
    ("route-only setting in defaults", conf(["defaults = {", '  path = "/x";' + BAD, "};"])),
    ("route without an upstream", conf(routes=['  { name = "a"; path = "/v1/a"; }' + BAD])),
    ("route path with an open brace",
     conf(routes=route('name = "a";', 'upstream = "http://127.0.0.1:9";',
                       'path = "/v1/{id";' + BAD))),
    ("route path with a dot segment",
     conf(routes=route('name = "a";', 'upstream = "http://127.0.0.1:9";',
                       'path = "/v1/../x";' + BAD))),
    ("route name with a space",
     conf(routes=route('path = "/v1/a";', 'upstream = "http://127.0.0.1:9";',
                       'name = "a b";' + BAD))),
    ("route name as a number",
     conf(routes=route('path = "/v1/a";', 'upstream = "http://127.0.0.1:9";',
                       'name = 5;' + BAD))),
    ("upstream with credentials",
     conf(routes=route('name = "a";', 'path = "/v1/a";',
                       'upstream = "http://u:p@127.0.0.1:9";' + BAD))),
    ("upstream with a query",
     conf(routes=route('name = "a";', 'path = "/v1/a";',
                       'upstream = "http://127.0.0.1:9/x?q=1";' + BAD))),
    ("upstream port 0",
     conf(routes=route('name = "a";', 'path = "/v1/a";',
                       'upstream = "http://127.0.0.1:0";' + BAD))),
    ("lease shorter than upstream_timeout",
     conf(routes=route('name = "a";', 'path = "/v1/a";', 'upstream = "http://127.0.0.1:9";',
                       'lease = "5s";' + BAD, 'upstream_timeout = "10s";'))),
    ("duplicate route name",
     conf(routes=[ROUTE + ","] + route('path = "/v1/b";', 'upstream = "http://127.0.0.1:9";',
                                       'name = "a";' + BAD))),
    ("route as a string", HEAD + ['routes = ( "not a group" );' + BAD]),
    ("empty routes", HEAD + ["routes = ( );" + BAD]),
    ("syntax error", conf(["shutdown_grace = ;" + BAD])),
]


def test_check_reports_every_kind_of_conf_error_with_file_and_line(tmp_path, binary):
    failures = []
    for n, (what, lines) in enumerate(BROKEN_CONFS):
        want = [i for i, l in enumerate(lines, 1) if l.endswith(BAD)]
        assert len(want) == 1, (what, lines)
        path = str(tmp_path / ("broken-%02d.conf" % n))
        with open(path, "w") as f:
            f.write("\n".join(lines) + "\n")
        r = run_binary(["-c", path, "--check"])
        out = r.stdout + r.stderr
        m = re.search(re.escape(path) + r":(\d+): \S", out)
        if r.returncode != 1:
            failures.append("%s: exit %d: %r" % (what, r.returncode, out))
        elif not m:
            failures.append("%s: no FILE:LINE: in %r" % (what, out))
        elif int(m.group(1)) != want[0]:
            failures.append("%s: line %s, want %d: %r" % (what, m.group(1), want[0], out))
    assert not failures, "\n".join(failures)
