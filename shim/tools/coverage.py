#!/usr/bin/env python3
"""How much of what a real client resolves the simulated driver has.

Usage: coverage.py TRACE_FILE [--names]

TRACE_FILE is the stderr of a client run on the sim with CGPU_SIM_TRACE=1:
one line per cuGetProcAddress look-up,
`cgpu-sim: cuGetProcAddress(NAME, VERSION, FLAGS) -> SYMBOL[ (stub)]`,
or `-> SYMBOL_NOT_FOUND` / `-> VERSION_NOT_SUFFICIENT`. Prints how many
distinct names were asked for, how many exist in the sim, how many of those
are only counted stubs, and how many are missing; with --names, every stub
and missing name (one per line, prefixed `stub ` / `missing `).
"""
import re
import sys

path = sys.argv[1]
names = "--names" in sys.argv[2:]
line_re = re.compile(r"cuGetProcAddress\((\w+), (\d+), (\d+)\) -> (\S+)( \(stub\))?")
lookups = 0
found, stub, missing, too_new = set(), set(), set(), set()
for line in open(path, errors="replace"):
    m = line_re.search(line)
    if not m:
        continue
    lookups += 1
    name, answer, is_stub = m.group(1), m.group(4), m.group(5)
    if answer == "SYMBOL_NOT_FOUND":
        missing.add(name)
    elif answer == "VERSION_NOT_SUFFICIENT":
        too_new.add(name)
    else:
        found.add(name)
        if is_stub:
            stub.add(name)
# A name found at one version and refused at another exists.
missing -= found
too_new -= found
asked = found | missing | too_new
print(f"look-ups:            {lookups}")
print(f"distinct names:      {len(asked)}")
print(f"exist in the sim:    {len(found)}")
print(f"  of which stubs:    {len(stub)}")
print(f"missing:             {len(missing)}")
if too_new:
    print(f"version too new:     {len(too_new)}")
if names:
    for n in sorted(stub):
        print(f"stub {n}")
    for n in sorted(missing):
        print(f"missing {n}")
    for n in sorted(too_new):
        print(f"too-new {n}")
