#!/usr/bin/env bash
# SASS opcode histogram of one kernel of the installed library (device machine).
# Usage: bash scripts/sass_hist.sh MANGLED_SUBSTRING   e.g. mma_kernelI6__halfLi4ELb0
set -uo pipefail
lib=$(python3 -c "import kbit, os; print(os.path.join(os.path.dirname(kbit.__file__), 'libkbit_cuda.so'))")
OUT=${OUT:-out}; mkdir -p "$OUT"
cuobjdump -sass "$lib" | awk -v pat="$1" '/Function :/{f = index($0, pat) > 0} f' > "$OUT/sass_$1.txt"
echo "$1: $(grep -cE '^ +/\*[0-9a-f]+\*/' "$OUT/sass_$1.txt") instructions"
grep -oE '^ +/\*[0-9a-f]+\*/ +(@!?U?P[0-9T] +)?[A-Z0-9_]+(\.[A-Z0-9_]+)*' "$OUT/sass_$1.txt" \
  | awk '{print $NF}' | sed -E 's/\..*//' | sort | uniq -c | sort -rn | head -25 | tr '\n' ' '
echo
