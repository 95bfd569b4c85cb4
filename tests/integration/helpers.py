"""Shared helpers for the integration tests: the stub's control client, the
conf file writer, raw HTTP for requests `requests` cannot express, and the
problem+json assertion."""
import base64
import collections
import http.client
import json
import socket
import threading
import time
import uuid

import requests

TIMEOUT = 15  # seconds; every network call in the suite has a timeout


def new_key(prefix="k"):
    return "%s-%s" % (prefix, uuid.uuid4().hex)


_handed_out = collections.deque(maxlen=256)

# Stubs started with port 0 that have not reported their port yet (Stub):
# until such a process binds, the kernel may give it any free port, one
# free_port just handed out included.
_binding = []


def free_port():
    """A port nothing listens on, and not one of the last ones handed out:
    the kernel may give the same free port to two binds in a row, and a
    proxy's listen and admin_listen must differ. Stubs still starting are
    waited for first, so that none binds the port after it was handed
    out."""
    while _binding:
        stub = _binding.pop()
        if stub.proc.poll() is None:
            stub.port  # waits until it has bound and reported its port
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.append(port)
            return port


def log_entries(proxy):
    """The JSON objects of proxy's log, in order (other lines skipped)."""
    out = []
    for line in proxy.log().splitlines():
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if isinstance(doc, dict):
            out.append(doc)
    return out


def wait_until(pred, timeout=10.0, interval=0.02, what="condition"):
    """Polls pred() until it returns something truthy; fails after timeout.
    Used to wait for events (a request reaching the stub), never to judge
    speed."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError("timed out waiting for " + what)
        time.sleep(interval)


# --- the stub upstream -------------------------------------------------------

class StubRequest:
    def __init__(self, rec):
        self.rec = rec
        self.method = rec["method"]
        self.target = rec["target"]
        self.path = rec["path"]
        self.query = rec["query"]
        self.header_list = [(k, v) for k, v in rec["headers"]]
        self.body = base64.b64decode(rec["body_b64"])
        self.time = rec["time"]
        self.seq = rec["seq"]

    def headers(self, name):
        """Every value of header name, in order."""
        return [v for k, v in self.header_list if k.lower() == name.lower()]

    def header(self, name):
        vals = self.headers(name)
        assert len(vals) <= 1, "header %s sent %d times: %r" % (name, len(vals), vals)
        return vals[0] if vals else None

    @property
    def key(self):
        return self.header("Idempotency-Key")

    def __repr__(self):
        return "<StubRequest #%d %s %s key=%r>" % (self.seq, self.method, self.target,
                                                   self.headers("Idempotency-Key"))


class Stub:
    """A stub process. port may be a callable that waits for the process to
    report its port: the stub then starts while other fixtures are set up."""

    def __init__(self, port, proc):
        self._port = port
        self.proc = proc
        if callable(port):
            _binding.append(self)

    @property
    def port(self):
        if callable(self._port):
            self._port = self._port()
            if self in _binding:
                _binding.remove(self)
        return self._port

    @property
    def url(self):
        return "http://127.0.0.1:%d" % self.port

    def _ctl(self, method, what, body=None):
        r = requests.request(method, self.url + "/__stub/" + what,
                             data=json.dumps(body) if body is not None else None,
                             timeout=TIMEOUT)
        r.raise_for_status()
        return r.json()

    def requests(self, prefix=None, key=None, method=None):
        out = []
        for rec in self._ctl("GET", "requests")["requests"]:
            sr = StubRequest(rec)
            if prefix is not None and not sr.target.startswith(prefix):
                continue
            if key is not None and key not in sr.headers("Idempotency-Key"):
                continue
            if method is not None and sr.method != method:
                continue
            out.append(sr)
        return out

    def count(self, **kw):
        return len(self.requests(**kw))

    def reset(self):
        self._ctl("POST", "reset")

    def configure(self, *rules, append=False):
        self._ctl("POST", "config", {"rules": list(rules), "append": append})

    def release(self, gate):
        self._ctl("POST", "release", {"gate": gate})

    def wait_for(self, n=1, timeout=10.0, **kw):
        """Waits until the stub has received at least n matching requests."""
        return wait_until(lambda: self.requests(**kw) if self.count(**kw) >= n else None,
                          timeout=timeout, what="%d request(s) at the stub %r" % (n, kw))


# --- conf files --------------------------------------------------------------

def cfg_value(v, indent=""):
    if isinstance(v, Raw):
        return v.text
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, str):
        return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(v, dict):
        inner = indent + "  "
        body = "".join("%s%s = %s;\n" % (inner, k, cfg_value(x, inner))
                       for k, x in v.items() if x is not None)
        return "{\n" + body + indent + "}"
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(x, dict) for x in v):
            inner = indent + "  "
            return "(\n" + ",\n".join(inner + cfg_value(x, inner) for x in v) + "\n" + indent + ")"
        return "[" + ", ".join(cfg_value(x, indent) for x in v) + "]"
    raise TypeError("cannot write %r to a conf file" % (v,))


class Raw:
    """A conf value written verbatim (for deliberately wrong types)."""
    def __init__(self, text):
        self.text = text


def render_conf(settings):
    """settings: an ordered dict of top-level settings. None values are left
    out (so an override can delete a default)."""
    return "".join("%s = %s;\n" % (k, cfg_value(v)) for k, v in settings.items()
                   if v is not None)


# --- HTTP --------------------------------------------------------------------

class RawResponse:
    def __init__(self, status, headers, body):
        self.status_code = status
        self.header_list = headers
        self.content = body

    def header(self, name):
        vals = [v for k, v in self.header_list if k.lower() == name.lower()]
        return ", ".join(vals) if vals else None

    @property
    def headers(self):
        return {k.lower(): self.header(k) for k, _ in self.header_list}

    def json(self):
        return json.loads(self.content)


def raw_request(port, method, target, headers, body=b"", host=None, timeout=TIMEOUT):
    """Sends one request exactly as given (header lines in order, duplicates
    and odd bytes kept) and reads the response. headers: list of (name,
    value) with str or bytes values. Content-Length is added for a body
    unless a Content-Length or Transfer-Encoding header is given."""
    lines = [("%s %s HTTP/1.1" % (method, target)).encode()]
    names = {n.lower() for n, _ in headers}
    if "host" not in names:
        lines.append(("Host: %s" % (host or "127.0.0.1:%d" % port)).encode())
    for n, v in headers:
        vb = v if isinstance(v, bytes) else v.encode("latin-1")
        lines.append(n.encode() + b": " + vb)
    if body and "content-length" not in names and "transfer-encoding" not in names:
        lines.append(b"Content-Length: %d" % len(body))
    data = b"\r\n".join(lines) + b"\r\n\r\n" + body
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    try:
        sock.sendall(data)
        resp = http.client.HTTPResponse(sock, method=method)
        resp.begin()
        content = resp.read()
        return RawResponse(resp.status, resp.getheaders(), content)
    finally:
        sock.close()


def assert_problem(resp, status, code):
    """A proxy-made error: RFC 9457 problem+json with the fields the spec
    names, status equal to the HTTP status, and the expected code."""
    got_ct = resp.headers.get("content-type") or ""
    assert resp.status_code == status, \
        "expected %d %s, got %d: %r" % (status, code, resp.status_code, resp.content[:500])
    assert got_ct.split(";")[0].strip().lower() == "application/problem+json", \
        "problem Content-Type is %r" % got_ct
    doc = json.loads(resp.content)
    assert isinstance(doc, dict), doc
    for field in ("type", "title", "status", "detail", "code"):
        assert field in doc, "problem body lacks %r: %r" % (field, doc)
    assert doc["status"] == status, doc
    assert doc["code"] == code, doc
    assert isinstance(doc["type"], str) and doc["type"], doc
    assert isinstance(doc["title"], str) and doc["title"], doc
    assert isinstance(doc["detail"], str), doc
    return doc


def is_replay(resp):
    return (resp.headers.get("idempotent-replayed") or "").lower() == "true"


def assert_retry_after(resp):
    ra = resp.headers.get("retry-after")
    assert ra is not None, "no Retry-After on %d" % resp.status_code
    assert ra.isdigit() and int(ra) >= 1, "Retry-After %r is not delay-seconds >= 1" % ra
    return int(ra)


def fire_together(n, fn, join_timeout=120):
    """fn(i) in n threads released at the same moment, each with its own
    connection; results in order (an exception is returned, not raised)."""
    barrier = threading.Barrier(n)
    results = [None] * n

    def run(i):
        try:
            barrier.wait(TIMEOUT * 2)
            results[i] = fn(i)
        except Exception as e:  # reported with the others by the caller
            results[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(join_timeout)
    return results
