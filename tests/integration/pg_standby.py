"""A primary and a real streaming standby of their own, for the failover
tests (never the session's shared cluster: these tests kill a primary).

The primary is made as conftest's cluster is (initdb as the postgres user
when running as root, since PostgreSQL refuses root; trust auth; its own
port on 127.0.0.1); the standby is a `pg_basebackup -R` of it whose
primary_conninfo carries an application_name, so that the primary's
synchronous_standby_names can name it. synchronous_commit stays on: with
sync=True a commit returns only once the standby has the WAL, which is the
durability a failover needs; sync=False makes the standby asynchronous.

    pair = StandbyPair(tmpdir, sync=True)
    try:
        pair.start()
        pair.wait_streaming()
        pair.migrate()                # as the fixtures do: idemproxy --migrate
        ... pair.url ...              # libpq multi-host, read-write
        pair.kill_primary()           # SIGKILL of postmaster and backends
        pair.promote()
    finally:
        pair.stop()                   # always, also after a failure
"""
import atexit
import contextlib
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time

import psycopg

from conftest import BINARY, pg_bindir
from helpers import free_port, render_conf

APP_NAME = "idemproxy_standby"


def _reachable_by(path, uid):
    """Whether user uid can walk down to path (every ancestor searchable)."""
    path = os.path.abspath(path)
    while True:
        st = os.stat(path)
        if st.st_uid != uid and not st.st_mode & stat.S_IXOTH:
            return False
        parent = os.path.dirname(path)
        if parent == path:
            return True
        path = parent


class _Node:
    """One server: its data directory, port and log."""

    def __init__(self, pair, name):
        self.pair = pair
        self.name = name
        self.data = os.path.join(pair.dir, name)
        self.logfile = os.path.join(pair.dir, name + ".log")
        self.port = free_port()
        self.running = False
        self.killed_pids = []

    def opts(self):
        return ("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=on -c full_page_writes=off "
                "-c max_connections=200 -c wal_sender_timeout=5s "
                "-c wal_receiver_status_interval=1s" % (self.port, self.pair.dir))

    def pg_ctl(self, *args, timeout=90):
        return self.pair.run("pg_ctl", "-D", self.data, *args, timeout=timeout)

    def start(self):
        self.pg_ctl("-l", self.logfile, "-w", "-t", "60", "-o", self.opts(), "start")
        self.running = True

    def stop(self):
        """A fast shutdown: its walsender or walreceiver goes at once."""
        self.pg_ctl("-m", "fast", "-w", "-t", "60", "stop")
        self.running = False

    def conninfo(self, db="postgres"):
        return "postgresql://postgres@127.0.0.1:%d/%s" % (self.port, db)

    def connect(self, db="postgres"):
        return psycopg.connect(self.conninfo(db), autocommit=True, connect_timeout=5)

    def query(self, sql, params=None, db="postgres"):
        with self.connect(db) as c:
            cur = c.execute(sql, params)
            return cur.fetchall() if cur.description else []

    def postmaster_pid(self):
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                return int(f.readline())
        except (OSError, ValueError):
            return None

    def log_tail(self, n=3000):
        try:
            with open(self.logfile, errors="replace") as f:
                return "\n--- %s ---\n%s" % (self.logfile, f.read()[-n:])
        except OSError:
            return ""


def _children(pid):
    """The pids whose parent is pid (the postmaster's backends)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % entry) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(entry))
    return out


def _alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


class StandbyPair:
    def __init__(self, tmpdir=None, sync=True, db="idem"):
        self.bindir = pg_bindir()
        self.sync = sync
        self.db = db
        self.as_postgres = os.geteuid() == 0
        uid = pwd.getpwnam("postgres").pw_uid if self.as_postgres else os.geteuid()
        # The servers run as postgres: a test's tmp_path under a root-only
        # directory is not theirs to enter, so the data go elsewhere then.
        base = tmpdir if tmpdir and _reachable_by(str(tmpdir), uid) else None
        self.dir = tempfile.mkdtemp(prefix="idemproxy-standby-", dir=base)
        if self.as_postgres:
            os.chown(self.dir, uid, pwd.getpwnam("postgres").pw_gid)
        self.primary = _Node(self, "primary")
        self.standby = _Node(self, "standby")
        self.current = self.primary   # the read-write one
        self._stopped = False
        atexit.register(self.stop)    # also on an interrupted session

    # --- what the tests use -------------------------------------------------

    @property
    def primary_port(self):
        return self.primary.port

    @property
    def standby_port(self):
        return self.standby.port

    def url_for(self, db):
        """libpq's multi-host form: libpq tries both hosts in order and keeps
        the one that accepts writes."""
        return ("postgresql://postgres@127.0.0.1:%d,127.0.0.1:%d/%s"
                "?target_session_attrs=read-write" % (self.primary.port, self.standby.port, db))

    @property
    def url(self):
        return self.url_for(self.db)

    def run(self, prog, *args, timeout=90):
        cmd = [os.path.join(self.bindir, prog)] + list(args)
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.dir)
        if r.returncode != 0:
            raise RuntimeError("%s failed (%d):\n%s%s%s%s" % (
                " ".join(cmd), r.returncode, r.stdout, r.stderr,
                self.primary.log_tail(), self.standby.log_tail()))
        return r

    def start(self):
        """initdb and start the primary, clone the standby from it and start
        it, then name it in synchronous_standby_names (sync=True) and
        create the database."""
        self.run("initdb", "-D", self.primary.data, "-A", "trust", "-U", "postgres",
                 "-E", "UTF8", "--no-locale", "--no-sync")
        self.primary.start()
        self.run("pg_basebackup", "-D", self.standby.data, "-R", "-X", "stream",
                 "--checkpoint=fast", "--no-sync",
                 "-d", "host=127.0.0.1 port=%d user=postgres application_name=%s"
                 % (self.primary.port, APP_NAME))
        self._ensure_application_name()
        self.standby.start()
        if self.sync:
            self.primary.query("ALTER SYSTEM SET synchronous_standby_names = '%s'" % APP_NAME)
            self.primary.query("SELECT pg_reload_conf()")
        self.primary.query("CREATE DATABASE %s" % self.db)
        return self

    def _ensure_application_name(self):
        """pg_basebackup -R writes the conninfo it was given into
        primary_conninfo; a version that leaves application_name out gets
        the line again with it (the last line wins)."""
        auto = os.path.join(self.standby.data, "postgresql.auto.conf")
        with open(auto) as f:
            text = f.read()
        if "application_name=%s" % APP_NAME not in text:
            with open(auto, "a") as f:
                f.write("primary_conninfo = 'host=127.0.0.1 port=%d user=postgres "
                        "application_name=%s'\n" % (self.primary.port, APP_NAME))

    def wait_streaming(self, timeout=30.0):
        """Returns once the primary streams to the standby with the
        sync_state asked for ("sync" or "async")."""
        want = "sync" if self.sync else "async"
        deadline = time.monotonic() + timeout
        rows = []
        while time.monotonic() < deadline:
            rows = self.primary.query(
                "SELECT state, sync_state FROM pg_stat_replication "
                "WHERE application_name = %s", (APP_NAME,))
            if rows and rows[0] == ("streaming", want):
                return
            time.sleep(0.05)
        raise AssertionError("standby not streaming as %s within %.0fs (saw %r)%s%s" % (
            want, timeout, rows, self.primary.log_tail(), self.standby.log_tail()))

    def migrate(self, binary=BINARY):
        """Brings the database to the proxy's schema with `idemproxy
        --migrate`, as conftest's make_proxy does, through the multi-host
        URL (the standby gets it by replication)."""
        conf = os.path.join(self.dir, "migrate.conf")
        with open(conf, "w") as f:
            f.write(render_conf({
                "listen": "127.0.0.1:%d" % free_port(),
                "database": {"url": self.url},
                "routes": [{"name": "r", "path": "/r", "upstream": "http://127.0.0.1:9"}],
            }))
        env = dict(os.environ)
        env.pop("IDEMPROXY_DATABASE_URL", None)
        env.pop("IDEMPROXY_LISTEN", None)
        r = subprocess.run([binary, "-c", conf, "--migrate"], capture_output=True, text=True,
                           timeout=60, env=env, stdin=subprocess.DEVNULL)
        if r.returncode != 0:
            raise RuntimeError("--migrate failed (%d):\n%s%s" % (r.returncode, r.stdout,
                                                               r.stderr))

    def query(self, sql, params=None):
        """A statement on the current read-write server, in the database."""
        return self.current.query(sql, params, db=self.db)

    def kill_primary(self):
        """SIGKILL of the primary's postmaster and every backend, as in a
        machine that dies: no shutdown checkpoint, no goodbye to clients.
        The postmaster goes first so that it cannot restart the others."""
        pid = self.primary.postmaster_pid()
        if pid is None:
            raise RuntimeError("the primary has no postmaster.pid")
        victims = [pid] + _children(pid)
        for p in victims:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.primary.killed_pids = victims
        self.primary.running = False
        deadline = time.monotonic() + 20
        while any(_alive(p) for p in victims):
            if time.monotonic() > deadline:
                raise RuntimeError("primary processes still alive after SIGKILL")
            time.sleep(0.02)

    def promote(self, timeout=30.0):
        """pg_ctl promote, then wait until the standby accepts writes, then
        clear synchronous_standby_names on it (as Patroni does outside strict
        mode): with no standby left, a commit waiting for one would hang."""
        self.standby.pg_ctl("promote", "-w", "-t", str(int(timeout)))
        deadline = time.monotonic() + timeout
        while self.standby.query("SELECT pg_is_in_recovery()")[0][0]:
            if time.monotonic() > deadline:
                raise AssertionError("standby still in recovery%s" % self.standby.log_tail())
            time.sleep(0.05)
        self.standby.query("ALTER SYSTEM RESET synchronous_standby_names")
        self.standby.query("SELECT pg_reload_conf()")
        self.current = self.standby

    def stop(self):
        """Stops whatever runs (immediate shutdown, then SIGKILL of anything
        left) and removes the data; safe to call more than once."""
        if self._stopped:
            return
        self._stopped = True
        for node in (self.standby, self.primary):
            pid = node.postmaster_pid()
            if node.running:
                try:
                    node.pg_ctl("-m", "immediate", "-w", "-t", "30", "stop", timeout=40)
                except (RuntimeError, subprocess.SubprocessError):
                    pass
                node.running = False
            for p in ([pid] + _children(pid) if pid and _alive(pid) else []):
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        shutil.rmtree(self.dir, ignore_errors=True)


@contextlib.contextmanager
def running_pair(tmpdir, sync=True):
    """A pair started, streaming and migrated; stopped on the way out, also
    after a failure."""
    p = StandbyPair(tmpdir, sync=sync)
    try:
        p.start()
        p.wait_streaming()
        p.migrate()
        yield p
    finally:
        p.stop()
