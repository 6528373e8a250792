#!/usr/bin/env python3
"""Compiles (syntax only) every translation unit of the given build whose path matches a pattern
with clang's dangling-reference warnings as errors (-Wdangling, -Wdangling-gsl): a reference bound
into a temporary container, such as `const Variant& v = variants().at(i)` (variants() returns a
copy), reads freed memory.  That bug sat in the GPU tests unseen on the GPU-less CI, which never
runs their bodies, and failed every backward EveryVariant test on the GPU with std::bad_alloc
(2026-12-06).  The sanitizer build, compiled with clang, carries the same errors for everything it
builds; this check covers the GPU test sources it leaves out.

Parsing their headers (gtest, Eigen, FlexTile's) was four fifths of each source's seconds, so the
sources that share flags share a precompiled header of all their includes (built first, with the
same errors on); where that header does not build, each source is parsed whole.

  check_dangling_references.py COMPILE_COMMANDS.json CLANG REGEX
"""
import json
import os
import re
import shlex
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor

commands_path, clang, pattern = sys.argv[1:4]
# One entry a source: a file compiled into several targets (GpuTestEnvironment.cpp, into each GPU
# test binary) has one entry per target with the same flags, and each took seconds.
entries = list({e["file"]: e for e in json.load(open(commands_path)) if re.search(pattern, e["file"])}.values())
if not entries:
    sys.exit(f"check_dangling_references: no source of {commands_path} matches '{pattern}'")

ERRORS = ["-Wno-everything", "-Werror=dangling", "-Werror=dangling-gsl"]
INCLUDE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def kept_flags(entry):
    args = entry["arguments"] if "arguments" in entry else shlex.split(entry["command"])
    kept, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a in ("-o", "-c"):
            skip = a == "-o"
        elif a.startswith(("-I", "-D", "-std=", "-isystem")) or (kept and kept[-1] == "-isystem"):
            kept.append(a)
    return tuple(kept)


def includes(entry):
    """The source's include lines, a quoted one found beside the source made absolute."""
    lines = []
    for line in open(entry["file"], encoding="utf-8"):
        m = INCLUDE.match(line)
        if not m:
            continue
        beside = os.path.join(os.path.dirname(entry["file"]), m.group(2))
        lines.append(f'#include "{beside}"' if m.group(1) == '"' and os.path.exists(beside) else line.strip())
    return lines


def run(command, entry):
    return subprocess.run(command, cwd=entry["directory"], capture_output=True, text=True)


def precompiled_header(group, flags, scratch, index):
    """A header of every include of the group's sources, precompiled; None where it does not build
    (then each source is parsed whole, and a header's own dangling reference fails each of them)."""
    union = list(dict.fromkeys(line for e in group for line in includes(e)))
    header = os.path.join(scratch, f"group{index}.h")
    with open(header, "w") as f:
        f.write("#pragma once\n" + "\n".join(union) + "\n")
    built = run([clang, *flags, "-x", "c++-header", *ERRORS, header, "-o", header + ".pch"], group[0])
    return None if built.returncode else header + ".pch"


def check(entry, pch):
    command = [clang, *kept_flags(entry), *(["-include-pch", pch] if pch else []), "-fsyntax-only", *ERRORS,
               entry["file"]]
    result = run(command, entry)
    whole = bool(result.returncode and pch and "dangling" not in result.stderr)
    if whole:
        result = run([c for c in command if c not in ("-include-pch", pch)], entry)  # the header clashed
    return entry["file"], result.returncode, result.stderr, whole or not pch


by_flags = {}
for e in entries:
    by_flags.setdefault(kept_flags(e), []).append(e)
groups = list(by_flags.items())
failed = 0
with tempfile.TemporaryDirectory() as scratch, ThreadPoolExecutor(max_workers=2) as pool:
    headers = pool.map(lambda i: precompiled_header(groups[i][1], groups[i][0], scratch, i), range(len(groups)))
    jobs = [(e, header) for header, (_, group) in zip(headers, groups) for e in group]
    parsed_whole = 0
    for path, rc, err, whole in pool.map(lambda job: check(*job), jobs):
        parsed_whole += whole
        if rc:
            failed += 1
            print(f"FAIL: {path}\n{err}")
print(f"check_dangling_references: {len(entries)} sources in {len(groups)} groups of flags "
      f"({parsed_whole} parsed without the precompiled header), {failed} with a dangling reference")
sys.exit(1 if failed else 0)
