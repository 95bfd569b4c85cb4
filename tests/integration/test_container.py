"""The deployment artefacts: docker/build.sh (the Dockerfile's build stage,
run here as it runs there, into a temporary prefix) and the systemd unit
conf/idemproxy.service."""
import os
import re
import shlex
import subprocess

import pytest

from conftest import ROOT

DOCKERFILE = os.path.join(ROOT, "docker", "Dockerfile")
CONTAINER_CONF = os.path.join(ROOT, "docker", "idemproxy.conf")
UNIT = os.path.join(ROOT, "conf", "idemproxy.service")


def run(args, **kw):
    kw.setdefault("timeout", 60)
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, **kw)


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """docker/build.sh PREFIX with a fresh BUILD dir: a full build, as in the
    image, without touching the tree's build/."""
    tmp = tmp_path_factory.mktemp("container")
    prefix, build = tmp / "prefix", tmp / "build"
    env = dict(os.environ, BUILD=str(build))
    r = run(["sh", os.path.join(ROOT, "docker", "build.sh"), prefix], env=env, timeout=300)
    assert r.returncode == 0, "docker/build.sh failed (%d):\n%s%s" % (
        r.returncode, r.stdout[-4000:], r.stderr[-4000:])
    assert "installed %s/bin/idemproxy" % prefix in r.stdout
    assert (build / "idemproxy").exists()
    return prefix


def test_installed_binary_runs_version_and_check(installed):
    binary = installed / "bin" / "idemproxy"
    assert os.access(binary, os.X_OK)
    v = run([binary, "--version"])
    assert v.returncode == 0, v.stderr
    assert re.fullmatch(r"idemproxy \d+\.\d+\.\d+\S* \(commit \S+\)\n", v.stdout), v.stdout

    c = run([binary, "-c", CONTAINER_CONF, "--check"])
    assert c.returncode == 0, c.stderr
    lines = c.stdout.splitlines()
    assert lines[0] == "%s: OK" % CONTAINER_CONF
    routes = {l.split()[0]: l for l in lines[1:]}
    assert set(routes) == {"create_payment", "capture_payment", "create_refund"}
    assert all("-> http://upstream:9000" in l for l in routes.values())

    # the example conf it installs validates too
    example = installed / "share" / "idemproxy" / "idemproxy.conf.example"
    c = run([binary, "-c", example, "--check"])
    assert c.returncode == 0, c.stderr
    assert os.access(installed / "share" / "idemproxy" / "demo_upstream.py", os.X_OK)

    # a broken conf is refused with FILE:LINE
    bad = installed / "bad.conf"
    bad.write_text(open(CONTAINER_CONF).read().replace('workers       = 16;',
                                                       'workers       = "x";'))
    c = run([binary, "-c", bad, "--check"])
    assert c.returncode == 1
    assert re.match(r"%s:\d+: " % re.escape(str(bad)), c.stderr), c.stderr


def test_dockerfile_copies_what_build_sh_installs(installed):
    """The runtime stage copies paths out of the build stage's prefix: each
    must be something build.sh really installs."""
    text = open(DOCKERFILE).read()
    m = re.search(r"^RUN .*docker/build\.sh (\S+)\s*$", text, re.M)
    assert m, "the Dockerfile no longer runs docker/build.sh PREFIX"
    out = m.group(1).rstrip("/")
    copies = re.findall(r"^COPY --from=build (\S+) (\S+)\s*$", text, re.M)
    assert copies, "no COPY --from=build in the Dockerfile"
    for src, _ in copies:
        assert src.startswith(out + "/"), src
        assert (installed / src[len(out) + 1:]).exists(), "%s is not installed" % src
    assert any(dst == "/usr/local/bin/idemproxy" for _, dst in copies)
    # the image's health check asks the admin port the container conf serves
    port = re.search(r"HEALTHCHECK.*\n.*127\.0\.0\.1:(\d+)/healthz", text).group(1)
    conf = open(CONTAINER_CONF).read()
    assert re.search(r'^admin_listen\s*=\s*"[^"]*:%s";' % port, conf, re.M)


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
