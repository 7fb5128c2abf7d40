"""A run of stage 00 or of the tasks stage killed at any point, outside DVC, then its output loaded: the previous
output whole, the new one whole, or a refusal naming the output, never a mix of the two runs' files.

A stage runs in a fresh interpreter (:data:`RUN`) whose audit hook (:func:`sys.addaudithook`) sees every file
operation Python makes under the stage's output (an open for writing, a rename, a removal, a folder made) and
every call into C through ctypes (the atomic exchange of :func:`digiq.io.swap_in`), and, just before each, copies
the output and its hidden siblings as they lie on disk: what a SIGKILL at that instant leaves, since what a
killed process had not yet handed to the system is lost with it. Writes done in Rust (safetensors, tokenizers)
are not seen themselves; the next operation Python makes copies what they left. Each copy is then loaded.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from digiq.data.task_lists import read_tasks
from digiq.env.tasks import TASK_SETS
from digiq.io import StageError
from digiq.models.policy import AutoUIPolicy
from digiq.paths import ROOT, Paths

SPLITS = ("train", "val", "test")

# argv: stage (base_policy | tasks), root, snapshot folder, then "exchange" or "fallback" (swap_in as on a file
# system without an atomic exchange), then "copy" (a copy before every operation) or "kill-in-swap" (SIGKILL as
# the new output is renamed into place: with the fallback, after the old one was moved aside).
RUN = r"""
import os, shutil, signal, sys
from pathlib import Path

stage, root, snaps, swap, mode = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4], sys.argv[5]

import digiq.io
from digiq.paths import Paths

if swap == "fallback":
    digiq.io._RENAMEAT2 = None
paths = Paths(root)
watch = paths.base_policy if stage == "base_policy" else paths.tasks
writes = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND


def ours(name):
    return (name == watch.name or name.startswith(f".{watch.name}.")) and not name.endswith(".lock")


def state():
    out = []
    for entry in sorted(p for p in watch.parent.iterdir() if ours(p.name)) if watch.parent.exists() else []:
        for d, dirs, files in os.walk(entry):
            for f in sorted(files):
                st = os.stat(os.path.join(d, f))
                out.append((os.path.relpath(os.path.join(d, f), watch.parent), st.st_size, st.st_mtime_ns))
            out.append((os.path.relpath(d, watch.parent), -1, 0))
        if entry.is_file():
            out.append((entry.name, entry.stat().st_size, entry.stat().st_mtime_ns))
    return out


busy, last, n = False, None, 0


def snapshot():
    global busy, last, n
    busy = True
    try:
        now = state()
        if now != last:
            last, n = now, n + 1
            target = snaps / f"{n:04d}" / watch.parent.relative_to(root)
            target.mkdir(parents=True)
            for entry in watch.parent.iterdir():
                if ours(entry.name):
                    copy = shutil.copytree if entry.is_dir() else shutil.copy2
                    copy(entry, target / entry.name)
    finally:
        busy = False


def relevant(path):
    if isinstance(path, int):
        return False
    p = Path(os.path.abspath(os.fsdecode(path)))
    return watch.parent in p.parents and ours(p.relative_to(watch.parent).parts[0])


def hook(event, args):
    if busy:
        return
    if mode == "kill-in-swap":
        if event == "os.rename" and Path(os.fsdecode(args[1])) == watch and ".tmp-" in os.fsdecode(args[0]):
            os.kill(os.getpid(), signal.SIGKILL)
        return
    if event == "open":
        path, how, flags = args
        writing = any(c in (how or "") for c in "wax+") or (how is None and flags & writes)
        if writing and relevant(path):
            snapshot()
    elif event in ("os.rename", "os.remove", "os.rmdir", "os.mkdir", "shutil.rmtree", "os.unlink"):
        if relevant(args[0]) or event == "os.rename" and relevant(args[1]):
            snapshot()
    elif event == "ctypes.call_function":
        snapshot()


if stage == "base_policy":
    from digiq.config import BasePolicyConfig, EnvConfig
    from digiq.env.taskgen import generate_tasks
    from digiq.stages.base_policy import run_base_policy

    for ts in ("general", "webshop"):
        paths.task_list(ts, "train").parent.mkdir(parents=True, exist_ok=True)
        paths.task_list(ts, "train").write_text("\n".join(generate_tasks(ts, "train", 2, seed=3)) + "\n")
    tiny = dict(demo_tasks=1, d_model=16, num_layers=1, vocab_size=500, batch_size=8)

    def run(new):
        # Another seed, and another number of steps in the config: every file of the two runs differs.
        cfg = BasePolicyConfig(seed=2 if new else 1, epochs=2 if new else 1, **tiny)
        run_base_policy(cfg, EnvConfig(), paths)
else:
    import yaml
    from digiq.env.__main__ import generate_task_lists

    params = root / "params.yaml"

    def run(new):
        doc = yaml.safe_load(params.read_text())
        doc["tasks"].update(n_train=4, n_val=3, n_test=3, n_test_webshop=4, seed=1 if new else 0)
        params.write_text(yaml.safe_dump(doc))
        generate_task_lists(root)

run(new=False)
snapshot()  # the previous output: copy 0001
if mode == "kill-in-swap":
    sys.addaudithook(hook)
    run(new=True)
    sys.exit("the run was not killed: no swap of " + str(watch))
sys.addaudithook(hook)
run(new=True)
snapshot()  # the new output: the last copy
"""


def _run(stage: str, root: Path, snaps: Path, swap: str, mode: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TQDM_DISABLE": "1"}
    return subprocess.run([sys.executable, "-c", RUN, stage, str(root), str(snaps), swap, mode], env=env,
                          capture_output=True, text=True, timeout=600)  # fmt: skip


def _checkpoint(folder: Path) -> dict[str, object]:
    """A loaded checkpoint's files: what tells one run's output from another's."""
    config = json.loads((folder / "config.json").read_text())
    config.pop("digests", None)
    return {"config": config, "weights": (folder / "model.safetensors").read_bytes(),
            "tokenizer": {p.name: p.read_bytes() for p in sorted((folder / "tokenizer").iterdir())}}  # fmt: skip


def _load_policy(root: Path) -> dict[str, object]:
    folder = Paths(root).base_policy
    AutoUIPolicy.load(folder)
    return _checkpoint(folder)


def _load_tasks(root: Path) -> dict[str, object]:
    return {f"{ts}_{split}": [t.instruction for t in read_tasks(Paths(root), ts, split, None, "kill test")]
            for ts in TASK_SETS for split in SPLITS}  # fmt: skip


LOAD = {"base_policy": _load_policy, "tasks": _load_tasks}
OUTPUT = {"base_policy": lambda p: p.base_policy, "tasks": lambda p: p.tasks}


def _verdicts(stage: str, snaps: Path) -> dict[str, list[str]]:
    """Each copy as ``old``, ``new``, ``refused`` (an error naming the output) or ``mix``, with the copies' names."""
    copies = sorted(snaps.iterdir())
    old, new = LOAD[stage](copies[0]), LOAD[stage](copies[-1])
    assert all(old[k] != new[k] for k in old), "the two runs must differ in every part for a mix to show"
    out: dict[str, list[str]] = {"old": [], "new": [], "refused": [], "mix": []}
    for copy in copies:
        try:
            got = LOAD[stage](copy)
        except (OSError, ValueError, StageError) as e:
            assert str(OUTPUT[stage](Paths(copy))) in str(e), f"copy {copy.name}: a refusal not naming the output: {e}"
            out["refused"].append(f"{copy.name}: {e}")
            continue
        verdict = "old" if got == old else "new" if got == new else "mix"
        mixed = sorted(k for k in got if got[k] == old[k]) if verdict == "mix" else []
        out[verdict].append(f"{copy.name}" + (f" (old: {mixed})" if mixed else ""))
    return out


def _tasks_root(tmp_path: Path) -> Path:
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(ROOT / "params.yaml", root / "params.yaml")
    shutil.copytree(ROOT / "params", root / "params")
    return root


@pytest.mark.parametrize("swap", ["exchange", "fallback"])
@pytest.mark.parametrize("stage", [pytest.param("base_policy", marks=pytest.mark.slow), "tasks"])  # slow: two SFTs
def test_a_run_killed_at_any_point_leaves_the_old_output_whole_or_a_named_refusal(stage, swap, tmp_path):
    root = _tasks_root(tmp_path) if stage == "tasks" else tmp_path / "root"
    done = _run(stage, root, tmp_path / "copies", swap, "copy")
    assert done.returncode == 0, done.stderr[-3000:]
    verdicts = _verdicts(stage, tmp_path / "copies")
    assert verdicts["mix"] == [], verdicts
    assert len(verdicts["old"]) > 1 and verdicts["new"], verdicts  # kill points before the swap, and after it
    if swap == "exchange":  # the swap is one step: the output is never missing
        assert verdicts["refused"] == [], verdicts
    else:  # between the fallback's two renames: no output, and the message says where the old one lies
        assert all("was cut short, and the previous" in r for r in verdicts["refused"]), verdicts
    leftovers = [p.name for p in OUTPUT[stage](Paths(root)).parent.iterdir() if ".tmp-" in p.name or ".old-" in p.name]
    assert leftovers == []


def test_a_rerun_after_a_kill_in_the_swap_writes_the_output_whole_and_clears_what_the_kill_left(tmp_path):
    """A real SIGKILL of the tasks stage between the fallback swap's two renames: the lists are missing, the refusal
    names where the old ones lie whole, and the next run writes the new ones whole and leaves nothing beside them."""
    root = _tasks_root(tmp_path)
    paths = Paths(root)
    killed = _run("tasks", root, tmp_path / "copies", "fallback", "kill-in-swap")
    assert killed.returncode == -9, killed.stderr[-3000:]
    old = _load_tasks(tmp_path / "copies" / "0001")
    assert not paths.tasks.exists()
    with pytest.raises(StageError, match=rf"missing input {paths.tasks}.*the previous tasks lies whole at "
                                         rf"{paths.tasks.parent}/\.tasks\.old-"):  # fmt: skip
        _load_tasks(root)
    done = subprocess.run([sys.executable, "-m", "digiq.env", "generate-task-lists", "--root", str(root)],
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr
    new = _load_tasks(root)
    assert all(new[k] != old[k] for k in old)
    assert sorted(p.name for p in paths.data.iterdir()) == [".tasks.lock", "tasks"]
