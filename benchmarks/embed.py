"""Stage 05's embedding of one VLM pair by pair (the loop it had) against each distinct pair once, in one run.

Both embed the same states and (state, candidate) pairs of the offline data
with the same VLM and batch size: first the stage's former loop, copied
here unchanged as the baseline (every pair asked, duplicates included), then
:func:`digiq.stages.embed.embed_rows` (each batch's distinct pairs asked
once, copied to their duplicates). Their outputs are compared bit for bit.
Screenshot loading is inside both figures.

Data: a pipeline root's offline data and candidates (default: this
repository's, from stages 01-02) and a VLM checkpoint (default: stage 04's);
``--states`` takes the first steps only. ``--tiny`` builds its own instead:
noisy-expert rollouts of 12 train tasks, 16 candidates per state drawn like
a peaked policy's (the action taken, then 15 draws from 13 actions with
weights 1/rank: about 7.4 distinct, as stage 02 measures on the pipeline's
data), and a freshly initialised VLM of the pipeline's tiny size.

Last line: ``embed_speedup=<number>`` (pair-by-pair time divided by deduplicated time).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerFast

from digiq.config import EmbedConfig, load_settings
from digiq.data.candidates import read_candidates
from digiq.data.trajectories import TrajectoryStore
from digiq.env.actions import format_action, parse_action, press_back, press_home, tap
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import parse_task
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig
from digiq.paths import Paths
from digiq.rollout import ExpertPolicy, rollout
from digiq.stages.embed import embed_rows, pair_rows, state_rows
from digiq.workers import threads_per_worker

N_CANDIDATES = 16


def pair_by_pair(vlm: ScreenVLM, store: TrajectoryStore, steps: list[dict], cands: list[dict], batch: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """The stage's loop before deduplication, as it was (its files left out): state, candidate and P(Yes) rows."""
    recipe = vlm.recipe
    names = sorted({s["image_path"] for s in steps} | {s["next_image_path"] for s in steps})
    # Each screenshot prepared once. The tiny recipe's are small enough to keep them all; the original's are
    # full-size screenshots (its icon goes on before scaling), so it keeps only the states being embedded.
    keep_all = recipe.name == "tiny"
    base: dict[str, np.ndarray] = {}

    def prepared(paths: list[str]) -> list[np.ndarray]:
        wanted = dict.fromkeys(paths)
        if not keep_all:
            for p in [p for p in base if p not in wanted]:
                del base[p]
        missing = [p for p in wanted if p not in base]
        for i in range(0, len(missing), 64):
            chunk = missing[i : i + 64]
            base.update(zip(chunk, recipe.base([store.load_image(p) for p in chunk]), strict=True))
        return [base[p] for p in paths]

    if keep_all:
        for i in tqdm(range(0, len(names), 64), desc="load screenshots", leave=False):
            prepared(names[i : i + 64])
    state_paths = [s["image_path"] for s in steps] + [s["next_image_path"] for s in steps if s["done"]]
    state_tasks = [s["task"] for s in steps] + [s["task"] for s in steps if s["done"]]
    s_rep_parts = []
    for i in tqdm(range(0, len(state_paths), batch), desc="embed states", leave=False):
        r, _ = vlm.embed([recipe.state(b) for b in prepared(state_paths[i : i + batch])],
                         [recipe.state_question(t) for t in state_tasks[i : i + batch]])  # fmt: skip
        s_rep_parts.append(r)
    s_rep = np.concatenate(s_rep_parts)
    # Candidate images are drawn batch by batch: all of them at once would take gigabytes.
    pairs = [(s, a) for s, c in zip(steps, cands, strict=True) for a in c["action_list"]]
    c_rep_parts, c_yes_parts = [], []
    for i in tqdm(range(0, len(pairs), batch), desc="embed candidates", leave=False):
        chunk = [(s, parse_action(a)) for s, a in pairs[i : i + batch]]
        shown = prepared([s["image_path"] for s, _ in chunk])
        r, y = vlm.embed([recipe.mark(b, a) for b, (_, a) in zip(shown, chunk, strict=True)],
                         [recipe.question(a, s["task"]) for s, a in chunk])  # fmt: skip
        c_rep_parts.append(r)
        c_yes_parts.append(y)
    return s_rep, np.concatenate(c_rep_parts), np.concatenate(c_yes_parts)


def deduplicated(vlm: ScreenVLM, store: TrajectoryStore, steps: list[dict], cands: list[dict], batch: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:  # fmt: skip
    """The stage's rows now: state, candidate and P(Yes) rows, and how many pairs were asked."""
    s_rep, _, _ = embed_rows(vlm, store, state_rows(steps), batch, "embed states")
    c_rep, c_yes, distinct = embed_rows(vlm, store, pair_rows(steps, cands), batch, "embed candidates")
    return s_rep, c_rep, c_yes, distinct


def proposals(taken: str, rng: np.random.Generator) -> list[str]:
    """A state's candidates as a peaked policy samples them: the action taken, then 15 draws that repeat."""
    grid = rng.choice(100, 10, replace=False)  # ten distinct taps on a 10 x 10 grid
    pool = [taken, *(format_action(tap(0.05 + 0.1 * (g // 10), 0.05 + 0.1 * (g % 10))) for g in grid),
            format_action(press_back()), format_action(press_home())]  # fmt: skip
    weights = 1 / np.arange(1, len(pool) + 1)
    return [taken, *(pool[i] for i in rng.choice(len(pool), N_CANDIDATES - 1, p=weights / weights.sum()))]


def tiny_root(root: Path) -> Path:
    """Offline data and candidates in ``root`` (a pipeline root) and a tiny VLM beside them; the VLM's folder."""
    paths = Paths(root)
    width = load_settings().env.width
    tasks = [parse_task(t, "general") for t in generate_tasks("general", "train", 12, seed=3)]
    store = TrajectoryStore(paths.offline)
    rollout(ExpertPolicy(noise=0.3, seed=2), tasks, n_envs=12, seed=1, width=width, store=store)
    steps = store.read().to_pandas()
    rng = np.random.default_rng(0)
    paths.candidates.parent.mkdir(parents=True)
    pq.write_table(pa.table({"traj_id": steps.traj_id, "step_id": steps.step_id,
                             "action_list": [proposals(a, rng) for a in steps.action],
                             "valid_list": [[True] * N_CANDIDATES] * len(steps)}), paths.candidates)  # fmt: skip
    folder = root / "vlm"
    tok: PreTrainedTokenizerFast = train_tokenizer(default_corpus(n_tasks=200))
    ScreenVLM.tiny(tok, VLMConfig(), seed=0).save(folder, stage="benchmark")
    return folder


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", type=Path, default=Paths().root, help="pipeline root with offline data and candidates")
    ap.add_argument("--vlm", type=Path, default=Paths().vlm, help="VLM checkpoint folder")
    ap.add_argument("--tiny", action="store_true", help="build small data and a tiny VLM instead (no pipeline run)")
    ap.add_argument("--states", type=int, default=0, help="the first steps only (0: all)")
    ap.add_argument("--batch", type=int, default=EmbedConfig().batch_size, help="rows per forward pass")
    ap.add_argument("--repeats", type=int, default=3, help="timings of each, alternating; the fastest is kept")
    ap.add_argument("--threads", type=int, default=threads_per_worker(2),
                    help="torch threads (default: a stage 05 worker's, of two)")  # fmt: skip
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        root, folder = (Path(tmp), tiny_root(Path(tmp))) if args.tiny else (args.root, args.vlm)
        paths = Paths(root)
        vlm = ScreenVLM.load(folder)
        store = TrajectoryStore(paths.offline)
        steps = store.read().select(["task", "image_path", "next_image_path", "done"]).to_pylist()
        cands = read_candidates(paths).select(["action_list"]).to_pylist()
        if args.states:
            steps, cands = steps[: args.states], cands[: args.states]
        rows = len(state_rows(steps)) + sum(len(c["action_list"]) for c in cands)
        blank = np.zeros((vlm.cfg.image_size, vlm.cfg.image_size, 3), np.uint8)
        vlm.embed([blank] * 4, ["<image>\nwarm-up"] * 4)  # torch's first call sets itself up: in neither figure
        before, after = [], []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            old = pair_by_pair(vlm, store, steps, cands, args.batch)
            before.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            *new, distinct = deduplicated(vlm, store, steps, cands, args.batch)
            after.append(time.perf_counter() - t0)
        # A pair asked alone is padded to its own width rather than its batch's: why the batches stay as they were.
        alone = [vlm.embed([vlm.recipe.mark(vlm.recipe.base([store.load_image(p)])[0], a)], [vlm.recipe.question(a, t)])[0][0]
                 for p, t, a in pair_rows(steps, cands, 0, 32)]  # fmt: skip
    pairs = len(old[1])
    same = [np.array_equal(a, b) for a, b in zip(old, new, strict=True)]
    print(f"{len(steps)} states, {pairs} pairs, {distinct} distinct in their batches ({distinct / pairs:.1%}); "
          f"batch {args.batch}, torch threads {torch.get_num_threads()}, best of {args.repeats}")  # fmt: skip
    print(f"pair by pair: {min(before):.1f} s, {pairs / min(before):.1f} pairs/s ({rows / min(before):.1f} rows/s "
          f"with the states)")  # fmt: skip
    print(f"deduplicated: {min(after):.1f} s, {pairs / min(after):.1f} pairs/s ({rows / min(after):.1f} rows/s "
          f"with the states)")  # fmt: skip
    print(f"bit-identical (state, candidates, p_yes): {same}")
    print(f"a pair asked alone vs in its batch: max abs difference {np.abs(np.stack(alone) - old[1][:32]).max():.3g}")
    print(f"embed_speedup={min(before) / min(after):.2f}")


if __name__ == "__main__":
    main()
