"""The man pages (`make man`): idemproxy(8) from doc/man/idemproxy.8.md,
idemproxy.conf(5) from doc/configuration.md between doc/man's head and
tail. Both render without a warning, and idemproxy.conf(5) holds every
setting of the settings tables in src/ with its default and the reload
rule the table gives it: a setting added to the code without its row in
doc/configuration.md, or a row left behind, fails here."""
import os
import re
import subprocess

import pytest

from conftest import ROOT

SRC = [os.path.join(ROOT, "src", f) for f in ("config.c", "config_route.c")]
CONF_DOC = os.path.join(ROOT, "doc", "configuration.md")


def run(args, **kw):
    return subprocess.run(args, capture_output=True, text=True, timeout=120,
                          stdin=subprocess.DEVNULL, **kw)


@pytest.fixture(scope="module")
def pages():
    r = run(["make", "-C", ROOT, "--no-print-directory", "-s", "man"])
    assert r.returncode == 0, "make man:\n%s%s" % (r.stdout, r.stderr)
    return {p: os.path.join(ROOT, "build", "man", p) for p in ("idemproxy.8", "idemproxy.conf.5")}


def rendered(page, width=80):
    r = run(["man", "--warnings", "-E", "UTF-8", "-l", page],
            env=dict(os.environ, MANWIDTH=str(width), MAN_KEEP_FORMATTING="", PAGER="cat"))
    assert r.returncode == 0, r.stderr
    assert r.stderr == "", "man %s at width %d:\n%s" % (page, width, r.stderr)
    return r.stdout


@pytest.mark.parametrize("name", ["idemproxy.8", "idemproxy.conf.5"])
def test_man_pages_render_without_warnings(pages, name):
    r = run(["groff", "-ww", "-z", "-t", "-man", pages[name]])
    assert r.returncode == 0 and r.stderr == "", "groff -ww:\n%s" % r.stderr
    for width in (60, 80, 120):
        text = rendered(pages[name], width)
    head = text.splitlines()[0].split()
    section = name.rsplit(".", 1)[1]
    assert head[0] == head[-1] == "%s(%s)" % (name.rsplit(".", 1)[0].upper(), section)
    for h in ("NAME", "SYNOPSIS", "DESCRIPTION", "FILES", "SEE ALSO"):
        assert re.search(r"^%s$" % h, text, re.M), "%s has no %s section" % (name, h)
    if section == "8":
        for h in ("OPTIONS", "SIGNALS", "EXIT STATUS", "ENVIRONMENT"):
            assert re.search(r"^%s$" % h, text, re.M), h
        for opt in ("--check", "--migrate", "--reencrypt", "--batch", "--version", "--help",
                    "SIGHUP", "SIGTERM", "IDEMPROXY_DATABASE_URL", "IDEMPROXY_LISTEN"):
            assert opt in text, opt
    # a link to another page keeps its words, never its relative URL
    assert not re.search(r"\.md#", text), text


def table_settings():
    """(name as the conf spells it, restart-only) for every row of every
    settings table, from the sources: the scopes of cfg_all_tables, and
    each table's rows."""
    text = "".join(open(p).read() for p in SRC)
    scopes = dict((table, scope) for scope, table in re.findall(
        r'\{\s*"([\w-]*)",\s*(cfg_\w+),\s*CFG_N\(', text[text.index("cfg_all_tables"):]))
    assert {"", "database", "route"} <= set(scopes.values()), scopes
    out = {}
    for table, body in re.findall(r"cfg_opt (cfg_\w+)\[\] = \{(.*?)\n\};", text, re.S):
        if table not in scopes:
            continue
        rows = re.split(r"\{\s*\.name\s*=\s*", body)[1:]
        assert rows, table
        scope = scopes[table]
        for row in rows:
            name = re.match(r'"([^"]+)"', row).group(1)
            full = "%s.%s" % (scope, name) if scope not in ("", "route", "route-only") else name
            out[full] = ("CFG_RESTART" in row, scope.startswith("route-only"))
    assert len(out) >= 40, out
    return out


def test_every_setting_is_in_idemproxy_conf_5_with_its_default(pages):
    settings = table_settings()
    text = rendered(pages["idemproxy.conf.5"], 200)
    documented = set(re.findall(r"^\s+(\S+) \(default: ", text, re.M))
    for name, (_, route_only) in settings.items():
        if route_only:  # required in each route: no default
            assert re.search(r"Route-only:.*\b%s\b" % name, text, re.S), name
        else:
            assert name in documented, "%s is not in idemproxy.conf(5)" % name
    gone = documented - set(settings)
    assert not gone, "idemproxy.conf(5) documents settings the code no longer has: %s" % gone
    # the jwt group's own settings (config_route.c)
    known = re.search(r'known\[\] = \{([^}]*"issuer"[^}]*)\}', open(SRC[1]).read())
    for k in re.findall(r'"(\w+)"', known.group(1)):
        assert re.search(r"^\s+jwt \(default: .*\b%s\b" % k, text, re.M | re.S), k


def test_the_restart_only_list_is_the_tables(pages):
    text = open(CONF_DOC).read()
    m = re.search(r"^- \*\*Restart only:\*\*(.*?)^- \*\*Applied on reload:\*\*", text, re.M | re.S)
    assert m, "doc/configuration.md lost its list of restart-only settings"
    settings = table_settings()
    named = set(re.findall(r"`([\w.]+)`", m.group(1))) & set(settings)
    assert named == {n for n, (restart, _) in settings.items() if restart}
    man = rendered(pages["idemproxy.conf.5"], 200)
    assert "RELOAD RULES" in man and "Restart only: " in man
