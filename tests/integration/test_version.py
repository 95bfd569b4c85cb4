"""The build's identity: `idemproxy --version` and idemproxy_build_info in
/metrics name the same version (debian/changelog's newest entry, the one
source) and commit (git's, or the COMMIT file outside a checkout)."""
import os
import re
import shutil
import subprocess
import uuid

from conftest import ROOT
from test_ops import scrape

VERSION_SH = os.path.join(ROOT, "scripts", "version.sh")


def changelog_version():
    first = open(os.path.join(ROOT, "debian", "changelog")).readline()
    return re.match(r"^idemproxy \(([^)]+)\) ", first).group(1)


def run(args, **kw):
    return subprocess.run([str(a) for a in args], capture_output=True, text=True,
                          timeout=60, stdin=subprocess.DEVNULL, **kw)


def version_of(binary):
    r = run([binary, "--version"])
    assert r.returncode == 0, r.stderr
    m = re.fullmatch(r"idemproxy (\S+) \(commit (\S+)\)\n", r.stdout)
    assert m, r.stdout
    return m.group(1), m.group(2)


def test_version_and_build_info_name_the_same_build(binary, proxy):
    version, commit = version_of(binary)
    assert version == changelog_version()
    assert re.fullmatch(r"[0-9a-f]{12}(-dirty)?", commit), commit
    # a commit of this checkout: HEAD, or one before it when the binary was
    # built before the last commit
    r = run(["git", "-C", ROOT, "merge-base", "--is-ancestor", commit[:12], "HEAD"])
    assert r.returncode == 0, "%s is not HEAD or before it: %s" % (commit, r.stderr)

    m = scrape(proxy)
    assert m.types.get("idemproxy_build_info") == "gauge"
    assert m.series("idemproxy_build_info") == [({"version": version, "commit": commit}, 1.0)]


def header(src):
    r = run(["sh", VERSION_SH, src])
    if r.returncode:
        return None, r.stderr
    d = dict(re.findall(r'^#define (IDEMPROXY_\w+) "(.*)"$', r.stdout, re.M))
    return (d["IDEMPROXY_VERSION"], d["IDEMPROXY_COMMIT"]), r.stderr


def test_version_script_outside_a_checkout(tmp_path):
    """A tarball or the package build's copy: the COMMIT file, else
    "unknown"; never the commit of a checkout the copy happens to sit in."""
    # Under the checkout's build/ as `make deb` puts its copy.
    tree = os.path.join(ROOT, "build", "version-test-%s" % uuid.uuid4().hex[:8])
    os.makedirs(os.path.join(tree, "debian"))
    try:
        shutil.copy(os.path.join(ROOT, "debian", "changelog"), os.path.join(tree, "debian"))
        version = changelog_version()
        assert header(tree)[0] == (version, "unknown")

        commit_file = os.path.join(tree, "COMMIT")
        open(commit_file, "w").write("0123456789ab-dirty\n")
        assert header(tree)[0] == (version, "0123456789ab-dirty")
        # filled in by git archive (export-subst): a full hash, shortened
        open(commit_file, "w").write("%s\n" % ("fedcba9876543210" * 3)[:40])
        assert header(tree)[0] == (version, "fedcba987654")
        # the checkout's own COMMIT, not filled in
        open(commit_file, "w").write("$Format:%H$\n")
        assert header(tree)[0] == (version, "unknown")
        # what would break the C string or the label is refused
        open(commit_file, "w").write('ab"c\n')
        got, err = header(tree)
        assert got is None and "unexpected characters" in err
    finally:
        shutil.rmtree(tree)
