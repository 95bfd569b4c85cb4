#!/usr/bin/python3
"""Writes what `idemproxy -c conf/idemproxy.conf --contract` prints into
doc/contract.md's marked copy (test_contract.py checks that they agree).
Usage: scripts/contract-doc.py [BINARY]  (default build/idemproxy)."""
import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
binary = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build", "idemproxy")
doc = subprocess.run([binary, "-c", os.path.join(ROOT, "conf", "idemproxy.conf"), "--contract"],
                     check=True, capture_output=True, text=True).stdout
page_path = os.path.join(ROOT, "doc", "contract.md")
with open(page_path, encoding="utf-8") as f:
    page = f.read()
marker = "<!-- contract of conf/idemproxy.conf -->\n```json\n"
new, n = re.subn(re.escape(marker) + r".*?```\n", lambda m: marker + doc + "```\n", page, count=1, flags=re.S)
if n != 1:
    sys.exit("doc/contract.md has no marked copy of the example's contract")
with open(page_path, "w", encoding="utf-8") as f:
    f.write(new)
