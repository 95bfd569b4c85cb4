"""Fixtures for the black-box integration tests.

One PostgreSQL cluster per pytest session (initdb in a temp dir, as the
postgres user when running as root, since PostgreSQL refuses root); one
database per test; one stub upstream process per test; and a factory that
writes a conf file, migrates, starts build/idemproxy and stops it with
SIGTERM at teardown, failing the test if the proxy crashed or did not exit 0.
"""
import atexit
import ctypes
import glob
import itertools
import os
import pwd
import selectors
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest
import requests
from psycopg.rows import dict_row

from helpers import TIMEOUT, Stub, free_port, render_conf

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
BINARY = os.environ.get("IDEMPROXY_BIN", os.path.join(ROOT, "build", "idemproxy"))
STUB = os.path.join(HERE, "stub_upstream.py")
ADMIN_TOKEN = "test-admin-token"


def _die_with_parent():
    """preexec_fn: the child gets SIGTERM when pytest dies, so an aborted
    session leaves no proxy or stub holding ports."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    setattr(item, "rep_" + rep.when, rep)


# --- PostgreSQL --------------------------------------------------------------

def pg_bindir():
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if out and os.path.exists(os.path.join(out, "initdb")):
            return out
    except (OSError, subprocess.SubprocessError):
        pass
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"),
                   key=lambda p: int(p.split("/")[4]) if p.split("/")[4].isdigit() else 0)
    if not found:
        raise RuntimeError("no PostgreSQL server binaries (initdb) found")
    return os.path.dirname(found[-1])


class PgCluster:
    def __init__(self):
        self.bindir = pg_bindir()
        self.tmp = tempfile.mkdtemp(prefix="idemproxy-it-pg-")
        self.data = os.path.join(self.tmp, "data")
        self.logfile = os.path.join(self.tmp, "postgres.log")
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0
        self.started = False
        # test databases are dropped in the background, off the tests' path
        self.dropper = ThreadPoolExecutor(1)
        if self.as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(self.tmp, pw.pw_uid, pw.pw_gid)

    def _run(self, args, timeout=120):
        cmd = list(args)
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                           cwd=self.tmp)
        if r.returncode != 0:
            raise RuntimeError("%s failed (%d):\n%s%s%s" % (
                " ".join(cmd), r.returncode, r.stdout, r.stderr, self.log_tail()))
        return r

    def log_tail(self):
        try:
            with open(self.logfile, errors="replace") as f:
                return "\n--- postgres.log ---\n" + f.read()[-4000:]
        except OSError:
            return ""

    def start(self):
        self._run([os.path.join(self.bindir, "initdb"), "-D", self.data, "-A", "trust",
                   "-U", "postgres", "-E", "UTF8", "--no-locale", "--no-sync"])
        opts = ("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off "
                "-c max_connections=300" % (self.port, self.tmp))
        self._run([os.path.join(self.bindir, "pg_ctl"), "-D", self.data, "-l", self.logfile,
                   "-w", "-t", "60", "-o", opts, "start"])
        self.started = True

    def stop(self):
        if self.started:
            self.started = False
            try:
                self._run([os.path.join(self.bindir, "pg_ctl"), "-D", self.data,
                           "-m", "immediate", "-w", "stop"], timeout=60)
            except (RuntimeError, subprocess.SubprocessError):
                pass
        shutil.rmtree(self.tmp, ignore_errors=True)

    def conninfo(self, dbname):
        return "postgresql://postgres@127.0.0.1:%d/%s" % (self.port, dbname)

    def admin(self):
        return psycopg.connect(self.conninfo("postgres"), autocommit=True)

    def create_database(self, name):
        with self.admin() as c:
            c.execute("CREATE DATABASE %s" % name)

    def drop_database(self, name):
        with self.admin() as c:
            c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)


# `make test-citus`: every test's database is on a Citus cluster (a
# coordinator and two workers, citus_cluster.py) and its proxies run with
# database.distributed = "citus".
CITUS = os.environ.get("IDEMPROXY_TEST_CITUS") == "1"
# Its own tests need that cluster: collected only then.
collect_ignore = [] if CITUS else ["test_citus.py"]


def new_cluster():
    if CITUS:
        from citus_cluster import CitusCluster
        return CitusCluster()
    return PgCluster()


@pytest.fixture(scope="session")
def pg_cluster():
    cluster = new_cluster()
    atexit.register(cluster.stop)  # also on an interrupted session
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.dropper.shutdown(wait=True)
        cluster.stop()


class PgDb:
    """The test's own database: .url for the proxy, helpers for SQL."""

    def __init__(self, cluster, name):
        self.cluster = cluster
        self.name = name
        self.url = cluster.conninfo(name)
        self._conn = None

    def conn(self):
        if self._conn is None or self._conn.closed:
            self._conn = psycopg.connect(self.url, autocommit=True, row_factory=dict_row)
        return self._conn

    def query(self, sql, params=None):
        return self.conn().execute(sql, params).fetchall()

    def execute(self, sql, params=None):
        """Runs a statement, returns the number of rows it affected."""
        return self.conn().execute(sql, params).rowcount

    def records(self, key=None):
        if key is None:
            return self.query("SELECT * FROM idempotency_records ORDER BY created_at, idem_key")
        return self.query("SELECT * FROM idempotency_records WHERE idem_key = %s "
                          "ORDER BY created_at, tenant, operation", (key,))

    def record(self, key):
        rows = self.records(key)
        assert len(rows) <= 1, "more than one record for key %r: %r" % (key, rows)
        return rows[0] if rows else None

    def close(self):
        if self._conn is not None:
            self._conn.close()
            self._conn = None


_db_seq = itertools.count(1)


@pytest.fixture
def pg(pg_cluster):
    name = "t_%d" % next(_db_seq)
    pg_cluster.create_database(name)
    db = PgDb(pg_cluster, name)
    yield db
    db.close()
    pg_cluster.dropper.submit(pg_cluster.drop_database, name)


# --- the stub upstream -------------------------------------------------------

def start_stub(tmp_path, extra_args=()):
    """Starts a stub process; its port is read when first needed."""
    err = open(os.path.join(str(tmp_path), "stub-%d.err" % time.monotonic_ns()), "wb")
    proc = subprocess.Popen([sys.executable, STUB, "--port", "0"] + list(extra_args),
                            stdout=subprocess.PIPE, stderr=err, preexec_fn=_die_with_parent)
    err.close()

    def read_port():
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        line = b""
        if sel.select(timeout=15):
            line = proc.stdout.readline()
        sel.close()
        if not line.strip().isdigit():
            proc.kill()
            proc.wait(5)
            raise RuntimeError("stub upstream did not start (printed %r)" % line)
        return int(line)

    return Stub(read_port, proc)


def stop_stub(s):
    if s.proc.poll() is None:
        s.proc.terminate()
        try:
            s.proc.wait(5)
        except subprocess.TimeoutExpired:
            s.proc.kill()
            s.proc.wait(5)
    s.proc.stdout.close()


@pytest.fixture
def stub(tmp_path):
    s = start_stub(tmp_path)
    yield s
    stop_stub(s)


# --- the proxy ---------------------------------------------------------------

def default_routes(upstream):
    return [
        {"name": "create_payment", "path": "/v1/payments", "upstream": upstream},
        {"name": "capture", "path": "/v1/payments/{id}/capture", "upstream": upstream},
        {"name": "refund", "path": "/v1/refunds", "upstream": upstream},
        {"name": "optional", "path": "/v1/optional", "upstream": upstream, "key": "optional"},
        {"name": "hooks", "path": "/hooks/*", "upstream": upstream,
         "tenant": "header:X-Tenant-Id"},
        {"name": "auth", "path": "/v1/auth/*", "upstream": upstream,
         "tenant": "authorization"},
    ]


class Proxy:
    def __init__(self, conf_path, log_path, port, admin_port, env, binary=None):
        self.binary = binary or BINARY
        self.conf_path = conf_path
        self.log_path = log_path
        self.port = port
        self.admin_port = admin_port
        self.url = "http://127.0.0.1:%d" % port
        self.admin_url = "http://127.0.0.1:%d" % admin_port if admin_port else None
        self.env = env
        self.proc = None
        self.acknowledged_exit = False

    def log(self):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()
        except OSError:
            return ""

    def request(self, method, path, key=None, headers=None, **kw):
        h = dict(headers or {})
        if key is not None:
            h["Idempotency-Key"] = key
        kw.setdefault("timeout", TIMEOUT)
        return requests.request(method, self.url + path, headers=h, **kw)

    def post(self, path, key=None, **kw):
        return self.request("POST", path, key=key, **kw)

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def start(self, wait_ready=True):
        logf = open(self.log_path, "ab")
        self.proc = subprocess.Popen([self.binary, "-c", self.conf_path], stdin=subprocess.DEVNULL,
                                     stdout=logf, stderr=logf, env=self.env,
                                     preexec_fn=_die_with_parent)
        logf.close()
        if wait_ready:
            self.wait_ready()
        return self

    def wait_ready(self, timeout=20.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError("idemproxy exited with %d before it was ready:\n%s"
                                     % (self.proc.returncode, self.log()[-4000:]))
            if self._ready():
                return
            time.sleep(0.02)
        raise AssertionError("idemproxy was not ready within %.0fs:\n%s"
                             % (timeout, self.log()[-4000:]))

    def _ready(self):
        try:
            socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
        except OSError:
            return False
        if not self.admin_url:
            return True
        try:
            return requests.get(self.admin_url + "/healthz", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def wait_exit(self, timeout=20.0):
        """For tests that expect the process to end by itself."""
        rc = self.proc.wait(timeout)
        self.acknowledged_exit = True
        return rc

    def stop(self, timeout=30.0):
        """SIGTERM, then wait; returns the exit code (the caller judges it)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            self.acknowledged_exit = True
            raise AssertionError("idemproxy did not exit within %.0fs of SIGTERM:\n%s"
                                 % (timeout, self.log()[-4000:]))
        self.acknowledged_exit = True
        return rc

    def teardown_problem(self):
        """Stops the proxy; returns a description of what went wrong, if
        anything (a crash, a non-zero exit, a hang on SIGTERM)."""
        if self.proc is None or self.acknowledged_exit:
            return None
        if self.proc.poll() is not None:
            rc = self.proc.returncode
            return "idemproxy died during the test (exit %s%s)" % (
                rc, " = signal %s" % signal.Signals(-rc).name if rc < 0 else "")
        try:
            rc = self.stop()
        except AssertionError as e:
            return str(e)
        if rc != 0:
            return "idemproxy exited %s%s after SIGTERM (expected 0)" % (
                rc, " = signal %s" % signal.Signals(-rc).name if rc < 0 else "")
        return None


def run_binary(args, env=None, timeout=60):
    return subprocess.run([BINARY] + list(args), capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


@pytest.fixture(scope="session")
def binary():
    assert os.access(BINARY, os.X_OK), \
        "%s is missing: run `make` first" % BINARY
    return BINARY


@pytest.fixture
def make_proxy(request, binary, stub, pg, tmp_path):  # stub first: it starts while pg sets up
    """make_proxy(routes=None, route_overrides=None, defaults=None, top=None,
    migrate=True, start=True, wait_ready=True, env=None, binary=None) -> Proxy.

    routes replaces the default route list ("{stub}" in an upstream is the
    stub's URL); route_overrides maps a route name to settings merged into
    it; defaults becomes the defaults group; top overrides top-level
    settings (None deletes one); binary runs another build of the proxy."""
    proxies = []
    seq = itertools.count(1)

    def factory(routes=None, route_overrides=None, defaults=None, top=None,
                migrate=True, start=True, wait_ready=True, env=None, binary=None):
        n = next(seq)
        port = free_port()
        admin_port = free_port()
        if routes is None:
            routes = default_routes(stub.url)
        routes = [dict(r, upstream=r.get("upstream", stub.url).replace("{stub}", stub.url))
                  for r in routes]
        for name, over in (route_overrides or {}).items():
            matched = [r for r in routes if r["name"] == name]
            assert matched, "no route %r to override" % name
            for r in matched:
                r.update(over)
                for k in [k for k, v in r.items() if v is None]:
                    del r[k]
        settings = {
            "listen": "127.0.0.1:%d" % port,
            "admin_listen": "127.0.0.1:%d" % admin_port,
            "admin_token": ADMIN_TOKEN,
            "workers": 4,
            "shutdown_grace": "3s",
            "log_level": "info",
            # Tests read request lines right after the request: each line
            # is written at once. test_access_log.py covers the buffered
            # default (100ms) and sets the interval itself.
            "log_flush_interval": "0s",
            "database": {"url": pg.url},
            "reaper": {"interval": "10m"},
        }
        if request.node.get_closest_marker("no_replay_cache"):
            # Tests that rewrite records behind the proxy's back (a completed
            # record made processing again, expiry moved into the past)
            # break the immutability the replay cache relies on; tests of
            # the store path want every replay to reach the store. Both run
            # without the cache; test_replay_cache.py covers it.
            settings["replay_cache_size"] = 0
        if os.environ.get("IDEMPROXY_TEST_BUSY_POLL"):
            # `make check-busy-poll`: the same tests with the waits polled
            # (busy.h) instead of slept; a test's own top settings win.
            settings["busy_poll"] = os.environ["IDEMPROXY_TEST_BUSY_POLL"]
        if defaults:
            settings["defaults"] = defaults
        settings["routes"] = routes
        for k, v in (top or {}).items():
            settings[k] = v
        if CITUS and isinstance(settings.get("database"), dict):
            settings["database"] = dict(settings["database"])
            settings["database"].setdefault("distributed", "citus")
        if not settings.get("admin_listen"):
            admin_port = None
        conf_path = os.path.join(str(tmp_path), "idemproxy-%d.conf" % n)
        with open(conf_path, "w") as f:
            f.write(render_conf(settings))
        run_env = dict(os.environ)
        run_env.pop("IDEMPROXY_DATABASE_URL", None)
        run_env.pop("IDEMPROXY_LISTEN", None)
        # A test runner started by systemd must not have its proxies talk
        # to that systemd (test_sd_notify.py gives them a socket of its own).
        for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID"):
            run_env.pop(name, None)
        run_env.update(env or {})
        p = Proxy(conf_path, os.path.join(str(tmp_path), "idemproxy-%d.log" % n), port,
                  admin_port, run_env, binary)
        if migrate:
            r = run_binary(["-c", conf_path, "--migrate"], env=run_env)
            assert r.returncode == 0, "--migrate failed (%d):\n%s%s" % (
                r.returncode, r.stdout, r.stderr)
        if start:
            proxies.append(p)
            p.start(wait_ready=wait_ready)
        return p

    yield factory
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed:
        for p in proxies:  # shown under "Captured stdout teardown"
            print("--- %s (tail) ---\n%s" % (p.log_path, p.log()[-6000:]))
    problems = []
    for p in proxies:
        why = p.teardown_problem()
        if why:
            problems.append("%s\n--- %s (tail) ---\n%s" % (why, p.log_path, p.log()[-4000:]))
    if problems:
        pytest.fail("\n\n".join(problems), pytrace=False)


@pytest.fixture
def proxy(make_proxy):
    """A proxy with the default routes and settings."""
    return make_proxy()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "no_replay_cache: the test's proxies run with "
        "replay_cache_size = 0")
