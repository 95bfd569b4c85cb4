#!/usr/bin/python3
"""Self cost per function of one callgrind dump, highest first.

  cg_top.py FILE [N]          the N (default 30) costliest functions
  cg_top.py FILE --self NAME  the self cost of the functions whose name
                              starts with NAME, as one number

callgrind_annotate's exclusive view of a dump taken in the middle of a run
charges everything to the threads' entry point (their calls were counted in
an earlier part), so this reads the file itself. It needs a dump written
with --compress-strings=no."""
import collections
import sys


def self_costs(path):
    costs = collections.Counter()
    total = 0
    ob = fn = ""
    skip_next = False
    with open(path, errors="replace") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            c = line[0]
            if c.isdigit() or c in "+-*":
                if skip_next:
                    # The inclusive cost of a call: not this function's own.
                    skip_next = False
                    continue
                parts = line.split()
                if len(parts) >= 2:
                    n = int(parts[1])
                    costs[(fn, ob)] += n
                    total += n
            elif line.startswith("ob="):
                ob = line[3:]
            elif line.startswith("fn="):
                fn = line[3:]
            elif line.startswith("calls="):
                skip_next = True
    return costs, total


def main():
    path = sys.argv[1]
    costs, total = self_costs(path)
    if len(sys.argv) > 3 and sys.argv[2] == "--self":
        print(sum(n for (fn, _), n in costs.items()
                  if fn.startswith(sys.argv[3])))
        return
    top = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    print("%14s %7s  function [object]" % ("self Ir", "share"))
    for (fn, ob), n in costs.most_common(top):
        obj = ob.rsplit("/", 1)[-1]
        print("%14s %6.2f%%  %s [%s]" % ("{:,}".format(n),
                                         100.0 * n / max(total, 1), fn, obj))
    print("%14s %6.2f%%  total" % ("{:,}".format(total), 100.0))


if __name__ == "__main__":
    main()
