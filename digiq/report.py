"""Write the README's results and the docs' diagnostics and stage times from the metrics files, never by hand.

``python -m digiq.report`` rebuilds the block between ``<!-- results:start -->``
and ``<!-- results:end -->`` in README.md: success per policy and task set
(mean ± sample std over seeds, on the whole test list and on its first 96
tasks, the paper's protocol), each comparison with its paired bootstrap
interval, the variants and the ablations, and the paper's claims each judged
by its comparison's interval (:data:`~digiq.tables.PAPER_CLAIMS`). It also rebuilds the
validation block of docs/experiments.md, the diagnostics block of
docs/diagnostics.md (success per family, what each policy imitates, where the
data can teach, the oracle diagnostic and the critic's picks, the base
policy's missing skills) and the stage-time block of docs/pipeline-time.md.

No stage runs this module. The tables a stage's notebook shows too are in
:mod:`digiq.tables` and the results chart in :mod:`digiq.viz.charts`; what is
here reads only in the README and the experiments page (the rows' environment
steps, the ablation notes, the diagnostics of several stages side by side),
so a change to it reruns nothing.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import numpy as np

from digiq import pipeline
from digiq.env.tasks import TASK_SETS
from digiq.io import fill_block
from digiq.paths import Paths
from digiq.tables import (
    PAE_CLAIMS,
    TASK_SET_NAMES,
    Cell,
    claims_table,
    comparison_table,
    expert_pick_table,
    family_table,
    grouped_table,
    pae_claims_markdown,
    pct,
    pick_margin_table,
    rate,
    rewarded_table,
    skills_table,
    success_table,
    wrong_pick_table,
)

__all__ = [
    "results_markdown",
    "env_steps_table",
    "pae_markdown",
    "validation_markdown",
    "diagnostics_markdown",
    "stage_times_markdown",
    "representation_probe_table",
    "update_readme",
]


START, END = "<!-- results:start -->", "<!-- results:end -->"
VALIDATION = ("<!-- validation:start -->", "<!-- validation:end -->")  # in docs/experiments.md
DIAGNOSTICS = ("<!-- diagnostics:start -->", "<!-- diagnostics:end -->")  # in docs/diagnostics.md
STAGE_TIMES = ("<!-- stage-times:start -->", "<!-- stage-times:end -->")  # in docs/pipeline-time.md
RESULTS = ("<!-- results:start -->", "<!-- results:end -->")  # in docs/results.md: every table of the run
# The stages with a metrics file of their name (their wall time among the metrics), in the pipeline's order.
STAGES = tuple(s.name for s in pipeline.stages() if f"metrics/{s.name}.json" in s.metrics)
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
            "uninformed: a uniform pick among a state's distinct valid actions; base_sample: among its valid draws. "
            "feature_probe_*: fit to the oracle values themselves on half the states, scored on the other half "
            "(what the true values of that many states teach a ranker on the critic's inputs; *_ranker_* in the expert "
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


def _rows_table(diag: dict[str, Any], kept_rows: dict[str, float]) -> list[str]:
    """Per policy: how many rows it imitates (stage 07) and how often their action is the expert's, per task set (stage
    08); where stage 08 reports it, how many rows are at states where the expert's action was a candidate, and how
    often the rows there are the expert's."""
    shares = diag["rows_expert_share"]
    sets = list(next(iter(shares.values())))
    columns = {"rows_expert_share": "expert's action", "rows_expert_on_offer": "expert's action on offer",
               "rows_expert_share_where_on_offer": "expert's action where on offer"}  # fmt: skip
    columns = {key: label for key, label in columns.items() if key in diag}
    out = ["| policy | rows | " + " | ".join(f"{label}, {ts} (%)" for label in columns.values() for ts in sets) + " |",
           "|---|---|" + "---|" * len(sets) * len(columns)]  # fmt: skip
    for name in shares:
        cells = [pct(diag[key][name][ts]) if diag[key][name][ts] is not None else "-" for key in columns
                 for ts in sets]  # fmt: skip
        out.append(f"| {name} | {kept_rows.get(name, '-')} | " + " | ".join(cells) + " |")
    return out + ["", "rows: the (state, action) rows each policy is fit on (mean over its seeds); the share of them "
                  "whose action does what the simulator's expert would there (mean over seeds; - where none is kept); "
                  "the share of them at states where some candidate does (elsewhere every row is wrong); and the "
                  "expert's share of the rows at those states. The extraction ablation's rows count by their "
                  "weight."]  # fmt: skip


_STATES: tuple[str, Cell] = ("states", lambda ts, g, r: str(r["states"]))
_SUPPORT: list[tuple[str, Cell]] = [
    ("data's action is the expert's (%)", lambda ts, g, r: pct(r["taken_is_expert"])),
    ("a candidate is the expert's (%)", lambda ts, g, r: pct(r["expert_candidate"])),
]


def _support_table(support: dict[str, Any], success: dict[str, float]) -> list[str]:
    """Per family: the data's success (stage 01) and how often its action, or any candidate, is the expert's (stage 08)."""
    won: tuple[str, Cell] = ("data's success (%)", lambda ts, fam, r: pct(success[fam]) if fam in success else "-")
    return grouped_table(support, "family", [_STATES, won, *_SUPPORT],
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
    return grouped_table(support, "expert's action", columns,
                          "The expert's action at each stored state, by kind; Digi-Q's columns pool its seeds.")  # fmt: skip


def headline_markdown(paths: Paths) -> str:
    """The README's results: every row on the test lists, the chart, and the paper's and PAE's claims with their
    verdicts; every other table is on the results page (:func:`results_markdown`, ``docs/results.md``)."""
    ev, compared = _load(paths, "eval"), _load(paths, "comparisons")
    if not ev:
        return "No `metrics/eval.json` yet: run `make repro`."
    out = success_table(ev, _load(paths, "eval_train")) + ["", "![results](plots/results.png)"]
    if compared:
        out += ["", "The paper's claims, each judged by its comparison's interval:", "", *claims_table(compared)]
    judged = _load(paths, "pae_eval")
    if judged and "all" in judged:
        out += ["", "PAE's claims ([docs/pae.md](docs/pae.md)) on the whole test lists:", "",
                *claims_table(judged["all"], PAE_CLAIMS)[:-2]]  # fmt: skip
    return "\n".join(out)


def in_docs(markdown: str) -> str:
    """``markdown`` written for the repository's root, its links made relative to ``docs/``."""
    return markdown.replace("](plots/", "](../plots/").replace("](docs/", "](")


def results_markdown(paths: Paths) -> str:
    """The README's results: every row on the test lists, each comparison with its interval, the paper's claims."""
    ev, ab = _load(paths, "eval"), _load(paths, "ablations")
    train, compared = _load(paths, "eval_train"), _load(paths, "comparisons")
    if not ev:
        return "No `metrics/eval.json` yet: run `make repro`."
    margins = comparison_table(compared, ev) if compared else ["No `metrics/comparisons.json`: run stage 12."]
    out = success_table(ev, train) + ["", "![results](plots/results.png)", ""] + margins
    if ab:
        out += ["", "Ablations (success rate %, mean ± sample std over seeds):", ""] + success_table(ab)
        ablated = comparison_table(compared or {}, ab)
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
        practice = (_load(paths, "pae") or {}).get("rows", {})
        offline = [p for p in ev if p not in online["rows"] and p not in practice]
        out += ["", *env_steps_table(online, offline, practice)]
    if compared:
        out += ["", "The paper's claims, each judged by its comparison's interval:", ""] + claims_table(compared)
        if (paths.plots / "claims.png").exists():  # drawn by stage 12 (notebook 12)
            out += ["", "![the paper's claims](plots/claims.png)"]
    out += pae_markdown(paths)
    diag = _load(paths, "diagnostics") or {}
    if "critic_pick_margin" in diag:
        out += ["", "Digi-Q's critic against a ranking that knows nothing (stage 08):", ""]
        out += pick_margin_table(diag["critic_pick_margin"], diag["expert_pick"])
    return "\n".join(out)


def pae_markdown(paths: Paths) -> list[str]:
    """PAE's claims and panels (:func:`~digiq.tables.pae_claims_markdown`) from stage 12's and stage 11's metrics."""
    return pae_claims_markdown(_load(paths, "pae_eval"), _load(paths, "pae"))


def env_steps_table(online: dict[str, Any], offline_rows: list[str], practice: dict[str, Any] | None = None
                    ) -> list[str]:  # fmt: skip
    """The environment steps each row learnt from: the offline data for the offline rows, the rounds' for the online
    ones (off2on: both) and PAE's practice rows (``practice``: ``metrics/pae.json``'s rows), with the runs' rounds
    (per task set's run) and the online runs' wall time (means over seeds)."""
    out = ["| policy | environment steps learnt from | of them online | rounds | online wall time (s) |",
           "|---|---|---|---|---|"]  # fmt: skip
    data = online["offline_env_steps"]
    out += [f"| {p} | {data:,} | 0 | - | - |" for p in offline_rows if p != "base"]
    for row, entry in online["rows"].items():
        rounds = np.mean([len(r) for part in entry["by_task_set"].values() for r in part["per_seed"]])
        out.append(f"| {row} | {entry['env_steps']:,.0f} | {entry['online_env_steps']:,.0f} | {rounds:.1f} | "
                   f"{entry['wall_time_s']:,.0f} |")  # fmt: skip
    for row, entry in (practice or {}).items():
        rounds = np.mean([len(r) for part in entry["by_task_set"].values() for r in part["per_seed"]])
        out.append(f"| {row} | {entry['env_steps']:,.0f} | {entry['env_steps']:,.0f} | {rounds:.1f} | - |")
    return out + ["", "The offline rows learn from the collected data (stage 01) alone; the online and practice rows' "
                  "steps are means over seeds, and the online rows' wall time one seed's runs on both task sets "
                  "(stage 09; PAE's practice, stage 11, times itself as a whole)."]  # fmt: skip


# How each row of the extraction ablation weighs a drawn candidate of advantage A.
EXTRACTION_WEIGHTS = {"digiq_awr": "exp(A / beta)", "digiq_reinforce": "A itself"}


def _extraction_note(extraction: dict[str, Any]) -> list[str]:
    """What the extraction ablation's rows imitate (the actor stage's ``extraction`` metrics); empty without them."""
    if not extraction:
        return []
    rows = "; ".join(f"{name} weighs it by {EXTRACTION_WEIGHTS[name]}, {e['rows']:g} rows per seed"
                     + (f", the top 1% of them carrying {e['top_percent_weight_share']:.0%} of the weight"
                        if "top_percent_weight_share" in e else "")
                     for name, e in extraction.items())  # fmt: skip
    return ["", f"{', '.join(extraction)}: Digi-Q's critic and exactly Best-of-N's drawn candidates; each state's best "
            f"one imitated with a weight of its advantage A clamped to [0, 1], as released Digi-Q weighs it ({rows}); "
            "the loss is normalised by the sum of the weights."]  # fmt: skip


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
        if "partial" in r:  # a run stopped or refused a seed's checkpoint: its figures cover the seeds done only
            name += f" (partial: {r['seeds']} of {r['seeds'] + len(r['partial']['seeds_missing'])} seeds)"
        out.append(f"| {name} | " + " | ".join(rate(r[ts]) if ts in r else "-" for ts in sets) + " |")
    r = next((r for r in runs.values() if "partial" not in r), next(iter(runs.values())))
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
    """The diagnostics page's tables: per family, what each policy imitates, the critic's picks, missing skills."""
    ev, diag, skills = _load(paths, "eval"), _load(paths, "diagnostics") or {}, _load(paths, "skills")
    actor = _load(paths, "actor") or {}
    oracle = diag if diag.get("states") else {}
    success = (_load(paths, "collect") or {}).get("success_rate_by_family", {})
    out: list[str] = []
    if ev:
        out += ["Success by family on the test list (%, mean over seeds):", ""] + family_table(ev)
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
        out += ["", "Expert picks on the stored states of the trajectories no critic trained on (stage 08):", ""]
        out += expert_pick_table(diag["expert_pick"])
    if "critic_pick_margin" in diag:
        out += ["", "Digi-Q's critic against the uninformed level there, with its interval (stage 08):", ""]
        out += pick_margin_table(diag["critic_pick_margin"], diag["expert_pick"])
    if "expert_pick_train" in diag:
        out += ["", "The same on the trajectories the critics trained on:", ""]
        out += expert_pick_table(diag["expert_pick_train"])
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
        out += ["", "Where the base policy loses (stage 12, first seed, the first 96 test tasks; success % with one "
                "skill taken from the simulator's expert, everything else the policy's own):", ""]  # fmt: skip
        out += skills_table(skills)
    return "\n".join(out)


def stage_times_markdown(paths: Paths) -> str:
    """Each stage's wall time (``wall_time_s`` of its metrics) and its headline numbers, and their total."""
    out = ["| stage | wall time (s) | headline |", "|---|---|---|"]
    timing = _load(paths, "eval_timing") or {}
    total = 0.0
    for stage in STAGES:
        m = _load(paths, stage)
        if m is None:
            continue
        wall = timing.get("wall_time_s") if stage == "eval" else m.get("wall_time_s")
        total += wall or 0.0
        head = ", ".join(f"{k}={m[k]}" for k in HEADLINES.get(stage, ()) if k in m)
        out.append(f"| {stage} | {wall if wall is not None else '-'} | {head} |")
    out.append(f"| all stages | {total:.0f} ({total / 60:.0f} min) | |")
    return "\n".join(out)


def update_readme(readme: Path, paths: Paths, docs: Path | None = None) -> None:
    """The README's headline block and, with ``docs`` (the docs folder), the results page's block (every table)
    and the blocks of its experiments, diagnostics and pipeline-time pages, from the metrics."""
    fill_block(readme, (START, END), headline_markdown(paths))
    if docs is not None:
        fill_block(docs / "results.md", RESULTS, in_docs(results_markdown(paths)))
        fill_block(docs / "experiments.md", VALIDATION, validation_markdown(paths))
        fill_block(docs / "diagnostics.md", DIAGNOSTICS, diagnostics_markdown(paths))
        fill_block(docs / "pipeline-time.md", STAGE_TIMES, stage_times_markdown(paths))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", default=str(Paths().root / "README.md"))
    ap.add_argument("--docs", default=str(Paths().root / "docs"), help="the folder of results.md, "
                    "experiments.md, diagnostics.md and pipeline-time.md")  # fmt: skip
    args = ap.parse_args()
    update_readme(Path(args.readme), Paths(), Path(args.docs))
    print(f"updated {args.readme} and the blocks in {args.docs}")


if __name__ == "__main__":
    main()
