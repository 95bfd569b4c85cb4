"""The Debian package on this machine (`make check-deb`, its own CI phase):
dpkg -i, what the package put where with which owner and mode, the user,
the conf as a conffile the service user can read, --version and --check,
the man pages through man, the unit through systemd-analyze, then
dpkg --purge and what Debian policy expects after it. The machine is left
as it was found: the test refuses to start on a machine that has the
package or an idemproxy user already, and removes the user it caused."""
import glob
import grp
import os
import pwd
import re
import stat
import subprocess
import time

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
DEB_DIR = os.environ.get("IDEMPROXY_DEB_DIR", os.path.join(ROOT, "build", "deb"))
CONF = "/etc/idemproxy/idemproxy.conf"
UNIT = "/lib/systemd/system/idemproxy.service"
PAGES = ("/usr/share/man/man8/idemproxy.8.gz", "/usr/share/man/man5/idemproxy.conf.5.gz")
SHARE = ("/usr/share/idemproxy/idemproxy.conf.example",
         "/usr/share/idemproxy/prometheus/idemproxy-alerts.yml",
         "/usr/share/idemproxy/grafana/idemproxy-dashboard.json")


def run(args, **kw):
    kw.setdefault("timeout", 120)
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, **kw)


def dpkg(*args):
    """dpkg, waiting (up to 10 minutes) while apt or dpkg elsewhere holds
    the lock."""
    deadline = time.monotonic() + 600
    while True:
        r = run(["dpkg"] + list(args), timeout=300)
        if r.returncode == 0 or "lock" not in r.stderr or time.monotonic() > deadline:
            return r
        time.sleep(2)


def installed():
    r = run(["dpkg-query", "-W", "-f", "${Status}", "idemproxy"])
    return r.returncode == 0 and r.stdout.endswith(" installed")


def user_exists():
    try:
        pwd.getpwnam("idemproxy")
        return True
    except KeyError:
        return False


def group_exists():
    try:
        grp.getgrnam("idemproxy")
        return True
    except KeyError:
        return False


def system_state():
    """What the package may touch outside its own files."""
    units = sorted(glob.glob("/etc/systemd/system/**/*idemproxy*", recursive=True) +
                   glob.glob("/var/lib/systemd/deb-systemd-helper-*/**/*idemproxy*",
                             recursive=True))
    return {"passwd": open("/etc/passwd").read(), "group": open("/etc/group").read(),
            "packages": run(["dpkg-query", "-W"]).stdout, "units": units,
            "etc": os.path.exists("/etc/idemproxy")}


@pytest.fixture(scope="module")
def package():
    assert os.geteuid() == 0, "make check-deb installs a package: run it as root"
    debs = glob.glob(os.path.join(DEB_DIR, "idemproxy_*_*.deb"))
    assert len(debs) == 1, "no single package in %s (make deb): %s" % (DEB_DIR, debs)
    assert not installed(), "idemproxy is installed on this machine: not touching it"
    assert not user_exists() and not group_exists(), \
        "this machine has an idemproxy user or group already: not touching it"
    before = system_state()
    r = dpkg("-i", debs[0])
    try:
        assert r.returncode == 0, "dpkg -i:\n%s%s" % (r.stdout, r.stderr)
        yield {"deb": debs[0], "before": before}
    finally:
        purged = dpkg("--purge", "idemproxy")
        # Debian leaves a system user behind on purge (files anywhere may
        # still be owned by it); the test removes the one it caused.
        if user_exists():
            run(["deluser", "--system", "--quiet", "idemproxy"])
        if group_exists():
            run(["delgroup", "--system", "--quiet", "idemproxy"])
        assert purged.returncode == 0, purged.stderr
        assert system_state() == before, "the machine differs after the purge"


def mode_owner(path):
    st = os.stat(path)
    return (stat.S_IMODE(st.st_mode), pwd.getpwuid(st.st_uid).pw_name,
            grp.getgrgid(st.st_gid).gr_name)


def test_installed_files_user_and_modes(package):
    assert installed()
    u = pwd.getpwnam("idemproxy")
    assert u.pw_uid < 1000 and u.pw_dir == "/nonexistent", u
    assert u.pw_shell in ("/usr/sbin/nologin", "/bin/false"), u
    assert grp.getgrgid(u.pw_gid).gr_name == "idemproxy"
    assert not os.path.exists("/nonexistent")

    assert mode_owner("/usr/sbin/idemproxy") == (0o755, "root", "root")
    assert mode_owner(CONF) == (0o640, "root", "idemproxy")
    assert mode_owner("/etc/idemproxy") == (0o750, "root", "idemproxy")
    for f in (UNIT,) + PAGES + SHARE:
        assert mode_owner(f) == (0o644, "root", "root"), f
    conffiles = run(["dpkg-query", "-W", "-f", "${Conffiles}", "idemproxy"]).stdout
    assert [l.split()[0] for l in conffiles.strip().splitlines()] == [CONF]
    # the conf is the example conf, unchanged
    assert open(CONF).read() == open(os.path.join(ROOT, "conf", "idemproxy.conf")).read()

    # Depends computed by dpkg-shlibdeps: the libraries the binary links
    depends = run(["dpkg-deb", "-f", package["deb"], "Depends"]).stdout
    for lib in ("libc6", "libmicrohttpd12", "libcurl4", "libpq5", "libjose0", "libssl3"):
        assert re.search(r"\b%s\b" % lib, depends), (lib, depends)


def test_version_and_check_as_the_service_user(package):
    v = run(["/usr/sbin/idemproxy", "--version"])
    assert v.returncode == 0, v.stderr
    want = run(["dpkg-query", "-W", "-f", "${Version}", "idemproxy"]).stdout
    m = re.fullmatch(r"idemproxy (\S+) \(commit (\S+)\)\n", v.stdout)
    assert m and m.group(1) == want, v.stdout
    head = run(["git", "-C", ROOT, "rev-parse", "HEAD"]).stdout
    assert head and head.startswith(m.group(2)[:12]), (m.group(2), head)

    c = run(["runuser", "-u", "idemproxy", "--", "/usr/sbin/idemproxy", "-c", CONF, "--check"])
    assert c.returncode == 0 and c.stdout.startswith("%s: OK" % CONF), c.stdout + c.stderr
    # nobody else reads it (it may hold admin_token)
    c = run(["runuser", "-u", "nobody", "--", "/usr/sbin/idemproxy", "-c", CONF, "--check"])
    assert c.returncode == 1 and "ermission denied" in c.stderr, c.stdout + c.stderr


def test_man_pages_open(package):
    env = dict(os.environ, MANWIDTH="100", PAGER="cat", MAN_KEEP_FORMATTING="")
    for args, title, words in ((["idemproxy.conf"], "IDEMPROXY.CONF(5)", "listen (default:"),
                               (["5", "idemproxy.conf"], "IDEMPROXY.CONF(5)", "RELOAD RULES"),
                               (["8", "idemproxy"], "IDEMPROXY(8)", "EXIT STATUS")):
        r = run(["man", "--warnings"] + args, env=env)
        assert r.returncode == 0 and r.stderr == "", (args, r.stderr)
        assert r.stdout.startswith(title) and words in r.stdout, args


def test_unit_verifies_and_is_not_enabled(package):
    # with its Documentation= man pages now installed
    r = run(["systemd-analyze", "verify", UNIT])
    assert r.returncode == 0 and not (r.stdout + r.stderr).strip(), r.stdout + r.stderr
    r = run(["deb-systemd-helper", "was-enabled", "idemproxy.service"])
    assert r.returncode != 0, "the package enabled the service at install"
    assert not glob.glob("/etc/systemd/system/*.wants/idemproxy.service")


def test_purge_removes_the_conf_and_keeps_the_user(package):
    """Last: purges, and checks what Debian expects after it. The fixture's
    own purge then finds nothing left to do."""
    r = dpkg("--purge", "idemproxy")
    assert r.returncode == 0, r.stderr
    assert not installed()
    for f in ("/usr/sbin/idemproxy", UNIT, CONF, "/etc/idemproxy", "/usr/share/idemproxy",
              "/usr/share/doc/idemproxy") + PAGES:
        assert not os.path.exists(f), f
    # the system user stays: files elsewhere may still be owned by it
    assert user_exists()
