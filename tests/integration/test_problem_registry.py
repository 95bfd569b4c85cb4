"""The registry of problem types (doc/problems.md) against the source: every
code a call site in src/*.c gives is in src/problem.c's table, every code
of the table is documented and every documented code is in the table; a
row's title and default state and action are the table's, its status
column names every status a call site gives with that code, and every
state and action a call site states explicitly is in its row. A code used
but not registered, or registered but undocumented, fails here."""
import glob
import os
import re
import sys

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# Functions whose calls name a problem's code (the first string literal of
# the call) and its status (the integer literal before it).
EMITTERS = ("reply_problem", "reply_problem_state", "problem_render", "problem",
            "problem_with", "problem_as", "problem_body", "answer", "answer_now",
            "answer_close", "reject", "refuse", "admin_answer_problem")
# Calls that pass a code on rather than name one: (file, code argument).
FORWARDERS = {("reply.c", "code"), ("admin.c", "code"), ("http_front.c", "code"),
              ("proxy.c", "p->code"), ("admin_resolve.c", "in->code"),
              ("admin_keys.c", "code")}
ABBREV = {"NE": "not_executed", "IP": "in_progress", "UN": "unknown", "CO": "completed",
          "SAME": "retry_same_key", "NEW": "retry_new_key", "FIX": "fix_request",
          "STOP": "do_not_retry"}
CONSTANTS = {"PROBLEM_NOT_EXECUTED": "not_executed", "PROBLEM_IN_PROGRESS": "in_progress",
             "PROBLEM_UNKNOWN": "unknown", "PROBLEM_COMPLETED": "completed",
             "PROBLEM_RETRY_SAME_KEY": "retry_same_key",
             "PROBLEM_RETRY_NEW_KEY": "retry_new_key",
             "PROBLEM_FIX_REQUEST": "fix_request", "PROBLEM_DO_NOT_RETRY": "do_not_retry"}
STRING = re.compile(r'"(?:[^"\\]|\\.)*"')


def read(path):
    with open(os.path.join(ROOT, path), encoding="utf-8") as f:
        return f.read()


def strip_comments(text):
    out, i = [], 0
    for m in re.finditer(r'"(?:[^"\\\n]|\\.)*"|\'(?:[^\'\\]|\\.)*\'|/\*.*?\*/|//[^\n]*',
                         text, re.S):
        out.append(text[i:m.start()])
        out.append(m.group(0) if m.group(0)[0] in "\"'" else " ")
        i = m.end()
    out.append(text[i:])
    return "".join(out)


def join_literals(s):
    return "".join(eval(x) for x in STRING.findall(s))  # C and Python agree here


def table():
    """{code: (title, state, action)} from src/problem.c's table."""
    text = strip_comments(read("src/problem.c"))
    body = text[text.index("problems[] = {"):]
    body = body[:body.index("};")]
    rows = re.findall(r'\{\s*"([a-z_]+)",\s*((?:"(?:[^"\\]|\\.)*"\s*)+),\s*(\w+),\s*(\w+)\s*\}',
                      body)
    assert rows, "no rows parsed from src/problem.c"
    out = {}
    for code, title, state, action in rows:
        assert code not in out, "%s twice in the table" % code
        out[code] = (join_literals(title), ABBREV[state], ABBREV[action])
    assert len(out) == body.count('{ "'), "a row of the table was not parsed"
    return out


def split_args(s):
    """The top-level comma-separated arguments of a call's text."""
    args, depth, cur, i = [], 0, "", 0
    while i < len(s):
        c = s[i]
        if c == '"':
            m = STRING.match(s, i)
            cur += m.group(0)
            i = m.end()
            continue
        if c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        if c == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += c
        i += 1
    args.append(cur.strip())
    return args


def call_sites():
    """[(file, code or None, status or None, {state and action names},
    code argument)] for every emitter call in src/*.c."""
    sites = []
    name = re.compile(r"(?<![\w.>])(%s)\(" % "|".join(EMITTERS))
    for path in sorted(glob.glob(os.path.join(ROOT, "src", "*.c"))):
        text = strip_comments(open(path, encoding="utf-8").read())
        for m in name.finditer(text):
            i, depth = m.end(), 1
            while depth:
                if text[i] == '"':
                    i = STRING.match(text, i).end()
                    continue
                depth += {"(": 1, ")": -1}.get(text[i], 0)
                i += 1
            inner = text[m.end():i - 1]
            after = text[i:].lstrip()[:1]
            if after == "{" or "const char *" in inner:
                continue  # a definition
            args = split_args(inner)
            lit = [k for k, a in enumerate(args) if STRING.fullmatch(a)]
            code_at = lit[0] if lit else None
            code = join_literals(args[code_at]) if code_at is not None else None
            status = None
            if code_at is not None and code_at > 0 and args[code_at - 1].isdigit():
                status = int(args[code_at - 1])
            said = {CONSTANTS[c] for c in re.findall(r"\bPROBLEM_[A-Z_]+\b", inner)
                    if c in CONSTANTS}
            code_arg = next((a for a in args if re.search(r"\bcode\b", a)), None)
            sites.append((os.path.basename(path), code, status, said, code_arg))
    return sites


def registry():
    """{code: (status cell, title, state cell, action cell)} from
    doc/problems.md's registry table."""
    text = read("doc/problems.md")
    section = text[text.index("## Registry"):]
    section = section[:section.index("\n## ", 1)]
    out = {}
    for line in section.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 6 or not cells[0].startswith("`"):
            continue
        code = cells[0].strip("`")
        assert code not in out, "%s documented twice" % code
        out[code] = (cells[1], cells[2], cells[3], cells[4])
    assert out, "no registry rows parsed from doc/problems.md"
    return out


def backticked(cell):
    return re.findall(r"`([a-z_]+)`", cell)


def test_every_code_given_is_registered_and_every_registered_code_documented():
    tab, doc, sites = table(), registry(), call_sites()
    given = {code for _, code, _, _, _ in sites if code}
    assert given, "no call sites found"
    assert sorted(given - set(tab)) == [], "codes given but not in src/problem.c's table"
    # internal_error is problem_render's fallback for a call without a code
    assert sorted(set(tab) - given - {"internal_error"}) == [], \
        "codes in the table that no call site gives"
    assert '"internal_error"' in read("src/problem.c").split("problem_render(", 1)[1]
    assert sorted(set(tab) - set(doc)) == [], "codes not documented in doc/problems.md"
    assert sorted(set(doc) - set(tab)) == [], "codes documented but not in the table"


def test_calls_that_pass_a_code_on_are_known():
    for f, code, _, _, code_arg in call_sites():
        if code is None:
            assert (f, code_arg) in FORWARDERS, (
                "%s passes code %r on: add the wrapper's name to EMITTERS so that "
                "its callers are read" % (f, code_arg))


def test_each_row_agrees_with_the_table_and_the_call_sites():
    tab, doc = table(), registry()
    bad = []
    for code, (title, state, action) in tab.items():
        status_cell, doc_title, state_cell, action_cell = doc[code]
        if doc_title != title:
            bad.append("%s: title %r, the table says %r" % (code, doc_title, title))
        states, actions = backticked(state_cell), backticked(action_cell)
        if not states or states[0] != state:
            bad.append("%s: default state %r, the table says %r" % (code, states[:1], state))
        if not actions or actions[0] != action:
            bad.append("%s: default action %r, the table says %r" % (code, actions[:1], action))
    for f, code, status, said, _ in call_sites():
        if code is None:
            continue
        status_cell, _, state_cell, action_cell = doc[code]
        if status is not None and str(status) not in re.findall(r"\d{3}", status_cell):
            bad.append("%s: %s gives status %d, not in %r" % (code, f, status, status_cell))
        for name in said:
            if name not in backticked(state_cell) + backticked(action_cell):
                bad.append("%s: %s states %s, not in its row" % (code, f, name))
    assert bad == [], "\n".join(bad)


@pytest.mark.parametrize("mutation,expect", [
    ("unregistered", "codes given but not in"),
    ("undocumented", "codes not documented"),
])
def test_the_checks_fail_on_a_stray_code(monkeypatch, mutation, expect):
    """The checker itself: a call site with an unknown code, and a table row
    without a documentation row, are both caught."""
    me = sys.modules[__name__]
    if mutation == "unregistered":
        found = call_sites()
        monkeypatch.setattr(me, "call_sites",
                            lambda: found + [("x.c", "no_such_code", 500, set(), None)])
    else:
        real = read

        def fake(path):
            text = real(path)
            if path == "doc/problems.md":
                text = "\n".join(l for l in text.splitlines()
                                 if not l.startswith("| `overloaded`"))
            return text
        monkeypatch.setattr(me, "read", fake)
    with pytest.raises(AssertionError) as e:
        test_every_code_given_is_registered_and_every_registered_code_documented()
    assert expect in str(e.value)
