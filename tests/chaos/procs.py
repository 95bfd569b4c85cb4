"""The processes of the soak and the fuzzer: a PostgreSQL cluster of their
own (fsync on, so a crash-restart is a real crash recovery), idemproxy
instances, and the cleanup that removes them even on failure or Ctrl-C.

As in tests/integration/conftest.py: initdb into a temp dir as the postgres
user when running as root (PostgreSQL refuses root), trust auth, its own
port on 127.0.0.1; unlike there, fsync and synchronous_commit stay on.
"""
import collections
import ctypes
import fcntl
import glob
import json
import os
import pwd
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

import psycopg
import requests

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from helpers import render_conf  # noqa: E402

BINARY = os.environ.get("IDEMPROXY_BIN", os.path.join(ROOT, "build", "idemproxy"))

_cleanups = []
PIPE_SETSZ = 1031   # F_SETPIPE_SZ (Linux)


def at_cleanup(fn):
    _cleanups.append(fn)
    return fn


STOPPING = {"on": False}


def cleanup_all():
    STOPPING["on"] = True   # threads still running start nothing new
    while _cleanups:
        fn = _cleanups.pop()
        try:
            fn()
        except Exception as e:  # cleanup goes on whatever one step did
            print("cleanup: %s" % e, file=sys.stderr)


def die_with_parent():
    """preexec_fn: the child gets SIGTERM when the soak dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)
    except OSError:
        pass


_handed_out = collections.deque(maxlen=256)


def free_port():
    """Not one of the last ports handed out: the kernel may give the same
    free port to two binds in a row (a proxy's listen and admin_listen)."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _handed_out:
            _handed_out.append(port)
            return port


KEEP_LOGS = {"on": False}   # set when a run failed: its logs stay for a look


def make_tmp(prefix, logs=False):
    """A temp dir removed at cleanup; one holding logs stays when the run
    failed (KEEP_LOGS) and its path is printed."""
    d = tempfile.mkdtemp(prefix=prefix)

    def rm():
        if logs and KEEP_LOGS["on"]:
            print("logs kept in %s" % d)
        else:
            shutil.rmtree(d, ignore_errors=True)
    at_cleanup(rm)
    return d


def pg_bindir():
    try:
        out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
        if out and os.path.exists(os.path.join(out, "initdb")):
            return out
    except (OSError, subprocess.SubprocessError):
        pass
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries (initdb) found")
    return os.path.dirname(found[-1])


class Pg:
    def __init__(self, tmp):
        self.bindir = pg_bindir()
        self.tmp = tmp
        self.data = os.path.join(tmp, "pgdata")
        self.logfile = os.path.join(tmp, "postgres.log")
        self.port = free_port()
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            pw = pwd.getpwnam("postgres")
            os.chown(tmp, pw.pw_uid, pw.pw_gid)
        self.running = False

    def _run(self, args, timeout=120):
        cmd = [os.path.join(self.bindir, args[0])] + list(args[1:])
        if self.as_postgres:
            cmd = ["runuser", "-u", "postgres", "--"] + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.tmp)
        if r.returncode != 0:
            raise RuntimeError("%s failed (%d): %s%s" % (" ".join(cmd), r.returncode,
                                                        r.stdout, r.stderr))
        return r

    EXTRA = ""

    def opts(self):
        return ("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=on "
                "-c synchronous_commit=on -c max_connections=100" % (self.port, self.tmp)
                + self.EXTRA)

    def start(self):
        self._run(["initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "-E", "UTF8",
                   "--no-locale"])
        at_cleanup(self.stop)
        self._run(["pg_ctl", "-D", self.data, "-l", self.logfile, "-w", "-t", "60",
                   "-o", self.opts(), "start"])
        self.running = True

    def restart_immediate(self):
        """A crash: every backend is killed, the restart recovers from WAL."""
        self._run(["pg_ctl", "-D", self.data, "-l", self.logfile, "-w", "-t", "60",
                   "-m", "immediate", "-o", self.opts(), "restart"])

    def stop(self):
        if self.running:
            self.running = False
            try:
                self._run(["pg_ctl", "-D", self.data, "-m", "immediate", "-w", "stop"],
                          timeout=60)
            except (RuntimeError, subprocess.SubprocessError):
                pass

    def url(self, db):
        return "postgresql://postgres@127.0.0.1:%d/%s" % (self.port, db)

    def create_db(self, name):
        with psycopg.connect(self.url("postgres"), autocommit=True) as c:
            c.execute("CREATE DATABASE %s" % name)
        return self.url(name)


class CitusNode(Pg):
    """One server of a Citus cluster (as tests/integration/citus_cluster.py
    starts them, but with fsync on): Citus loaded, room for its connections
    between the nodes and for its two-phase commits."""
    EXTRA = (" -c max_connections=300 -c shared_preload_libraries=citus "
             "-c max_prepared_transactions=200")


class CitusPg:
    """A coordinator and two workers on 127.0.0.1, each its own cluster;
    the proxies talk to the coordinator only. Each database is created on
    all three with the extension and the workers joined (citus_add_node).
    A crash-restart picks one node: the coordinator (every tenant's claims
    fail) or a worker (its tenants' claims fail)."""

    def __init__(self, tmp):
        dirs = [os.path.join(tmp, n) for n in ("coordinator", "worker1", "worker2")]
        for d in dirs:
            os.makedirs(d)
        if os.geteuid() == 0:   # the nodes' postgres user goes through it
            pw = pwd.getpwnam("postgres")
            os.chown(tmp, pw.pw_uid, pw.pw_gid)
        self.coordinator = CitusNode(dirs[0])
        self.workers = [CitusNode(d) for d in dirs[1:]]
        self.nodes = [self.coordinator] + self.workers
        self.names = ["coordinator", "worker1", "worker2"]
        self.port = self.coordinator.port

    def start(self):
        for n in self.nodes:
            n.start()

    def restart_immediate(self, node=0):
        """A crash of one node (an index into names); returns its name."""
        i = node
        self.nodes[i].restart_immediate()
        return self.names[i]

    def stop(self):
        for n in self.nodes:
            n.stop()

    def url(self, db):
        return self.coordinator.url(db)

    def create_db(self, name):
        for n in self.nodes:
            n.create_db(name)
            with psycopg.connect(n.url(name), autocommit=True) as c:
                c.execute("CREATE EXTENSION citus")
        with psycopg.connect(self.url(name), autocommit=True) as c:
            c.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)",
                      (self.coordinator.port,))
            for w in self.workers:
                c.execute("SELECT citus_add_node('127.0.0.1', %s)", (w.port,))
        return self.url(name)

    def worker_of(self, db, tenant):
        """The name of the worker holding the shard of a stored tenant."""
        with psycopg.connect(self.url(db), autocommit=True) as c:
            port = c.execute(
                "SELECT nodeport FROM pg_dist_shard_placement WHERE shardid = "
                "get_shard_id_for_distribution_column('idempotency_records', %s::text)",
                (tenant,)).fetchone()[0]
        return self.names[[n.port for n in self.nodes].index(port)]


def rss_kb(pid):
    try:
        with open("/proc/%d/status" % pid) as f:
            for ln in f:
                if ln.startswith("VmRSS:"):
                    return int(ln.split()[1])
    except (OSError, ValueError):
        pass
    return None


class Proxy:
    """One idemproxy instance: its conf (rewritten for a SIGHUP), its log
    (appended across restarts), its process."""

    def __init__(self, name, tmp, settings):
        self.name = name
        self.port = free_port()
        self.admin_port = free_port()
        self.conf_path = os.path.join(tmp, "%s.conf" % name)
        self.log_path = os.path.join(tmp, "%s.log" % name)
        self.settings = dict(settings, listen="127.0.0.1:%d" % self.port,
                             admin_listen="127.0.0.1:%d" % self.admin_port)
        self.url = "http://127.0.0.1:%d" % self.port
        self.proc = None
        self.started = 0.0
        self.extra_env = {}
        # log_pipe: the proxy's stdout and stderr go through a pipe that a
        # thread of the soak drains into the log file; clearing draining
        # stops the reader (a log reader that stops reading)
        self.log_pipe = False
        self.draining = threading.Event()
        self.draining.set()
        self.drainer = None
        self.write_conf()
        at_cleanup(self.kill_quietly)

    def write_conf(self):
        tmpf = self.conf_path + ".new"
        with open(tmpf, "w") as f:
            f.write(render_conf(self.settings))
        os.replace(tmpf, self.conf_path)

    def env(self):
        e = dict(os.environ)
        e.pop("IDEMPROXY_DATABASE_URL", None)
        e.pop("IDEMPROXY_LISTEN", None)
        e.update(self.extra_env)
        return e

    def migrate(self):
        r = subprocess.run([BINARY, "-c", self.conf_path, "--migrate"], capture_output=True,
                           text=True, timeout=60, env=self.env())
        if r.returncode != 0:
            raise RuntimeError("--migrate failed: %s%s" % (r.stdout, r.stderr))

    def start(self, timeout=20.0):
        if STOPPING["on"]:
            raise RuntimeError("cleaning up: not starting proxy %s" % self.name)
        self.wait_drained()   # the last process's lines come first
        self.started = time.time()
        logf = open(self.log_path, "ab")
        out = subprocess.PIPE if self.log_pipe else logf
        self.proc = subprocess.Popen([BINARY, "-c", self.conf_path], stdin=subprocess.DEVNULL,
                                     stdout=out, stderr=subprocess.STDOUT, env=self.env(),
                                     preexec_fn=die_with_parent)
        if self.log_pipe:
            self.drainer = threading.Thread(target=self._drain, args=(self.proc.stdout, logf),
                                            daemon=True)
            self.drainer.start()
        else:
            logf.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError("proxy %s exited %s at start:\n%s" % (
                    self.name, self.proc.returncode, self.log_tail()))
            try:
                if requests.get("http://127.0.0.1:%d/healthz" % self.admin_port,
                                timeout=1).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise RuntimeError("proxy %s not ready in %.0fs:\n%s" % (self.name, timeout,
                                                                 self.log_tail()))

    def _drain(self, pipe, logf):
        """Copies the pipe into the log file while draining is set. The
        pipe is made as small as the kernel allows (one page), so a stop
        of the reader blocks the writer after a few lines, not 64 KiB."""
        try:
            fcntl.fcntl(pipe.fileno(), PIPE_SETSZ, 4096)
        except OSError:
            pass
        try:
            while True:
                self.draining.wait()
                data = os.read(pipe.fileno(), 65536)
                if not data:
                    break
                logf.write(data)
                logf.flush()
        finally:
            logf.close()
            pipe.close()

    def wait_drained(self, timeout=10):
        """The log file holds everything the last process wrote (it has
        ended or is about to)."""
        self.draining.set()
        if self.drainer is not None:
            self.drainer.join(timeout)
            self.drainer = None

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def signal(self, sig):
        if self.alive():
            self.proc.send_signal(sig)

    def kill_quietly(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)

    def log_tail(self, n=3000):
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-n:]
        except OSError:
            return ""

    def log_lines(self):
        self.wait_drained()
        out = []
        try:
            with open(self.log_path, errors="replace") as f:
                for ln in f:
                    try:
                        out.append(dict(json.loads(ln), inst=self.name))
                    except ValueError:
                        out.append({"msg": "(not JSON) " + ln.strip()[:200],
                                    "inst": self.name})
        except OSError:
            pass
        return out


def describe_rc(rc):
    if rc is None:
        return "running"
    if rc < 0:
        try:
            return "signal %s" % signal.Signals(-rc).name
        except ValueError:
            return "signal %d" % -rc
    return "exit %d" % rc
