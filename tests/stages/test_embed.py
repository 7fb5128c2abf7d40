"""Stage 05: each distinct (state, candidate) embedded once, in jobs of whole batches, with the bytes of pair by pair.

The reference is the stage's loop before deduplication: every row of every
batch of ``batch_size`` rows, counted from the first, shown to the VLM with
its screenshot prepared alone. Row ``i`` of the stage's files must equal it
exactly, duplicates included.
"""

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch
from transformers import PreTrainedTokenizerFast

from digiq.config import ComputeConfig, EmbedConfig
from digiq.data.candidates import read_candidates
from digiq.data.features import load_features
from digiq.data.trajectories import DataError, TrajectoryStore
from digiq.env.actions import format_action, press_back, tap
from digiq.models.vlm import ScreenVLM, VLMConfig
from digiq.paths import Paths
from digiq.stages.embed import load_vlm, pair_rows, run_embed, state_rows
from digiq.workers import threads_per_worker

N = 5  # candidates per state
TAP = format_action(tap(0.25, 0.75))
# The same tap written otherwise: another string, the same parsed action, so the same VLM input.
TAP_AGAIN = TAP.replace("0.2500", "0.25")


@pytest.fixture
def embed_root(values_root, tmp_path) -> Paths:
    """The small pipeline root's offline data, candidates with duplicates, and a tiny VLM on the base's tokenizer."""
    paths = Paths(tmp_path)
    shutil.copytree(Paths(values_root).offline, paths.offline)
    shutil.copytree(Paths(values_root).base_policy, paths.base_policy)
    steps = TrajectoryStore(paths.offline).read().to_pandas()
    lists = [[a, TAP, a, TAP_AGAIN, format_action(press_back())] for a in steps.action]
    paths.candidates.parent.mkdir(parents=True)
    pq.write_table(pa.table({"traj_id": steps.traj_id, "step_id": steps.step_id, "action_list": lists,
                             "valid_list": [[True] * N] * len(steps)}), paths.candidates)  # fmt: skip
    tok = PreTrainedTokenizerFast.from_pretrained(paths.base_policy / "tokenizer")
    cfg = VLMConfig(image_size=32, patch_size=8, vision_hidden=16, hidden=32, heads=2)
    ScreenVLM.tiny(tok, cfg, seed=1).save(paths.vlm, stage="vlm_finetune")
    return paths


def pair_by_pair(paths: Paths, name: str, batch: int) -> dict[str, np.ndarray]:
    """The stage's rows as the loop without deduplication made them: every row asked, batch by batch."""
    vlm = load_vlm(paths, name)
    recipe, store = vlm.recipe, TrajectoryStore(paths.offline)
    steps = store.read().to_pylist()
    cands = read_candidates(paths).to_pylist()

    def embed(rows: list) -> tuple[np.ndarray, np.ndarray]:
        parts = []
        for i in range(0, len(rows), batch):
            chunk = rows[i : i + batch]
            bases = [recipe.base([store.load_image(p)])[0] for p, _, _ in chunk]
            parts.append(vlm.embed([recipe.state(b) if a is None else recipe.mark(b, a) for b, (_, _, a) in zip(bases, chunk)],
                                   [recipe.state_question(t) if a is None else recipe.question(a, t) for _, t, a in chunk]))  # fmt: skip
        return np.concatenate([r for r, _ in parts]), np.concatenate([y for _, y in parts])

    s_rep, _ = embed(state_rows(steps))
    c_rep, c_yes = embed(pair_rows(steps, cands))
    S = len(steps)
    final = iter(s_rep[S:])
    next_state = np.stack([next(final) if s["done"] else s_rep[i + 1] for i, s in enumerate(steps)])
    return {"state": s_rep[:S], "next_state": next_state, "candidates": c_rep.reshape(S, N, -1),
            "p_yes": c_yes.reshape(S, N)}  # fmt: skip


def test_each_distinct_pair_is_embedded_once_and_every_row_is_the_pair_by_pair_one(embed_root):
    paths, batch = embed_root, 2 * N  # whole states per batch: a state's duplicates share one forward pass
    metrics = run_embed(EmbedConfig(batch_size=batch), paths, ["finetuned", "untuned"])
    S = metrics["states"]
    steps = TrajectoryStore(paths.offline).read().to_pylist()
    distinct = sum(len(set(pair_rows(steps, read_candidates(paths).to_pylist())[i : i + batch]))
                   for i in range(0, S * N, batch))  # fmt: skip
    assert metrics["distinct_pairs"] == distinct <= 3 * S  # "a" twice and the tap twice: at most 3 of 5 asked
    for name in ("finetuned", "untuned"):
        got, want = load_features(paths, name), pair_by_pair(paths, name, batch)
        for key, arr in want.items():
            assert np.array_equal(got[key], arr), (name, key)
        c = got["candidates"]
        assert np.array_equal(c[:, 0], c[:, 2]) and np.array_equal(c[:, 1], c[:, 3])  # twins, copied
        assert not np.array_equal(c[:, 0], c[:, 4])  # the rows differ: equality above is not vacuous
    assert not np.array_equal(load_features(paths)["candidates"], load_features(paths, "untuned")["candidates"])


@pytest.mark.slow  # worker processes, each loading torch
def test_jobs_in_workers_cut_at_batches_write_the_same_bytes(embed_root):
    """Batches that split states, several jobs per VLM in two processes: still every row pair by pair's."""
    paths, batch = embed_root, 7
    run_embed(EmbedConfig(batch_size=batch), paths, ["finetuned"], ComputeConfig(workers=2))
    threads = torch.get_num_threads()
    torch.set_num_threads(threads_per_worker(2))  # the workers' own: float sums may differ with the thread count
    try:
        want = pair_by_pair(paths, "finetuned", batch)
    finally:
        torch.set_num_threads(threads)
    got = load_features(paths)
    for key, arr in want.items():
        assert np.array_equal(got[key], arr), key


def test_candidate_lists_of_different_lengths_are_named(embed_root):
    table = pq.read_table(embed_root.candidates)
    lists = table.column("action_list").to_pylist()
    lists[1] = lists[1][:-1]
    pq.write_table(table.set_column(2, "action_list", pa.array(lists)), embed_root.candidates)
    with pytest.raises(DataError, match=f"different lengths; every state needs {N}"):
        run_embed(EmbedConfig(batch_size=4), embed_root)
    assert not Path(embed_root.features()).exists()
