#!/usr/bin/env python3
"""Compiles (syntax only) every translation unit of the given build whose path matches a pattern
with clang's dangling-reference warnings as errors (-Wdangling, -Wdangling-gsl): a reference bound
into a temporary container, such as `const Variant& v = variants().at(i)` (variants() returns a
copy), reads freed memory.  That bug sat in the GPU tests unseen on the GPU-less CI, which never
runs their bodies, and failed every backward EveryVariant test on the GPU with std::bad_alloc
(2026-12-06).  The sanitizer build, compiled with clang, carries the same errors for everything it
builds; this check covers the GPU test sources it leaves out, in a few seconds each.

  check_dangling_references.py COMPILE_COMMANDS.json CLANG REGEX
"""
import json
import re
import shlex
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

commands_path, clang, pattern = sys.argv[1:4]
entries = [e for e in json.load(open(commands_path)) if re.search(pattern, e["file"])]
if not entries:
    sys.exit(f"check_dangling_references: no source of {commands_path} matches '{pattern}'")


def syntax_command(entry):
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    kept, skip = [clang], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-c"):
            skip = a == "-o"
        elif a.startswith(("-I", "-D", "-std=", "-isystem")) or (kept[-1] == "-isystem"):
            kept.append(a)
    return kept + ["-fsyntax-only", "-Wno-everything", "-Werror=dangling", "-Werror=dangling-gsl", entry["file"]]


def check(entry):
    run = subprocess.run(syntax_command(entry), cwd=entry["directory"], capture_output=True, text=True)
    return entry["file"], run.returncode, run.stderr


failed = 0
with ThreadPoolExecutor(max_workers=2) as pool:
    for path, rc, err in pool.map(check, entries):
        if rc:
            failed += 1
            print(f"FAIL: {path}\n{err}")
print(f"check_dangling_references: {len(entries)} sources, {failed} with a dangling reference")
sys.exit(1 if failed else 0)
