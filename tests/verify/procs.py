"""The campaign's processes inside the namespaces: idemproxy instances
(restartable, optionally under a skewed clock), the ledger upstream and
the load generator."""
import ctypes
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import netns

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "integration"))
from helpers import render_conf  # noqa: E402

BUILD = os.path.join(ROOT, "build")
FAKETIME_LIB = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1"
PROXY_PORT, ADMIN_PORT = 8080, 8081


def die_with_parent():
    """preexec_fn: the child gets SIGKILL when the campaign dies (kept
    across the exec of `ip netns exec`)."""
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)


_spawns = queue.Queue()


def _spawner():
    while True:
        argv, kw, box, done = _spawns.get()
        try:
            box["proc"] = subprocess.Popen(argv, preexec_fn=die_with_parent, **kw)
        except BaseException as e:  # handed to the caller
            box["err"] = e
        done.set()


threading.Thread(target=_spawner, name="spawner", daemon=True).start()


def popen(argv, **kw):
    """subprocess.Popen from the one thread that lives as long as the
    campaign: PR_SET_PDEATHSIG fires when the thread that forked the child
    ends, so a proxy restarted from a nemesis thread would die with it."""
    box, done = {}, threading.Event()
    _spawns.put((argv, kw, box, done))
    done.wait()
    if "err" in box:
        raise box["err"]
    return box["proc"]


def stop_proc(proc, sig=signal.SIGTERM, timeout=10.0):
    """Signals proc and waits for it; SIGKILL after timeout. Returns rc."""
    if proc is None:
        return None
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    return proc.returncode


class Proxy:
    """One idemproxy instance in namespace `name`; its log (stderr) is
    appended to RUN_DIR/<name>.log across restarts."""

    def __init__(self, net, name, rundir, settings, binary=None, skew_binary=None):
        self.net = net
        self.name = name
        self.ip = net.ip(name)
        self.binary = binary or os.path.join(BUILD, "idemproxy")
        # libfaketime hangs in its first clock_gettime under jemalloc (whose
        # start reads the clock): the skewed instance runs a build with
        # glibc's malloc, the same code otherwise
        self.skew_binary = skew_binary or os.path.join(BUILD, "libc", "idemproxy")
        self.conf_path = os.path.join(rundir, "%s.conf" % name)
        self.log_path = os.path.join(rundir, "%s.log" % name)
        self.url = "http://%s:%d" % (self.ip, PROXY_PORT)
        self.admin = "http://%s:%d" % (self.ip, ADMIN_PORT)
        self.proc = None
        self.skew = None          # seconds the clock is off, or None
        self.starts = 0
        with open(self.conf_path, "w") as f:
            f.write(render_conf(dict(settings, listen="%s:%d" % (self.ip, PROXY_PORT),
                                     admin_listen="%s:%d" % (self.ip, ADMIN_PORT))))

    def argv(self):
        cmd = self.net.exec_args(self.name)
        if self.skew is None:
            return cmd + [self.binary, "-c", self.conf_path]
        return cmd + ["env", "LD_PRELOAD=" + FAKETIME_LIB, "FAKETIME=%+.1fs" % self.skew,
                      self.skew_binary, "-c", self.conf_path]

    def migrate(self):
        r = subprocess.run(self.net.exec_args(self.name) + [self.binary, "-c", self.conf_path,
                                                            "--migrate"],
                           capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError("--migrate failed: %s%s" % (r.stdout, r.stderr))

    def alive(self):
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout=90.0):
        """Starts it and waits until /healthz answers; an instance that
        exits at start (the database out of reach: a partition, a failover
        under way) is started again until timeout."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, "ab") as logf:
                self.proc = popen(self.argv(), stdin=subprocess.DEVNULL, stdout=logf,
                                  stderr=subprocess.STDOUT)
            self.starts += 1
            while time.monotonic() < deadline and self.proc.poll() is None:
                try:
                    if netns.http_get(self.net, self.name, self.admin + "/healthz",
                                      timeout=1.0)[0] == 200:
                        return
                except OSError:
                    pass
                time.sleep(0.1)
            time.sleep(0.3)
        stop_proc(self.proc, signal.SIGKILL)
        raise RuntimeError("proxy %s did not start in %.0fs (see %s)" % (
            self.name, timeout, self.log_path))

    def stop(self, sig=signal.SIGTERM):
        return stop_proc(self.proc, sig, timeout=10.0)

    def metrics(self):
        """{name: value} of the unlabelled samples of /metrics."""
        status, body = netns.http_get(self.net, self.name, self.admin + "/metrics")
        if status != 200:
            raise RuntimeError("%s /metrics: %d" % (self.name, status))
        out = {}
        for ln in body.decode(errors="replace").splitlines():
            parts = ln.split()
            if len(parts) == 2 and not ln.startswith("#") and "{" not in parts[0]:
                try:
                    out[parts[0]] = float(parts[1])
                except ValueError:
                    pass
        return out


class Ledger:
    def __init__(self, net, rundir, ports, seed, slow_ms, mix=None):
        self.net = net
        args = [os.path.join(BUILD, "verify_ledger"), "--log",
                os.path.join(rundir, "ledger.tsv"), "--seed", str(seed),
                "--slow-ms", str(slow_ms)]
        for port in ports:
            args += ["--listen", "%s:%d" % (net.ip("up"), port)]
        if mix:
            args += ["--mix", mix]
        self.err = open(os.path.join(rundir, "ledger.err"), "ab")
        self.proc = popen(net.exec_args("up") + args, stdin=subprocess.DEVNULL,
                          stdout=self.err, stderr=subprocess.STDOUT)
        for port in ports:
            netns.wait_port(net, "cl", net.ip("up"), port)

    def stop(self):
        rc = stop_proc(self.proc, signal.SIGTERM, timeout=15.0)
        self.err.close()
        return rc


class Load:
    """The load generator in `cl`; progress() counts the requests it has
    logged so far (its A lines)."""

    def __init__(self, net, rundir, args):
        self.log_path = os.path.join(rundir, "load.tsv")
        self.out_path = os.path.join(rundir, "load.out")
        self.out = open(self.out_path, "wb")
        self.err = open(os.path.join(rundir, "load.err"), "wb")
        argv = [os.path.join(BUILD, "verify_load"), "--log", self.log_path] + args
        self.proc = popen(net.exec_args("cl") + argv, stdin=subprocess.DEVNULL,
                          stdout=self.out, stderr=self.err)
        self.pos = 0
        self.count = 0
        self.last = b"\n"

    def progress(self):
        """Lines starting with "A" logged so far (read incrementally)."""
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self.pos)
                data = f.read(64 << 20)
        except OSError:
            return self.count
        if data:
            self.pos += len(data)
            self.count += (self.last + data).count(b"\nA\t")
            self.last = data[-1:]
        return self.count

    def stop(self):
        stop_proc(self.proc, signal.SIGKILL)

    def wait(self, timeout):
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return stop_proc(self.proc, signal.SIGTERM, timeout=10.0)

    def summary(self):
        self.out.close()
        self.err.close()
        try:
            with open(self.out_path) as f:
                lines = [ln for ln in f.read().splitlines() if ln.strip().startswith("{")]
            return json.loads(lines[-1]) if lines else {}
        except (OSError, ValueError):
            return {}
