"""A PostgreSQL cluster of its own for the outage tests.

Those tests stop the database under a running proxy and start it again on
the same port; doing that to the session's shared cluster would break every
other test. This reuses conftest's cluster (initdb as the postgres user,
throwaway directory, trust auth) and adds a stop that keeps the data and a
start on the same port.
"""
import os

from conftest import PgCluster


class PrivatePgCluster(PgCluster):
    def _server_opts(self):
        # The same server options as the shared cluster's.
        return ("-p %d -k %s -c listen_addresses=127.0.0.1 -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off "
                "-c max_connections=300" % (self.port, self.tmp))

    def _pg_ctl(self, *args, timeout=120):
        return self._run([os.path.join(self.bindir, "pg_ctl"), "-D", self.data] + list(args),
                         timeout=timeout)

    def pause(self):
        """Stops the server (fast shutdown: every session is terminated),
        keeping the data directory and the port for resume()."""
        self._pg_ctl("-m", "fast", "-w", "-t", "60", "stop")
        self.running = False

    def resume(self):
        """Starts the server again on the same port; returns once it
        accepts connections."""
        self._pg_ctl("-l", self.logfile, "-w", "-t", "60", "-o", self._server_opts(), "start")
        self.running = True

    def crash_restart(self):
        """An immediate shutdown (every backend killed, no checkpoint, as in
        a crash) and a start on the same port, with crash recovery; returns
        once the server accepts connections again."""
        self._pg_ctl("-m", "immediate", "-l", self.logfile, "-w", "-t", "60",
                     "-o", self._server_opts(), "restart")
        self.running = True

    def start(self):
        super().start()
        self.running = True

    def stop(self):
        # A paused server has nothing left to stop; only remove its files.
        if not getattr(self, "running", False):
            self.started = False
        super().stop()
