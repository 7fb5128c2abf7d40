"""The experiment's rows: every policy the pipeline trains and evaluates, what kind it is and what makes it.

A row is one arm of the comparison (a line of the README's tables). The
paper's comparison is Digi-Q against the base policy, Filtered BC and
offline DigiRL (``PAPER``, beside ``base``); named variants change Digi-Q's
critic (``variants`` in params.yaml); the ablations change one thing of
Digi-Q each (``ablations``); the online rows learn from their own rollouts
(``digirl.online``). The critic stage fits the rows' critics, the actor stage
their policies, the diagnostics and eval stages judge them; each reads the
rows from :func:`all_rows` instead of naming them.

    python -m digiq.rows   # the rows params.yaml asks for
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from digiq.config import (
    ABLATION_NAMES,
    BLIND_ROW,
    EXTRACTIONS,
    ONLINE_ROWS,
    PAE_ROWS,
    PERFECT_CRITIC_ROW,
    UNTUNED_ROW,
    AblationsConfig,
    load_settings,
)

__all__ = [
    "BASE",
    "PAPER",
    "EXTRACTIONS",
    "UNTUNED_ROW",
    "BLIND_ROW",
    "PERFECT_CRITIC_ROW",
    "ABLATION_NAMES",
    "ONLINE_ROWS",
    "PAE_ROWS",
    "VLM_OF_ROW",
    "Row",
    "all_rows",
    "critic_rows",
    "vlm_rows",
    "main",
]

BASE = "base"  # the base policy itself, stage 00's
PAPER = ("digiq", "filtered_bc", "digirl_offline")  # the paper's comparison, fit by stage 07
#: Whose features each Best-of-N row's critic reads: the embed stage's folder (``data/features/<name>``).
VLM_OF_ROW = {"digiq": "finetuned", UNTUNED_ROW: "untuned", BLIND_ROW: "blind"}

Kind = Literal["best_of_n", "extraction", "perfect_critic", "filtered_bc", "digirl_offline", "online"]
Group = Literal["paper", "variant", "ablation", "online"]


@dataclass(frozen=True)
class Row:
    """One row: its name, what kind of policy it is, which group of the tables it stands in, and what makes it.

    ``critic`` is the row whose stage-06 critic it reads (Best-of-N and the
    extractions), ``vlm`` whose features that critic reads, ``candidates`` the
    K of Best-of-N (None: ``actor.k_candidates``), ``extraction`` the weighted
    extraction (``awr``, ``reinforce``).
    """

    name: str
    kind: Kind
    group: Group
    critic: str | None = None
    vlm: str | None = None
    candidates: int | None = None
    extraction: str | None = None

    @property
    def owns_critic(self) -> bool:
        """Whether stage 06 fits a critic for this row (others read another row's)."""
        return self.critic == self.name


def vlm_rows(ablations: AblationsConfig) -> list[str]:
    """The rows, ``digiq`` first, whose critics read another VLM's features: the VLM ablations switched on."""
    return ["digiq"] + [
        row for row, on in ((UNTUNED_ROW, ablations.untuned_vlm), (BLIND_ROW, ablations.blind_vlm)) if on
    ]


def all_rows(ablations: AblationsConfig, variants: Sequence[str] = (), online: Sequence[str] = ()) -> list[Row]:
    """Every row stage 07 fits or stage 09 trains, in the tables' order: the paper's, the named ``variants``,
    the ablations ``ablations`` switches on, the ``online`` rows (``digirl.online``). ``base`` is no row here:
    it is the policy they all start from."""
    out = [Row("digiq", "best_of_n", "paper", critic="digiq", vlm=VLM_OF_ROW["digiq"]),
           Row("filtered_bc", "filtered_bc", "paper"), Row("digirl_offline", "digirl_offline", "paper")]  # fmt: skip
    out += [Row(name, "best_of_n", "variant", critic=name, vlm=VLM_OF_ROW["digiq"]) for name in variants]
    out += [Row(f"digiq_n{n}", "best_of_n", "ablation", critic="digiq", vlm=VLM_OF_ROW["digiq"], candidates=n)
            for n in ablations.n_candidates]  # fmt: skip
    out += [Row(row, "best_of_n", "ablation", critic=row, vlm=VLM_OF_ROW[row]) for row in vlm_rows(ablations)[1:]]
    out += [Row(f"digiq_{e}", "extraction", "ablation", critic="digiq", vlm=VLM_OF_ROW["digiq"], extraction=e)
            for e in ablations.extraction]  # fmt: skip
    if ablations.perfect_critic:
        out.append(Row(PERFECT_CRITIC_ROW, "perfect_critic", "ablation"))
    out += [Row(name, "online", "online") for name in online]
    return out


def critic_rows(table: Sequence[Row]) -> list[Row]:
    """The rows of ``table`` stage 06 fits a critic for: ``digiq``, the VLM ablations, then the variants."""
    own = [r for r in table if r.owns_critic]
    return [r for r in own if r.group != "variant"] + [r for r in own if r.group == "variant"]


def main() -> None:
    settings = load_settings()
    table = all_rows(settings.ablations, list(settings.variants), settings.digirl.online)
    for r in table:
        made = ", ".join(f"{k}={v}" for k in ("critic", "vlm", "candidates", "extraction") if (v := getattr(r, k)))
        print(f"{r.name:<22} {r.group:<9} {r.kind:<15} {made}")


if __name__ == "__main__":
    main()
