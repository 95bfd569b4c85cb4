"""The deployment artefacts: the container image's build stage, run here as
it runs there (its COPY lines into a build context, then docker/build.sh,
i.e. `make install`, staged with DESTDIR), its runtime stage (the staged
binary as uid 10001 on a read-only root file system, serving), and the
systemd unit conf/idemproxy.service."""
import os
import re
import shlex
import shutil
import subprocess
import tempfile

import pytest

from conftest import ROOT
from helpers import is_replay, new_key

DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")
CONTAINER_CONF = os.path.join(ROOT, "docker", "idemproxy.conf")
UNIT = os.path.join(ROOT, "conf", "idemproxy.service")
IMAGE_UID = 10001


def run(args, **kw):
    kw.setdefault("timeout", 60)
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, **kw)


def build_stage():
    """The build stage's context COPYs, the DESTDIR and PREFIX it stages
    `make install` with, and the runtime stage's COPY --from=build lines."""
    text = open(DOCKERFILE).read()
    build, _, runtime = text.partition("\nFROM debian:12-slim")
    assert runtime, "no runtime stage FROM debian:12-slim"
    m = re.search(r"^RUN BUILD=\S+ DESTDIR=(\S+) docker/build\.sh (\S+)\s*$", build, re.M)
    assert m, "the build stage no longer runs DESTDIR=... docker/build.sh PREFIX"
    copies = re.findall(r"^COPY (?!--)(\S+) (\S+)\s*$", build, re.M)
    return copies, m.group(1), m.group(2), re.findall(
        r"^COPY --from=build (\S+) (\S+)\s*$", runtime, re.M), runtime


def copy_in(src, dst):
    """COPY src dst: a directory's content, or a file."""
    os.makedirs(os.path.dirname(dst), exist_ok=True)
    if os.path.isdir(src):
        shutil.copytree(src, dst, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns("__pycache__"))
    else:
        shutil.copy2(src, dst)


@pytest.fixture(scope="module")
def image():
    """The build stage without docker: a context holding only what the
    Dockerfile COPYs, built with a fresh BUILD dir (a full build, as in the
    image) and staged in DESTDIR. Then the runtime stage's tree: what it
    COPYs out of the stage, in a directory others may enter (the image's
    user must reach its binary)."""
    tmp = tempfile.mkdtemp(prefix="idemproxy-image-")
    os.chmod(tmp, 0o755)
    try:
        ctx, build, out = (os.path.join(tmp, d) for d in ("src", "build", "out"))
        copies, destdir, prefix, runtime_copies, _ = build_stage()
        for src, dst in copies:
            copy_in(os.path.join(ROOT, src), os.path.join(ctx, src if dst in ("./", ".") else dst))
        env = dict(os.environ, BUILD=build, DESTDIR=out)
        r = run(["sh", os.path.join(ctx, "docker", "build.sh"), prefix], env=env, timeout=300)
        assert r.returncode == 0, "docker/build.sh failed (%d):\n%s%s" % (
            r.returncode, r.stdout[-4000:], r.stderr[-4000:])
        assert "installed %s%s/sbin/idemproxy" % (out, prefix) in r.stdout
        root = os.path.join(tmp, "root")
        for src, dst in runtime_copies:
            assert src.startswith(destdir + "/"), src
            staged = os.path.join(out, src[len(destdir) + 1:])
            assert os.path.exists(staged), "%s is not installed by the build stage" % src
            copy_in(staged, root + dst)
        yield {"tmp": tmp, "out": out, "prefix": prefix, "root": root,
               "runtime_copies": runtime_copies}
    finally:
        shutil.rmtree(tmp)


def test_staged_install_runs_version_and_check(image):
    binary = os.path.join(image["out"] + image["prefix"], "sbin", "idemproxy")
    assert os.access(binary, os.X_OK)
    v = run([binary, "--version"])
    assert v.returncode == 0, v.stderr
    # no .git in the context and no --build-arg COMMIT: unknown
    assert re.fullmatch(r"idemproxy \d+\.\d+\.\d+\S* \(commit unknown\)\n", v.stdout), v.stdout
    assert b".debug_info" not in open(binary, "rb").read(), "the image's binary is stripped"

    c = run([binary, "-c", CONTAINER_CONF, "--check"])
    assert c.returncode == 0, c.stderr
    lines = c.stdout.splitlines()
    assert lines[0] == "%s: OK" % CONTAINER_CONF
    routes = {l.split()[0]: l for l in lines[1:]}
    assert set(routes) == {"create_payment", "capture_payment", "create_refund"}
    assert all("-> http://upstream:9000" in l for l in routes.values())

    # the example conf it installs validates too
    example = os.path.join(image["out"] + image["prefix"], "share", "idemproxy",
                           "idemproxy.conf.example")
    c = run([binary, "-c", example, "--check"])
    assert c.returncode == 0, c.stderr

    # a broken conf is refused with FILE:LINE
    bad = os.path.join(image["tmp"], "bad.conf")
    open(bad, "w").write(open(CONTAINER_CONF).read().replace('workers       = 16;',
                                                              'workers       = "x";'))
    c = run([binary, "-c", bad, "--check"])
    assert c.returncode == 1
    assert re.match(r"%s:\d+: " % re.escape(bad), c.stderr), c.stderr


def test_dockerfile_runtime_stage(image):
    """What the runtime stage copies, the user it runs as, and its health
    check against the container conf; compose runs the proxy read-only."""
    copies, runtime = image["runtime_copies"], build_stage()[4]
    assert ("/out/usr/sbin/idemproxy", "/usr/sbin/idemproxy") in copies
    assert re.search(r'^ENTRYPOINT \["/usr/sbin/idemproxy"\]$', runtime, re.M)
    user = re.search(r"^USER (\S+)$", runtime, re.M).group(1)
    assert user.split(":")[0] not in ("root", "0")
    assert re.search(r"--uid %d\b.* %s$" % (IMAGE_UID, user.split(":")[0]), runtime, re.M | re.S)
    # the image's health check asks the admin port the container conf serves
    port = re.search(r"HEALTHCHECK.*\n.*127\.0\.0\.1:(\d+)/healthz", runtime).group(1)
    conf = open(CONTAINER_CONF).read()
    assert re.search(r'^admin_listen\s*=\s*"[^"]*:%s";' % port, conf, re.M)
    compose = open(os.path.join(ROOT, "docker", "compose.yaml")).read()
    anchor = re.search(r"^x-idemproxy: &idemproxy\n((?:  .*\n)+)", compose, re.M).group(1)
    assert re.search(r"^  read_only: true$", anchor, re.M), anchor
    assert "--read-only" in open(DOCKERFILE).read()


def test_image_serves_as_non_root_on_a_read_only_root(image, make_proxy, stub):
    """The runtime stage's binary as `docker run --read-only` runs it: uid
    10001, every file system but /proc, /sys, /dev and /run read-only (its
    own directory included: a write anywhere fails). It forwards a key
    once and replays it."""
    root = image["root"]
    conf = os.path.join(root, "etc", "idemproxy", "idemproxy.conf")
    os.makedirs(os.path.dirname(conf))
    wrapper = os.path.join(image["tmp"], "run-as-image.sh")
    open(wrapper, "w").write("""#!/bin/sh
# $1 $2: -c CONF (in a directory only root may enter): a copy the image's
# user reads, as a mounted conf would be.
set -eu
install -m 0644 "$2" %(conf)s
exec unshare --mount sh -c '
set -eu
for m in $(awk "{print \\$2}" /proc/self/mounts | sort -u); do
	case $m in /proc*|/sys*|/dev*|/run*) ;; *) mount -o remount,bind,ro "$m" ;; esac
done
if touch %(root)s/probe 2>/dev/null; then echo "the root is writable" >&2; exit 99; fi
exec setpriv --reuid=%(uid)d --regid=%(uid)d --clear-groups --pdeathsig=SIGKILL \
	%(root)s/usr/sbin/idemproxy -c %(conf)s'
""" % {"conf": conf, "root": root, "uid": IMAGE_UID})
    os.chmod(wrapper, 0o755)
    p = make_proxy(binary=wrapper)
    status = open("/proc/%d/status" % p.proc.pid).read()
    assert re.search(r"^Uid:\s+%d\s+%d\s+%d\s+%d$" % ((IMAGE_UID,) * 4), status, re.M), status
    assert os.readlink("/proc/%d/exe" % p.proc.pid) == os.path.join(root, "usr/sbin/idemproxy")
    key = new_key()
    first = p.post("/v1/payments", key=key, json={"amount": 100, "currency": "EUR"})
    again = p.post("/v1/payments", key=key, json={"amount": 100, "currency": "EUR"})
    assert first.status_code == 201 and not is_replay(first), first.text
    assert again.status_code == 201 and is_replay(again) and again.content == first.content
    assert stub.count(key=key) == 1
    assert not os.path.exists(os.path.join(root, "probe"))


def unit_settings():
    out = {}
    section = None
    for line in open(UNIT):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("["):
            section = line.strip("[]")
            continue
        k, _, v = line.partition("=")
        out.setdefault((section, k), []).append(v)
    return out


def test_systemd_unit_is_sandboxed_and_verifies(binary, tmp_path):
    s = unit_settings()

    def one(k, section="Service"):
        v = s.get((section, k))
        assert v and len(v) == 1, "%s= in [%s]: %r" % (k, section, v)
        return v[0]

    start = shlex.split(one("ExecStart"))
    pre = shlex.split(one("ExecStartPre"))
    assert pre == start + ["--check"]
    assert start[1] == "-c"
    assert one("ExecReload") == "/bin/kill -HUP $MAINPID"
    assert one("KillSignal") == "SIGTERM"
    assert "IDEMPROXY_DATABASE_URL" in open(UNIT).read()
    assert one("EnvironmentFile").lstrip("-").startswith("/etc/idemproxy/")
    # TimeoutStopSec must leave room for shutdown_grace (default 10s, and
    # the example conf's value)
    grace = re.search(r'^shutdown_grace\s*=\s*"(\d+)s";', open(
        os.path.join(ROOT, "conf", "idemproxy.conf")).read(), re.M)
    grace_s = int(grace.group(1)) if grace else 10
    stop = re.fullmatch(r"(\d+)s", one("TimeoutStopSec"))
    assert stop and int(stop.group(1)) > max(grace_s, 10)
    for k, v in (("ProtectSystem", "strict"), ("ProtectHome", "yes"), ("PrivateTmp", "yes"),
                 ("NoNewPrivileges", "yes"), ("CapabilityBoundingSet", ""),
                 ("RestrictAddressFamilies", "AF_INET AF_INET6 AF_UNIX"),
                 ("MemoryDenyWriteExecute", "yes"), ("LockPersonality", "yes")):
        assert one(k) == v, k
    assert "@system-service" in s[("Service", "SystemCallFilter")]
    # never root: a dynamic or a dedicated user
    if ("Service", "DynamicUser") in s:
        assert one("DynamicUser") == "yes"
    else:
        assert one("User") not in ("", "root", "0")

    # systemd's own checks, on a copy whose binary exists here
    unit = tmp_path / "idemproxy.service"
    unit.write_text(open(UNIT).read().replace(start[0], binary))
    # (--man=no: the pages it names are checked by test_man.py, and
    # opened with man from the installed package by `make check-deb`)
    r = run(["systemd-analyze", "verify", "--man=no", unit])
    assert r.returncode == 0 and not r.stderr.strip() and not r.stdout.strip(), \
        "systemd-analyze verify:\n%s%s" % (r.stdout, r.stderr)
    # the overall exposure score (0 = locked down, 100 = none), x10
    r = run(["systemd-analyze", "security", "--offline=yes", "--threshold=20", unit])
    assert r.returncode == 0, "systemd-analyze security:\n%s%s" % (r.stdout[-3000:],
                                                                  r.stderr)
