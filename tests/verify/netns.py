"""The campaign's network: one namespace per part (cl, p1, p2, up, pg1,
pg2) on a private /24, joined by a bridge that lives in a namespace of its
own, so nothing of the host's network is touched; partitions are nftables
drop rules inside the namespaces.

    net = Net(run_id)           # names ivf<run_id>-<node>, 10.231.X.0/24
    net.up()
    net.cut("p1", ["pg1", "pg2"], "both")   # or "a_to_b", "b_to_a"
    net.heal("p1", ["pg1", "pg2"], "both")
    net.down()                  # kills what runs inside, removes it all

A cut of a→b drops a's packets to b in a's output chain; both directions
also drop, in a's input chain, what comes from b. Cuts are counted per
address, so overlapping cuts of the same pair heal only with the last.

sweep() removes the namespaces (and kills the processes inside: they are
the campaign's) and the PostgreSQL directories (/tmp/ivf<run id>-pg) of
earlier runs whose owner process is gone: a campaign killed with SIGKILL
leaves them behind.
"""
import ctypes
import os
import shutil
import signal
import subprocess
import threading
import time

PREFIX = "ivf"
OWNER_DIR = "/run/idemproxy-verify"
NODES = {"cl": 10, "p1": 11, "p2": 12, "up": 20, "pg1": 31, "pg2": 32}
CLONE_NEWNET = 0x40000000

NFT_RULES = """
table inet ivf {
  set out4 { type ipv4_addr; }
  set in4 { type ipv4_addr; }
  chain output { type filter hook output priority 0; policy accept; ip daddr @out4 drop; }
  chain input { type filter hook input priority 0; policy accept; ip saddr @in4 drop; }
}
"""


def run(args, timeout=30, check=True, input=None):
    r = subprocess.run(args, capture_output=True, text=True, timeout=timeout, input=input)
    if check and r.returncode != 0:
        raise RuntimeError("%s failed (%d): %s%s" % (" ".join(args), r.returncode,
                                                    r.stdout, r.stderr))
    return r


def list_netns():
    r = run(["ip", "netns", "list"], check=False)
    return [ln.split()[0] for ln in r.stdout.splitlines() if ln.strip()]


def pid_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True


def kill_inside(ns):
    """SIGKILLs every process in namespace ns (they are the campaign's:
    nothing else is started in its namespaces)."""
    r = run(["ip", "netns", "pids", ns], check=False)
    for tok in r.stdout.split():
        try:
            os.kill(int(tok), signal.SIGKILL)
        except (ValueError, ProcessLookupError):
            pass


def remove_ns(ns):
    kill_inside(ns)
    run(["ip", "netns", "del", ns], check=False)


def owner_path(run_id):
    return os.path.join(OWNER_DIR, run_id)


def sweep(log=print):
    """Removes the namespaces left by earlier runs whose owner is gone."""
    stale = {}
    for ns in list_netns():
        if not ns.startswith(PREFIX) or "-" not in ns:
            continue
        rid = ns[len(PREFIX):].split("-", 1)[0]
        try:
            with open(owner_path(rid)) as f:
                if pid_alive(int(f.read().strip() or "0")):
                    continue
        except (OSError, ValueError):
            pass
        stale.setdefault(rid, []).append(ns)
    for rid, names in sorted(stale.items()):
        log("sweep: removing namespaces of an earlier run %s: %s" % (rid, " ".join(names)))
        for ns in names:
            remove_ns(ns)
        shutil.rmtree("/tmp/%s%s-pg" % (PREFIX, rid), ignore_errors=True)
        try:
            os.unlink(owner_path(rid))
        except OSError:
            pass


class Net:
    def __init__(self, run_id, subnet):
        self.run_id = run_id
        self.subnet = subnet            # X of 10.231.X.0/24
        self.bridge_ns = self.ns("br")
        self.made = []
        self.cuts = {}                  # (node, set, addr) -> count
        self.lock = threading.Lock()

    def ns(self, node):
        return "%s%s-%s" % (PREFIX, self.run_id, node)

    def ip(self, node):
        return "10.231.%d.%d" % (self.subnet, NODES[node])

    def up(self):
        os.makedirs(OWNER_DIR, exist_ok=True)
        with open(owner_path(self.run_id), "w") as f:
            f.write(str(os.getpid()))
        self._add_ns(self.bridge_ns)
        br = ["ip", "-n", self.bridge_ns]
        run(br + ["link", "add", "br0", "type", "bridge"])
        run(br + ["link", "set", "br0", "up"])
        for node in NODES:
            self._add_node(node)

    def _add_ns(self, name):
        run(["ip", "netns", "add", name])
        self.made.append(name)
        run(["ip", "-n", name, "link", "set", "lo", "up"])

    def _add_node(self, node):
        name = self.ns(node)
        self._add_ns(name)
        br = ["ip", "-n", self.bridge_ns]
        run(br + ["link", "add", "v-" + node, "type", "veth", "peer", "name", "eth0",
                  "netns", name])
        run(br + ["link", "set", "v-" + node, "master", "br0"])
        run(br + ["link", "set", "v-" + node, "up"])
        run(["ip", "-n", name, "addr", "add", self.ip(node) + "/24", "dev", "eth0"])
        run(["ip", "-n", name, "link", "set", "eth0", "up"])
        run(["ip", "netns", "exec", name, "nft", "-f", "-"], input=NFT_RULES)

    def down(self):
        """Kills everything inside and removes the namespaces; safe to call
        twice and after a partial up()."""
        for name in reversed(self.made):
            remove_ns(name)
        self.made = []
        try:
            os.unlink(owner_path(self.run_id))
        except OSError:
            pass

    def exec_args(self, node):
        """The argv prefix that runs a command inside node's namespace (ip
        execs it: the process id is the command's)."""
        return ["ip", "netns", "exec", self.ns(node)]

    # --- partitions ------------------------------------------------------------

    def _set(self, node, setname, addr, add):
        key = (node, setname, addr)
        n = self.cuts.get(key, 0) + (1 if add else -1)
        self.cuts[key] = max(n, 0)
        if (add and n == 1) or (not add and n == 0):
            verb = "add" if add else "delete"
            run(self.exec_args(node) + ["nft", verb, "element", "inet", "ivf", setname,
                                        "{ %s }" % addr])

    def _apply(self, a, bs, direction, add):
        with self.lock:
            for b in bs:
                if direction in ("both", "a_to_b"):
                    self._set(a, "out4", self.ip(b), add)
                if direction == "both":
                    self._set(a, "in4", self.ip(b), add)
                if direction == "b_to_a":
                    self._set(b, "out4", self.ip(a), add)

    def cut(self, a, bs, direction="both"):
        """Drops traffic between node a and each node of bs."""
        self._apply(a, bs, direction, True)

    def heal(self, a, bs, direction="both"):
        self._apply(a, bs, direction, False)

    def heal_all(self):
        with self.lock:
            for (node, setname, addr), n in list(self.cuts.items()):
                if n > 0:
                    run(self.exec_args(node) + ["nft", "flush", "set", "inet", "ivf", setname],
                        check=False)
            self.cuts = {}

    # --- sockets inside a namespace -------------------------------------------

    def call_in(self, node, fn, timeout=30):
        """Runs fn() in a thread that joined node's network namespace (the
        sockets it opens live there); returns its result."""
        out = {}

        def body():
            try:
                fd = os.open("/run/netns/" + self.ns(node), os.O_RDONLY)
                try:
                    libc = ctypes.CDLL(None, use_errno=True)
                    if libc.setns(fd, CLONE_NEWNET) != 0:
                        raise OSError(ctypes.get_errno(), "setns " + node)
                finally:
                    os.close(fd)
                out["v"] = fn()
            except BaseException as e:  # handed to the caller
                out["e"] = e
        t = threading.Thread(target=body, daemon=True)
        t.start()
        t.join(timeout)
        if t.is_alive():
            raise TimeoutError("call in %s took over %ss" % (node, timeout))
        if "e" in out:
            raise out["e"]
        return out["v"]


def http_get(net, node, url, timeout=2.0):
    """GET url from inside node's namespace: (status, body bytes)."""
    import urllib.error
    import urllib.request

    def get():
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()
    return net.call_in(node, get, timeout=timeout + 5)


def wait_port(net, node, host, port, timeout=20.0):
    """Waits until host:port accepts a TCP connection from inside node."""
    import socket
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        def probe():
            with socket.create_connection((host, port), timeout=1):
                return True
        try:
            return net.call_in(node, probe)
        except OSError:
            time.sleep(0.1)
    raise TimeoutError("%s:%d not reachable from %s in %.0fs" % (host, port, node, timeout))
