"""Write the README's results from the metrics files, never by hand.

``python -m digiq.report`` rebuilds the block between the markers
``<!-- results:start -->`` and ``<!-- results:end -->`` in README.md from
``metrics/*.json``: success rates per policy and task set (mean ± std over
seeds), Digi-Q's margins, per-family success, the ablations, what each
policy imitates, what base + 20 asks of the test tasks the data can teach,
where the data can teach (by family and by the expert's kind of action),
the oracle diagnostic, each stage's wall time and its headline numbers. The
eval notebook draws the bar charts with :func:`save_results_chart`.
"""

from __future__ import annotations

import argparse
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from digiq.env.tasks import TASK_SETS
from digiq.io import atomic_path, atomic_write_text
from digiq.paths import Paths

__all__ = ["results_markdown", "update_readme", "save_results_chart", "expert_pick_table", "reach"]


START, END = "<!-- results:start -->", "<!-- results:end -->"
TASK_SET_NAMES = {"general": "General", "webshop": "Web Shopping"}
STAGES = ("tasks", "base_policy", "collect", "augment_actions", "vlm_finetune", "embed", "critic", "actor", "eval")
HEADLINES = {
    "base_policy": ("demo_episodes", "train_loss_last"),
    "collect": ("trajectories", "transitions", "success_rate_by_task_set"),
    "augment_actions": ("states", "n_candidates", "sampled_valid_rate"),
    "vlm_finetune": ("accuracy_heldout", "majority_rate_heldout"),
    "embed": ("states", "pairs_per_s"),
    "critic": ("v_mc_return_corr_heldout", "q_loss_last"),
    "actor": ("kept_fraction",),
}


def _load(paths: Paths, stage: str) -> dict[str, Any] | None:
    p = paths.metrics / f"{stage}.json"
    return json.loads(p.read_text()) if p.exists() else None


def _pct(x: float) -> str:
    return f"{100 * x:.1f}"


def _rate(r: dict[str, Any]) -> str:
    """``mean ± std`` in percent, over seeds."""
    return f"{_pct(r['success_rate'])} ± {_pct(r.get('success_rate_std', 0.0))}"


def _success_table(results: dict[str, Any], train: dict[str, Any] | None = None) -> list[str]:
    """One row per policy, test columns and, from ``train`` (eval_train.json), the paper's train columns beside them.

    A seeds column when the rows were repeated differently (ablations.seeds).
    """
    train = {p: sets for p, sets in (train or {}).items() if isinstance(sets, dict)}
    seeds = {p: len(sets["general"].get("per_seed", [0])) for p, sets in results.items()}
    n = next(iter(results.values()))["general"]["n_episodes"]
    columns: list[tuple[str, str, dict[str, Any]]] = []
    for ts in TASK_SETS:
        if any(ts in train.get(p, {}) for p in results):
            columns.append((f"{TASK_SET_NAMES[ts]} train", ts, train))
        columns.append((f"{TASK_SET_NAMES[ts]} test", ts, results))
    varied = len(set(seeds.values())) > 1
    head = ["policy", *(["seeds"] if varied else []), *(c[0] for c in columns)]
    out = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]
    for p in results:
        cells = [_rate(src[p][ts]) if ts in src.get(p, {}) else "-" for _, ts, src in columns]
        out.append("| " + " | ".join([p, *([str(seeds[p])] if varied else []), *cells]) + " |")
    over = "the row's seeds (± 0.0 with one)" if varied else f"{next(iter(seeds.values()))} seed(s)"
    note = f"Success rate (%), mean ± standard deviation over {over}, {n} test tasks per task set and seed"
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
            vals = [_pct(results[p][ts]["by_family"][f]) if f in results[p][ts]["by_family"] else "-" for p in policies]
            out.append(f"| {ts} | {f} | " + " | ".join(vals) + " |")
    return out


def _targets(ev: dict[str, Any]) -> list[str]:
    """Digi-Q's margins over each other policy, per task set (the claim under test)."""
    if "digiq" not in ev:
        return []
    out = ["| Digi-Q minus | General (points) | Web Shopping (points) |", "|---|---|---|"]
    for p in (q for q in ev if q != "digiq"):
        d = [100 * (ev["digiq"][ts]["success_rate"] - ev[p][ts]["success_rate"]) for ts in TASK_SETS]
        out.append(f"| {p} | {d[0]:+.1f} | {d[1]:+.1f} |")
    return out


def _oracle_table(oracle: dict[str, Any]) -> list[str]:
    if not oracle.get("states"):
        return ["Oracle diagnostic off (`actor.oracle_states: 0`)."]
    if "top1_hit_rate" not in oracle:
        return [f"Oracle diagnostic: no informative states among {oracle.get('states', 0)} sampled."]
    out = ["| ranking | top-1 is truly best (%) | true value of its pick |", "|---|---|---|"]
    for name, hit in oracle["top1_hit_rate"].items():
        out.append(f"| {name} | {_pct(hit)} | {oracle['oracle_value_of_pick'][name]:.3f} |")
    out += ["", f"{oracle['informative_states']} of {oracle['states']} sampled states have candidates of different "
            f"true value; best possible pick's mean value {oracle['oracle_value_of_pick']['best']:.3f}. "
            "feature_probe_*: fit to the oracle values themselves on half the states, scored on the other half "
            "(what the true values of that many states teach a ranker on the critic's inputs; probe_* in the expert "
            "picks below learns from every stored state)."]  # fmt: skip
    behaviour = oracle.get("behaviour_values")
    if behaviour:
        flat = "; ".join(f"{ts} {_pct(v['flat'])}% of {v['states']}" for ts, v in behaviour.items()
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
    """How often each ranking picks the expert's action, over every stored state (stage 06; notebooks 06 and 07)."""
    if not pick:
        return ["Expert picks off (`actor.oracle_states: 0`)."]
    if "hit_rate" not in pick:
        return ["Expert picks: no stored state has both expert and other valid candidates."]
    groups = [k.removeprefix("hit_rate_") for k in pick if k.startswith("hit_rate_")]
    out = ["| ranking | all | " + " | ".join(groups) + " |", "|---|---|" + "---|" * len(groups)]
    for name, rate in pick["hit_rate"].items():
        out.append(f"| {name} | {_pct(rate)} | " + " | ".join(_pct(pick[f"hit_rate_{g}"][name]) for g in groups) + " |")
    return out + ["", f"Picks that do what the simulator's expert would (%), over the {pick['informative_states']} "
                  f"of {pick['states']} stored states whose valid candidates include both such and other actions "
                  "(mean over seeds, critic_untuned over the ablations' seeds; critic_*: the argmax of Q of each "
                  "VLM's critic; probe_*: a ranker on the same critic inputs fit to the expert's choices on the other "
                  "half of the episodes, what those inputs allow with a label on every candidate)."]  # fmt: skip


def wrong_pick_table(wrong: dict[str, Any]) -> list[str]:
    """Where the critic's argmax is not the expert's: the kind it picks, beside the data's and the expert's (stage 06; notebook 06)."""
    if not wrong:
        return ["Wrong picks off (`actor.oracle_states: 0`), or the critic never missed the expert."]
    columns = [(f"{head} (%)", lambda ts, kind, r, key=key: _pct(r[key])) for head, key in
               (("critic's wrong picks", "critic"), ("data's action there", "data"), ("expert's action there", "expert"))]  # fmt: skip
    counts = ", ".join(f"{ts} {r['wrong_picks']}" for ts, r in wrong.items())
    return _grouped_table({ts: r["kinds"] for ts, r in wrong.items()}, "action kind", columns,
                          "Over the informative stored states where the argmax of the critic's Q (critic_finetuned "
                          f"above) does not do what the expert would ({counts} per seed, pooled over seeds): the kind "
                          "of action it picks, the kind the data took there, and the kind the expert would take.")  # fmt: skip


def rewarded_table(rewarded: dict[str, Any]) -> list[str]:
    """Per family: the rewarded steps the critics trained on and their Q of the taken action (stage 05; notebook 05)."""
    if not rewarded:
        return ["No rewarded step among the transitions the critics trained on."]
    columns: list[tuple[str, Cell]] = [("rewarded steps trained on", lambda ts, fam, r: f"{r['steps']:g}"),
                                       ("critic's Q of their action (target 1.0)", lambda ts, fam, r: f"{r['q_taken']:.3f}")]  # fmt: skip
    return _grouped_table(rewarded, "family", columns,
                          "A rewarded step ends its episode, so its TD target is exactly the reward, 1 (mean over the "
                          "seeds' critics, each over the steps of the episodes it trained on; families with none left "
                          "out).")  # fmt: skip


def _rows_table(actor: dict[str, Any]) -> list[str]:
    """Per policy: how many rows it imitates and how often their action is the expert's, per task set (stage 06)."""
    shares = actor["rows_expert_share"]
    sets = list(next(iter(shares.values())))
    out = ["| policy | rows | " + " | ".join(f"expert's action, {ts} (%)" for ts in sets) + " |",
           "|---|---|" + "---|" * len(sets)]  # fmt: skip
    for name, share in shares.items():
        cells = [_pct(share[ts]) if share[ts] is not None else "-" for ts in sets]
        out.append(f"| {name} | {actor['kept_rows'].get(name, '-')} | " + " | ".join(cells) + " |")
    return out + ["", "rows: the (state, action) rows each policy is fit on (mean over its seeds); the share of them "
                  "whose action does what the simulator's expert would there (mean over seeds; - where none is kept)."]  # fmt: skip


Cell = Callable[[str, str, dict[str, Any]], str]  # (task set, group, support row) -> a table cell


def _grouped_table(support: dict[str, Any], group: str, columns: list[tuple[str, Cell]], note: str) -> list[str]:
    """A row per task set and group of a support report (stage 06), with the given columns."""
    out = [f"| task set | {group} | " + " | ".join(h for h, _ in columns) + " |", "|---" * (len(columns) + 2) + "|"]
    for ts, groups in support.items():
        for g, r in groups.items():
            out.append(f"| {ts} | {g} | " + " | ".join(cell(ts, g, r) for _, cell in columns) + " |")
    return out + ["", note]


_STATES: tuple[str, Cell] = ("states", lambda ts, g, r: str(r["states"]))
_SUPPORT: list[tuple[str, Cell]] = [
    ("data's action is the expert's (%)", lambda ts, g, r: _pct(r["taken_is_expert"])),
    ("a candidate is the expert's (%)", lambda ts, g, r: _pct(r["expert_candidate"])),
]


def _support_table(support: dict[str, Any], success: dict[str, float]) -> list[str]:
    """Per family: the data's success (stage 01) and how often its action, or any candidate, is the expert's (stage 06)."""
    won: tuple[str, Cell] = ("data's success (%)", lambda ts, fam, r: _pct(success[fam]) if fam in success else "-")
    return _grouped_table(support, "family", [_STATES, won, *_SUPPORT],
                          "A family whose states rarely offer a candidate that does what the simulator's expert would "
                          "cannot be learnt from these data by any offline method: no critic can pick it, no actor "
                          "imitate it.")  # fmt: skip


def _kind_table(support: dict[str, Any], kept: dict[str, Any]) -> list[str]:
    """Per kind of the expert's action: what the data offer there (stage 06) and what Digi-Q keeps."""

    def digiq(key: str) -> Cell:
        def cell(ts: str, kind: str, r: dict[str, Any]) -> str:
            value = kept.get(ts, {}).get(kind, {}).get(key)
            return _pct(value) if value is not None else "-"

        return cell

    columns = [_STATES, *_SUPPORT, ("Digi-Q keeps a row (%)", digiq("kept")),
               ("Digi-Q's rows there the expert's (%)", digiq("expert"))]  # fmt: skip
    return _grouped_table(support, "expert's action", columns,
                          "The expert's action at each stored state, by kind; Digi-Q's columns pool its seeds.")  # fmt: skip


def reach(results: dict[str, Any], success: dict[str, float], gain: float = 0.20) -> dict[str, dict[str, Any]]:
    """Per task set: what Digi-Q would need on the test tasks whose family the collected data ever solve.

    A family the data never solve offers no reward to learn from, so no
    offline method can be expected to lift it; base + ``gain`` then has to
    come from the other test tasks. ``results`` are eval.json (and
    ablations.json) entries with ``tasks_by_family``; ``success`` is stage
    01's success per family. Returns, per task set, the test tasks of
    unsolved families, the success the rest would need, and each policy's
    success on the rest.
    """
    out: dict[str, dict[str, Any]] = {}
    for ts in TASK_SETS:
        counts = results["base"][ts]["tasks_by_family"]
        n = sum(counts.values())
        unsolved = sorted(f for f in counts if success.get(f, 0.0) == 0.0)
        rest = n - sum(counts[f] for f in unsolved)
        need = int(np.ceil(round((results["base"][ts]["success_rate"] + gain) * n, 6)))
        on_rest = {p: sum(r[ts]["by_family"].get(f, 0.0) * c for f, c in counts.items() if f not in unsolved) / rest
                   for p, r in results.items()} if rest else {}  # fmt: skip
        out[ts] = {"tasks": n, "unsolved_families": unsolved, "unsolved_tasks": n - rest, "needed_tasks": need,
                   "needed_on_rest": need / rest if rest else None, "on_rest": on_rest}  # fmt: skip
    return out


def _reach_table(results: dict[str, Any], success: dict[str, float]) -> list[str]:
    r = reach(results, success)
    out = ["| task set | test tasks | in families the data never solve | base + 20 (tasks) | needed on the others (%) "
           "| best policy on the others (%) | Digi-Q on the others (%) |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for ts, x in r.items():
        need = _pct(x["needed_on_rest"]) if x["needed_on_rest"] is not None else "-"
        best = max(x["on_rest"], key=x["on_rest"].get) if x["on_rest"] else None
        best_cell = f"{_pct(x['on_rest'][best])} ({best})" if best else "-"
        digiq = _pct(x["on_rest"]["digiq"]) if "digiq" in x["on_rest"] else "-"
        out.append(f"| {ts} | {x['tasks']} | {x['unsolved_tasks']} ({', '.join(x['unsolved_families']) or 'none'}) "
                   f"| {x['needed_tasks']} | {need} | {best_cell} | {digiq} |")  # fmt: skip
    return out + ["", "Families the data never solve: success 0 in stage 01's collected trajectories. Their test "
                  "tasks offer an offline method no reward to learn from, so base + 20 has to come from the other "
                  "test tasks (success per policy: mean over its seeds, ablations included)."]  # fmt: skip


def _skills_table(skills: dict[str, Any]) -> list[str]:
    """The base policy alone and with each skill lent by the expert, per task set (stage 07, first seed)."""
    if "off" in skills:
        return [f"Expert-skill diagnostic off: {skills['off']}."]
    out = ["| base policy | General test | Web Shopping test |", "|---|---|---|"]
    for skill, res in sorted(skills.items(), key=lambda kv: kv[0] != "none"):  # the base alone first
        if isinstance(res, dict):
            name = "alone" if skill == "none" else f"+ the expert's {skill}"
            out.append(f"| {name} | {_pct(res['general']['success_rate'])} | {_pct(res['webshop']['success_rate'])} |")
    return out


def results_markdown(paths: Paths) -> str:
    ev, ab, oracle = _load(paths, "eval"), _load(paths, "ablations"), _load(paths, "oracle")
    skills, train = _load(paths, "skills"), _load(paths, "eval_train")
    out = []
    if ev:
        out += _success_table(ev, train) + ["", "![results](plots/results.png)", ""] + _targets(ev)
        out += ["", "Success by family (%, mean over seeds):", ""] + _family_table(ev)
    else:
        out.append("No `metrics/eval.json` yet: run `make repro`.")
    if ab:
        out += ["", "Ablations (success rate %, mean ± std over seeds):", ""] + _success_table(ab, train)
        perfect = (_load(paths, "actor") or {}).get("perfect_critic")
        if perfect and "digiq_perfect_critic" in ab:
            out += ["", "digiq_perfect_critic: Digi-Q's actor on a perfect critic's picks (the candidate doing what "
                    f"the simulator's expert would; {_pct(perfect['states_with_expert_candidate'])}% of states have "
                    f"one, and the data's own action is it in {_pct(perfect['taken_action_is_expert'])}%)."]  # fmt: skip
    actor = _load(paths, "actor") or {}
    if "rows_expert_share" in actor:
        out += ["", "What each policy imitates (stage 06):", ""] + _rows_table(actor)
    success = (_load(paths, "collect") or {}).get("success_rate_by_family", {})
    if ev and success and "tasks_by_family" in ev["base"]["general"]:
        out += ["", "What base + 20 asks of the test tasks the data can teach (stages 01 and 07):", ""]
        out += _reach_table({**ev, **(ab or {})}, success)
    if "expert_support" in actor:
        out += ["", "Where the data can teach (stages 01 and 06):", ""] + _support_table(
            actor["expert_support"], success
        )
    if "expert_support_by_kind" in actor:
        out += ["", "By the kind of the expert's action (stage 06):", ""] + _kind_table(
            actor["expert_support_by_kind"], actor.get("digiq_rows_by_kind", {})
        )
    if oracle:
        out += ["", "Oracle diagnostic (stage 06; true candidate values from the simulator):", ""] + _oracle_table(
            oracle
        )
    if oracle and "expert_pick" in oracle:
        out += ["", "Expert picks over all stored states (stage 06):", ""] + expert_pick_table(oracle["expert_pick"])
    wrong = (oracle or {}).get("critic_wrong_picks")
    if wrong:
        out += ["", "Where the critic's picks go wrong (stage 06):", ""] + wrong_pick_table(wrong)
    rewarded = (_load(paths, "critic") or {}).get("rewarded_steps")
    if rewarded:
        out += ["", "The critic at the data's rewarded steps (stage 05):", ""] + rewarded_table(rewarded)
    if skills:
        out += ["", "Where the base policy loses (stage 07, first seed; success % with one skill taken from the "
                "simulator's expert, everything else the policy's own):", ""] + _skills_table(skills)  # fmt: skip
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
        stds = [100 * results[p][ts].get("success_rate_std", 0.0) for ts in TASK_SETS]
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


def update_readme(readme: Path, paths: Paths) -> None:
    text = readme.read_text(encoding="utf-8")
    if START not in text or END not in text:
        raise ValueError(f"{readme} has no {START} ... {END} block to fill")
    block = f"{START}\n{results_markdown(paths)}\n{END}"
    atomic_write_text(readme, re.sub(re.escape(START) + ".*?" + re.escape(END), lambda _: block, text, flags=re.S))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--readme", default=str(Paths().root / "README.md"))
    args = ap.parse_args()
    update_readme(Path(args.readme), Paths())
    print(f"updated {args.readme}")


if __name__ == "__main__":
    main()
