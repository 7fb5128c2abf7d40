"""Command line: ``python -m digiq.viz render-demo OUT.png``: one expert episode per task family as a contact sheet."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from PIL import Image

from digiq.env.expert import Expert, run_episode
from digiq.env.gym_env import AndroidSimEnv
from digiq.env.taskgen import FAMILY_WEIGHTS, generate_tasks
from digiq.env.tasks import Task, parse_task
from digiq.io import atomic_path
from digiq.viz.draw import contact_sheet, draw_action


def render_demo(out: str, seed: int, width: int, max_frames: int) -> None:
    """A contact sheet of one expert episode per task family."""
    env = AndroidSimEnv(width=width)
    rows = []
    for task_set, weights in FAMILY_WEIGHTS.items():
        for fam in weights:
            instruction = generate_tasks(task_set, "train", 1, seed=seed, families=[fam])[0]
            task: Task = parse_task(instruction, task_set)
            frames: list[Image.Image] = []
            ok, steps = run_episode(
                env, task, seed, Expert(), on_step=lambda shot, a, out=frames: out.append(draw_action(shot, a))
            )
            frames.append(Image.fromarray(env.device.screenshot()))  # where the episode ended
            rows.append(
                (f"[{fam}] {instruction} -> {'success' if ok else 'failed'} in {steps} steps", frames[:max_frames])
            )
    with atomic_path(Path(out)) as tmp:
        contact_sheet(rows).save(tmp, format="PNG")
    print(f"wrote {out}: {len(rows)} episodes")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m digiq.viz", description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("render-demo", help="contact sheet of one expert episode per family")
    r.add_argument("out")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--width", type=int, default=162)
    r.add_argument("--max-frames", type=int, default=9)
    args = ap.parse_args(argv)
    render_demo(args.out, args.seed, args.width, args.max_frames)
    return 0


if __name__ == "__main__":
    sys.exit(main())
