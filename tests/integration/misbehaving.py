"""Raw-socket upstreams for the failure tests.

RawUpstream is an HTTP/1.1 server on a plain socket, run in threads of the
test process, that gives a test exact control over what goes on the wire:
which bytes are sent, when a connection is closed or reset, how long an idle
keep-alive connection lives. It counts at the socket level: every request it
parses is recorded with the connection it came on and its position on that
connection, before the test's handler decides what to do with it.

A handler is handler(req) -> action, called on the connection's thread (it
may block, e.g. on a threading.Barrier). Actions:

  Respond(status=201, body=None, headers=None, close=False)
  Close()           read the request, close without answering (FIN)
  Reset()           read the request, abort the connection (RST)
  Half(status=201, size=200)
                    the headers and half of a size-byte body, then close
  Sleep(seconds, then)
                    wait, then do `then` (the client may be gone by then)
  Respond(..., extra=b"...", extra_delay=None)
                    after the response, bytes nobody asked for: in the same
                    write (extra_delay None) or in a write of their own after
                    extra_delay seconds; counted in extra_sent once written
  Chunked(status=200, chunks, headers=None, trailers=None)
                    a chunked response, trailer fields after the last chunk
  Wire(data, close=False)
                    these exact bytes as the response
"""
import json
import select
import socket
import struct
import threading
import time
import uuid

from helpers import wait_until

MAX_HEAD = 64 * 1024


class Respond:
    def __init__(self, status=201, body=None, headers=None, close=False, extra=b"",
                 extra_delay=None):
        self.status = status
        self.body = body
        self.headers = list(headers or [])
        self.close = close
        self.extra = extra
        self.extra_delay = extra_delay


class Chunked:
    def __init__(self, status=200, chunks=(), headers=None, trailers=None):
        self.status = status
        self.chunks = list(chunks)
        self.headers = list(headers or [])
        self.trailers = list(trailers or [])


class Wire:
    def __init__(self, data, close=False):
        self.data = data
        self.close = close


class Close:
    pass


class Reset:
    pass


class Half:
    def __init__(self, status=201, size=200):
        self.status = status
        self.size = size


class Sleep:
    def __init__(self, seconds, then=None):
        self.seconds = seconds
        self.then = then if then is not None else Close()


class RawRequest:
    def __init__(self, conn_id, index, method, target, headers, body):
        self.conn_id = conn_id      # which accepted connection (1, 2, ...)
        self.index = index          # 1 for the first request on it
        self.method = method
        self.target = target
        self.header_list = headers  # [(name, value)] as received
        self.body = body
        self.seq = 0                # arrival order over all connections

    def headers(self, name):
        return [v for k, v in self.header_list if k.lower() == name.lower()]

    @property
    def key(self):
        vals = self.headers("Idempotency-Key")
        return vals[0] if len(vals) == 1 else None

    def __repr__(self):
        return "<RawRequest #%d conn=%d/%d %s %s key=%r>" % (
            self.seq, self.conn_id, self.index, self.method, self.target, self.key)


class _Gone(Exception):
    """The peer closed the connection (or the server is stopping)."""


class RawUpstream:
    """An upstream on 127.0.0.1. port=0 picks a free port. idle_close: close
    a keep-alive connection that stays idle this many seconds after a
    response (None: keep it open)."""

    def __init__(self, handler=None, port=0, idle_close=None):
        self.handler = handler or (lambda req: Respond())
        self.idle_close = idle_close
        self.lock = threading.Lock()
        self.requests = []
        self.accepted = 0
        self.open = 0
        self.closed_idle = 0
        self.extra_sent = 0
        self._conns = set()
        self._stopping = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.url = "http://127.0.0.1:%d" % self.port
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    # --- what the tests look at ----------------------------------------------

    def seen(self, key=None):
        with self.lock:
            reqs = list(self.requests)
        if key is None:
            return reqs
        return [r for r in reqs if key in r.headers("Idempotency-Key")]

    def count(self, key=None):
        return len(self.seen(key))

    def wait_for(self, n=1, key=None, timeout=10.0):
        return wait_until(lambda: self.count(key) >= n, timeout=timeout,
                          what="%d request(s) with key %r at the raw upstream" % (n, key))

    def wait_all_closed(self, timeout=10.0):
        wait_until(lambda: self.open == 0, timeout=timeout,
                   what="the raw upstream's connections to close")

    def stop(self):
        self._stopping.set()
        try:
            self.sock.close()
        except OSError:
            pass
        with self.lock:
            conns = list(self._conns)
        for c in conns:
            try:
                c.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._acceptor.join(5)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    # --- serving -------------------------------------------------------------

    def _accept_loop(self):
        while not self._stopping.is_set():
            try:
                r, _, _ = select.select([self.sock], [], [], 0.1)
                if not r:
                    continue
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.lock:
                self.accepted += 1
                self.open += 1
                conn_id = self.accepted
                self._conns.add(conn)
            threading.Thread(target=self._serve, args=(conn, conn_id), daemon=True).start()

    def _serve(self, conn, conn_id):
        buf = bytearray()
        index = 0
        try:
            while not self._stopping.is_set():
                idle = self.idle_close if index > 0 else None
                try:
                    head, buf = self._read_head(conn, buf, idle)
                except _Gone:
                    return
                except socket.timeout:
                    with self.lock:
                        self.closed_idle += 1
                    return
                index += 1
                method, target, headers = parse_head(head)
                body, buf = self._read_body(conn, buf, headers)
                req = RawRequest(conn_id, index, method, target, headers, body)
                with self.lock:
                    self.requests.append(req)
                    req.seq = len(self.requests)
                if not self._act(conn, req, self.handler(req)):
                    return
        except (OSError, _Gone):
            return
        finally:
            with self.lock:
                self.open -= 1
                self._conns.discard(conn)
            try:
                conn.close()
            except OSError:
                pass

    def _recv(self, conn, timeout):
        """One recv; timeout None waits (in slices, to notice stop())."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._stopping.is_set():
                raise _Gone()
            left = 0.1 if deadline is None else min(0.1, deadline - time.monotonic())
            if left <= 0:
                raise socket.timeout()
            r, _, _ = select.select([conn], [], [], left)
            if r:
                data = conn.recv(65536)
                if not data:
                    raise _Gone()
                return data

    def _read_head(self, conn, buf, idle_timeout):
        first = True
        while b"\r\n\r\n" not in buf:
            if len(buf) > MAX_HEAD:
                raise _Gone()
            # Only the wait for the first byte of a new request is "idle".
            buf += self._recv(conn, idle_timeout if first and not buf else None)
            first = False
        end = buf.index(b"\r\n\r\n")
        return bytes(buf[:end]), buf[end + 4:]

    def _read_exact(self, conn, buf, n):
        while len(buf) < n:
            buf += self._recv(conn, None)
        return bytes(buf[:n]), buf[n:]

    def _read_line(self, conn, buf):
        while b"\r\n" not in buf:
            buf += self._recv(conn, None)
        i = buf.index(b"\r\n")
        return bytes(buf[:i]), buf[i + 2:]

    def _read_body(self, conn, buf, headers):
        te = ",".join(v for k, v in headers if k.lower() == "transfer-encoding").lower()
        if "chunked" in te:
            out = bytearray()
            while True:
                line, buf = self._read_line(conn, buf)
                size = int(line.split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while True:
                        trailer, buf = self._read_line(conn, buf)
                        if not trailer:
                            return bytes(out), buf
                data, buf = self._read_exact(conn, buf, size + 2)
                out += data[:size]
        cl = [v for k, v in headers if k.lower() == "content-length"]
        n = int(cl[0]) if cl else 0
        return self._read_exact(conn, buf, n)

    def _act(self, conn, req, action):
        """Carries out an action; returns True to keep the connection."""
        if isinstance(action, Sleep):
            self._stopping.wait(action.seconds)
            return self._act(conn, req, action.then)
        if isinstance(action, Close):
            return False
        if isinstance(action, Reset):
            conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            return False
        if isinstance(action, Half):
            body = body_of(action.size)
            conn.sendall(response_head(action.status, [("Content-Type", "text/plain")],
                                       len(body), close=False) + body[:len(body) // 2])
            return False
        if isinstance(action, Wire):
            conn.sendall(action.data)
            return not action.close
        if isinstance(action, Chunked):
            out = response_head(action.status, action.headers + [
                ("Transfer-Encoding", "chunked")], None, False)
            for c in action.chunks:
                out += b"%x\r\n" % len(c) + c + b"\r\n"
            out += b"0\r\n" + "".join("%s: %s\r\n" % t for t in action.trailers).encode(
                "latin-1") + b"\r\n"
            conn.sendall(out)
            return True
        if isinstance(action, Respond):
            body = action.body
            headers = list(action.headers)
            if body is None:
                body = json.dumps({"id": uuid.uuid4().hex, "seq": req.seq,
                                   "conn": req.conn_id, "key": req.key}).encode()
                headers.append(("Content-Type", "application/json"))
            data = response_head(action.status, headers, len(body), action.close) + body
            if action.extra and action.extra_delay is None:
                conn.sendall(data + action.extra)
                self._count_extra()
            else:
                conn.sendall(data)
            if action.extra and action.extra_delay is not None:
                self._stopping.wait(action.extra_delay)
                conn.sendall(action.extra)
                self._count_extra()
            return not action.close
        raise TypeError("unknown action %r" % (action,))


    def _count_extra(self):
        with self.lock:
            self.extra_sent += 1


def parse_head(head):
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ")
    if len(parts) != 3:
        raise _Gone()
    headers = []
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers.append((name.strip(), value.strip()))
    return parts[0], parts[1], headers


REASONS = {200: "OK", 201: "Created", 402: "Payment Required", 503: "Service Unavailable"}


def response_head(status, headers, length, close):
    lines = ["HTTP/1.1 %d %s" % (status, REASONS.get(status, "Status"))]
    lines += ["%s: %s" % (k, v) for k, v in headers]
    if length is not None:
        lines.append("Content-Length: %d" % length)
    if close:
        lines.append("Connection: close")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def body_of(size):
    pattern = b"0123456789abcdef"
    return (pattern * (size // len(pattern) + 1))[:size]


def closed_port():
    """A port on 127.0.0.1 that nothing listens on (connections are
    refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
