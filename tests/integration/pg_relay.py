"""A TCP relay between the proxy and PostgreSQL that can lose one answer.

PgRelay(pg_port) listens on 127.0.0.1 and passes the PostgreSQL protocol
through unchanged. After arm(statement), the next execution of the prepared
statement of that name (a Bind message naming it) is carried to the server
and runs there to its end, but its answer is swallowed up to and including
ReadyForQuery — so the statement has committed — and then both sides of the
connection are closed: the client sees "server closed the connection
unexpectedly" for a statement that did take effect. One shot; .tripped
counts the answers lost.

The proxy must connect with sslmode=disable and gssencmode=disable (url()
adds them), so the first message is the plain startup packet.
"""
import select
import socket
import struct
import threading

SSL_REQUEST = 80877103
GSSENC_REQUEST = 80877104


class PgRelay:
    def __init__(self, pg_port):
        self.pg_port = pg_port
        self.lock = threading.Lock()
        self.armed = None
        self.tripped = 0
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

    def stop(self):
        self._stopping.set()
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
            state = {"trap": False, "closed": False}
            threading.Thread(target=self._up, args=(client, server, state),
                             daemon=True).start()
            threading.Thread(target=self._down, args=(client, server, state),
                             daemon=True).start()

    def _close(self, client, server, state):
        state["closed"] = True
        for s in (client, server):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            try:
                s.close()
            except OSError:
                pass

    def _up(self, client, server, state):
        """Client to server: parse messages to spot the armed Bind."""
        buf = b""
        startup = True
        try:
            while True:
                data = client.recv(65536)
                if not data:
                    break
                buf += data
                while True:
                    if startup:
                        if len(buf) < 8:
                            break
                        n, code = struct.unpack("!II", buf[:8])
                        if len(buf) < n:
                            break
                        buf = buf[n:]
                        if code not in (SSL_REQUEST, GSSENC_REQUEST):
                            startup = False
                        continue
                    if len(buf) < 5:
                        break
                    kind = buf[:1]
                    n = struct.unpack("!I", buf[1:5])[0]
                    if len(buf) < 1 + n:
                        break
                    payload, buf = buf[5:1 + n], buf[1 + n:]
                    if kind == b"B":
                        portal_end = payload.index(b"\0")
                        name = payload[portal_end + 1:payload.index(b"\0", portal_end + 1)]
                        with self.lock:
                            if self.armed is not None and name == self.armed:
                                self.armed = None
                                state["trap"] = True
                server.sendall(data)
        except OSError:
            pass
        if not state["closed"]:
            self._close(client, server, state)

    def _down(self, client, server, state):
        """Server to client: pass through, or swallow the trapped answer."""
        buf = b""
        try:
            while True:
                data = server.recv(65536)
                if not data:
                    break
                if not state["trap"]:
                    client.sendall(data)
                    continue
                # The answer to the trapped statement (and anything after
                # it) is never delivered; close once ReadyForQuery went by.
                buf += data
                done = False
                while len(buf) >= 5:
                    n = struct.unpack("!I", buf[1:5])[0]
                    if len(buf) < 1 + n:
                        break
                    kind, buf = buf[:1], buf[1 + n:]
                    if kind == b"Z":
                        done = True
                        break
                if done:
                    with self.lock:
                        self.tripped += 1
                    break
        except OSError:
            pass
        if not state["closed"]:
            self._close(client, server, state)
