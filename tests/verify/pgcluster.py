"""PostgreSQL for the campaign: a primary and a synchronous streaming
standby, each in its own network namespace (pg1, pg2), and the faults the
nemesis plays on them: a crash-restart in place and a failover.

As tests/chaos/procs.py: initdb as the postgres user (PostgreSQL refuses
root), trust authentication, fsync and synchronous_commit on. The standby
is made with `pg_basebackup -R` and named by `cluster_name`, which the
primary's `synchronous_standby_names` lists, so a commit returns only once
the standby has the WAL.

A failover is what Patroni does: SIGKILL of the primary's postmaster and
backends, `pg_ctl promote` of the standby, `synchronous_standby_names`
emptied on the new primary (its non-strict mode: commits go on without a
standby), then the old primary rebuilt from the new one with pg_basebackup
and, once it streams, named synchronous again. Until then `sync` is False
and no second failover may start.
"""
import os
import pwd
import shutil
import signal
import subprocess
import threading
import time

import psycopg

PORT = 5432


def pg_bindir():
    out = subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True,
                         timeout=10).stdout.strip()
    if out and os.path.exists(os.path.join(out, "initdb")):
        return out
    import glob
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    if not found:
        raise RuntimeError("no PostgreSQL server binaries (initdb) found")
    return os.path.dirname(found[-1])


def children_of(pid):
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == pid:
                    out.append(int(d))
        except (OSError, ValueError, IndexError):
            pass
    return out


class Node:
    """One server: its data directory and socket directory under base, the
    namespace it listens in."""

    def __init__(self, net, name, base):
        self.net = net
        self.name = name
        self.bindir = pg_bindir()
        self.dir = os.path.join(base, name)
        self.data = os.path.join(self.dir, "data")
        self.logfile = os.path.join(self.dir, "postgres.log")
        os.makedirs(self.dir, exist_ok=True)
        pw = pwd.getpwnam("postgres")
        os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.ip = net.ip(name)

    def _run(self, args, timeout=120, in_ns=False):
        cmd = ["runuser", "-u", "postgres", "--", os.path.join(self.bindir, args[0])] + args[1:]
        if in_ns:
            cmd = self.net.exec_args(self.name) + cmd
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=self.dir)
        if r.returncode != 0:
            raise RuntimeError("%s: %s failed (%d): %s%s" % (self.name, args[0], r.returncode,
                                                            r.stdout, r.stderr[-2000:]))
        return r

    def opts(self):
        return ("-p %d -k %s -c listen_addresses=%s -c fsync=on -c synchronous_commit=on "
                "-c max_connections=300 -c cluster_name=%s -c wal_keep_size=256MB "
                "-c wal_sender_timeout=5s -c wal_receiver_timeout=5s "
                "-c wal_retrieve_retry_interval=1s"
                % (PORT, self.dir, self.ip, self.name))

    def initdb(self):
        self._run(["initdb", "-D", self.data, "-A", "trust", "-U", "postgres", "-E", "UTF8",
                   "--no-locale"])
        with open(os.path.join(self.data, "pg_hba.conf"), "a") as f:
            f.write("host all all 10.231.%d.0/24 trust\n"
                    "host replication all 10.231.%d.0/24 trust\n"
                    % (self.net.subnet, self.net.subnet))

    def basebackup(self, primary):
        """Replaces the data directory with a copy of primary's, set up
        (-R) to stream from it."""
        shutil.rmtree(self.data, ignore_errors=True)
        self._run(["pg_basebackup", "-h", primary.ip, "-p", str(PORT), "-U", "postgres",
                   "-D", self.data, "-R", "-X", "stream", "-c", "fast"], in_ns=True,
                  timeout=180)

    def start(self):
        self._run(["pg_ctl", "-D", self.data, "-l", self.logfile, "-w", "-t", "60",
                   "-o", self.opts(), "start"], in_ns=True)

    def restart_immediate(self):
        self._run(["pg_ctl", "-D", self.data, "-l", self.logfile, "-w", "-t", "60",
                   "-m", "immediate", "-o", self.opts(), "restart"], in_ns=True)

    def promote(self):
        self._run(["pg_ctl", "-D", self.data, "-w", "-t", "60", "promote"])

    def stop(self):
        try:
            self._run(["pg_ctl", "-D", self.data, "-m", "immediate", "-w", "-t", "30",
                       "stop"], timeout=40)
        except (RuntimeError, subprocess.SubprocessError):
            self.kill9()

    def postmaster_pid(self):
        try:
            with open(os.path.join(self.data, "postmaster.pid")) as f:
                return int(f.readline().strip())
        except (OSError, ValueError):
            return None

    def kill9(self):
        """SIGKILL of the postmaster and every backend: the machine died."""
        pid = self.postmaster_pid()
        if pid is None:
            return
        kids = children_of(pid)
        for p in [pid] + kids:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(os.path.exists("/proc/%d" % p)
                                                  for p in [pid] + kids):
            time.sleep(0.05)

    def connect(self, db="postgres"):
        return psycopg.connect(host=self.dir, port=PORT, user="postgres", dbname=db,
                               autocommit=True, connect_timeout=10)

    def sql(self, query, args=None, db="postgres"):
        with self.connect(db) as c:
            cur = c.execute(query, args)
            return cur.fetchall() if cur.description else None

    def set_sync_names(self, names):
        self.sql("ALTER SYSTEM SET synchronous_standby_names = '%s'" % names)
        self.sql("SELECT pg_reload_conf()")

    def version(self):
        return self.sql("SHOW server_version")[0][0]


class Cluster:
    def __init__(self, net, base, log=print):
        self.base = base
        os.makedirs(base, exist_ok=True)
        pw = pwd.getpwnam("postgres")
        os.chown(base, pw.pw_uid, pw.pw_gid)
        self.primary = Node(net, "pg1", base)
        self.standby = Node(net, "pg2", base)
        self.sync = False
        self.lock = threading.Lock()   # one database fault at a time
        self.log = log

    def start(self, dbs):
        self.primary.initdb()
        self.primary.start()
        for db in dbs:
            self.primary.sql("CREATE DATABASE %s" % db)
        self.attach_standby()

    def attach_standby(self):
        """Builds the standby from the primary, waits until it streams, then
        names it synchronous and waits until it is."""
        self.standby.basebackup(self.primary)
        self.standby.start()
        self._wait_replication("streaming", "state")
        self.primary.set_sync_names(self.standby.name)
        self._wait_replication("sync", "sync_state")
        self.sync = True

    def _wait_replication(self, want, column, timeout=60):
        deadline = time.monotonic() + timeout
        got = None
        while time.monotonic() < deadline:
            rows = self.primary.sql("SELECT %s FROM pg_stat_replication WHERE "
                                    "application_name = %%s" % column, (self.standby.name,))
            got = rows[0][0] if rows else None
            if got == want:
                return
            time.sleep(0.1)
        raise RuntimeError("standby %s not %s in %ds (%s)" % (self.standby.name, want,
                                                              timeout, got))

    def url(self, db):
        return ("postgresql://postgres@%s:%d,%s:%d/%s?target_session_attrs=read-write"
                % (self.primary.ip, PORT, self.standby.ip, PORT, db))

    def crash_restart(self):
        self.primary.restart_immediate()

    def failover(self, promoted):
        """Kills the primary, promotes the standby; calls promoted(old,
        new) once the new primary takes writes; then rebuilds the old one
        as the new synchronous standby."""
        old, new = self.primary, self.standby
        self.sync = False
        old.kill9()
        new.promote()
        new.set_sync_names("")
        self.primary, self.standby = new, old
        promoted(old.name, new.name)
        self.attach_standby()

    def stop(self):
        for n in (self.standby, self.primary):
            if n.postmaster_pid() is not None:
                n.stop()
