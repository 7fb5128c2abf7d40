"""Markdown tables of the pipeline's metrics, as a stage's notebook shows them and the README repeats them.

Each function takes a metrics dict (``metrics/<stage>.json`` or a part of
it) and returns the table's lines. The critic's, the diagnostics' and the
evaluation's notebooks show their own stage's tables with these, so these
are part of what those stages run; :mod:`digiq.report`, which gathers every
stage's tables into README.md and the docs' generated blocks, is not: a change to
how the README reads reruns no stage.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from digiq.env.tasks import TASK_SETS

__all__ = [
    "TASK_SET_NAMES",
    "pct",
    "rate",
    "success_table",
    "evaluated_sets",
    "family_table",
    "comparison_table",
    "Claim",
    "PAPER_CLAIMS",
    "PAE_CLAIMS",
    "claims_table",
    "pae_claims_markdown",
    "judge_claim",
    "Lead",
    "expert_pick_table",
    "pick_margin_table",
    "interval_cell",
    "typed_text_table",
    "wrong_pick_table",
    "rewarded_table",
    "Cell",
    "grouped_table",
    "skills_table",
]

TASK_SET_NAMES = {"general": "General", "webshop": "Web Shopping"}


def pct(x: float) -> str:
    """A rate in [0, 1] as percent with one decimal."""
    return f"{100 * x:.1f}"


def rate(r: dict[str, Any]) -> str:
    """``mean ± std`` in percent over seeds; the mean alone with one seed, whose sample std is undefined (null)."""
    std = r.get("success_rate_std")
    return pct(r["success_rate"]) + (f" ± {pct(std)}" if std is not None else "")


def success_table(results: dict[str, Any], train: dict[str, Any] | None = None) -> list[str]:
    """One row per policy, test columns and, from ``train`` (eval_train.json), the paper's train columns beside them.

    When a test list is longer than the paper's 96 tasks, its first 96 (the
    paper's protocol) get their own column beside the whole list's.
    """
    train = {p: sets for p, sets in (train or {}).items() if isinstance(sets, dict)}
    some = next(iter(results.values()))
    seeds = len(next(iter(some.values()))["per_seed"])
    columns: list[tuple[str, str, dict[str, Any], bool]] = []  # (head, task set, results, the first tasks only)
    sizes = []
    for ts in evaluated_sets(results):
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
            rate(src[p][ts]["first96"] if part else src[p][ts]) if ts in src.get(p, {}) else "-"
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


def evaluated_sets(results: dict[str, Any]) -> list[str]:
    """The task sets stage 12 evaluated (``eval.json``'s policies all hold the same ones: those the data hold)."""
    some = next(iter(results.values()))
    return [ts for ts in TASK_SETS if ts in some]


def family_table(results: dict[str, Any]) -> list[str]:
    policies = list(results)
    out = ["| task set | family | " + " | ".join(policies) + " |", "|---" * (len(policies) + 2) + "|"]
    for ts in evaluated_sets(results):
        for f in sorted({f for p in policies for f in results[p][ts]["by_family"]}):
            vals = [pct(results[p][ts]["by_family"][f]) if f in results[p][ts]["by_family"] else "-" for p in policies]
            out.append(f"| {ts} | {f} | " + " | ".join(vals) + " |")
    return out


def comparison_table(comparisons: dict[str, Any], rows: Iterable[str]) -> list[str]:
    """The paired comparisons of stage 12 between ``rows``: difference in points and its 95% bootstrap interval.

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


# PAE's claims (docs/pae.md, written before the first run): its rows against the base, the same practice on human
# tasks, DigiRL's online Filtered BC baseline; and the evaluator's cost. Read on the whole test lists and, for the
# first, on the test tasks no proposal matched.
PAE_CLAIMS: tuple[Claim, ...] = (
    Claim("Practice on proposed tasks improves on the policy it starts from (PAE: about 50% relative on unseen tasks)",
          "pae-base", ">", "both"),
    Claim("Proposed tasks are no worse to practise on than human-written train tasks", "pae-pae_human", ">=", "both"),
    Claim("PAE beats online Filtered BC on human tasks", "pae-filtered_bc_online", ">", "both"),
    Claim("A perfect evaluator does at least as well as the learned one", "pae_oracle-pae", ">=", "both"),
)  # fmt: skip


class Lead(NamedTuple):
    """A claim's comparison on one task set, as the claimed winner's lead in points: the paired difference, its 95%
    interval, and what the interval reads (holds, reversed, no detectable difference)."""

    diff: float
    low: float
    high: float
    reading: str


def judge_claim(claim: Claim, comparisons: dict[str, Any]) -> tuple[dict[str, Lead | None], str]:
    """``claim``'s lead on each task set (``None``: its comparison is missing there) and its verdict
    (:func:`claims_table` says how it is read)."""
    leads: dict[str, Lead | None] = {}
    for ts in TASK_SETS:
        c = comparisons.get(ts, {}).get(claim.comparison)
        if c is None:
            leads[ts] = None
            continue
        low, high = sorted(claim.sign * x for x in c["ci95"])
        leads[ts] = Lead(claim.sign * c["diff"], low, high, HOLDS if low > 0 else REVERSED if high < 0 else UNDETECTED)
    return leads, _verdict(claim, [None if lead is None else lead.reading for lead in leads.values()])


def claims_table(comparisons: dict[str, Any], claims: Sequence[Claim] = PAPER_CLAIMS) -> list[str]:
    """``claims`` (the paper's by default), each judged on every task set by its comparison in ``comparisons``
    (comparisons.json's layout).

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
    for claim in claims:
        leads, verdict = judge_claim(claim, comparisons)
        cells = [NOT_MEASURED if lead is None else f"{lead.diff:+.1f} [{lead.low:+.1f}, {lead.high:+.1f}], {lead.reading}"
                 for lead in leads.values()]  # fmt: skip
        which = "both task sets" if claim.on == "both" else "at least one task set"
        out.append(f"| {claim.text}: {claim.condition()} on {which} | " + " | ".join(cells) + f" | **{verdict}** |")
    return out + ["", "Each cell: the claimed winner's lead in points with its 95% paired bootstrap interval; holds: "
                  "above 0, reversed: below 0, no detectable difference: the interval holds 0. Verdict: not measured "
                  "if the comparison is missing on a task set; reproduced if reversed nowhere and holding where the "
                  "claim requires (a ≥ claim: reversed nowhere); no detectable difference if every interval holds 0; "
                  "otherwise not reproduced."]  # fmt: skip


Cell = Callable[[str, str, dict[str, Any]], str]  # (task set, group, support row) -> a table cell


def grouped_table(support: dict[str, Any], group: str, columns: list[tuple[str, Cell]], note: str) -> list[str]:
    """A row per task set and group of a support report (stage 08), with the given columns."""
    out = [f"| task set | {group} | " + " | ".join(h for h, _ in columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for ts, groups in support.items():
        for g, r in groups.items():
            out.append(f"| {ts} | {g} | " + " | ".join(cell(ts, g, r) for _, cell in columns) + " |")
    return out + ["", note]


def expert_pick_table(pick: dict[str, Any]) -> list[str]:
    """How often each ranking picks the expert's action, over every stored state (stage 08; notebook 08)."""
    if not pick:
        return ["Expert picks off (`diagnostics.oracle_states: 0`)."]
    if "hit_rate" not in pick:
        return ["Expert picks: no stored state has both expert and other valid candidates."]
    groups = [k.removeprefix("hit_rate_") for k in pick if k.startswith("hit_rate_")]
    split = ["kind_rate", "within_kind_rate"] if "kind_rate" in pick else []
    heads = [*groups, *(["right kind", "right action of that kind"] if split else [])]
    out = ["| ranking | all | " + " | ".join(heads) + " |", "|---|---|" + "---|" * len(heads)]
    for name, rate in pick["hit_rate"].items():
        cells = [pick[f"hit_rate_{g}"][name] for g in groups] + [pick[k][name] for k in split]
        out.append(f"| {name} | {pct(rate)} | " + " | ".join(pct(c) for c in cells) + " |")
    return out + ["", f"Picks that do what the simulator's expert would (%), over the {pick['informative_states']} "
                  f"of {pick['states']} states whose valid candidates include both such and other actions "
                  "(mean over seeds; uninformed: a uniform pick among each state's distinct valid actions, the "
                  "level of a ranking that knows nothing, as the argmax sees a candidate drawn twice as one; "
                  "base_sample: a uniform pick among the valid draws, the base policy's own sampling rate; "
                  "critic_<row>: the argmax of Q of that row's critic; mlp_ranker_* and linear_ranker_*: a network shaped like a "
                  "Q head and a linear scorer on the same critic inputs, fit to the expert's choices on the other "
                  "half of the episodes, what those inputs allow with a label on every candidate). Right kind: the "
                  "pick is of a kind of action the expert's is (a tap where it taps); right action of that kind: "
                  "how often such a pick is the expert's action (the right element to tap)."]  # fmt: skip


def pick_margin_table(margin: dict[str, Any], pick: dict[str, Any]) -> list[str]:
    """Digi-Q's critic against the uninformed level on the held-out states, with the interval (stage 08; README)."""
    if not margin:
        return ["Critic's margin off (`diagnostics.oracle_states: 0`), or no held-out state is informative."]
    groups = list(margin)
    rates = [pick["hit_rate" + ("" if g == "all" else f"_{g}")] for g in groups]
    heads = ["all" if g == "all" else TASK_SET_NAMES.get(g, g) for g in groups]

    return ["| held-out states | " + " | ".join(heads) + " |", "|---|" + "---|" * len(heads),
            "| Digi-Q's critic picks the expert's action (%) | " + " | ".join(pct(r["critic_digiq"]) for r in rates) + " |",
            "| uninformed level (%) | " + " | ".join(pct(r["uninformed"]) for r in rates) + " |",
            "| critic - uninformed (points, 95% CI) | " + " | ".join(interval_cell(margin[g]) for g in groups) + " |",
            "", f"Over the {margin[groups[0]]['units']:,} informative stored states of the {margin[groups[0]]['clusters']:,} "
            "trajectories no critic trained on (states whose valid candidates include both an action the "
            "simulator's expert would take and another), scored by each seed's critic (mean over seeds); "
            "uninformed: a uniform pick among each state's distinct valid actions. The interval resamples held-out "
            "trajectories and seeds (digiq.stats.cluster_bootstrap)."]  # fmt: skip


def interval_cell(m: dict[str, Any]) -> str:
    """A difference in points with its 95% interval, and what the interval says where it holds 0."""
    lo, hi = m["ci95"]
    return f"{m['diff']:+.1f} [{lo:+.1f}, {hi:+.1f}]" + ("" if lo > 0 or hi < 0 else ", no detectable difference")


def typed_text_table(typed: dict[str, Any], margins: dict[str, Any]) -> list[str]:
    """The typed-text check of stage 08 per critic row, task set and perturbation, then each critic row's pick margin
    where the expert types and elsewhere (``margins``: row, task set, group; notebook 08, docs)."""
    if not typed or not typed.get("states"):
        return ["Typed-text check off (`diagnostics.oracle_states: 0`), or no held-out state where the expert types "
                "has a candidate that types what it would."]  # fmt: skip
    rows = [(row, ts, kind, r) for row, by in typed.items() if isinstance(by, dict) and "all" in by
            for ts, kinds in by.items() if ts != "text_encoder" for kind, r in kinds.items()]  # fmt: skip
    lines = ["| critic | text | task set | against | right query above (points over ties, 95% CI) | wins (%) | "
             "ties (%) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for row, ts, kind, r in rows:
        lines.append(f"| {row} | {typed[row]['text_encoder']} | {TASK_SET_NAMES.get(ts, ts)} | {kind} | "
                     f"{interval_cell(r)} | {pct(r['win_share'])} | {pct(r['tie_share'])} |")  # fmt: skip
    lines += ["", f"At the {typed['states']:,} held-out states where the simulator's expert types and some candidate "
              "types what it would; each kind of perturbation of that query keeps the candidate's VLM "
              "representation, so only the text the critic reads changes. A critic that cannot tell them apart "
              "ties (0 points); the interval resamples held-out trajectories and seeds.", ""]  # fmt: skip
    lines += ["| critic | its top pick is the expert's action | task set | critic - uninformed (points, 95% CI) |",
              "|---|---|---|---|"]  # fmt: skip
    for row, by_ts in margins.items():
        for ts, groups in by_ts.items():
            for group in ("typing", "other"):
                if group in groups:
                    lines.append(f"| {row} | where the expert {'types' if group == 'typing' else 'does not type'} | "
                                 f"{TASK_SET_NAMES.get(ts, ts)} | {interval_cell(groups[group])} |")  # fmt: skip
    return lines


def wrong_pick_table(wrong: dict[str, Any]) -> list[str]:
    """Where the critic's argmax is not the expert's: the kind it picks, beside the data's and the expert's (stage 08; notebook 08)."""
    if not wrong:
        return ["Wrong picks off (`diagnostics.oracle_states: 0`), or the critic never missed the expert."]
    columns = [(f"{head} (%)", lambda ts, kind, r, key=key: pct(r[key])) for head, key in
               (("critic's wrong picks", "critic"), ("data's action there", "data"), ("expert's action there", "expert"))]  # fmt: skip
    counts = ", ".join(f"{ts} {r['wrong_picks']}" for ts, r in wrong.items())
    return grouped_table({ts: r["kinds"] for ts, r in wrong.items()}, "action kind", columns,
                          "Over the informative stored states where the argmax of Digi-Q's critic's Q (critic_digiq "
                          f"above) does not do what the expert would ({counts} per seed, pooled over seeds): the kind "
                          "of action it picks, the kind the data took there, and the kind the expert would take.")  # fmt: skip


def rewarded_table(rewarded: dict[str, Any]) -> list[str]:
    """Per family: the rewarded steps the critics trained on and their Q of the taken action (stage 06; notebook 06)."""
    if not rewarded:
        return ["No rewarded step among the transitions the critics trained on."]
    columns: list[tuple[str, Cell]] = [("rewarded steps trained on", lambda ts, fam, r: f"{r['steps']:g}"),
                                       ("critic's Q of their action (target 1.0)", lambda ts, fam, r: f"{r['q_taken']:.3f}")]  # fmt: skip
    return grouped_table(rewarded, "family", columns,
                          "A rewarded step ends its episode, so its TD target is exactly the reward, 1 (mean over the "
                          "seeds' critics, each over the steps of the episodes it trained on; families with none left "
                          "out).")  # fmt: skip


def skills_table(skills: dict[str, Any]) -> list[str]:
    """The base policy alone and with each skill lent by the expert, per task set (stage 12, first seed)."""
    if "off" in skills:
        return [f"Expert-skill diagnostic off: {skills['off']}."]
    sets = [ts for ts in TASK_SETS if ts in skills["none"]]
    out = ["| base policy | " + " | ".join(f"{TASK_SET_NAMES[ts]} test" for ts in sets) + " |", "|---" * (len(sets) + 1)
           + "|"]  # fmt: skip
    for skill, res in sorted(skills.items(), key=lambda kv: kv[0] != "none"):  # the base alone first
        if isinstance(res, dict):
            name = "alone" if skill == "none" else f"+ the expert's {skill}"
            out.append(f"| {name} | " + " | ".join(pct(res[ts]["success_rate"]) for ts in sets) + " |")
    return out


def pae_claims_markdown(judged: dict[str, Any] | None, practice: dict[str, Any] | None) -> list[str]:
    """PAE's claims (docs/pae.md) judged by stage 12's intervals (``judged``: ``metrics/pae_eval.json``), on the
    whole test lists and on the test tasks no proposal matched; the proposals' validity and the learned evaluator's
    agreement with ground truth (``practice``: stage 11's ``metrics/pae.json``). Nothing when PAE did not run."""
    if not judged or "all" not in judged:  # not run, or off (pae.rows is [])
        return []
    out = ["", "PAE's claims ([docs/pae.md](docs/pae.md)), each judged by its comparison's interval, on the whole test "
           "lists:", "", *claims_table(judged["all"], PAE_CLAIMS)[:-2]]  # fmt: skip
    sizes = ", ".join(f"{n} {TASK_SET_NAMES[ts]}" for ts, n in judged["unmatched_tasks"].items())
    out += ["", f"On the test tasks whose goal no proposal has ({sizes}):", "",
            *claims_table(judged["unmatched"], PAE_CLAIMS[:1])]  # fmt: skip
    compared = {row for pairs in judged["unmatched"].values() for name in pairs for row in name.split("-")}
    out += ["", "Every PAE comparison on those tasks:", "", *comparison_table(judged["unmatched"], compared)]
    practice = practice or {}
    panel, evaluated = practice.get("proposer_panel"), practice.get("evaluator_panel", {}).get("pae", {}).get("all")
    if panel and evaluated and evaluated.get("precision") is not None:
        out += ["", f"The {panel['proposals']} proposals: {pct(panel['valid'])}% map to a task the simulator can check "
                f"(the scripted expert does {pct(panel['expert_success_on_valid'] or 0)}% of those). The pae row's "
                f"evaluator against that check over its practice episodes: precision {pct(evaluated['precision'])}%, "
                f"recall {pct(evaluated['recall'] or 0)}%, agreement {pct(evaluated['agreement'])}%."]  # fmt: skip
    return out
