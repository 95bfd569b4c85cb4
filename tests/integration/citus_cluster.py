"""A Citus cluster for the tests: a coordinator and two workers on
127.0.0.1, each its own initdb and port (as the postgres user when running
as root), with shared_preload_libraries = 'citus'.

Each test gets its own database on all three nodes (copied from a template
that has the extension, which is much faster than CREATE EXTENSION each
time), joined on the coordinator with citus_add_node. The tests then talk to
the coordinator only, as the proxy does.

conftest.py uses this in place of its plain cluster when
IDEMPROXY_TEST_CITUS=1 (`make test-citus`).
"""
import os

import psycopg

from conftest import PgCluster

TEMPLATE = "citus_template"


class CitusNode(PgCluster):
    """One PostgreSQL server of the cluster, with Citus loaded."""

    def _server_opts(self):
        # max_prepared_transactions: Citus commits multi-node writes with
        # two-phase commit. track_functions: the tests count where
        # idem_claim ran (pg_stat_user_functions).
        return ("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off "
                "-c max_connections=300 -c shared_preload_libraries=citus "
                "-c max_prepared_transactions=200 -c track_functions=pl "
                "-c citus.log_remote_commands=off" % (self.port, self.tmp))

    def _pg_ctl(self, *args, timeout=120):
        return self._run([os.path.join(self.bindir, "pg_ctl"), "-D", self.data] + list(args),
                         timeout=timeout)

    def start(self):
        self._run([os.path.join(self.bindir, "initdb"), "-D", self.data, "-A", "trust",
                   "-U", "postgres", "-E", "UTF8", "--no-locale", "--no-sync"])
        self._pg_ctl("-l", self.logfile, "-w", "-t", "60", "-o", self._server_opts(), "start")
        self.started = True
        self.running = True
        with self.admin() as c:
            c.execute("CREATE DATABASE %s" % TEMPLATE)
        with psycopg.connect(self.conninfo(TEMPLATE), autocommit=True) as c:
            c.execute("CREATE EXTENSION citus")
        # The extension's maintenance daemon stays connected to a database
        # with Citus, and CREATE DATABASE refuses a template in use: a
        # template database is skipped by the daemon only when it does not
        # allow connections.
        with self.admin() as c:
            c.execute("UPDATE pg_database SET datallowconn = false "
                      "WHERE datname = %s", (TEMPLATE,))
            c.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                      "WHERE datname = %s", (TEMPLATE,))

    def pause(self):
        """Stops the server (fast shutdown), keeping data and port."""
        self._pg_ctl("-m", "fast", "-w", "-t", "60", "stop")
        self.running = False

    def resume(self):
        self._pg_ctl("-l", self.logfile, "-w", "-t", "60", "-o", self._server_opts(), "start")
        self.running = True

    def stop(self):
        if not getattr(self, "running", False):
            self.started = False
        super().stop()

    def create_database(self, name):
        with self.admin() as c:
            c.execute("CREATE DATABASE %s TEMPLATE %s" % (name, TEMPLATE))

    def drop_database(self, name):
        with self.admin() as c:
            c.execute("DROP DATABASE IF EXISTS %s WITH (FORCE)" % name)


class CitusCluster:
    """The coordinator's address is the cluster's (conninfo, admin); the
    workers are reached through .workers."""

    def __init__(self):
        self.coordinator = CitusNode()
        self.workers = [CitusNode(), CitusNode()]
        self.nodes = [self.coordinator] + self.workers
        self.dropper = self.coordinator.dropper
        self.port = self.coordinator.port

    def start(self):
        for n in self.nodes:
            n.start()

    def stop(self):
        for n in self.nodes:
            n.dropper.shutdown(wait=True)
            n.stop()

    def conninfo(self, dbname):
        return self.coordinator.conninfo(dbname)

    def admin(self):
        return self.coordinator.admin()

    def log_tail(self):
        return self.coordinator.log_tail()

    def create_database(self, name):
        for n in self.nodes:
            n.create_database(name)
        with psycopg.connect(self.conninfo(name), autocommit=True) as c:
            c.execute("SELECT citus_set_coordinator_host('127.0.0.1', %s)",
                      (self.coordinator.port,))
            for w in self.workers:
                c.execute("SELECT citus_add_node('127.0.0.1', %s)", (w.port,))

    def drop_database(self, name):
        for n in self.nodes:
            if getattr(n, "running", True):
                n.drop_database(name)
