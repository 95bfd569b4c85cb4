"""A partition between the proxy and the upstream: a request the proxy gave
up on must never reach the upstream later (the lease rule: nothing acts
after its lease ended).

The stub upstream runs in a network namespace of the test's own, behind a
veth pair; nftables inside the namespace drops every packet of the stub's
port while the partition lasts. Needs root (ip netns, nft)."""
import os
import selectors
import subprocess
import sys
import time

import pytest

from conftest import STUB
from helpers import Stub, assert_problem, new_key, wait_until
from store_support import pay

TABLE = "idp_partition"


def sh(*args, ns=None):
    cmd = (["ip", "netns", "exec", ns] if ns else []) + list(args)
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, "%s: %s" % (" ".join(cmd), r.stderr)
    return r.stdout


def free_subnet():
    """A 10.232.<n>.0/30 that no interface of this host uses."""
    used = sh("ip", "-4", "-o", "addr")
    for i in range(255):
        n = (os.getpid() + i) % 254 + 1
        if " 10.232.%d." % n not in used:
            return n
    raise RuntimeError("no free 10.232.<n>.0/30")


class NsStub(Stub):
    def __init__(self, host, port, proc):
        self.host = host
        super().__init__(port, proc)

    @property
    def url(self):
        return "http://%s:%d" % (self.host, self.port)


def start_ns_stub(ns, host, tmp_path):
    err = open(os.path.join(str(tmp_path), "ns-stub.err"), "wb")
    proc = subprocess.Popen(["ip", "netns", "exec", ns, sys.executable, STUB,
                             "--host", host, "--port", "0"],
                            stdout=subprocess.PIPE, stderr=err)
    err.close()
    sel = selectors.DefaultSelector()
    sel.register(proc.stdout, selectors.EVENT_READ)
    line = proc.stdout.readline() if sel.select(timeout=15) else b""
    sel.close()
    if not line.strip().isdigit():
        proc.kill()
        proc.wait(5)
        raise RuntimeError("stub upstream did not start in %s (printed %r)" % (ns, line))
    return NsStub(host, int(line), proc)


@pytest.fixture
def ns_stub(tmp_path):
    """The stub upstream inside a namespace of its own, reached over a veth
    pair: (stub, namespace). The namespace and the host's end of the pair
    are removed at teardown, whatever the test did."""
    n = free_subnet()
    ns, host_if, ns_if = "idp-part-%d" % os.getpid(), "ipo%d" % n, "ipi%d" % n
    stub = None
    sh("ip", "netns", "add", ns)
    try:
        sh("ip", "link", "add", host_if, "type", "veth", "peer", "name", ns_if)
        sh("ip", "link", "set", ns_if, "netns", ns)
        sh("ip", "addr", "add", "10.232.%d.1/30" % n, "dev", host_if)
        sh("ip", "link", "set", host_if, "up")
        sh("ip", "addr", "add", "10.232.%d.2/30" % n, "dev", ns_if, ns=ns)
        sh("ip", "link", "set", ns_if, "up", ns=ns)
        sh("ip", "link", "set", "lo", "up", ns=ns)
        stub = start_ns_stub(ns, "10.232.%d.2" % n, tmp_path)
        yield stub, ns
    finally:
        if stub is not None:
            stub.proc.kill()
            stub.proc.wait(5)
            stub.proc.stdout.close()
        subprocess.run(["ip", "link", "del", host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def partition(ns, port):
    """Drops every packet to and from the stub's port inside the namespace."""
    rules = ("table inet %s {\n"
             " chain in { type filter hook input priority 0; tcp dport %d drop; }\n"
             " chain out { type filter hook output priority 0; tcp sport %d drop; }\n"
             "}\n" % (TABLE, port, port))
    r = subprocess.run(["ip", "netns", "exec", ns, "nft", "-f", "-"], input=rules,
                       capture_output=True, text=True, timeout=20)
    assert r.returncode == 0, r.stderr


def heal(ns):
    sh("nft", "delete", "table", "inet", TABLE, ns=ns)


def queued_bytes(stub, ns):
    """Bytes the kernel still holds between the proxy and the stub: unsent
    or unacknowledged on the proxy's side, unread on the stub's side."""
    out = sh("ss", "-Htn", "state", "all", "dst", "%s:%d" % (stub.host, stub.port))
    out += sh("ss", "-Htn", "state", "all", "src", "%s:%d" % (stub.host, stub.port), ns=ns)
    total = 0
    for line in out.splitlines():
        f = line.split()
        if f[0] != "LISTEN":
            total += int(f[1]) + int(f[2])
    return total


def test_abandoned_request_is_never_delivered_after_the_partition_heals(make_proxy, ns_stub):
    """Bug: the proxy gave the request up (upstream_timeout, 504), curl
    closed the socket, but the kernel kept the orphaned socket and went on
    retransmitting the request: once the partition healed, it reached the
    upstream and executed after its lease had ended."""
    stub, ns = ns_stub
    # One worker: one upstream connection pool, so the request below goes
    # on the connection the first one left open.
    proxy = make_proxy(top={"workers": 1}, route_overrides={"create_payment": {
        "upstream": stub.url, "upstream_timeout": "1s", "lease": "3s"}})
    # An established kept-alive connection: the request is written on it
    # at once, and then sits in the send queue, unacknowledged.
    assert pay(proxy, new_key("warm")).status_code == 201
    key = new_key("part")
    partition(ns, stub.port)
    try:
        assert_problem(pay(proxy, key), 504, "upstream_outcome_unknown")
        # Healed a while after the proxy gave up: by then the kernel has
        # retransmitted the request several times (RTO 0.2, 0.4, 0.8 s...).
        time.sleep(1)
    finally:
        heal(ns)
    # Whatever the kernel still held is delivered (or given up) by its next
    # retransmission; then the stub has read all it will ever read.
    wait_until(lambda: stub.count(key=key) > 0 or queued_bytes(stub, ns) == 0,
               timeout=20, what="the kernel's queues toward the stub to drain")
    assert stub.count(key=key) == 0
    # The retry after the lease is forwarded, and it is the key's only
    # execution (this also counts a late delivery the stub recorded just
    # after the queues above looked empty).
    r = wait_until(lambda: (lambda r: r if r.status_code != 409 else None)(pay(proxy, key)),
                   timeout=20, what="the lease to end")
    assert r.status_code == 201
    assert stub.count(key=key) == 1
