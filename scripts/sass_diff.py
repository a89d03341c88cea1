"""Compare the SASS of the kernels in two CUDA objects, instruction by instruction, with the
kernel-parameter constant offsets (c[0x0][...]) normalized: a refactor that compiles to the
same machine code is then shown without a GPU. Kernels are paired by mangled name after
optional regex rewrites of the OLD names (--map 'PATTERN=>REPLACEMENT', applied in order).
Needs cuobjdump and nvdisasm on PATH (the CUDA toolkit, or the PyPI wheels
nvidia-cuda-cuobjdump / nvidia-cuda-nvdisasm, which run on a CPU machine).

    python scripts/sass_diff.py old.o new.o [--map 'gemv_rows_m_kernel=>gemv_rows_kernel' ...]

Kernels in an anonymous namespace carry a hash of the source path (_GLOBAL__N__<hash>_): for
objects built from different paths, map the old hash to the new one first
(--map '_GLOBAL__N__8dbd8d80_=>_GLOBAL__N__33047b72_'; cuobjdump -sass shows both).

Exit status 0 when every paired kernel is identical and none is unpaired."""
import argparse
import re
import subprocess
import sys


def kernels(path):
    sass = subprocess.run(["cuobjdump", "-sass", path], capture_output=True, text=True, check=True).stdout
    out = {}
    for body in re.split(r"\n\s*Function : ", sass)[1:]:
        name = body.split("\n", 1)[0].strip()
        code = re.findall(r"/\*[0-9a-f]{4,6}\*/\s+([^;]*);", body)
        out[name] = [re.sub(r"c\[0x0\]\[0x[0-9a-f]+\]", "c[param]", i) for i in code]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--map", action="append", default=[], help="PATTERN=>REPLACEMENT on old names")
    a = ap.parse_args()
    old, new = kernels(a.old), kernels(a.new)
    renamed = {}
    for name, code in old.items():
        for rule in a.map:
            pat, rep = rule.split("=>", 1)
            name = re.sub(pat, rep, name)
        renamed[name] = code
    same = 0
    bad = [f"only in {a.old}: {n}" for n in renamed if n not in new]
    bad += [f"only in {a.new}: {n}" for n in new if n not in renamed]
    for name in sorted(set(renamed) & set(new)):
        if renamed[name] == new[name]:
            same += 1
        else:
            bad.append(f"differs ({len(renamed[name])} vs {len(new[name])} instructions): {name}")
    print("\n".join(bad))
    print(f"{same} kernels identical, {len(bad)} differing or unpaired")
    return 0 if not bad else 1


if __name__ == "__main__":
    sys.exit(main())
