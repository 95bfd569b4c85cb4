"""The ledger upstream of the verification campaign (tests/verify/ledger.c):
its answers and its log, checked column by column against what a client
saw, with resp_hash and body_sha recomputed here."""
import json
import os
import random
import re
import resource
import signal
import socket
import struct
import subprocess
import time

import pytest
import requests

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
LEDGER = os.path.join(ROOT, "build", "verify_ledger")
COLUMNS = ("seq port t_start t_end tenant key attempt_id method target "
           "body_sha kind effect exec status resp_hash cut").split()
STATUS = {"ok": 201, "e402": 402, "slow": 201, "e503": 503, "drop": 0,
          "stream": 201}


def fnv1a(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return "%016x" % h


def resp_hash(status, headers, body):
    ct = headers.get("content-type", "").strip()
    ex = headers.get("x-ledger-exec", "").strip()
    return fnv1a(("%d\n%s\n%s\n" % (status, ct, ex)).encode() + body)


def effect_body(exec_id, tenant, key, body_sha, declined=False):
    d = {"exec": exec_id, "tenant": tenant, "key": key, "body_sha": body_sha}
    if declined:
        d["declined"] = True
    return json.dumps(d, separators=(",", ":")).encode()


def free_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module", autouse=True)
def built():
    subprocess.run(["make", "-s", "build/verify_ledger"], cwd=ROOT,
                   check=True)


class Ledger:
    def __init__(self, tmp_path, nports=1, mix=None, seed=1, slow_ms=None):
        self.ports = [free_port() for _ in range(nports)]
        self.log = str(tmp_path / ("ledger-%d.tsv" % self.ports[0]))
        args = [LEDGER, "--log", self.log, "--seed", str(seed)]
        for p in self.ports:
            args += ["--listen", "127.0.0.1:%d" % p]
        if mix:
            args += ["--mix", mix]
        if slow_ms is not None:
            args += ["--slow-ms", str(slow_ms)]
        self.err = open(str(tmp_path / ("ledger-%d.err" % self.ports[0])),
                        "w")
        self.proc = subprocess.Popen(args, stderr=self.err)
        self.port = self.ports[0]
        self.url = "http://127.0.0.1:%d" % self.port
        deadline = time.time() + 10
        while True:
            try:
                for p in self.ports:
                    r = requests.get("http://127.0.0.1:%d/health" % p,
                                     timeout=2)
                    assert r.status_code == 200
                break
            except requests.ConnectionError:
                assert self.proc.poll() is None, "ledger exited at start"
                assert time.time() < deadline, "ledger not listening"
                time.sleep(0.05)

    def stop(self, sig=signal.SIGTERM):
        self.proc.send_signal(sig)
        rc = self.proc.wait(timeout=10)
        self.err.close()
        return rc

    def lines(self):
        with open(self.log) as f:
            text = f.read()
        rows = text.split("\n")
        assert rows[0].split("\t") == COLUMNS
        assert rows[-1] == ""
        out = []
        for row in rows[1:-1]:
            cols = row.split("\t")
            assert len(cols) == len(COLUMNS), row
            out.append(dict(zip(COLUMNS, cols)))
        return out

    def wait_line(self, pred, timeout=5):
        """A line the ledger flushed by itself (every 100 ms)."""
        deadline = time.time() + timeout
        while time.time() < deadline:
            found = [l for l in self.lines() if pred(l)]
            if found:
                return found
            time.sleep(0.05)
        raise AssertionError("no such line in the log")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        if not self.err.closed:
            self.err.close()


@pytest.fixture
def ledgers(tmp_path):
    started = []

    def start(**kw):
        led = Ledger(tmp_path, **kw)
        started.append(led)
        return led

    yield start
    for led in started:
        led.kill()


def request_bytes(method, target, headers, body=None):
    """A request; with no body, no Content-Length either (the caller may
    add a chunked one)."""
    lines = ["%s %s HTTP/1.1" % (method, target), "Host: ledger"]
    lines += ["%s: %s" % kv for kv in headers.items()]
    if body is not None:
        lines.append("Content-Length: %d" % len(body))
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + (body or b"")


def v1_headers(i, extra=None):
    h = {"X-Tenant-Id": "t%d" % (i % 4 + 1), "Idempotency-Key": "k-%d" % i,
         "X-Attempt-Id": "a-%d" % i, "Content-Type": "application/json"}
    h.update(extra or {})
    return h


def read_response(sock):
    """(status, headers, body) of one answer, or None at EOF before any."""
    buf = b""
    while b"\r\n\r\n" not in buf:
        try:
            d = sock.recv(65536)
        except ConnectionResetError:
            d = b""
        if not d:
            assert buf == b"", "connection closed inside a head"
            return None
        buf += d
    head, _, rest = buf.partition(b"\r\n\r\n")
    lines = head.decode().split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {}
    for l in lines[1:]:
        k, _, v = l.partition(":")
        headers[k.strip().lower()] = v.strip()
    n = int(headers.get("content-length", "0"))
    while len(rest) < n:
        d = sock.recv(65536)
        assert d, "connection closed inside a body"
        rest += d
    assert len(rest) == n
    return status, headers, rest


def connect(port):
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return s


def test_ok_answer_and_every_column(ledgers):
    led = ledgers(mix="ok=1")
    body = b'{"amount":100}'
    t0 = time.time_ns() // 1000
    r = requests.post(led.url + "/v1/payments?x=1", data=body,
                      headers=v1_headers(3), timeout=5)
    t1 = time.time_ns() // 1000
    assert led.stop() == 0
    [l] = led.lines()
    exec_id = r.headers["X-Ledger-Exec"]
    assert r.status_code == 201
    assert r.headers["Content-Type"] == "application/json"
    assert r.content == effect_body(exec_id, "t4", "k-3", fnv1a(body))
    assert re.fullmatch(r"%d-\d{16}-1" % led.port, exec_id)
    assert (l["seq"], l["port"]) == ("1", str(led.port))
    assert t0 <= int(l["t_start"]) <= int(l["t_end"]) <= t1
    assert (l["tenant"], l["key"], l["attempt_id"]) == ("t4", "k-3", "a-3")
    assert (l["method"], l["target"]) == ("POST", "/v1/payments?x=1")
    assert l["body_sha"] == fnv1a(body)
    assert (l["kind"], l["effect"], l["exec"]) == ("ok", "1", exec_id)
    assert l["status"] == "201"
    assert l["resp_hash"] == resp_hash(201, {k.lower(): v for k, v in
                                             r.headers.items()}, r.content)
    assert l["cut"] == "0"


@pytest.mark.parametrize("kind", ["e402", "e503"])
def test_declined_and_unavailable(ledgers, kind):
    led = ledgers(mix=kind + "=1")
    r = requests.post(led.url + "/v1/refunds", data=b"{}",
                      headers=v1_headers(1), timeout=5)
    assert led.stop() == 0
    [l] = led.lines()
    hdrs = {k.lower(): v for k, v in r.headers.items()}
    assert r.status_code == STATUS[kind] and l["status"] == str(STATUS[kind])
    assert hdrs["content-type"] == "application/json"
    assert l["resp_hash"] == resp_hash(r.status_code, hdrs, r.content)
    assert l["kind"] == kind and l["cut"] == "0"
    if kind == "e402":
        assert l["effect"] == "1" and l["exec"] == hdrs["x-ledger-exec"]
        assert r.content == effect_body(l["exec"], "t2", "k-1", fnv1a(b"{}"),
                                        declined=True)
    else:
        assert l["effect"] == "0" and l["exec"] == ""
        assert "x-ledger-exec" not in hdrs
        assert r.json()["error"]


def test_chunked_body_and_keep_alive(ledgers):
    led = ledgers(mix="ok=1")
    pieces = [b'{"a":', b"1" * 300, b',"b":2}']
    chunked = b"".join(b"%x;ext=1\r\n%s\r\n" % (len(p), p) for p in pieces)
    chunked += b"0\r\nX-Trailer: yes\r\n\r\n"
    first = request_bytes("POST", "/v1/transfers", dict(
        v1_headers(1), **{"Transfer-Encoding": "chunked"})) + chunked
    second = request_bytes("PUT", "/v1/payments", v1_headers(2), b"xyz")
    third = request_bytes("GET", "/v1/payments/9", v1_headers(3))
    s = connect(led.port)
    answers = []
    for req in (first, second, third):
        for i in range(0, len(req), 7):  # the parser sees it bit by bit
            s.sendall(req[i:i + 7])
        answers.append(read_response(s))
    s.close()
    assert led.stop() == 0
    lines = {l["attempt_id"]: l for l in led.lines()}
    assert len(lines) == 3
    for i, (want_body, (status, hdrs, body)) in enumerate(
            zip([b"".join(pieces), b"xyz", b""], answers), 1):
        l = lines["a-%d" % i]
        assert status == 201 and l["exec"] == hdrs["x-ledger-exec"]
        assert l["body_sha"] == fnv1a(want_body)
        assert l["resp_hash"] == resp_hash(status, hdrs, body)
    assert lines["a-3"]["body_sha"] == "cbf29ce484222325"
    assert [lines["a-%d" % i]["method"] for i in (1, 2, 3)] == \
        ["POST", "PUT", "GET"]


def test_slow_answer_comes_after_slow_ms(ledgers):
    led = ledgers(mix="slow=1", slow_ms=600)
    t0 = time.monotonic()
    r = requests.post(led.url + "/v1/payments", data=b"{}",
                      headers=v1_headers(1), timeout=10)
    elapsed = time.monotonic() - t0
    assert led.stop() == 0
    [l] = led.lines()
    # Measured on this side's monotonic clock: the log's times are the
    # wall clock's, which may be slewed.
    assert r.status_code == 201 and elapsed >= 0.6
    assert int(l["t_end"]) > int(l["t_start"])
    assert (l["kind"], l["effect"], l["cut"]) == ("slow", "1", "0")
    assert l["exec"] == r.headers["X-Ledger-Exec"]


def test_stream_arrives_in_pieces(ledgers):
    led = ledgers(mix="stream=1")
    s = connect(led.port)
    t0 = time.monotonic()
    s.sendall(request_bytes("POST", "/v1/payments", v1_headers(1), b"{}"))
    got, reads = b"", []
    while True:
        d = s.recv(65536)
        assert d
        got += d
        reads.append(got)
        head, sep, body = got.partition(b"\r\n\r\n")
        if sep and len(body) == int(re.search(
                rb"Content-Length: (\d+)", head).group(1)):
            break
    elapsed = time.monotonic() - t0
    s.close()
    assert led.stop() == 0
    [l] = led.lines()
    # The head leaves alone, then half the body, then the rest, each 100 to
    # 300 ms after the one before.
    head_len = got.index(b"\r\n\r\n") + 4
    first_with_head = next(r for r in reads if len(r) >= head_len)
    assert len(first_with_head) < len(got)
    assert len(reads) >= 2 and elapsed >= 0.2
    assert got.startswith(b"HTTP/1.1 201 ")
    assert (l["kind"], l["status"], l["cut"]) == ("stream", "201", "0")


def test_drop_closes_without_answer(ledgers):
    led = ledgers(mix="drop=1")
    s = connect(led.port)
    s.sendall(request_bytes("POST", "/v1/payments", v1_headers(1), b"{}"))
    assert read_response(s) is None
    s.close()
    assert led.stop() == 0
    [l] = led.lines()
    assert (l["kind"], l["effect"], l["status"]) == ("drop", "1", "0")
    assert l["exec"] and l["resp_hash"] == "" and l["cut"] == "0"


@pytest.mark.parametrize("kind", ["slow", "stream"])
def test_client_closing_mid_answer_is_cut(ledgers, kind):
    led = ledgers(mix=kind + "=1", slow_ms=30000)
    s = connect(led.port)
    s.sendall(request_bytes("POST", "/v1/payments", v1_headers(1), b"{}"))
    if kind == "stream":
        buf = b""
        while b"\r\n\r\n" not in buf:
            buf += s.recv(65536)
    else:
        time.sleep(0.2)  # most likely waiting by now; either way is a cut
    s.close()
    # Logged when the ledger saw the close, not when it stops.
    [l] = led.wait_line(lambda l: True)
    assert led.proc.poll() is None
    assert led.stop() == 0
    assert (l["kind"], l["status"], l["cut"]) == (kind, "201", "1")
    body = effect_body(l["exec"], "t2", "k-1", fnv1a(b"{}"))
    want = resp_hash(201, {"content-type": "application/json",
                           "x-ledger-exec": l["exec"]}, body)
    assert l["resp_hash"] == want


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stop_flushes_and_exits_0(ledgers, sig):
    led = ledgers(mix="slow=1", slow_ms=60000)
    s = connect(led.port)
    s.sendall(request_bytes("POST", "/v1/payments", v1_headers(1), b"{}"))
    time.sleep(0.3)
    # The pending answer is logged only at the stop: the line must be there.
    assert led.stop(sig) == 0
    [l] = led.lines()
    assert (l["kind"], l["effect"], l["cut"]) == ("slow", "1", "1")
    assert read_response(s) is None
    s.close()


def run_mix(ledgers, seed):
    led = ledgers(seed=seed, slow_ms=50)
    for i in range(40):
        s = connect(led.port)
        s.sendall(request_bytes("POST", "/v1/payments",
                             v1_headers(i, {"Connection": "close"}), b"{}"))
        ans = read_response(s)
        s.close()
        got_status = ans[0] if ans else 0
        led.wait_line(lambda l: l["attempt_id"] == "a-%d" % i)
        [l] = [l for l in led.lines() if l["attempt_id"] == "a-%d" % i]
        assert got_status == STATUS[l["kind"]] == int(l["status"])
    assert led.stop() == 0
    lines = sorted(led.lines(), key=lambda l: int(l["seq"]))
    return [l["kind"] for l in lines]


def test_seeded_mix_is_reproducible(ledgers):
    a, b, c = run_mix(ledgers, 7), run_mix(ledgers, 7), run_mix(ledgers, 8)
    assert a == b
    assert a != c
    assert set(a) <= set(STATUS) and len(set(a)) >= 3


def test_mix_weights_limit_the_kinds(ledgers):
    led = ledgers(mix="ok=1,e503=1,slow=0", seed=3)
    with requests.Session() as sess:
        for i in range(30):
            sess.post(led.url + "/v1/payments", data=b"{}",
                      headers=v1_headers(i), timeout=5)
    assert led.stop() == 0
    assert {l["kind"] for l in led.lines()} == {"ok", "e503"}


def test_health_is_answered_and_not_logged(ledgers):
    led = ledgers(mix="ok=1")
    for path in ("/health", "/other", "/v1"):
        r = requests.get(led.url + path, timeout=5)
        assert r.status_code == 200 and "X-Ledger-Exec" not in r.headers
    r = requests.post(led.url + "/v1/payments", data=b"{}",
                      headers=v1_headers(1), timeout=5)
    assert led.stop() == 0
    [l] = led.lines()
    assert l["seq"] == "1" and l["exec"] == r.headers["X-Ledger-Exec"]


def test_exec_ids_unique_across_ports(ledgers):
    led = ledgers(mix="ok=1,e402=1,e503=1", nports=2, seed=5)
    seen = {}
    sessions = [requests.Session(), requests.Session()]
    for i in range(60):
        port = led.ports[i % 2]
        r = sessions[i % 2].post("http://127.0.0.1:%d/v1/payments" % port,
                                 data=b"{}", headers=v1_headers(i), timeout=5)
        seen["a-%d" % i] = (port, r.headers.get("X-Ledger-Exec", ""))
    for sess in sessions:
        sess.close()
    assert led.stop() == 0
    lines = led.lines()
    assert sorted(int(l["seq"]) for l in lines) == list(range(1, 61))
    execs = [l["exec"] for l in lines if l["effect"] == "1"]
    assert len(execs) == len(set(execs)) > 0
    for l in lines:
        port, exec_id = seen[l["attempt_id"]]
        assert l["port"] == str(port) and l["exec"] == exec_id
        if exec_id:
            assert exec_id.startswith("%d-" % port)
            assert exec_id.endswith("-" + l["seq"])


def refused(port, data, tail=b""):
    s = connect(port)
    try:
        s.sendall(data)
        if tail:
            s.sendall(tail)
    except (BrokenPipeError, ConnectionResetError):
        pass
    ans = read_response(s)
    rest = s.recv(65536)  # then the ledger closes
    s.close()
    return ans[0], ans[1].get("connection"), rest


def test_limits_and_malformed_requests(ledgers):
    led = ledgers(mix="ok=1")
    big_head = b"POST /v1/x HTTP/1.1\r\nX-Pad: " + b"a" * 70000
    assert refused(led.port, big_head) == (431, "close", b"")
    cl = b"POST /v1/x HTTP/1.1\r\nContent-Length: 2000000\r\n\r\n"
    assert refused(led.port, cl, b"z" * 100000) == (413, "close", b"")
    chunk = b"%x\r\n%s\r\n" % (65536, b"c" * 65536)
    te = (b"POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
          + chunk * 17)
    assert refused(led.port, te) == (413, "close", b"")
    assert refused(led.port, b"NONSENSE\r\n\r\n")[0] == 400
    bad_chunk = (b"POST /v1/x HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n"
                 b"zz\r\n")
    assert refused(led.port, bad_chunk)[0] == 400
    gz = b"POST /v1/x HTTP/1.1\r\nTransfer-Encoding: gzip\r\n\r\n"
    assert refused(led.port, gz)[0] == 501
    r = requests.post(led.url + "/v1/payments", data=b"{}",
                      headers=v1_headers(1), timeout=5)
    assert led.stop() == 0
    assert [l["attempt_id"] for l in led.lines()] == ["a-1"]
    assert r.status_code == 201


def test_many_connections_and_clients_closing_at_any_moment(ledgers):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = min(hard, 8192)
    if soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
    n = min(3000, want - 200)
    assert n >= 1000, "the test needs about 3000 descriptors"
    led = ledgers(mix="ok=1")
    full = request_bytes("POST", "/v1/payments", dict(
        v1_headers(1), **{"Transfer-Encoding": "chunked"})) + \
        b"5\r\nhello\r\n0\r\n\r\n"
    rnd = random.Random(28)
    socks = []
    for i in range(n):
        s = socket.create_connection(("127.0.0.1", led.port), timeout=10)
        cut_at = rnd.randrange(len(full))  # never the whole request
        if cut_at:
            s.sendall(full[:cut_at])
        socks.append(s)
    # Thousands of half requests held open: the ledger still serves.
    r = requests.post(led.url + "/v1/payments", data=b"{}",
                      headers=v1_headers(2), timeout=10)
    assert r.status_code == 201
    for i, s in enumerate(socks):
        if i % 2:  # half of them reset, half closed
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER,
                         struct.pack("ii", 1, 0))
        s.close()
    r = requests.get(led.url + "/health", timeout=10)
    assert r.status_code == 200 and led.proc.poll() is None
    assert led.stop() == 0
    assert [l["attempt_id"] for l in led.lines()] == ["a-2"]
