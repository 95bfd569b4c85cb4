"""A TCP relay between the proxy and PostgreSQL that can lose, hold or cut answers.

PgRelay(pg_port) listens on 127.0.0.1 and passes the PostgreSQL protocol
through unchanged, one pair of threads per relayed connection (a hold on one
connection never slows another).

arm(statement): the next execution of the prepared statement of that name (a
Bind message naming it) is carried to the server and runs there to its end,
but its answer is swallowed up to and including ReadyForQuery, so the
statement has committed, and then both sides of the connection are closed:
the client sees "server closed the connection unexpectedly" for a statement
that did take effect. One shot; .tripped counts the answers lost.

hold(statement, seconds=None, then="deliver", phase="answer", shots=1): for
the next `shots` executions of that statement (shots=None: every one until
clear()):
  - phase="answer": the statement reaches the server and runs to its end; its
    answer (the answer of its Sync group, up to and including ReadyForQuery)
    is held. The hold ends at the later of its time and the arrival of that
    ReadyForQuery, so the statement has always ended on the server;
  - phase="statement": the Bind and every message after it on that
    connection are held before the server sees them.
`seconds` counts from the moment the relay saw the Bind (None: until
release()). Then then="deliver" passes what was held on (and everything
queued behind it), or then="cut" closes both sides of that connection.
release() ends every hold in place now; clear() starts no new holds (holds in
place go on). .held counts holds started, .cuts connections cut by holds.
terminate_all() closes every relayed connection at once.

hold_all(seconds, then="deliver"): a stalled network path. From now on no
byte passes in either direction on any relayed connection, nor on one
opened meanwhile (the first bytes read wait in the relay, the rest in the
kernel's buffers); after `seconds` (or at release()) then="deliver" lets
everything through again, then="cut" closes every relayed connection
first. Returns at once; .all_holds counts them.

Answers are matched to statements by counting ReadyForQuery messages: the
startup packet, every Sync, simple Query and FunctionCall get one.

The proxy must connect with sslmode=disable and gssencmode=disable (url()
adds them), so the first message is the plain startup packet.
"""
import select
import socket
import struct
import threading
import time

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104
# Client messages the server answers with one ReadyForQuery each.
READY_AFTER = (b"S", b"Q", b"F")
POLL = 0.01


class _Hold:
    def __init__(self, seconds, then, phase, arm=False):
        self.deadline = None if seconds is None else time.monotonic() + seconds
        self.then, self.phase, self.arm = then, phase, arm
        self.released = False
        self.z_index = None     # ReadyForQuery messages before its answer
        self.buffer = []        # raw messages held
        self.complete = False   # phase "answer": its ReadyForQuery is held

    def due(self):
        if self.phase == "answer" and not self.complete:
            return False
        return self.released or (self.deadline is not None
                                 and time.monotonic() >= self.deadline)


class _Conn:
    def __init__(self, client, server):
        self.client, self.server = client, server
        self.lock = threading.Lock()
        self.closed = False
        self.expected_z = 0     # ReadyForQuery the server owes for what it got
        self.raw_bytes = 0      # one-byte answers owed (SSL/GSS requests)
        self.answer_holds = []  # phase "answer" holds, in stream order
        self.stmt_hold = None


class PgRelay:
    def __init__(self, pg_port):
        self.pg_port = pg_port
        self.lock = threading.Lock()
        self.armed = None
        self.tripped = 0
        self.held = 0
        self.cuts = 0
        self._specs = []        # [statement bytes, seconds, then, phase, shots]
        self._active = []       # holds started and not yet ended
        self._conns = set()
        self.all_holds = 0
        self._flowing = threading.Event()   # cleared by hold_all
        self._flowing.set()
        self._all_timer = None
        self._all_then = None
        self._stopping = threading.Event()
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self._acceptor = threading.Thread(target=self._accept_loop, daemon=True)
        self._acceptor.start()

    def url(self, dbname):
        return ("postgresql://postgres@127.0.0.1:%d/%s?sslmode=disable&gssencmode=disable"
                % (self.port, dbname))

    def arm(self, statement):
        with self.lock:
            self.armed = statement.encode()

    def hold(self, statement, seconds=None, then="deliver", phase="answer", shots=1):
        assert then in ("deliver", "cut"), then
        assert phase in ("answer", "statement"), phase
        assert shots is None or shots > 0, shots
        with self.lock:
            self._specs.append([statement.encode(), seconds, then, phase, shots])

    def release(self):
        with self.lock:
            for h in self._active:
                h.released = True
        self._end_all()

    def hold_all(self, seconds, then="deliver"):
        assert then in ("deliver", "cut"), then
        with self.lock:
            assert self._all_timer is None, "hold_all is already in place"
            self.all_holds += 1
            self._all_then = then
            self._flowing.clear()
            self._all_timer = threading.Timer(seconds, self._end_all)
            self._all_timer.daemon = True
            self._all_timer.start()

    def _end_all(self):
        with self.lock:
            timer, self._all_timer = self._all_timer, None
            then = self._all_then
        if timer is None:
            return
        timer.cancel()
        if then == "cut":
            self.terminate_all()   # before anything held can pass
        self._flowing.set()

    def clear(self):
        with self.lock:
            self._specs = []

    def terminate_all(self):
        with self.lock:
            conns = list(self._conns)
        for c in conns:
            self._close(c)

    def stop(self):
        self._stopping.set()
        self.release()
        try:
            self.sock.close()
        except OSError:
            pass
        self._acceptor.join(5)

    def _accept_loop(self):
        while not self._stopping.is_set():
            try:
                r, _, _ = select.select([self.sock], [], [], 0.1)
                if not r:
                    continue
                client, _ = self.sock.accept()
                server = socket.create_connection(("127.0.0.1", self.pg_port), timeout=10)
                server.settimeout(None)
            except OSError:
                if self._stopping.is_set():
                    return
                continue
            conn = _Conn(client, server)
            with self.lock:
                self._conns.add(conn)
            threading.Thread(target=self._up, args=(conn,), daemon=True).start()
            threading.Thread(target=self._down, args=(conn,), daemon=True).start()

    def _close(self, conn):
        with conn.lock:
            if conn.closed:
                return
            conn.closed = True
        for s in (conn.client, conn.server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass
        with self.lock:
            self._conns.discard(conn)
            for h in conn.answer_holds + [conn.stmt_hold]:
                if h in self._active:
                    self._active.remove(h)

    def _start_hold(self, name):
        """The hold a Bind of statement `name` starts, or None."""
        with self.lock:
            if self.armed is not None and name == self.armed:
                self.armed = None
                h = _Hold(0, "cut", "answer", arm=True)
                self._active.append(h)
                return h
            for spec in self._specs:
                if spec[0] != name:
                    continue
                if spec[4] is not None:
                    spec[4] -= 1
                    if spec[4] == 0:
                        self._specs.remove(spec)
                h = _Hold(spec[1], spec[2], spec[3])
                self.held += 1
                self._active.append(h)
                return h
        return None

    def _end_hold(self, conn, h):
        """Ends a due hold: False when it cut the connection."""
        with self.lock:
            if h in self._active:
                self._active.remove(h)
            if h.then == "cut":
                if h.arm:
                    self.tripped += 1
                else:
                    self.cuts += 1
        if h.then == "cut":
            self._close(conn)
            return False
        return True

    @staticmethod
    def _recv(sock, waiting):
        """One recv; b"" at the end. With a hold waiting, returns None after
        a short slice without data so the caller can look at the hold."""
        if waiting:
            try:
                r, _, _ = select.select([sock], [], [], POLL)
            except ValueError:   # closed meanwhile (a cut, or stop())
                return b""
            if not r:
                return None
        return sock.recv(65536)

    def _up(self, conn):
        """Client to server: spot the Binds that start holds."""
        buf = b""
        startup = True
        try:
            while True:
                self._flowing.wait()
                h = conn.stmt_hold
                if h is not None and h.due():
                    conn.stmt_hold = None
                    if not self._end_hold(conn, h):
                        return
                    conn.server.sendall(b"".join(h.buffer))
                    buf, startup = self._pass_up(conn, buf, startup)
                    continue
                data = self._recv(conn.client, h is not None)
                if data is None:
                    continue
                if not data:
                    break
                self._flowing.wait()
                buf += data
                if conn.stmt_hold is None:
                    buf, startup = self._pass_up(conn, buf, startup)
        except OSError:
            pass
        self._close(conn)

    def _pass_up(self, conn, buf, startup):
        """Passes every whole message in buf on to the server, stopping at a
        Bind that starts a statement hold; returns what is left unread."""
        out = []
        while True:
            if startup:
                if len(buf) < 8:
                    break
                n, code = struct.unpack("!II", buf[:8])
                if len(buf) < n:
                    break
                out.append(buf[:n])
                buf = buf[n:]
                if code in (SSL_REQUEST, GSSENC_REQUEST):
                    conn.raw_bytes += 1
                else:
                    startup = False
                    conn.expected_z += 1
                continue
            if len(buf) < 5:
                break
            kind = buf[:1]
            n = struct.unpack("!I", buf[1:5])[0]
            if len(buf) < 1 + n:
                break
            msg, buf = buf[:1 + n], buf[1 + n:]
            h = None
            if kind == b"B":
                payload = msg[5:]
                portal_end = payload.index(b"\0")
                h = self._start_hold(payload[portal_end + 1:
                                             payload.index(b"\0", portal_end + 1)])
            if h is not None and h.phase == "statement":
                # Everything from the Bind on waits with the hold, in order;
                # what follows it is read once the hold has ended.
                conn.server.sendall(b"".join(out))
                h.buffer.append(msg)
                conn.stmt_hold = h
                return buf, startup
            if h is not None:
                h.z_index = conn.expected_z
                with conn.lock:
                    conn.answer_holds.append(h)
            if kind in READY_AFTER:
                conn.expected_z += 1
            out.append(msg)
        conn.server.sendall(b"".join(out))
        return buf, startup

    def _down(self, conn):
        """Server to client: pass through, or hold a statement's answer."""
        buf = b""
        zcount = 0
        try:
            while True:
                self._flowing.wait()
                with conn.lock:
                    h = conn.answer_holds[0] if conn.answer_holds else None
                if h is not None and h.due():
                    with conn.lock:
                        conn.answer_holds.pop(0)
                    if not self._end_hold(conn, h):
                        return
                    conn.client.sendall(b"".join(h.buffer))
                    buf, zcount = self._pass_down(conn, buf, zcount)
                    continue
                data = self._recv(conn.server, h is not None)
                if data is None:
                    continue
                if not data:
                    break
                self._flowing.wait()
                buf, zcount = self._pass_down(conn, buf + data, zcount)
        except OSError:
            pass
        self._close(conn)

    def _pass_down(self, conn, buf, zcount):
        """Passes whole messages in buf on to the client until the first
        message of a held answer; stops after the held ReadyForQuery."""
        out = []
        while buf and conn.raw_bytes > 0:
            out.append(buf[:1])
            buf = buf[1:]
            conn.raw_bytes -= 1
        while len(buf) >= 5:
            n = struct.unpack("!I", buf[1:5])[0]
            if len(buf) < 1 + n:
                break
            with conn.lock:
                h = conn.answer_holds[0] if conn.answer_holds else None
            if h is not None and h.z_index > zcount:
                h = None
            if h is not None and h.complete:
                break       # what comes after a held answer waits behind it
            msg, buf = buf[:1 + n], buf[1 + n:]
            if msg[:1] == b"Z":
                zcount += 1
            if h is None:
                out.append(msg)
                continue
            h.buffer.append(msg)
            if msg[:1] == b"Z":
                h.complete = True
        conn.client.sendall(b"".join(out))
        return buf, zcount
