"""A checkpoint is saved whole and loaded only whole: its tokenizer, weights and config from one save, or refused by
name; a swap cut between its two renames is named, and put back by the next run of the stage."""

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

import digiq.io
from digiq.io import StageError, atomic_folder, clear_leftovers, require
from digiq.models.critic import Critic, CriticNetConfig
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig
from digiq.pae.learned import LearnedEvaluator


@pytest.fixture(scope="module")
def toks():
    """Two tokenizers of one size from other text: either fits the other's weights, which is what hides a mix."""
    a, b = (train_tokenizer(default_corpus(n_tasks=60, seed=s), vocab_size=500) for s in (1, 2))
    assert len(a) == len(b) and a.get_vocab() != b.get_vocab()
    return a, b


def _policy(tok, seed: int) -> AutoUIPolicy:
    torch.manual_seed(seed)
    return AutoUIPolicy(PolicyConfig(d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1, image_dim=16), tok)


def test_a_save_replaces_the_folder_whole_and_records_its_parts_digests(toks, tmp_path):
    folder = tmp_path / "policy"
    folder.mkdir()
    (folder / "stale.txt").write_text("a file of an earlier save")
    _policy(toks[0], 0).save(folder, stage="test")
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors", "tokenizer"]
    assert sorted(json.loads((folder / "config.json").read_text())["digests"]) == ["model.safetensors", "tokenizer"]
    assert [p.name for p in tmp_path.iterdir()] == ["policy"]  # no temporary folder left beside it
    AutoUIPolicy.load(folder)


def test_a_tokenizer_or_weights_from_another_save_are_refused_by_name(toks, tmp_path):
    one, other = tmp_path / "one", tmp_path / "other"
    _policy(toks[0], 0).save(one)
    _policy(toks[1], 1).save(other)
    mixed = shutil.copytree(one, tmp_path / "mixed")
    shutil.rmtree(mixed / "tokenizer")
    shutil.copytree(other / "tokenizer", mixed / "tokenizer")
    with pytest.raises(ValueError, match=rf"checkpoint {mixed}: its tokenizer is not the one its weights were saved "
                                         rf"with: {mixed / 'config.json'} records SHA-256 \w+\.\.\., "
                                         rf"{mixed / 'tokenizer'} has \w+\.\.\."):  # fmt: skip
        AutoUIPolicy.load(mixed)
    mixed = shutil.copytree(one, tmp_path / "mixed_weights")
    shutil.copy(other / "model.safetensors", mixed / "model.safetensors")
    with pytest.raises(ValueError, match=rf"cannot load the weights {mixed / 'model.safetensors'}: they are not the "
                                         "ones saved with its config"):  # fmt: skip
        AutoUIPolicy.load(mixed)


def test_a_checkpoint_saved_before_digests_were_kept_loads_unchecked(toks, tmp_path):
    """Outputs DVC tracks were saved without digests: they stay loadable, as they were."""
    folder = tmp_path / "policy"
    _policy(toks[0], 0).save(folder)
    config = json.loads((folder / "config.json").read_text())
    del config["digests"]
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    shutil.rmtree(folder / "tokenizer")
    toks[1].save_pretrained(folder / "tokenizer")
    assert AutoUIPolicy.load(folder).tokenizer.get_vocab() == toks[1].get_vocab()


def test_the_critics_and_the_vlms_weights_and_tokenizer_are_checked_too(toks, tmp_path):
    torch.manual_seed(0)
    Critic(CriticNetConfig(feature_dim=8, hidden=16)).save(tmp_path / "c1")
    Critic(CriticNetConfig(feature_dim=8, hidden=16)).save(tmp_path / "c2")
    shutil.copy(tmp_path / "c2" / "model.safetensors", tmp_path / "c1" / "model.safetensors")
    with pytest.raises(ValueError, match="they are not the ones saved with its config"):
        Critic.load(tmp_path / "c1")
    vlm = ScreenVLM.tiny(toks[0], VLMConfig(image_size=32, hidden=32))
    vlm.save(tmp_path / "vlm")
    shutil.rmtree(tmp_path / "vlm" / "tokenizer")
    toks[1].save_pretrained(tmp_path / "vlm" / "tokenizer")
    with pytest.raises(ValueError, match=rf"checkpoint {tmp_path / 'vlm'}: its tokenizer is not the one"):
        ScreenVLM.load(tmp_path / "vlm")


def test_an_evaluators_threshold_beside_another_vlm_is_refused(toks, tmp_path):
    """The evaluator's folder holds more than its VLM, so it is not replaced whole: its threshold names its VLM."""
    LearnedEvaluator(ScreenVLM.tiny(toks[0], VLMConfig(image_size=32, hidden=32)), 0.4).save(tmp_path / "ev")
    assert LearnedEvaluator.load(tmp_path / "ev").threshold == 0.4
    ScreenVLM.tiny(toks[1], VLMConfig(image_size=32, hidden=32)).save(tmp_path / "ev" / "vlm")  # a save cut after it
    with pytest.raises(ValueError, match=rf"{tmp_path / 'ev' / 'evaluator.json'}: its threshold was chosen for "
                                         "another VLM"):  # fmt: skip
        LearnedEvaluator.load(tmp_path / "ev")


def _cut_swap(path: Path, monkeypatch) -> None:
    """Replace ``path`` through :func:`atomic_folder` as a file system without an atomic exchange does, cut (as a
    kill would) between moving the old folder aside and renaming the new one into place."""
    monkeypatch.setattr(digiq.io, "_RENAMEAT2", None)
    real = os.replace

    def cut(src, dst):
        if Path(dst) == path:
            raise KeyboardInterrupt  # stands for the kill: nothing after it runs but the finally blocks
        real(src, dst)

    monkeypatch.setattr(os, "replace", cut)
    with pytest.raises(KeyboardInterrupt), atomic_folder(path) as tmp:
        (tmp / "general_train.txt").write_text("new\n")
    monkeypatch.setattr(os, "replace", real)


def test_a_swap_cut_between_its_renames_is_named_and_put_back_by_the_next_run(tmp_path, monkeypatch):
    tasks = tmp_path / "data" / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "general_train.txt").write_text("old\n")
    _cut_swap(tasks, monkeypatch)
    assert not tasks.exists()
    (old,) = tasks.parent.glob(".tasks.old-*")
    with pytest.raises(StageError, match=rf"missing input {tasks / 'general_train.txt'}; .*a run replacing {tasks} "
                                         rf"was cut short, and the previous tasks lies whole at {old}"):  # fmt: skip
        require("critic", tasks / "general_train.txt")
    (tasks.parent / ".tasks.tmp-999").mkdir()  # a dead run's half-written folder
    (tasks.parent / ".tasks.lock").touch()  # the stage's lock: not a leftover
    clear_leftovers(tasks)
    assert (tasks / "general_train.txt").read_text() == "old\n"
    assert sorted(p.name for p in tasks.parent.iterdir()) == [".tasks.lock", "tasks"]


def test_a_checkpoint_whose_swap_was_cut_names_where_the_previous_one_lies(toks, tmp_path, monkeypatch):
    folder = tmp_path / "base_policy"
    _policy(toks[0], 0).save(folder)
    _cut_swap(folder, monkeypatch)
    with pytest.raises(FileNotFoundError, match=rf"no policy checkpoint in {folder} .*the previous base_policy lies "
                                                rf"whole at {tmp_path}/\.base_policy\.old-"):  # fmt: skip
        AutoUIPolicy.load(folder)
    clear_leftovers(folder)
    AutoUIPolicy.load(folder)
