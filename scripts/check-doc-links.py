#!/usr/bin/env python3
"""Checks every relative link in the Markdown files of the repository: the
file must exist and, for `#anchor`, the heading must exist (GitHub's slugs).
Usage: scripts/check-doc-links.py   (exit 1 and one line per dead link)"""
import os, re, subprocess, sys

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "*.md"],
                       cwd=root, capture_output=True, text=True, check=True).stdout.split()

def slugs(path):
    out, seen, fence = set(), {}, False
    for line in open(path, encoding="utf-8"):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        m = None if fence else re.match(r"^(#{1,6})\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))
        s = re.sub(r"[^\w\- ]", "", text.lower()).replace(" ", "-")
        n = seen.get(s, 0)
        seen[s] = n + 1
        out.add(s if n == 0 else f"{s}-{n}")
    return out

link = re.compile(r"\]\(([^)\s]+)\)")
bad = 0
for f in files:
    path = os.path.join(root, f)
    fence = False
    for no, line in enumerate(open(path, encoding="utf-8"), 1):
        if line.lstrip().startswith("```"):
            fence = not fence
        if fence:
            continue
        for target in link.findall(line):
            if re.match(r"^[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = os.path.normpath(os.path.join(os.path.dirname(path), file)) if file else path
            if not os.path.exists(dest):
                print(f"{f}:{no}: {target}: no such file")
                bad += 1
            elif anchor and dest.endswith(".md") and anchor not in slugs(dest):
                print(f"{f}:{no}: {target}: no heading #{anchor}")
                bad += 1
sys.exit(1 if bad else 0)
