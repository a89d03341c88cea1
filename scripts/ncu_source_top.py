"""Read scripts/ncu_source.sh's SASS CSV: the instructions with the most warp-stall samples,
each with its largest stall-reason columns, and the samples summed per stall reason.
Usage: python3 scripts/ncu_source_top.py src_TAG.csv [N]"""
import csv
import sys


def num(s):
    try:
        return float(s.replace(",", ""))
    except (AttributeError, ValueError):
        return None


rows = list(csv.reader(open(sys.argv[1], newline="")))
top_n = int(sys.argv[2]) if len(sys.argv) > 2 else 40
head_i = next(i for i, r in enumerate(rows) if any("Source" == c.strip() for c in r))
head = [c.strip() for c in rows[head_i]]
body = [r for r in rows[head_i + 1:] if len(r) == len(head)]
col = {h: i for i, h in enumerate(head)}
samp = next(h for h in head if h.startswith("Warp Stall Sampling (All"))
reasons = [h for h in head if "stall" in h.lower() and h != samp and "Not-issued" not in h]
total = sum(num(r[col[samp]]) or 0 for r in body)
print(f"{len(body)} SASS lines, {total:.0f} samples; columns: {head}")
sums = {h: sum(num(r[col[h]]) or 0 for r in body) for h in reasons}
print("per reason:", ", ".join(f"{h}={v:.0f}" for h, v in sorted(sums.items(), key=lambda t: -t[1]) if v))
addr = next((h for h in head if "Address" in h), head[0])
for idx, r in sorted(enumerate(body), key=lambda t: -(num(t[1][col[samp]]) or 0))[:top_n]:
    s = num(r[col[samp]]) or 0
    rs = sorted(((num(r[col[h]]) or 0, h) for h in reasons), reverse=True)[:3]
    print(f"{idx:5d} {r[col[addr]]:>8} {s:6.0f} {100 * s / max(total, 1):5.1f}%  {r[col['Source']][:60]:60}  "
          + " ".join(f"{h.split('_')[-1] if '_' in h else h}={v:.0f}" for v, h in rs if v))
