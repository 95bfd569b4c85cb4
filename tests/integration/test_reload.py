"""SIGHUP and the settings: each one is either applied by a reload or named
in a warning as needing a restart, and a reload at any moment of start-up
is safe."""
import os
import signal

from helpers import new_key, wait_until
from store_support import pay


def sighup_once_blocked(proc):
    """SIGHUP terminates a process that has not blocked it yet: wait until
    the main thread blocks it (SigBlk in /proc), then send it at once, so
    the reload runs as soon as start-up reaches its signal loop."""
    def blocked():
        try:
            with open("/proc/%d/status" % proc.pid) as f:
                for line in f:
                    if line.startswith("SigBlk:"):
                        return int(line.split()[1], 16) & (1 << (signal.SIGHUP - 1))
        except OSError:
            return False
        return False
    wait_until(blocked, interval=0.0005, what="the proxy to block SIGHUP")
    proc.send_signal(signal.SIGHUP)


def test_reload_during_start_up_leaves_workers_a_valid_database_url(make_proxy, stub, pg):
    """The first reload frees the start-up configuration; workers that had
    not initialised yet must not read their database URL from it (run under
    the ASan build, a read of freed memory aborts the proxy)."""
    for _ in range(3):
        proxy = make_proxy(top={"workers": 200}, wait_ready=False)
        sighup_once_blocked(proxy.proc)
        proxy.wait_ready()
        wait_until(lambda: "configuration reloaded" in proxy.log(),
                   what="the reload")
        for _ in range(8):
            assert pay(proxy, new_key()).status_code == 201
        assert proxy.stop() == 0, proxy.log()[-4000:]
        log = proxy.log()
        assert "store connect failed" not in log, log[-4000:]
        assert "AddressSanitizer" not in log, log[-8000:]
