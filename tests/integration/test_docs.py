"""The documentation's links: every relative link in README.md, CHANGES.md,
doc/ and the tests' READMEs names a file that exists, and every #anchor one
of that page's headings (GitHub's rule: lower case, punctuation dropped,
spaces to hyphens, -1, -2 for repeats) or an explicit <a id>. A page moved
or a heading renamed without its links fails here."""
import glob
import os
import re

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

LINK = re.compile(r"\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
EXPLICIT = re.compile(r"<a (?:id|name)=\"([^\"]+)\"")


def pages(root=ROOT):
    found = [os.path.join(root, p) for p in ("README.md", "CHANGES.md")]
    found += glob.glob(os.path.join(root, "doc", "*.md"))
    found += glob.glob(os.path.join(root, "tests", "**", "README.md"), recursive=True)
    return sorted(p for p in found if os.path.exists(p))


def slug(heading):
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def prose_lines(path):
    """The lines outside fenced code blocks, with inline code removed."""
    in_code = False
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            if not in_code:
                yield n, re.sub(r"`[^`]*`", "", line)


def anchors(path):
    seen, out = {}, set()
    in_code = False
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.lstrip().startswith("```"):
                in_code = not in_code
                continue
            if in_code:
                continue
            out.update(EXPLICIT.findall(line))
            m = HEADING.match(line)
            if m:
                s = slug(m.group(1))
                k = seen.get(s, 0)
                seen[s] = k + 1
                out.add(s if k == 0 else "%s-%d" % (s, k))
    return out


def broken_links(files):
    """Every link in files that does not resolve, as 'file:line: target'."""
    cache, bad = {}, []
    for path in files:
        for n, line in prose_lines(path):
            for target in LINK.findall(line):
                if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                    continue  # http:, https:, mailto:
                file_part, _, anchor = target.partition("#")
                dest = (os.path.normpath(os.path.join(os.path.dirname(path), file_part))
                        if file_part else path)
                where = "%s:%d: %s" % (os.path.relpath(path, ROOT), n, target)
                if not os.path.exists(dest):
                    bad.append(where + " (no such file)")
                    continue
                if anchor and dest.endswith(".md"):
                    if dest not in cache:
                        cache[dest] = anchors(dest)
                    if anchor not in cache[dest]:
                        bad.append(where + " (no such anchor)")
    return bad


def test_every_link_and_anchor_resolves():
    files = pages()
    assert os.path.join(ROOT, "doc", "runbook.md") in files
    assert broken_links(files) == []


def test_the_checker_finds_broken_links(tmp_path):
    (tmp_path / "doc").mkdir()
    (tmp_path / "doc" / "a.md").write_text(
        "# A page\n\n## Second `part` (x.y)\n\n"
        "[ok](#a-page) [ok](#second-part-xy) [ok](b.md#b-1)\n"
        "[bad anchor](#nowhere) [bad file](c.md) [bad remote anchor](b.md#c)\n"
        "```\n[in code](#ignored)\n```\n")
    (tmp_path / "doc" / "b.md").write_text("# B\n\n## B\n")
    bad = broken_links([str(tmp_path / "doc" / "a.md")])
    assert [b.rsplit(": ", 1)[1] for b in bad] == [
        "#nowhere (no such anchor)", "c.md (no such file)",
        "b.md#c (no such anchor)"], bad


TEST_REF = re.compile(r"\b(test_\w+\.py)(?:::(test_\w+))?")


def missing_tests(page, tests_root):
    """Every test reference in page (`file::test`, or a file alone) that
    names no file under tests_root, or no function of that file."""
    files = {}
    for path in glob.glob(os.path.join(tests_root, "**", "test_*.py"), recursive=True):
        files.setdefault(os.path.basename(path), path)
    bad = []
    with open(page, encoding="utf-8") as f:
        text = f.read()
    for name, func in TEST_REF.findall(text):
        ref = name + ("::" + func if func else "")
        if name not in files:
            bad.append(ref + " (no such file)")
            continue
        if func:
            with open(files[name], encoding="utf-8") as f:
                if not re.search(r"^def %s\(" % re.escape(func), f.read(), re.M):
                    bad.append(ref + " (no such test)")
    return bad


def test_conformance_table_names_existing_tests():
    page = os.path.join(ROOT, "doc", "conformance.md")
    with open(page, encoding="utf-8") as f:
        assert len(TEST_REF.findall(f.read())) > 20
    assert missing_tests(page, os.path.join(ROOT, "tests")) == []


def test_the_test_reference_checker_finds_missing_tests(tmp_path):
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_a.py").write_text("def test_one():\n    pass\n")
    page = tmp_path / "page.md"
    page.write_text("| x | test_a.py::test_one, test_a.py::test_two |\n"
                    "| y | test_a.py | test_b.py | test_b.py::test_one |\n")
    assert missing_tests(str(page), str(tmp_path / "tests")) == [
        "test_a.py::test_two (no such test)", "test_b.py (no such file)",
        "test_b.py::test_one (no such file)"]
