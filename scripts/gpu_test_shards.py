#!/usr/bin/env python3
"""Deals GPU tests to shards by their measured time, longest first, for scripts/gpu_run.sh.

gtest's own sharding (GTEST_TOTAL_SHARDS) deals tests round-robin in declaration order, so a part
whose long tests sit together waits on its slowest shard (the forward's schedule sweeps: 131 s for
one shard, 71 s for another, 2026-12-06). Here each test goes to the shard with the least time so
far, longest test first (LPT), by the seconds of an earlier run:

  gpu_test_shards.py deal BINARY FILTER SHARDS [SECONDS_FILE]
      prints SHARDS lines, each the ':'-joined names of one shard's tests (a gtest filter), from the
      tests BINARY --gtest_list_tests selects with FILTER; a shard with no test prints '-*' (a
      filter that runs nothing). A test the seconds file does not list counts as 10 s.
  gpu_test_shards.py plan BINARY PROCESSES SECONDS_FILE NAME=FILTER...
      the same for several parts at once, PROCESSES shards in all, each part given shards in
      proportion to its tests' total time (at least one, at most one a test): prints a line
      "NAME<tab>INDEX<tab>FILTER" a shard, the parts in the order given.
  gpu_test_shards.py seconds LOG...
      prints "seconds name" for every test gtest reported as OK or FAILED in the logs (the longest
      of its runs): how scripts/gpu_test_seconds.txt is made from a run's gpu_tests.log.
"""
import re
import subprocess
import sys

DEFAULT_SECONDS = 10.0


def listed_tests(binary, gtest_filter):
    out = subprocess.run([binary, "--gtest_list_tests", "--gtest_filter=" + gtest_filter], check=True,
                         capture_output=True, text=True).stdout
    tests, suite = [], None
    for line in out.splitlines():
        if not line.strip() or line.startswith("Running main()"):
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()  # "Suite." or "Prefix/Suite."
        elif suite:
            tests.append(suite + line.split("#")[0].strip())
    return tests


def read_seconds(path):
    seconds = {}
    try:
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 2 and not line.startswith("#"):
                    seconds[parts[1]] = float(parts[0])
    except FileNotFoundError:
        pass
    return seconds


def dealt(tests, shards, seconds):
    """The tests in `shards` lists, longest first to the least loaded (LPT); '-*' for an empty one."""
    loads = [[0.0, i, []] for i in range(shards)]
    for test in sorted(tests, key=lambda t: (-seconds.get(t, DEFAULT_SECONDS), t)):
        shard = min(loads, key=lambda s: (s[0], s[1]))
        shard[0] += seconds.get(test, DEFAULT_SECONDS)
        shard[2].append(test)
    return [":".join(names) if names else "-*" for _, _, names in loads]


def deal(binary, gtest_filter, shards, seconds_file=None):
    seconds = read_seconds(seconds_file) if seconds_file else {}
    for line in dealt(listed_tests(binary, gtest_filter), shards, seconds):
        print(line)


def plan(binary, processes, seconds_file, parts):
    seconds = read_seconds(seconds_file)
    named = []
    for part in parts:
        name, _, gtest_filter = part.partition("=")
        tests = listed_tests(binary, gtest_filter)
        named.append((name, tests, sum(seconds.get(t, DEFAULT_SECONDS) for t in tests)))
    # One shard a part, then each further process to the part whose shards carry the most time.
    shards = {name: 1 for name, _, _ in named}
    for _ in range(max(0, processes - len(named))):
        open_parts = [(total / shards[name], name) for name, tests, total in named if shards[name] < len(tests)]
        if not open_parts:
            break
        shards[max(open_parts)[1]] += 1
    for name, tests, _ in named:
        for index, line in enumerate(dealt(tests, shards[name], seconds)):
            print(f"{name}\t{index}\t{line}")


def seconds_from_logs(paths):
    pattern = re.compile(r"^\[ +(?:OK|FAILED) +\] (\S+) \((\d+) ms\)")
    seconds = {}
    for path in paths:
        with open(path, errors="replace") as f:
            for line in f:
                m = pattern.match(line)
                if m:
                    seconds[m.group(1)] = max(seconds.get(m.group(1), 0.0), int(m.group(2)) / 1000.0)
    for name, s in sorted(seconds.items(), key=lambda kv: (-kv[1], kv[0])):
        print(f"{s:.1f} {name}")


def main(argv):
    if len(argv) >= 4 and argv[0] == "deal":
        deal(argv[1], argv[2], int(argv[3]), argv[4] if len(argv) > 4 else None)
    elif len(argv) >= 5 and argv[0] == "plan":
        plan(argv[1], int(argv[2]), argv[3], argv[4:])
    elif len(argv) >= 2 and argv[0] == "seconds":
        seconds_from_logs(argv[1:])
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main(sys.argv[1:])
