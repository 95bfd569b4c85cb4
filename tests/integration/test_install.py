"""`make install` and `make uninstall` (mk/install.mk) into a temporary
DESTDIR: the files, their modes, a unit that names the installed binary,
man pages that `man` finds, and nothing left after uninstall."""
import os
import stat
import subprocess

import pytest

from conftest import ROOT

FILES = {  # relative to PREFIX: mode
    "sbin/idemproxy": 0o755,
    "share/man/man8/idemproxy.8": 0o644,
    "share/man/man5/idemproxy.conf.5": 0o644,
    "lib/systemd/system/idemproxy.service": 0o644,
    "share/idemproxy/idemproxy.conf.example": 0o644,
    "share/idemproxy/prometheus/idemproxy-alerts.yml": 0o644,
    "share/idemproxy/grafana/idemproxy-dashboard.json": 0o644,
}


def run(args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=300, stdin=subprocess.DEVNULL, **kw)


def make(target, destdir, prefix):
    r = run(["make", "-C", ROOT, "--no-print-directory", target,
             "DESTDIR=%s" % destdir, "PREFIX=%s" % prefix])
    assert r.returncode == 0, "make %s:\n%s%s" % (target, r.stdout[-3000:], r.stderr[-3000:])


def tree(root):
    files, dirs = {}, set()
    for d, subdirs, names in os.walk(root):
        dirs.update(os.path.relpath(os.path.join(d, s), root) for s in subdirs)
        for n in names:
            p = os.path.join(d, n)
            files[os.path.relpath(p, root)] = stat.S_IMODE(os.lstat(p).st_mode)
    return files, dirs


@pytest.mark.parametrize("prefix", ["/usr/local", "/usr"])
def test_install_then_uninstall(tmp_path, prefix):
    dest = tmp_path / "dest"
    make("install", dest, prefix)
    root = str(dest) + prefix
    files, dirs = tree(dest)
    want = {os.path.join(prefix, f).lstrip("/"): m for f, m in FILES.items()}
    assert files == want
    for d in dirs:
        assert stat.S_IMODE(os.stat(dest / d).st_mode) == 0o755, d

    binary = os.path.join(root, "sbin", "idemproxy")
    v = run([binary, "--version"])
    assert v.returncode == 0 and v.stdout.startswith("idemproxy "), v.stdout + v.stderr
    example = os.path.join(root, "share", "idemproxy", "idemproxy.conf.example")
    c = run([binary, "-c", example, "--check"])
    assert c.returncode == 0, c.stderr

    # the unit runs the binary this install put in place; under /usr it is
    # the unit of conf/, byte for byte (the package's)
    unit = open(os.path.join(root, "lib", "systemd", "system", "idemproxy.service")).read()
    exec_lines = [l for l in unit.splitlines() if l.startswith(("ExecStart=", "ExecStartPre="))]
    assert len(exec_lines) == 2
    assert all(l.split("=", 1)[1].startswith(prefix + "/sbin/idemproxy -c ") for l in exec_lines)
    if prefix == "/usr":
        assert unit == open(os.path.join(ROOT, "conf", "idemproxy.service")).read()

    # man finds both pages in the installed tree
    for page, words in (("idemproxy.conf", "listen (default:"), ("idemproxy", "--migrate")):
        r = run(["man", "-M", os.path.join(root, "share", "man"), page],
                env=dict(os.environ, MANWIDTH="100", PAGER="cat", MAN_KEEP_FORMATTING=""))
        assert r.returncode == 0 and words in r.stdout, r.stderr

    make("uninstall", dest, prefix)
    files, dirs = tree(dest)
    assert files == {}
    assert not [d for d in dirs if "idemproxy" in d], dirs
