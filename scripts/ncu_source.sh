#!/usr/bin/env bash
# Where one kernel's warps stall, instruction by instruction: Nsight Compute's source page (SASS,
# with the warp-state samples of each instruction) for the first launch of a kernel, kept as CSV
# in $OUT (or ./gpu-logs), and a summary printed: the share of samples per opcode and the
# instructions that hold the most. Run on the GPU machine from the repo root with ./bundle.
#
#   scripts/ncu_source.sh NAME KERNEL_REGEX COMMAND...
#   e.g. scripts/ncu_source.sh dkdv_ws dkdv bundle/bin/flextile_attention_backward_bench --quick \
#          --variants full --dkdv 64,128,8,2,ws
# NAME names the files (ncu_src_NAME.csv, .err); letters, digits, '_' and '-' only (the device
# tool returns no file whose name has other characters). FLEXTILE_NCU: the ncu executable.
# A warp-specialized kernel's producer warps sample too (idle at their barriers): read the
# consumers' instructions in the list, not the totals alone.
set -uo pipefail
if [ $# -lt 3 ]; then sed -n '2,13p' "$0" >&2; exit 2; fi
name=$1 regex=$2
shift 2
case "$name" in *[!A-Za-z0-9_-]*) echo "ncu_source.sh: NAME '$name' may hold only letters, digits, '_' and '-'" >&2; exit 2 ;; esac
LOGS=${OUT:-./gpu-logs}
mkdir -p "$LOGS"
NCU=${FLEXTILE_NCU:-$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)}
if [ -z "$NCU" ]; then echo "ncu_source.sh: no ncu found (set FLEXTILE_NCU)" >&2; exit 2; fi
csv="$LOGS/ncu_src_$name.csv"
"$NCU" --kernel-name "regex:$regex" --launch-count 1 --section SourceCounters --page source --csv \
  --print-source sass "$@" > "$csv" 2> "$LOGS/ncu_src_$name.err"
rc=$?
echo "== ncu source page, $name (rc $rc): $csv"
python3 - "$csv" <<'PY'
import csv, collections, sys
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
head = next((i for i, r in enumerate(rows) if "Source" in r and any("Sampling" in c for c in r)), None)
if head is None:
    sys.exit("no source table in the report (see the .err file)")
hdr, data = rows[head], rows[head + 1:]
src = hdr.index("Source")
allc = next(j for j, c in enumerate(hdr) if "Sampling (All" in c)
# The per-reason columns (their names vary between ncu versions): any other column about stalls.
reasons = [j for j, c in enumerate(hdr) if "stall" in c.lower() and "Sampling (" not in c]
def num(r, j):
    try: return float(r[j] or 0)
    except (ValueError, IndexError): return 0.0
items = [(num(r, allc), r) for r in data if len(r) > src]
total = sum(v for v, _ in items) or 1.0
print(f"samples: {total:.0f}")
by_op = collections.Counter()
for v, r in items: by_op[(r[src].split() or ["?"])[0].split(".")[0]] += v
print("by opcode: " + ", ".join(f"{op} {v / total * 100:.1f}%" for op, v in by_op.most_common(12)))
print("instructions with the most samples:")
for v, r in sorted(items, key=lambda x: -x[0])[:25]:
    top = sorted(((num(r, j), hdr[j]) for j in reasons), reverse=True)[:2]
    why = ", ".join(f"{n} {c:.0f}" for c, n in top if c > 0)
    print(f"  {v / total * 100:5.1f}%  {r[0]:>8}  {r[src].strip()[:70]:70}  {why}")
PY
