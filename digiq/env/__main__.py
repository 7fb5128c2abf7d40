"""Command line: ``python -m digiq.env {check-tasks,generate-tasks,generate-task-lists,adb-server}``."""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from digiq.config import ConfigError, TasksConfig, load_settings
from digiq.env.adb_server import IDLE_TIMEOUT_S, AdbSimServer
from digiq.env.expert import Expert, run_episode
from digiq.env.gym_env import AndroidSimEnv
from digiq.env.state import Dynamics
from digiq.env.taskgen import FAMILY_WEIGHTS, PROTOCOL_TASKS, SPLITS, generate_tasks
from digiq.env.tasks import UnsupportedInstruction, parse_task
from digiq.io import StageError, atomic_folder, atomic_write_text, clear_leftovers, write_error
from digiq.lock import stage_lock
from digiq.paths import Paths


def check_tasks(files: list[str], task_set: str | None, seed: int, metrics: str | None = None) -> dict[str, Any]:
    """Parse every line of ``files`` and have the noiseless expert solve each parsed task.

    With ``metrics``, also writes per list its size, distinct instructions and family shares: what the
    protocol asks of test lists (AitW's family mix, at least 300 distinct tasks) can be read off there.
    """
    env = AndroidSimEnv(width=108)  # the expert reads widgets, not pixels: render small
    lines_by_family: Counter[str] = Counter()
    solved_by_family: Counter[str] = Counter()
    total = parsed = solved = 0
    unsupported: list[str] = []
    lists: dict[str, dict[str, Any]] = {}
    for path in files:
        try:
            lines = Path(path).read_text(encoding="utf-8").splitlines()
        except OSError as e:
            raise SystemExit(f"check-tasks: cannot read task list {path}: {e.strerror}") from None
        families: Counter[str] = Counter()
        for i, line in enumerate(lines):
            if not line.strip():
                continue
            total += 1
            try:
                task = parse_task(line, task_set)
            except UnsupportedInstruction as e:
                unsupported.append(f"{path}:{i + 1}: {e}")
                continue
            parsed += 1
            families[task.family] += 1
            ok, _ = run_episode(env, task, seed + i, Expert())
            solved += ok
            solved_by_family[task.family] += ok
        lines_by_family.update(families)
        listed = [ln for ln in lines if ln.strip()]
        lists[Path(path).name] = {
            "tasks": len(listed),
            "distinct": len(set(listed)),
            "family_share": {f: round(n / max(1, len(listed)), 4) for f, n in sorted(families.items())},
        }
    print(f"{'family':<16}{'tasks':>8}{'expert solved':>16}")
    for fam, n in sorted(lines_by_family.items()):
        print(f"{fam:<16}{n:>8}{solved_by_family[fam]:>16}")
    for msg in unsupported[:20]:
        print(f"unsupported: {msg}")
    if len(unsupported) > 20:
        print(f"... and {len(unsupported) - 20} more unsupported lines")
    result: dict[str, Any] = {"total": total, "parsed": parsed, "expert_success": solved}
    if metrics:
        out = {
            **result,
            "by_family": {
                f: {"tasks": n, "expert_success": solved_by_family[f]} for f, n in sorted(lines_by_family.items())
            },
            "lists": lists,
        }
        atomic_write_text(Path(metrics), json.dumps(out, indent=2) + "\n")
    print(json.dumps(result))
    return result


def generate_task_lists(root: Path) -> None:
    """The tasks stage: every task list as ``params.yaml``'s ``tasks`` group sets it, then their check.

    The group is read through its typed config (:func:`digiq.config.load_settings`), never pasted into a
    shell command: a value that is not a number in its range stops the stage, naming the file and the key,
    before anything runs. Writes ``data/tasks/{general,webshop}_{train,val,test}.txt`` and, from
    :func:`check_tasks`, ``metrics/tasks.json``, holding the stage's lock (:mod:`digiq.lock`) meanwhile.
    The lists are written together into a temporary folder swapped in for ``data/tasks`` whole
    (:func:`digiq.io.atomic_folder`): a run cut short leaves the previous lists, never new train lists
    beside old test lists.
    """
    paths = Paths(root)
    try:
        cfg = load_settings(paths.root / "params.yaml").tasks
        with stage_lock(paths.lock("tasks"), "tasks"):
            clear_leftovers(paths.tasks)  # what runs cut short left beside the lists: the lock says they are dead
            lists = []
            with atomic_folder(paths.tasks) as tmp:
                for split in SPLITS:
                    for task_set in FAMILY_WEIGHTS:
                        test = cfg.n_test if task_set == "general" else cfg.n_test_webshop
                        n = {"train": cfg.n_train, "val": cfg.n_val, "test": test}[split]
                        out = paths.task_list(task_set, split)
                        lines = generate_tasks(task_set, split, n, cfg.seed, cfg.split_seed)
                        try:  # plainly: the folder is swapped in whole
                            (tmp / out.name).write_text("\n".join(lines) + "\n", encoding="utf-8")
                        except OSError as e:
                            raise write_error(out, e) from None
                        print(f"wrote {len(lines)} {task_set} {split} tasks to {out}")
                        lists.append(str(out))
            check_tasks(lists, None, 0, str(paths.metrics / "tasks.json"))
    except (ConfigError, StageError) as e:
        raise SystemExit(f"generate-task-lists: {e}") from None


def adb_server(host: str, port: int, devices: int, width: int, calm: bool, idle_timeout_s: float,
               max_connections: int | None) -> None:  # fmt: skip
    """Serve simulated phones over adb's protocol until interrupted or sent ``adb kill-server``."""
    try:
        server = AdbSimServer(devices, dynamics=Dynamics.calm() if calm else None, width=width, host=host, port=port,
                              idle_timeout_s=idle_timeout_s, max_connections=max_connections)  # fmt: skip
    except ValueError as e:  # a count or time-out out of range
        raise SystemExit(f"adb-server: {e}") from None
    except OSError as e:
        raise SystemExit(
            f"adb-server: cannot listen on {host}:{port}: {e.strerror} (is an adb server running?)"
        ) from None
    with server:
        print(
            f"adb server (digiq simulator) on {host}:{server.port} with {devices} phone(s): {' '.join(server.serials)}"
        )
        print(f"point adb tools at it: ANDROID_ADB_SERVER_PORT={server.port} adb devices -l", flush=True)
        try:
            server.wait_closed()
        except KeyboardInterrupt:
            pass


def _count(text: str) -> int:
    """argparse type: a task count, named in the error when negative or not a number."""
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number of tasks, got {text!r}") from None
    if n < 0:
        raise argparse.ArgumentTypeError(f"the number of tasks must be >= 0, got {n}")
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m digiq.env", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("check-tasks", help="coverage of task lists: parsed per family, solved by the expert")
    c.add_argument("files", nargs="+")
    c.add_argument(
        "--task-set",
        choices=["general", "webshop"],
        default=None,
        help="step limit to use (default: webshop for 'Go to SITE' lines, else general)",
    )
    c.add_argument("--seed", type=int, default=0)
    c.add_argument("--metrics", help="also write the counts, per family too, to this JSON file")
    g = sub.add_parser("generate-tasks", help="write an AitW-style task list")
    g.add_argument("out")
    g.add_argument("--task-set", choices=sorted(FAMILY_WEIGHTS), required=True)
    g.add_argument("--split", choices=list(SPLITS), required=True)
    g.add_argument("-n", type=_count, default=PROTOCOL_TASKS, help="how many tasks (>= 0)")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--split-seed", type=int, default=TasksConfig().split_seed,
                   help="which entities are in which split (default: the pipeline's, tasks.split_seed)")  # fmt: skip
    t = sub.add_parser("generate-task-lists", help="the tasks stage: every task list as params.yaml's tasks group "
                       "sets it, and their check into metrics/tasks.json")  # fmt: skip
    t.add_argument("--root", default=".", help="pipeline root: params.yaml there, the lists in data/tasks/ "
                   "(default: the working directory, where DVC runs a stage)")  # fmt: skip
    s = sub.add_parser("adb-server", help="serve simulated phones over adb's host protocol (for adb tools and adb-sim)")
    s.add_argument("--host", default="127.0.0.1")
    s.add_argument("--port", type=int, default=5037, help="5037 is adb's own port; 0 picks a free one")
    s.add_argument("--devices", type=int, default=2, help="how many simulated phones")
    s.add_argument("--width", type=int, default=216, help="width of `screencap -p` PNGs (`wm size` says 1080x2280)")
    s.add_argument("--calm", action="store_true", help="no dialogs, late loads, jitter or ads")
    s.add_argument("--idle-timeout", type=float, default=IDLE_TIMEOUT_S,
                   help="seconds a connection may stay silent before it is closed and its thread freed")  # fmt: skip
    s.add_argument("--max-connections", type=int, default=None,
                   help="connections served at once, adb and console ports together; one more is refused "
                        "(default: 16 + 4 per phone)")  # fmt: skip
    args = ap.parse_args(argv)
    if args.cmd == "check-tasks":
        check_tasks(args.files, args.task_set, args.seed, args.metrics)
    elif args.cmd == "generate-task-lists":
        generate_task_lists(Path(args.root))
    elif args.cmd == "adb-server":
        adb_server(args.host, args.port, args.devices, args.width, args.calm, args.idle_timeout, args.max_connections)
    else:
        lines = generate_tasks(args.task_set, args.split, args.n, args.seed, args.split_seed)
        atomic_write_text(Path(args.out), "\n".join(lines) + "\n")
        print(f"wrote {len(lines)} {args.task_set} {args.split} tasks to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
