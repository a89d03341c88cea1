"""The `kbit` command: `kbit bench` (the main job) and `kbit info`."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="kbit", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("info", help="print the build and device status")
    bench = sub.add_parser("bench", help="benchmark the kbit ops on the GPU (cold L2, CUDA graphs)")
    from .bench import add_arguments

    add_arguments(bench)
    args = parser.parse_args(argv)
    if args.command == "info":
        import torch

        import kbit

        print(f"kbit {kbit.__version__}, torch {torch.__version__}")
        print(kbit.native_status())
        if torch.cuda.is_available():
            for i in range(torch.cuda.device_count()):
                p = torch.cuda.get_device_properties(i)
                print(f"cuda:{i}: {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs")
        else:
            print("no CUDA device visible")
        return 0
    from .bench import run

    return run(args)


if __name__ == "__main__":
    sys.exit(main())
