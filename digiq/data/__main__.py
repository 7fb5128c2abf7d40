"""Command line: ``import-legacy IN.pt OUT_DIR --images DIR --task-set general``, ``start-at STAGE DIR...``,
``upstream STAGE``."""

from __future__ import annotations

import argparse
import json
import sys

from digiq.config import load_settings
from digiq.data.legacy import IMAGE_PREFIX, import_legacy
from digiq.data.start import START_STAGES, place_imported, upstream_stages
from digiq.data.trajectories import DataError
from digiq.paths import Paths


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
    start = sub.add_parser("start-at", help="place imported folders as the outputs of the stages before STAGE")
    start.add_argument("stage", choices=sorted(START_STAGES), help="the first stage to run on the imported data")
    start.add_argument("folders", nargs="+", help="folders written by import-legacy (merged when several)")
    start.add_argument("--root", default=".", help="the pipeline root holding params.yaml and data/ (.)")
    up = sub.add_parser("upstream", help="the stages to run before `dvc repro --downstream STAGE` on imported data")
    up.add_argument("stage", choices=sorted(START_STAGES), help="the first stage to run on the imported data")
    args = parser.parse_args(argv)
    if args.command == "upstream":
        print(" ".join(upstream_stages(args.stage)))
        return 0
    try:
        if args.command == "import-legacy":
            summary = import_legacy(args.src, args.out, args.images, task_set=args.task_set,
                                    trust_pickle=args.trust_pickle, gamma=args.gamma)  # fmt: skip
        else:
            paths = Paths(args.root)
            settings = load_settings(paths.root / "params.yaml")
            summary = place_imported(args.folders, paths, args.stage, settings)
            summary["next"] = [
                f"dvc repro --single-item {' '.join(upstream_stages(args.stage))}",
                f"dvc repro --downstream {args.stage}",
            ]
    except DataError as e:
        print(f"{args.command}: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
