"""Write the README's results and the experiments page's diagnostics from the metrics files, never by hand.

``python -m digiq.report`` rebuilds the block between ``<!-- results:start -->``
and ``<!-- results:end -->`` in README.md: success per policy and task set
(mean ± sample std over seeds, on the whole test list and on its first 96
tasks, the paper's protocol), each comparison with its paired bootstrap
interval, the variants and the ablations, and the paper's claims each judged
by its comparison's interval (:data:`PAPER_CLAIMS`). It also rebuilds the diagnostics
block of docs/experiments.md: success per family, what each policy imitates,
where the data can teach, the oracle diagnostic and the critic's picks, the
base policy's missing skills, each stage's wall time. The eval notebook draws
the bar charts with :func:`save_results_chart`.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from digiq.env.tasks import TASK_SETS
from digiq.io import atomic_path, atomic_write_text
from digiq.paths import Paths

__all__ = [
    "Claim",
    "PAPER_CLAIMS",
    "claims_table",
    "results_markdown",
    "validation_markdown",
    "diagnostics_markdown",
    "update_readme",
    "save_results_chart",
    "expert_pick_table",
    "representation_probe_table",
    "fill_block",
    "pct",
]


START, END = "<!-- results:start -->", "<!-- results:end -->"
DIAGNOSTICS = ("<!-- diagnostics:start -->", "<!-- diagnostics:end -->")  # in docs/experiments.md
VALIDATION = ("<!-- validation:start -->", "<!-- validation:end -->")  # in docs/experiments.md
TASK_SET_NAMES = {"general": "General", "webshop": "Web Shopping"}
STAGES = (
    "tasks",
    "base_policy",
    "collect",
    "augment_actions",
    "vlm_finetune",
    "embed",
    "critic",
    "actor",
    "diagnostics",
    "digirl_online",
    "eval",
)
HEADLINES = {
    "base_policy": ("demo_episodes", "train_loss_last"),
    "collect": ("trajectories", "transitions", "success_rate_by_task_set"),
    "augment_actions": ("states", "n_candidates", "sampled_valid_rate"),
    "vlm_finetune": ("accuracy_heldout", "majority_rate_heldout"),
    "embed": ("states", "pairs_per_s"),
    "critic": ("v_mc_return_corr_heldout", "q_loss_last"),
    "actor": ("kept_fraction",),
    "digirl_online": ("offline_env_steps",),
}


def _load(paths: Paths, stage: str) -> dict[str, Any] | None:
    p = paths.metrics / f"{stage}.json"
    return json.loads(p.read_text()) if p.exists() else None


def pct(x: float) -> str:
    """A rate in [0, 1] as percent with one decimal."""
    return f"{100 * x:.1f}"


def _rate(r: dict[str, Any]) -> str:
    """``mean ± std`` in percent over seeds; the mean alone with one seed, whose sample std is undefined (null)."""
    std = r.get("success_rate_std")
    return pct(r["success_rate"]) + (f" ± {pct(std)}" if std is not None else "")


def _success_table(results: dict[str, Any], train: dict[str, Any] | None = None) -> list[str]:
    """One row per policy, test columns and, from ``train`` (eval_train.json), the paper's train columns beside them.

    When a test list is longer than the paper's 96 tasks, its first 96 (the
    paper's protocol) get their own column beside the whole list's.
    """
    train = {p: sets for p, sets in (train or {}).items() if isinstance(sets, dict)}
    some = next(iter(results.values()))
    seeds = len(some["general"]["per_seed"])
    columns: list[tuple[str, str, dict[str, Any], bool]] = []  # (head, task set, results, the first tasks only)
    sizes = []
    for ts in TASK_SETS:
        n, first = some[ts]["n_episodes"], some[ts].get("first96", {}).get("n_episodes")
        sizes.append(f"{n} {TASK_SET_NAMES[ts]}")
        if any(ts in train.get(p, {}) for p in results):
            columns.append((f"{TASK_SET_NAMES[ts]} train", ts, train, False))
        if first is not None and first < n:
            columns.append((f"{TASK_SET_NAMES[ts]} test, first {first}", ts, results, True))
        columns.append((f"{TASK_SET_NAMES[ts]} test", ts, results, False))
    head = ["policy", *(c[0] for c in columns)]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for p in results:
        cells = [
            _rate(src[p][ts]["first96"] if part else src[p][ts]) if ts in src.get(p, {}) else "-"
            for _, ts, src, part in columns
        ]
        out.append("| " + " | ".join([p, *cells]) + " |")
    note = (f"Success rate (%), mean ± sample standard deviation over {seeds} seed(s); {' and '.join(sizes)} test "
            "tasks per seed (first 96: the paper's protocol, the first 96 tasks of the same list)")  # fmt: skip
    held_in = sorted({r["n_episodes"] for sets in train.values() for r in sets.values()})
    if held_in:
        counts = "/".join(map(str, held_in))
        note += f"; train: the tasks of the first {counts} trajectories per task set in the offline data (stage 01)"
    return out + ["", note + "."]


def _family_table(results: dict[str, Any]) -> list[str]:
    policies = list(results)
    out = ["| task set | family | " + " | ".join(policies) + " |", "|---" * (len(policies) + 2) + "|"]
    for ts in TASK_SETS:
        for f in sorted({f for p in policies for f in results[p][ts]["by_family"]}):
            vals = [pct(results[p][ts]["by_family"][f]) if f in results[p][ts]["by_family"] else "-" for p in policies]
            out.append(f"| {ts} | {f} | " + " | ".join(vals) + " |")
    return out


def _comparison_table(comparisons: dict[str, Any], rows: Iterable[str]) -> list[str]:
    """The paired comparisons of stage 10 between ``rows``: difference in points and its 95% bootstrap interval.

    Empty when no comparison has both its policies among ``rows`` (a table of its own per results table).
    """
    keep = set(rows)
    names = [n for n in dict.fromkeys(n for pairs in comparisons.values() for n in pairs) if set(n.split("-")) <= keep]
    sets = [ts for ts in TASK_SETS if any(n in comparisons.get(ts, {}) for n in names)]
    if not names:
        return []
    out = ["| comparison | " + " | ".join(f"{TASK_SET_NAMES[ts]} (points, 95% CI)" for ts in sets) + " |",
           "|---|" + "---|" * len(sets)]  # fmt: skip
    for name in names:
        cells = []
        for ts in sets:
            c = comparisons[ts].get(name)
            if c is None:
                cells.append("-")
                continue
            lo, hi = c["ci95"]
            verdict = "" if lo > 0 or hi < 0 else ", no detectable difference"
            cells.append(f"{c['diff']:+.1f} [{lo:+.1f}, {hi:+.1f}]{verdict}")
        out.append(f"| {name.replace('-', ' - ', 1)} | " + " | ".join(cells) + " |")
    sizes = " and ".join(f"{next(iter(comparisons[ts].values()))['n_tasks']} {TASK_SET_NAMES[ts]}" for ts in sets)
    return out + ["", f"A - B in percentage points over the test tasks ({sizes}) and the seeds, with a 95% paired "
                  "bootstrap interval (tasks and seeds resampled alike for both rows; digiq.stats). An interval "
                  "holding 0 is no detectable difference."]  # fmt: skip


HOLDS, REVERSED, UNDETECTED = "holds", "reversed", "no detectable difference"  # one task set's reading
REPRODUCED, NOT_REPRODUCED, NOT_MEASURED = "reproduced", "not reproduced", "not measured"  # a claim's verdict
RELATIONS = {">": "> 0", "<": "< 0", ">=": "≥ 0", "<=": "≤ 0"}  # what the paper claims of A - B
REQUIRED = ("both", "at least one")  # on how many task sets a strict claim must hold


@dataclass(frozen=True)
class Claim:
    """One of the paper's claims, judged by one paired comparison ``A-B`` of metrics/comparisons.json.

    ``relation`` is what the paper claims of A - B: ``>`` or ``<`` (A detectably
    ahead or behind), or the weak ``>=`` / ``<=`` (A not detectably behind or
    ahead: only the opposite difference, detected, refutes it). ``on`` names
    the task sets a strict claim must hold on; a weak claim is judged on both.
    """

    text: str
    comparison: str
    relation: str
    on: str

    def __post_init__(self) -> None:
        if self.relation not in RELATIONS:
            raise ValueError(f"claim {self.text!r}: relation {self.relation!r} is not one of {list(RELATIONS)}")
        if self.on not in REQUIRED:
            raise ValueError(f"claim {self.text!r}: on={self.on!r} is not one of {list(REQUIRED)}")
        if len(self.comparison.split("-")) != 2:
            raise ValueError(f"claim {self.text!r}: comparison {self.comparison!r} is not a key 'A-B' of two rows")
        if self.weak and self.on != "both":
            raise ValueError(f"claim {self.text!r}: a weak ({self.relation}) claim is judged on both task sets")

    @property
    def weak(self) -> bool:
        return "=" in self.relation

    @property
    def sign(self) -> int:
        """+1 when the paper claims A ahead of B, -1 when behind: the cells show the claimed winner's lead."""
        return 1 if ">" in self.relation else -1

    def condition(self) -> str:
        """The claim as ``winner - loser > 0`` (or ``≥ 0``), the order the table's cells are in."""
        a, b = self.comparison.split("-")
        winner, loser = (a, b) if self.sign > 0 else (b, a)
        return f"`{winner} - {loser} {RELATIONS[self.relation.replace('<', '>')]}`"


# The headline comparisons must hold on both task sets, as the paper reports them; the ablation claims say a part
# of the method helps at all, so one task set where it detectably helps (and none where it detectably hurts) reproduces
# them. The figures quoted are the paper's published success rates.
PAPER_CLAIMS: tuple[Claim, ...] = (
    Claim("Digi-Q beats Filtered BC (paper, General / Web Shopping: 71.2 / 58.0 against 54.5 / 43.8)",
          "digiq-filtered_bc", ">", "both"),
    Claim("Digi-Q beats offline DigiRL (paper, General / Web Shopping: 71.2 / 58.0 against 59.0 / 47.6)",
          "digiq-digirl_offline", ">", "both"),
    Claim("The VLM's representation fine-tune helps", "digiq_untuned-digiq", "<", "at least one"),
    Claim("Best-of-16 is not below Best-of-1 (more candidates do not hurt)", "digiq_n1-digiq", "<=", "both"),
    Claim("Best-of-N beats AWR on the same critic", "digiq_awr-digiq", "<", "at least one"),
    Claim("Best-of-N beats a REINFORCE-style update on the same critic", "digiq_reinforce-digiq", "<", "at least one"),
    Claim("Online DigiRL beats online Filtered BC (DigiRL paper)", "digirl_online-filtered_bc_online", ">",
          "at least one"),
    Claim("Off-to-online DigiRL beats offline DigiRL (DigiRL paper)", "digirl_off2on-digirl_offline", ">",
          "at least one"),
)  # fmt: skip


def _verdict(claim: Claim, readings: list[str | None]) -> str:
    """The claim's verdict from its per-task-set readings (None: not measured there); see :func:`claims_table`."""
    if None in readings:
        return NOT_MEASURED
    holds_needed = 0 if claim.weak else len(readings) if claim.on == "both" else 1
    if REVERSED not in readings and readings.count(HOLDS) >= holds_needed:
        return REPRODUCED
    return UNDETECTED if all(r == UNDETECTED for r in readings) else NOT_REPRODUCED


def claims_table(comparisons: dict[str, Any]) -> list[str]:
    """:data:`PAPER_CLAIMS`, each judged on every task set by its comparison in ``comparisons`` (comparisons.json).

    A cell is the claimed winner's lead in points (A - B, negated when the paper
    claims A behind B) with its 95% paired bootstrap interval, read as *holds*
    (the interval is above 0), *reversed* (below 0) or *no detectable
    difference* (it holds 0). The verdict, in this order:

    - **not measured**: the comparison is missing on a task set (a row not run);
    - **reproduced**: reversed on no task set and, for a strict claim, holding
      on both task sets or on at least one, as the claim says (a weak claim,
      ``>=`` / ``<=``, needs only no reversal);
    - **no detectable difference**: every task set reads no detectable difference;
    - **not reproduced**: otherwise, i.e. reversed on a task set, or holding on
      fewer task sets than the claim requires.
    """
    heads = [TASK_SET_NAMES[ts] for ts in TASK_SETS]
    out = ["| claim | " + " | ".join(heads) + " | verdict |", "|---" * (len(heads) + 2) + "|"]
    for claim in PAPER_CLAIMS:
        cells: list[str] = []
        readings: list[str | None] = []  # None: not measured on that task set
        for ts in TASK_SETS:
            c = comparisons.get(ts, {}).get(claim.comparison)
            if c is None:
                cells.append(NOT_MEASURED)
                readings.append(None)
                continue
            diff, (lo, hi) = claim.sign * c["diff"], sorted(claim.sign * x for x in c["ci95"])
            reading = HOLDS if lo > 0 else REVERSED if hi < 0 else UNDETECTED
            cells.append(f"{diff:+.1f} [{lo:+.1f}, {hi:+.1f}], {reading}")
            readings.append(reading)
        which = "both task sets" if claim.on == "both" else "at least one task set"
        out.append(f"| {claim.text}: {claim.condition()} on {which} | " + " | ".join(cells)
                   + f" | **{_verdict(claim, readings)}** |")  # fmt: skip
    return out + ["", "Each cell: the claimed winner's lead in points with its 95% paired bootstrap interval; holds: "
                  "above 0, reversed: below 0, no detectable difference: the interval holds 0. Verdict: not measured "
                  "if the comparison is missing on a task set; reproduced if reversed nowhere and holding where the "
                  "claim requires (a ≥ claim: reversed nowhere); no detectable difference if every interval holds 0; "
                  "otherwise not reproduced."]  # fmt: skip


def _oracle_table(oracle: dict[str, Any]) -> list[str]:
    if not oracle.get("states"):
        return ["Oracle diagnostic off (`diagnostics.oracle_states: 0`)."]
    if "top1_hit_rate" not in oracle:
        return [f"Oracle diagnostic: no informative states among {oracle.get('states', 0)} sampled."]
    out = ["| ranking | top-1 is truly best (%) | true value of its pick |", "|---|---|---|"]
    for name, hit in oracle["top1_hit_rate"].items():
        out.append(f"| {name} | {pct(hit)} | {oracle['oracle_value_of_pick'][name]:.3f} |")
    out += ["", f"{oracle['informative_states']} of {oracle['states']} sampled states have candidates of different "
            f"true value; best possible pick's mean value {oracle['oracle_value_of_pick']['best']:.3f}. "
            "feature_probe_*: fit to the oracle values themselves on half the states, scored on the other half "
            "(what the true values of that many states teach a ranker on the critic's inputs; probe_* in the expert "
            "picks below learns from every stored state)."]  # fmt: skip
    behaviour = oracle.get("behaviour_values")
    if behaviour:
        flat = "; ".join(f"{ts} {pct(v['flat'])}% of {v['states']}" for ts, v in behaviour.items()
                         if isinstance(v, dict))  # fmt: skip
        out += ["", f"behaviour_value: the candidates' true values when the base policy continues after them "
                f"(temperature {behaviour['temperature']}, {behaviour['rollouts']} rollouts each), which is what "
                "Digi-Q's critic is trained to estimate; ties broken at random. Among the states above, every "
                f"candidate is worth the same to it (it fails after each alike) at: {flat}."]  # fmt: skip
    shares = oracle.get("candidate_variance_within_state", {})
    if shares:
        out += ["", "Share of the candidate features' variance that lies between a state's candidates:", ""]
    for vlm, parts in shares.items():
        out.append(f"- {vlm}: " + ", ".join(f"{name} {100 * share:.1f}%" for name, share in parts.items()))
    return out


def expert_pick_table(pick: dict[str, Any]) -> list[str]:
    """How often each ranking picks the expert's action, over every stored state (stage 08; notebook 08)."""
    if not pick:
        return ["Expert picks off (`diagnostics.oracle_states: 0`)."]
    if "hit_rate" not in pick:
        return ["Expert picks: no stored state has both expert and other valid candidates."]
    groups = [k.removeprefix("hit_rate_") for k in pick if k.startswith("hit_rate_")]
    out = ["| ranking | all | " + " | ".join(groups) + " |", "|---|---|" + "---|" * len(groups)]
    for name, rate in pick["hit_rate"].items():
        out.append(f"| {name} | {pct(rate)} | " + " | ".join(pct(pick[f"hit_rate_{g}"][name]) for g in groups) + " |")
    return out + ["", f"Picks that do what the simulator's expert would (%), over the {pick['informative_states']} "
                  f"of {pick['states']} stored states whose valid candidates include both such and other actions "
                  "(mean over seeds; critic_<row>: the argmax of Q of that row's critic; probe_*: a ranker on the same critic inputs fit to the expert's choices on the other "
                  "half of the episodes, what those inputs allow with a label on every candidate)."]  # fmt: skip


def representation_probe_table(probes: dict[str, Any]) -> list[str]:
    """Held-out AUROC of the linear probes on each VLM's (state, action) features and on the control (stage 08)."""
    if not probes:
        return ["Representation probes off (`diagnostics.oracle_states: 0`)."]
    names = list(next(iter(probes.values())))

    def cell(r: dict[str, Any]) -> str:
        # A probe that could not be fit, or whose scored rows hold one class only, has no AUROC.
        return "-" if r.get("auroc") is None else f"{r['auroc']:.3f} ({r['n_test']})"

    out = ["| features | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    out += [f"| {vlm} | " + " | ".join(cell(r[name]) for name in names) + " |" for vlm, r in probes.items()]
    return out + [
        "",
        "Held-out AUROC (rows scored) of a linear probe on each VLM's features of the data's "
        "(state, action) pairs (changes_screen: the fine-tune's own label) and of tap candidates "
        "(tap_on_goal_element: the tap lands on an element the goal names); control: features of the "
        "goal's words and the tap's place only, no screen. A VLM above the control reads the screen.",
    ]


def wrong_pick_table(wrong: dict[str, Any]) -> list[str]:
    """Where the critic's argmax is not the expert's: the kind it picks, beside the data's and the expert's (stage 08; notebook 08)."""
    if not wrong:
        return ["Wrong picks off (`diagnostics.oracle_states: 0`), or the critic never missed the expert."]
    columns = [(f"{head} (%)", lambda ts, kind, r, key=key: pct(r[key])) for head, key in
               (("critic's wrong picks", "critic"), ("data's action there", "data"), ("expert's action there", "expert"))]  # fmt: skip
    counts = ", ".join(f"{ts} {r['wrong_picks']}" for ts, r in wrong.items())
    return _grouped_table({ts: r["kinds"] for ts, r in wrong.items()}, "action kind", columns,
                          "Over the informative stored states where the argmax of Digi-Q's critic's Q (critic_digiq "
                          f"above) does not do what the expert would ({counts} per seed, pooled over seeds): the kind "
                          "of action it picks, the kind the data took there, and the kind the expert would take.")  # fmt: skip


def rewarded_table(rewarded: dict[str, Any]) -> list[str]:
    """Per family: the rewarded steps the critics trained on and their Q of the taken action (stage 06; notebook 06)."""
    if not rewarded:
        return ["No rewarded step among the transitions the critics trained on."]
    columns: list[tuple[str, Cell]] = [("rewarded steps trained on", lambda ts, fam, r: f"{r['steps']:g}"),
                                       ("critic's Q of their action (target 1.0)", lambda ts, fam, r: f"{r['q_taken']:.3f}")]  # fmt: skip
    return _grouped_table(rewarded, "family", columns,
                          "A rewarded step ends its episode, so its TD target is exactly the reward, 1 (mean over the "
                          "seeds' critics, each over the steps of the episodes it trained on; families with none left "
                          "out).")  # fmt: skip


def _rows_table(diag: dict[str, Any], kept_rows: dict[str, float]) -> list[str]:
    """Per policy: how many rows it imitates (stage 07) and how often their action is the expert's, per task set (stage 08)."""
    shares = diag["rows_expert_share"]
    sets = list(next(iter(shares.values())))
    out = ["| policy | rows | " + " | ".join(f"expert's action, {ts} (%)" for ts in sets) + " |",
           "|---|---|" + "---|" * len(sets)]  # fmt: skip
    for name, share in shares.items():
        cells = [pct(share[ts]) if share[ts] is not None else "-" for ts in sets]
        out.append(f"| {name} | {kept_rows.get(name, '-')} | " + " | ".join(cells) + " |")
    return out + ["", "rows: the (state, action) rows each policy is fit on (mean over its seeds); the share of them "
                  "whose action does what the simulator's expert would there (mean over seeds; - where none is kept). "
                  "The extraction ablation's rows (every drawn candidate, weighted) count by their weight, those of "
                  "negative weight not at all."]  # fmt: skip


Cell = Callable[[str, str, dict[str, Any]], str]  # (task set, group, support row) -> a table cell


def _grouped_table(support: dict[str, Any], group: str, columns: list[tuple[str, Cell]], note: str) -> list[str]:
    """A row per task set and group of a support report (stage 08), with the given columns."""
    out = [f"| task set | {group} | " + " | ".join(h for h, _ in columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for ts, groups in support.items():
        for g, r in groups.items():
            out.append(f"| {ts} | {g} | " + " | ".join(cell(ts, g, r) for _, cell in columns) + " |")
    return out + ["", note]


_STATES: tuple[str, Cell] = ("states", lambda ts, g, r: str(r["states"]))
_SUPPORT: list[tuple[str, Cell]] = [
    ("data's action is the expert's (%)", lambda ts, g, r: pct(r["taken_is_expert"])),
    ("a candidate is the expert's (%)", lambda ts, g, r: pct(r["expert_candidate"])),
]


def _support_table(support: dict[str, Any], success: dict[str, float]) -> list[str]:
    """Per family: the data's success (stage 01) and how often its action, or any candidate, is the expert's (stage 08)."""
    won: tuple[str, Cell] = ("data's success (%)", lambda ts, fam, r: pct(success[fam]) if fam in success else "-")
    return _grouped_table(support, "family", [_STATES, won, *_SUPPORT],
                          "A family whose states rarely offer a candidate that does what the simulator's expert would "
                          "cannot be learnt from these data by any offline method: no critic can pick it, no actor "
                          "imitate it.")  # fmt: skip


def _kind_table(support: dict[str, Any], kept: dict[str, Any]) -> list[str]:
    """Per kind of the expert's action: what the data offer there and what Digi-Q keeps (stage 08)."""

    def digiq(key: str) -> Cell:
        def cell(ts: str, kind: str, r: dict[str, Any]) -> str:
            value = kept.get(ts, {}).get(kind, {}).get(key)
            return pct(value) if value is not None else "-"

        return cell

    columns = [_STATES, *_SUPPORT, ("Digi-Q keeps a row (%)", digiq("kept")),
               ("Digi-Q's rows there the expert's (%)", digiq("expert"))]  # fmt: skip
    return _grouped_table(support, "expert's action", columns,
                          "The expert's action at each stored state, by kind; Digi-Q's columns pool its seeds.")  # fmt: skip


def _skills_table(skills: dict[str, Any]) -> list[str]:
    """The base policy alone and with each skill lent by the expert, per task set (stage 10, first seed)."""
    if "off" in skills:
        return [f"Expert-skill diagnostic off: {skills['off']}."]
    out = ["| base policy | General test | Web Shopping test |", "|---|---|---|"]
    for skill, res in sorted(skills.items(), key=lambda kv: kv[0] != "none"):  # the base alone first
        if isinstance(res, dict):
            name = "alone" if skill == "none" else f"+ the expert's {skill}"
            out.append(f"| {name} | {pct(res['general']['success_rate'])} | {pct(res['webshop']['success_rate'])} |")
    return out


def results_markdown(paths: Paths) -> str:
    """The README's results: every row on the test lists, each comparison with its interval, the paper's claims."""
    ev, ab = _load(paths, "eval"), _load(paths, "ablations")
    train, compared = _load(paths, "eval_train"), _load(paths, "comparisons")
    if not ev:
        return "No `metrics/eval.json` yet: run `make repro`."
    margins = _comparison_table(compared, ev) if compared else ["No `metrics/comparisons.json`: run stage 10."]
    out = _success_table(ev, train) + ["", "![results](plots/results.png)", ""] + margins
    if ab:
        out += ["", "Ablations (success rate %, mean ± sample std over seeds):", ""] + _success_table(ab)
        ablated = _comparison_table(compared or {}, ab)
        out += ["", *ablated] if ablated else []
        actor = _load(paths, "actor") or {}
        perfect = actor.get("perfect_critic")
        if perfect and "digiq_perfect_critic" in ab:
            out += ["", "digiq_perfect_critic: Digi-Q's actor on a perfect critic's picks (the candidate doing what "
                    f"the simulator's expert would; {pct(perfect['states_with_expert_candidate'])}% of states have "
                    f"one, and the data's own action is it in {pct(perfect['taken_action_is_expert'])}%)."]  # fmt: skip
        out += _extraction_note({name: e for name, e in actor.get("extraction", {}).items() if name in ab})
    online = _load(paths, "digirl_online")
    if online and online.get("rows"):
        out += ["", *env_steps_table(online, [p for p in ev if p not in online["rows"]])]
    if compared:
        out += ["", "The paper's claims, each judged by its comparison's interval:", ""] + claims_table(compared)
    return "\n".join(out)


def env_steps_table(online: dict[str, Any], offline_rows: list[str]) -> list[str]:
    """The environment steps each row learnt from: the offline data for the offline rows, the rounds' for the online
    ones (off2on: both), with the online runs' rounds and wall time (means over seeds)."""
    out = ["| policy | environment steps learnt from | of them online | rounds | online wall time (s) |",
           "|---|---|---|---|---|"]  # fmt: skip
    data = online["offline_env_steps"]
    out += [f"| {p} | {data:,} | 0 | - | - |" for p in offline_rows if p != "base"]
    for row, entry in online["rows"].items():
        rounds = np.mean([len(r) for r in entry["per_seed"]])
        out.append(f"| {row} | {entry['env_steps']:,.0f} | {entry['online_env_steps']:,.0f} | {rounds:g} | "
                   f"{entry['wall_time_s']:,.0f} |")  # fmt: skip
    return out + ["", "The offline rows learn from the collected data (stage 01) alone; the online rows' steps are "
                  "means over seeds, and their wall time is one run's (stage 09)."]  # fmt: skip


# How each row of the extraction ablation weighs a drawn candidate of advantage A.
EXTRACTION_WEIGHTS = {"digiq_awr": "exp(A / beta), clipped", "digiq_reinforce": "A itself"}


def _extraction_note(extraction: dict[str, Any]) -> list[str]:
    """What the extraction ablation's rows imitate (the actor stage's ``extraction`` metrics); empty without them."""
    if not extraction:
        return []
    rows = "; ".join(f"{name} weighs each by {EXTRACTION_WEIGHTS[name]}, {e['rows']:g} rows per seed"
                     + (f", mean weight {e['weight_mean']:.3f}" if "weight_mean" in e else "")
                     for name, e in extraction.items())  # fmt: skip
    return ["", f"{', '.join(extraction)}: Digi-Q's critic and exactly Best-of-N's drawn candidates, every valid one "
            f"imitated with a weight ({rows}); the loss is normalised by the sum of |weight|."]  # fmt: skip


def validation_markdown(paths: Paths) -> str:
    """The rows on the validation lists (``make val``: one ``python -m digiq.evaluate`` JSON per row in metrics/val/)."""
    found = sorted((paths.metrics / "val").glob("*.json"))
    if not found:
        return "No `metrics/val/` yet: run `make val` after `make repro`."
    runs = {p.stem: json.loads(p.read_text()) for p in found}
    sets = [ts for ts in TASK_SETS if any(ts in r for r in runs.values())]
    out = [
        "| policy | " + " | ".join(f"{TASK_SET_NAMES[ts]} val" for ts in sets) + " |",
        "|---" * (len(sets) + 1) + "|",
    ]
    for name, r in runs.items():
        out.append(f"| {name} | " + " | ".join(_rate(r[ts]) if ts in r else "-" for ts in sets) + " |")
    r = next(iter(runs.values()))
    n = "/".join(str(r[ts]["n_episodes"]) for ts in sets)
    return "\n".join(
        out
        + [
            "",
            f"Success rate (%), mean ± sample std over {r['seeds']} seeds, {n} validation tasks per "
            "seed (General/Web Shopping); each row's seed s is its stage-07 checkpoint of seed s.",
        ]
    )


def diagnostics_markdown(paths: Paths) -> str:
    """The experiments page's diagnostics: per family, what each policy imitates, the critic's picks, stage times."""
    ev, diag, skills = _load(paths, "eval"), _load(paths, "diagnostics") or {}, _load(paths, "skills")
    actor = _load(paths, "actor") or {}
    oracle = diag if diag.get("states") else {}
    success = (_load(paths, "collect") or {}).get("success_rate_by_family", {})
    out: list[str] = []
    if ev:
        out += ["Success by family on the test list (%, mean over seeds):", ""] + _family_table(ev)
    if "rows_expert_share" in diag:
        out += ["", "What each policy imitates (stages 07 and 08):", ""] + _rows_table(diag, actor.get("kept_rows", {}))
    if "expert_support" in diag:
        out += ["", "Where the data can teach (stages 01 and 08):", ""] + _support_table(
            diag["expert_support"], success
        )
    if "expert_support_by_kind" in diag:
        out += ["", "By the kind of the expert's action (stage 08):", ""] + _kind_table(
            diag["expert_support_by_kind"], diag.get("digiq_rows_by_kind", {})
        )
    if oracle:
        out += ["", "Oracle diagnostic (stage 08; true candidate values from the simulator):", ""] + _oracle_table(
            oracle
        )
    if "expert_pick" in diag:
        out += ["", "Expert picks over all stored states (stage 08):", ""] + expert_pick_table(diag["expert_pick"])
    if "probes" in diag:
        out += ["", "What each VLM's features carry (stage 08, linear probes):", ""] + representation_probe_table(
            diag["probes"]
        )
    wrong = diag.get("critic_wrong_picks")
    if wrong:
        out += ["", "Where Digi-Q's critic's picks go wrong (stage 08):", ""] + wrong_pick_table(wrong)
    rewarded = (_load(paths, "critic") or {}).get("rewarded_steps")
    if rewarded:
        out += ["", "Digi-Q's critic at the data's rewarded steps (stage 06):", ""] + rewarded_table(rewarded)
    if skills:
        out += ["", "Where the base policy loses (stage 10, first seed, the first 96 test tasks; success % with one "
                "skill taken from the simulator's expert, everything else the policy's own):", ""]  # fmt: skip
        out += _skills_table(skills)
    out += ["", "| stage | wall time (s) | headline |", "|---|---|---|"]
    timing = _load(paths, "eval_timing") or {}
    for stage in STAGES:
        m = _load(paths, stage)
        if m is None:
            continue
        wall = timing.get("wall_time_s") if stage == "eval" else m.get("wall_time_s", "-")
        head = ", ".join(f"{k}={m[k]}" for k in HEADLINES.get(stage, ()) if k in m)
        out.append(f"| {stage} | {wall if wall is not None else '-'} | {head} |")
    return "\n".join(out)


def save_results_chart(results: dict[str, Any], path: Path, title: str) -> Path:
    """Grouped bars (policy x task set) with standard-deviation error bars, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    policies = list(results)
    x = np.arange(len(TASK_SETS))
    width = 0.8 / len(policies)
    fig, ax = plt.subplots(figsize=(7, 3.6))
    for i, p in enumerate(policies):
        means = [100 * results[p][ts]["success_rate"] for ts in TASK_SETS]
        stds = [100 * (results[p][ts].get("success_rate_std") or 0.0) for ts in TASK_SETS]  # null: one seed
        ax.bar(x + (i - (len(policies) - 1) / 2) * width, means, width, yerr=stds, capsize=3, label=p)
    ax.set_xticks(x, ["General test", "Web Shopping test"])
    ax.set_ylabel("success rate (%)")
    ax.set_ylim(0, 100)
    ax.set_title(title)
    ax.legend(fontsize=8, ncols=min(4, len(policies)))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return path


def fill_block(path: Path, markers: tuple[str, str], body: str) -> None:
    """Replace the block between ``markers`` in ``path`` with ``body``."""
    start, end = markers
    text = path.read_text(encoding="utf-8")
    if start not in text or end not in text:
        raise ValueError(f"{path} has no {start} ... {end} block to fill")
    block = f"{start}\n{body}\n{end}"
    atomic_write_text(path, re.sub(re.escape(start) + ".*?" + re.escape(end), lambda _: block, text, flags=re.S))


def update_readme(readme: Path, paths: Paths, experiments: Path | None = None) -> None:
    """The README's results block and, with ``experiments``, that page's diagnostics block, from the metrics."""
    fill_block(readme, (START, END), results_markdown(paths))
    if experiments is not None:
        fill_block(experiments, VALIDATION, validation_markdown(paths))
        fill_block(experiments, DIAGNOSTICS, diagnostics_markdown(paths))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", default=str(Paths().root / "README.md"))
    ap.add_argument("--experiments", default=str(Paths().root / "docs" / "experiments.md"))
    args = ap.parse_args()
    update_readme(Path(args.readme), Paths(), Path(args.experiments))
    print(f"updated {args.readme} and {args.experiments}")


if __name__ == "__main__":
    main()
