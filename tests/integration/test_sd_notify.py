"""What systemd is told (sd_notify(3), conf/idemproxy.service's Type=notify
and WatchdogSec=), without a running systemd: each test binds the socket
systemd would (an AF_UNIX datagram socket, by path or in the abstract
namespace, "@name") and hands it to the proxy as NOTIFY_SOCKET, with
WATCHDOG_USEC (and WATCHDOG_PID) as systemd sets them.

READY=1 comes once a request can be served; RELOADING=1 (with
MONOTONIC_USEC) and READY=1 frame a SIGHUP; STOPPING=1 comes when the drain
begins; STATUS= says what the process is doing; WATCHDOG=1 comes every half
of WATCHDOG_USEC while the serving loop is alive, and stops while it is
frozen (freeze.py), so systemd would restart the process."""
import os
import re
import signal
import socket
import threading
import time

import pytest

from freeze import freeze_thread
from helpers import new_key, wait_until
from test_container import unit_settings
from test_signals import send_in_threads

PAY = "/v1/payments"
STATUS = re.compile(r"^(starting|ready|reloading|stopping) requests=(\d+) in_flight=(\d+) "
                    r"store=(up|down)( loop=(ok|stalled))?( reload=failed)?$")
WATCHDOG_USEC = 1000000  # a keep-alive every 0.5 s


class NotifySocket:
    """The socket systemd listens on; every datagram, parsed into its
    KEY=VALUE lines, in the order received."""

    def __init__(self, tmp_path, abstract=False):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = "idemproxy-test-notify-%d-%d" % (os.getpid(), time.monotonic_ns())
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            self.address = str(tmp_path / "notify.sock")
            self.sock.bind(self.address)
        self.lock = threading.Lock()
        self.messages = []
        self.done = False
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self):
        self.sock.settimeout(0.1)
        while not self.done:
            try:
                data = self.sock.recv(4096)
            except socket.timeout:
                continue
            except OSError:
                return
            fields = [tuple(line.split("=", 1)) for line in data.decode().split("\n") if line]
            with self.lock:
                self.messages.append((time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000,
                                      fields))

    def close(self):
        self.done = True
        self.thread.join(5)
        self.sock.close()

    def env(self, **extra):
        e = {"NOTIFY_SOCKET": self.address}
        e.update({k: str(v) for k, v in extra.items()})
        return e

    def all(self):
        with self.lock:
            return list(self.messages)

    def fields(self, since=0):
        """Every KEY=VALUE received from message number since on, flat."""
        return [f for _, m in self.all()[since:] for f in m]

    def count(self):
        with self.lock:
            return len(self.messages)

    def wait_for(self, key, value=None, since=0, what=None, timeout=10.0):
        """The index of the first message from since on with key (and value,
        a string or a compiled pattern it must match)."""
        def found():
            for i, (_, m) in enumerate(self.all()[since:]):
                for k, v in m:
                    if k == key and (value is None or
                                     (value.match(v) if hasattr(value, "match") else v == value)):
                        return (since + i,)
            return None
        return wait_until(found, timeout=timeout,
                          what=what or "%s=%s on NOTIFY_SOCKET" % (key, value or "*"))[0]

    def statuses(self, since=0):
        return [v for k, v in self.fields(since) if k == "STATUS"]


@pytest.fixture
def notify(tmp_path):
    n = NotifySocket(tmp_path)
    yield n
    n.close()


def watchdog_pid_wrapper(tmp_path, binary):
    """A script that sets WATCHDOG_PID to its own pid and execs the proxy:
    systemd's WATCHDOG_PID names the main process, which is the proxy."""
    path = tmp_path / "with-watchdog-pid.sh"
    path.write_text('#!/bin/sh\nWATCHDOG_PID=$$; export WATCHDOG_PID\nexec %s "$@"\n' % binary)
    path.chmod(0o755)
    return str(path)


def assert_statuses_parse(notify):
    st = notify.statuses()
    assert st, notify.all()
    bad = [s for s in st if not STATUS.match(s)]
    assert not bad, bad
    return st


@pytest.mark.parametrize("abstract", [False, True], ids=["path", "abstract"])
def test_ready_comes_when_a_request_can_be_served(make_proxy, stub, tmp_path, abstract):
    n = NotifySocket(tmp_path, abstract=abstract)
    try:
        proxy = make_proxy(env=n.env(), wait_ready=False)
        ready = n.wait_for("READY", "1")
        assert [k for k, _ in n.fields() if k == "READY"] == ["READY"]
        # At once, without waiting for the port the way the fixture does.
        key = new_key("ready")
        r = proxy.post(PAY, key=key, json={"amount": 1, "currency": "EUR"})
        assert r.status_code == 201, r.text
        assert stub.count(key=key) == 1
        n.wait_for("STATUS", re.compile(r"ready requests=[1-9]"), since=ready)
        assert_statuses_parse(n)
        assert "notifying systemd" in proxy.log()
    finally:
        n.close()


def test_no_ready_while_the_store_does_not_answer(make_proxy, notify):
    """The store must answer at start (the schema check): a proxy that
    cannot reach it exits 1 without READY=1, and Restart=on-failure tries
    again."""
    proxy = make_proxy(env=notify.env(), migrate=False, start=False,
                       top={"database": {"url": "postgresql://nobody@127.0.0.1:1/nothing"}})
    proxy.start(wait_ready=False)
    assert proxy.wait_exit() == 1
    assert "cannot reach the database" in proxy.log()
    assert [f for f in notify.fields() if f[0] == "READY"] == []


def test_reload_is_framed_by_reloading_and_ready(make_proxy, notify):
    proxy = make_proxy(env=notify.env(), wait_ready=False)
    first = notify.wait_for("READY", "1")
    before = time.clock_gettime_ns(time.CLOCK_MONOTONIC) // 1000
    proxy.proc.send_signal(signal.SIGHUP)
    i = notify.wait_for("RELOADING", "1", since=first + 1)
    got_at, fields = notify.all()[i]
    usec = dict(fields).get("MONOTONIC_USEC")
    assert usec is not None, fields
    # CLOCK_MONOTONIC at the reload: after the signal, before it arrived.
    assert before <= int(usec) <= got_at, (before, usec, got_at)
    j = notify.wait_for("READY", "1", since=i + 1)
    wait_until(lambda: "configuration reloaded" in proxy.log(), what="the reload's log line")
    # A conf that does not load: the old one stays, READY=1 still comes,
    # and the STATUS= line says the reload failed.
    with open(proxy.conf_path, "a") as f:
        f.write("\nworkers == 4;\n")
    proxy.proc.send_signal(signal.SIGHUP)
    k = notify.wait_for("RELOADING", "1", since=j + 1)
    notify.wait_for("READY", "1", since=k + 1)
    notify.wait_for("STATUS", re.compile(r"ready .* reload=failed$"), since=k + 1)
    assert_statuses_parse(notify)


def test_stopping_comes_when_the_drain_begins(make_proxy, stub, notify):
    proxy = make_proxy(env=notify.env(), top={"shutdown_grace": "30s"}, wait_ready=False)
    notify.wait_for("READY", "1")
    key = new_key("drain")
    stub.configure({"prefix": PAY, "key": key, "gate": "drain"})
    threads, out = send_in_threads(proxy, [key])
    try:
        stub.wait_for(key=key)
        proxy.proc.send_signal(signal.SIGTERM)
        i = notify.wait_for("STOPPING", "1")
        # The request is still upstream: this is the start of the drain.
        notify.wait_for("STATUS", re.compile(r"stopping .*in_flight=1"), since=i)
        assert proxy.proc.poll() is None and not out
    finally:
        stub.release("drain")
        for t in threads:
            t.join(30)
    assert proxy.wait_exit() == 0
    assert out[key].status_code == 201
    assert stub.count(key=key) == 1
    assert_statuses_parse(notify)


def test_watchdog_keepalives_stop_while_the_serving_loop_is_frozen(make_proxy, binary, stub,
                                                                  notify, tmp_path):
    proxy = make_proxy(env=notify.env(WATCHDOG_USEC=WATCHDOG_USEC), wait_ready=False,
                       binary=watchdog_pid_wrapper(tmp_path, binary))
    ready = notify.wait_for("READY", "1")
    # Two keep-alives: they keep coming while the loop runs.
    i = notify.wait_for("WATCHDOG", "1", since=ready)
    notify.wait_for("WATCHDOG", "1", since=i + 1)
    assert "watchdog_keepalive_ms=500" in proxy.log()
    with freeze_thread(proxy.proc.pid, "ip-serve"):
        frozen = notify.count()
        stalled = notify.wait_for("STATUS", re.compile(r".* loop=stalled"), since=frozen,
                                  what="the notifier to see the frozen loop")
        # Two keep-alive periods of a frozen loop: none comes.
        time.sleep(2 * WATCHDOG_USEC / 2 / 1e6)
        assert [f for f in notify.fields(stalled) if f[0] == "WATCHDOG"] == []
        assert proxy.proc.poll() is None
    back = notify.wait_for("WATCHDOG", "1", since=stalled, what="keep-alives after the thaw")
    notify.wait_for("STATUS", re.compile(r".* loop=ok"), since=back)
    key = new_key("after")
    assert proxy.post(PAY, key=key, json={"amount": 1, "currency": "EUR"}).status_code == 201
    assert stub.count(key=key) == 1
    assert "withholding the systemd watchdog keep-alive" in proxy.log()
    assert_statuses_parse(notify)


def test_no_watchdog_for_another_process(make_proxy, notify):
    """WATCHDOG_PID names another process: the keep-alives are not ours to
    send (sd_watchdog_enabled)."""
    proxy = make_proxy(env=notify.env(WATCHDOG_USEC=WATCHDOG_USEC, WATCHDOG_PID=1),
                       wait_ready=False)
    ready = notify.wait_for("READY", "1")
    notify.wait_for("STATUS", re.compile("ready "), since=ready)
    assert "watchdog_keepalive_ms=0" in proxy.log()
    assert proxy.stop() == 0
    notify.wait_for("STOPPING", "1", since=ready)
    assert [f for f in notify.fields() if f[0] == "WATCHDOG"] == []
    # Without a watchdog the STATUS= line has no loop= field.
    assert all(" loop=" not in s for s in assert_statuses_parse(notify))


def test_without_notify_socket_nothing_is_sent(make_proxy, stub, notify):
    # (make_proxy never passes on a NOTIFY_SOCKET of the test's own.)
    proxy = make_proxy(env={"WATCHDOG_USEC": str(WATCHDOG_USEC)})
    assert "NOTIFY_SOCKET" not in proxy.env
    key = new_key("plain")
    assert proxy.post(PAY, key=key, json={"amount": 1, "currency": "EUR"}).status_code == 201
    proxy.proc.send_signal(signal.SIGHUP)
    wait_until(lambda: "configuration reloaded" in proxy.log(), what="the reload")
    assert proxy.stop() == 0
    assert notify.all() == []
    assert "systemd" not in proxy.log()


def test_a_notify_socket_nobody_reads_is_logged_once_and_serving_goes_on(make_proxy, stub,
                                                                       tmp_path):
    gone = str(tmp_path / "nobody.sock")
    proxy = make_proxy(env={"NOTIFY_SOCKET": gone})
    key = new_key("gone")
    assert proxy.post(PAY, key=key, json={"amount": 1, "currency": "EUR"}).status_code == 201
    assert stub.count(key=key) == 1
    assert proxy.stop() == 0
    assert proxy.log().count("cannot notify systemd") == 1, proxy.log()[-3000:]


def test_the_unit_is_type_notify_with_a_watchdog():
    """conf/idemproxy.service asks for what this file tests; its sandboxing
    and systemd-analyze's checks are test_container.py's."""
    s = unit_settings()
    assert s[("Service", "Type")] == ["notify"]
    assert s[("Service", "NotifyAccess")] == ["main"]
    wd = s[("Service", "WatchdogSec")]
    assert len(wd) == 1 and re.fullmatch(r"[1-9]\d*s", wd[0]), wd
    # A watchdog kill must restart the service.
    assert s[("Service", "Restart")] == ["on-failure"]
