"""The propose stage: the crawl and the proposals as files, the same bytes with or without the task lists."""

from __future__ import annotations

import json

import pytest

from digiq.config import DeviceConfig, EnvConfig, JudgeConfig, ProposeConfig
from digiq.env.taskgen import generate_tasks
from digiq.pae.context import DeviceContext
from digiq.pae.proposals import read_proposals
from digiq.pae.propose_llm import ProposerError
from digiq.paths import Paths
from digiq.stages.propose import run_propose

CFG = ProposeConfig(per_group=4, crawl_depth=3)


def _outputs(paths: Paths) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in (paths.pae_crawl, paths.pae_proposals)}


def test_the_proposals_are_the_same_bytes_without_the_task_lists_and_the_stored_episodes(tmp_path):
    with_lists = Paths(tmp_path / "a")
    for split in ("train", "val", "test"):
        with_lists.task_list("general", split).parent.mkdir(parents=True, exist_ok=True)
        with_lists.task_list("general", split).write_text("\n".join(generate_tasks("general", split, 20)) + "\n")
    with_lists.offline.mkdir(parents=True)
    (with_lists.offline / "steps-00000.parquet").write_bytes(b"not read")
    metrics = run_propose(CFG, EnvConfig(width=108), with_lists)
    run_propose(CFG, EnvConfig(width=108), without := Paths(tmp_path / "b"))
    assert _outputs(with_lists) == _outputs(without)
    assert not without.tasks.exists()
    proposals = read_proposals(without.pae_proposals)
    assert metrics["proposals"] == len(proposals) and metrics["slot_sources"].keys() == {"lexicon", "screen"}
    assert DeviceContext.load(without.pae_crawl).depth == 3
    assert json.loads((without.metrics / "propose.json").read_text())["proposer"] == "builtin"


def test_the_crawl_runs_over_adb_as_on_the_simulator_in_process(tmp_path):
    sim, adb = Paths(tmp_path / "sim"), Paths(tmp_path / "adb")
    run_propose(CFG, EnvConfig(width=108), sim)
    run_propose(CFG, EnvConfig(width=108), adb, devices=DeviceConfig(backend="adb-sim", adb_port=0, sim_devices=1))
    assert _outputs(sim) == _outputs(adb)


def test_the_llm_proposer_needs_its_endpoint(tmp_path):
    cfg = ProposeConfig(proposer="llm", crawl_depth=1)
    with pytest.raises(ProposerError, match="proposing tasks for"):
        run_propose(cfg, EnvConfig(width=108), Paths(tmp_path), judge=JudgeConfig(base_url="http://127.0.0.1:9/v1",
                                                                                  api_key_env="", retries=0))  # fmt: skip
    assert not Paths(tmp_path).pae_proposals.exists()
