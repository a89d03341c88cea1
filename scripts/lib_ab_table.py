"""Tables of a library A/B (scripts/lib_ab.sh): for each M and kernel column, us per call of
every (shape, k) cell, one column per library and round, and the dense TOTAL of the best
kernel per cell, so that rounds of one library show the run-to-run spread.
Usage: python scripts/lib_ab_table.py name=run.json [name=run.json ...]"""
import json
import sys

runs = []
for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    try:
        runs.append((name, json.load(open(path))["linear"]))
    except (OSError, KeyError, ValueError) as e:
        print(f"{arg}: unreadable ({e})")
if not runs:
    sys.exit(1)
cells = sorted({key for _, r in runs for key in r["kbit_us"]},
               key=lambda s: (int(s.split(",")[0]), s.split(",")[2], s.split(",")[1]))
kernels = sorted({kern for _, r in runs for v in r["kbit_us"].values() for kern in v})
labels = [f"{name}#{sum(1 for n, _ in runs[:i + 1] if n == name)}" for i, (name, _) in enumerate(runs)]
for kern in kernels:
    rows = [c for c in cells if any(kern in r["kbit_us"].get(c, {}) for _, r in runs)]
    if not rows:
        continue
    print(f"\n{kern}: us per call")
    print("| M,shape,k | " + " | ".join(labels) + " |")
    for c in rows:
        vals = [r["kbit_us"].get(c, {}).get(kern) for _, r in runs]
        print(f"| {c} | " + " | ".join("-" if v is None else f"{v:.2f}" for v in vals) + " |")
print("\nBest of the kernels per cell, dense TOTAL (gateup+down+Q+O+KV): kbit us (fp16 / kbit)")
ms = sorted({int(c.split(",")[0]) for c in cells})
ks = sorted({int(c.split(",")[2]) for c in cells})
print("| M,k | " + " | ".join(labels) + " |")
for m in ms:
    for k in ks:
        out = []
        for _, r in runs:
            shapes = [s for s in ("gateup", "down", "Q", "O", "KV") if f"{m},{s},{k}" in r["kbit_us"]]
            if len(shapes) < 5:
                out.append("-")
                continue
            kb = sum(min(r["kbit_us"][f"{m},{s},{k}"].values()) for s in shapes)
            fp = sum(r["fp16_us"][f"{m},{s}"] for s in shapes)
            out.append(f"{kb:.1f} ({fp / kb:.2f}x)")
        print(f"| {m},{k} | " + " | ".join(out) + " |")
