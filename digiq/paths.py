"""Where every stage reads and writes: declared once, relative to the repository root."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

__all__ = ["Paths", "ROOT"]

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Paths:
    """All pipeline locations under ``root`` (the repository, or a scratch folder in tests)."""

    root: Path = ROOT

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

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
    def vlm(self) -> Path:
        return self.data / "models" / "vlm"

    def features(self, vlm: str = "finetuned") -> Path:
        """Stage-04 arrays from the fine-tuned VLM, or from the ``untuned`` one (an ablation)."""
        return self.data / "features" / vlm

    def critic(self, seed: int, row: str = "digiq") -> Path:
        """Stage-05 critic of ``row`` (``digiq``, a variant, or ``digiq_untuned``) for one seed."""
        return self.data / "models" / "critic" / f"seed{seed}" / row

    def actor(self, name: str, seed: int) -> Path:
        return self.data / "models" / "actors" / f"seed{seed}" / name

    @property
    def picks(self) -> Path:
        """Stage 06's imitated rows of every policy and seed (:mod:`digiq.data.picks`)."""
        return self.data / "models" / "actors" / "picks.parquet"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics"

    @property
    def plots(self) -> Path:
        return self.root / "plots"
