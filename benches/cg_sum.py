#!/usr/bin/env python3
"""Sum, over every call site in a callgrind output file (written with
--compress-strings=no --compress-pos=no), the calls to and the inclusive Ir of each function
whose name matches a regex. Prints one line per pattern: <label> <calls> <inclusive Ir>.

usage: cg_sum.py callgrind.out LABEL=REGEX [LABEL=REGEX ...]
"""
import re
import sys

path = sys.argv[1]
pats = []
for a in sys.argv[2:]:
    label, rx = a.split("=", 1)
    pats.append((label, re.compile(rx)))
calls = {l: 0 for l, _ in pats}
incl = {l: 0 for l, _ in pats}
names = {l: set() for l, _ in pats}

fn = None
cfn = None
pending = None  # (label, count) awaiting the cost line after calls=
with open(path, errors="replace") as f:
    for line in f:
        if pending is not None:
            label, n = pending
            pending = None
            parts = line.split()
            # "<pos> <Ir>" (only Ir is collected)
            incl[label] += int(parts[1]) if len(parts) > 1 else 0
            calls[label] += n
            continue
        if line.startswith("fn="):
            fn = line[3:].rstrip("\n")
        elif line.startswith("cfn="):
            cfn = line[4:].rstrip("\n")
        elif line.startswith("calls="):
            n = int(line[6:].split()[0])
            for label, rx in pats:
                if rx.search(cfn) and not rx.search(fn or ""):
                    # a call from outside the matched set (recursion is not double-counted)
                    pending = (label, n)
                    names[label].add(cfn)
                    break
            else:
                pending = ("", 0)
                incl.setdefault("", 0)
                calls.setdefault("", 0)
for label, _ in pats:
    print(label, calls[label], incl[label], "|".join(sorted(names[label])) or "-")
