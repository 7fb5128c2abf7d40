"""Command line: ``python -m digiq.data import-legacy IN.pt OUT_DIR --images DIR --task-set general``."""

from __future__ import annotations

import argparse
import json
import sys

from digiq.data.legacy import IMAGE_PREFIX, import_legacy
from digiq.data.trajectories import DataError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m digiq.data", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    imp = sub.add_parser("import-legacy", help="convert a released Digi-Q or DigiRL .pt file into a dataset folder")
    imp.add_argument("src", help="the released .pt file")
    imp.add_argument("out", help="an empty folder for the dataset (steps, images, candidates, features)")
    imp.add_argument("--images", required=True, help=f"local folder that replaces the {IMAGE_PREFIX} prefix")
    imp.add_argument("--task-set", required=True, choices=("general", "webshop"), help="which AitW set the file is")
    imp.add_argument("--trust-pickle", action="store_true",
                     help="allow unpickling the file (it can run code: only for files from a trusted source)")  # fmt: skip
    imp.add_argument("--gamma", type=float, default=0.95, help="discount for MC returns a file lacks (0.95)")
    args = parser.parse_args(argv)
    try:
        summary = import_legacy(args.src, args.out, args.images, task_set=args.task_set,
                                trust_pickle=args.trust_pickle, gamma=args.gamma)  # fmt: skip
    except DataError as e:
        print(f"import-legacy: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
