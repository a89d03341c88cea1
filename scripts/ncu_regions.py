"""Where a kernel's instructions and stall samples go, region by region: reads the SASS CSV of
scripts/ncu_source.sh (one launch, SourceCounters) and splits the code at every block-wide
barrier, PDL trigger (PREEXIT) and exit, in address order. Per region: warp instructions
executed (total and per warp of the CTAs given), stall samples, the most executed opcodes.
NOTES.md v37 used it on mma at M = 1 and 16 (setup / prologue / main loop / epilogue).
Usage: python3 scripts/ncu_regions.py src_TAG.csv CTAS [WARPS_PER_CTA (default 16)]"""
import collections
import csv
import sys

rows = list(csv.reader(open(sys.argv[1], newline="")))
ctas = int(sys.argv[2])
warps = ctas * (int(sys.argv[3]) if len(sys.argv) > 3 else 16)
head_i = next(i for i, r in enumerate(rows) if "Source" in r)
head = rows[head_i]
body = [r for r in rows[head_i + 1:] if len(r) == len(head)]
ci, cs, src = head.index("Instructions Executed"), head.index("Warp Stall Sampling (All Samples)"), head.index("Source")


def num(s):
    try:
        return int(s.replace(",", ""))
    except ValueError:
        return 0


total = sum(num(r[ci]) for r in body)
samples = sum(num(r[cs]) for r in body)
print(f"{total} warp instructions ({total / warps:.0f} per warp), {samples} stall samples")
region, instr, samp, ops = 0, 0, 0, collections.Counter()
for line, r in enumerate(body):
    text = r[src].strip()
    n = num(r[ci])
    instr += n
    samp += num(r[cs])
    words = text.split()
    if words:
        ops[(words[1] if words[0].startswith("@") and len(words) > 1 else words[0]).split(".")[0]] += n
    if any(t in text for t in ("BAR.SYNC", "BAR.RED", "PREEXIT", "EXIT")):
        if instr:
            top = ", ".join(f"{op} {c / warps:.0f}" for op, c in ops.most_common(8) if c)
            print(f"region {region} (to line {line}: {text[:32]}): {instr / warps:.0f} per warp, "
                  f"{100 * samp / max(samples, 1):.0f}% of samples; {top}")
        region, instr, samp, ops = region + 1, 0, 0, collections.Counter()
