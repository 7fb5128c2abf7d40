"""Where every stage reads and writes: declared once, relative to the repository root."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

__all__ = ["Paths", "ROOT"]

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Paths:
    """All pipeline locations under ``root`` (the repository, or a scratch folder in tests)."""

    root: Path = ROOT
    #: Output folders a running stage writes somewhere else until it has finished: (property name, folder).
    redirected: tuple[tuple[str, Path], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    def writing(self, name: str, folder: Path) -> Paths:
        """These paths with the output folder ``name`` (``vlm``, ``critics``, ``actors``...) moved to ``folder``."""
        if name not in _REDIRECTABLE:
            raise ValueError(f"Paths.writing: {name!r} is not one of {sorted(_REDIRECTABLE)}")
        return replace(self, redirected=(*self.redirected, (name, Path(folder))))

    def _output(self, name: str, default: Path) -> Path:
        return dict(self.redirected).get(name, default)

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def tasks(self) -> Path:
        return self.data / "tasks"

    def task_list(self, task_set: str, split: str) -> Path:
        return self.tasks / f"{task_set}_{split}.txt"

    @property
    def demos(self) -> Path:
        return self.data / "demos"

    @property
    def base_policy(self) -> Path:
        return self.data / "models" / "base_policy"

    @property
    def offline(self) -> Path:
        return self.data / "offline"

    @property
    def candidates(self) -> Path:
        return self.data / "candidates" / "candidates.parquet"

    @property
    def screens(self) -> Path:
        """The VLM pretraining's screens: the noisy expert's episodes, with view hierarchies, per split."""
        return self.data / "screens"

    @property
    def vlm_pretrained(self) -> Path:
        """The VLM after pretraining, before the representation fine-tune."""
        return self.data / "models" / "vlm_pretrained"

    @property
    def vlm(self) -> Path:
        """The representation fine-tune's output folder: the VLM whose features the critic reads."""
        return self._output("vlm", self.data / "models" / "vlm")

    @property
    def vlm_blind(self) -> Path:
        """The same fine-tune of a VLM that was never pretrained (an ablation), kept in the fine-tune's folder."""
        return self.vlm / "blind"

    def features(self, vlm: str = "finetuned") -> Path:
        """Stage-05 arrays from the fine-tuned VLM, or from an ablation's (``untuned``, ``blind``)."""
        return self.data / "features" / vlm

    @property
    def critic_inputs(self) -> Path:
        """The critic's text and view-hierarchy features, per stored step and candidate (:mod:`digiq.stages.critic_inputs`)."""
        return self._output("critic_inputs", self.data / "critic_inputs")

    @property
    def critics(self) -> Path:
        """Stage 06's output folder: every critic of every seed."""
        return self._output("critics", self.data / "models" / "critic")

    def critic(self, seed: int, row: str, task_set: str) -> Path:
        """Stage-06 critic of ``row`` (``digiq``, a variant, or a VLM ablation's) for one seed and task set."""
        return self.critics / f"seed{seed}" / row / task_set

    @property
    def actors(self) -> Path:
        """Stage 07's output folder: every policy of every seed, and their picks."""
        return self._output("actors", self.data / "models" / "actors")

    def actor(self, name: str, seed: int, task_set: str) -> Path:
        """Stage-07 policy of ``name`` for one seed and task set."""
        return self.actors / f"seed{seed}" / name / task_set

    @property
    def picks(self) -> Path:
        """Stage 07's imitated rows of every policy and seed (:mod:`digiq.data.picks`)."""
        return self.actors / "picks.parquet"

    @property
    def online(self) -> Path:
        """Stage 09's output folder: DigiRL's online runs, each resumable from its last finished round."""
        return self.data / "online"

    def online_run(self, row: str, seed: int, task_set: str) -> Path:
        """One online run: a trajectory store per round and ``latest/`` (policy, value functions, state)."""
        return self.online / f"seed{seed}" / row / task_set

    def online_policy(self, row: str, seed: int, task_set: str) -> Path:
        """The policy an online run ended with (after its last finished round)."""
        return self.online_run(row, seed, task_set) / "latest" / "policy"

    @property
    def pae(self) -> Path:
        """PAE's files: the crawl and proposals (the propose stage's), the learned evaluator and the practice runs."""
        return self.data / "pae"

    @property
    def pae_crawl(self) -> Path:
        return self.pae / "crawl.json"

    @property
    def pae_proposals(self) -> Path:
        return self.pae / "proposals.jsonl"

    @property
    def pae_evaluator(self) -> Path:
        """The learned evaluator: its VLM, threshold, and the validation episodes the threshold was chosen on."""
        return self._output("pae_evaluator", self.pae / "evaluator")

    @property
    def pae_runs(self) -> Path:
        """The practice runs, as the online runs are kept (:meth:`online_run`)."""
        return self.pae / "runs"

    def pae_policy(self, row: str, seed: int, task_set: str) -> Path:
        """The policy a practice run ended with."""
        return self.pae_runs / f"seed{seed}" / row / task_set / "latest" / "policy"

    def lock(self, stage: str) -> Path:
        """``stage``'s run lock (:mod:`digiq.lock`): held by the run of the stage that is writing its outputs."""
        return self.data / f".{stage}.lock"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics"

    @property
    def plots(self) -> Path:
        return self.root / "plots"


_REDIRECTABLE = {"vlm", "critic_inputs", "critics", "actors", "pae_evaluator"}
