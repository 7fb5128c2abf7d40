"""Stage 08's per-episode outcomes and paired comparisons, and ``python -m digiq.evaluate`` on any task file.

Every checkpoint here is a copy of the untrained tiny base policy of
``values_root`` (conftest), which solves nothing. Where the outcomes are
checked, a noisy scripted expert plays in its place (:func:`_expert`): Digi-Q's
rows err less than the base, and rows with the same noise play the very same
episodes on a seed's devices.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from digiq import evaluate
from digiq.config import EnvConfig, EvalConfig
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import MAX_INSTRUCTION_CHARS
from digiq.evaluate import main
from digiq.paths import ROOT, Paths
from digiq.report import results_markdown
from digiq.rollout import ExpertPolicy
from digiq.stages.common import write_metrics
from digiq.stages.eval import run_eval
from digiq.viz.charts import save_results_chart

N_TASKS = 3
WIDTH = 108
EVAL = {"n_envs": 3, "seed": 7, "temperature": 0.8}
MAIN, VARIANTS, ABLATIONS = ["digiq"], ["digiq_cql"], ["digiq_n1"]


def _expert(checkpoint: Path, cfg: EvalConfig) -> ExpertPolicy:
    """Stands in for :func:`~digiq.evaluate.load_agent`: a policy that solves some tasks and fails others."""
    row = checkpoint.parent.name  # a stage-07 policy's folder is <row>/<task set>
    return ExpertPolicy(noise=0.2 if row.startswith("digiq") else 0.6, seed=cfg.seed)


@pytest.fixture(scope="module")
def stage(values_root, tmp_path_factory) -> Paths:
    """Stage 08 run on two seeds: main policies, a variant and an ablation, each on both."""
    paths = Paths(tmp_path_factory.mktemp("eval"))
    source = Paths(values_root)
    shutil.copytree(source.base_policy, paths.base_policy)
    shutil.copytree(source.offline, paths.offline)  # five General trajectories: the train columns' tasks
    for seed in (0, 1):
        for name in MAIN + VARIANTS + ABLATIONS:
            for ts in ("general", "webshop"):
                shutil.copytree(source.base_policy, paths.actor(name, seed, ts))
    paths.tasks.mkdir(parents=True)
    for ts in ("general", "webshop"):
        paths.task_list(ts, "test").write_text("\n".join(generate_tasks(ts, "test", N_TASKS + 2)) + "\n")
    cfg = EvalConfig(n_tasks=N_TASKS, train_tasks=2, expert_skills=["type"], **EVAL)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(evaluate, "load_agent", _expert)
        run_eval(cfg, EnvConfig(width=WIDTH), paths, seeds=2, main=MAIN, ablations=ABLATIONS, variants=VARIANTS)
    return paths


def _metrics(paths: Paths, name: str) -> dict:
    return json.loads((paths.metrics / f"{name}.json").read_text())


def test_stage_writes_outcomes_summaries_and_paired_comparisons(stage):
    ev, ab, outcomes = _metrics(stage, "eval"), _metrics(stage, "ablations"), _metrics(stage, "eval_outcomes")
    assert list(ev) == sorted(["base", *MAIN, *VARIANTS]) and set(ab) == {"digiq", "digiq_n1"}
    assert set(outcomes) == {"base", *MAIN, *VARIANTS, *ABLATIONS}
    for policy, sets in [*ev.items(), *ab.items()]:
        seeds = 2
        for ts, r in sets.items():
            strings = outcomes[policy][ts]
            assert len(strings) == seeds and all(len(s) == N_TASKS and set(s) <= {"0", "1"} for s in strings)
            assert r["per_seed"] == [round(s.count("1") / N_TASKS, 4) for s in strings]  # task-list order, per seed
            assert r["n_episodes"] == N_TASKS and r["success_rate_std"] is not None
            # Fewer than 96 tasks: the paper's protocol is the whole list.
            assert r["first96"] == {"success_rate": r["success_rate"], "success_rate_std": r["success_rate_std"],
                                    "per_seed": r["per_seed"], "n_episodes": N_TASKS}  # fmt: skip
    played = "".join(s for sets in outcomes.values() for strings in sets.values() for s in strings)
    assert "0" in played and "1" in played
    # The same policy on one seed's devices and stream plays the same episodes: what pairs seed s with seed s.
    assert outcomes["digiq_cql"] == outcomes["digiq"]
    assert outcomes["digiq_n1"] == outcomes["digiq"]
    comparisons = _metrics(stage, "comparisons")
    pairs = {"digiq-base", "digiq_cql-digiq", "digiq_n1-digiq"}
    assert set(comparisons) == {"general", "webshop"} and all(set(c) == pairs for c in comparisons.values())
    for ts, c in comparisons.items():
        diff = sum(a.count("1") - b.count("1") for a, b in zip(outcomes["digiq"][ts], outcomes["base"][ts]))
        assert c["digiq-base"]["diff"] == round(100 * diff / (2 * N_TASKS), 2) and c["digiq-base"]["seeds"] == 2
        assert c["digiq-base"]["ci95"][0] <= c["digiq-base"]["diff"] <= c["digiq-base"]["ci95"][1]
        assert c["digiq_cql-digiq"] == {"diff": 0.0, "ci95": [0.0, 0.0], "n_tasks": N_TASKS, "seeds": 2}
        assert c["digiq_n1-digiq"] == {"diff": 0.0, "ci95": [0.0, 0.0], "n_tasks": N_TASKS, "seeds": 2}


def test_train_columns_cover_the_paper_s_rows_only(stage):
    train, ev = _metrics(stage, "eval_train"), _metrics(stage, "eval")
    assert set(train) == {"base", *MAIN} and set(ev) - set(train) == set(VARIANTS)  # no variant, no ablation
    for sets in train.values():
        assert set(sets) == {"general"} and sets["general"]["n_episodes"] == 2 and len(sets["general"]["per_seed"]) == 2
    skills = _metrics(stage, "skills")
    assert skills["none"]["general"]["success_rate"] == ev["base"]["general"]["per_seed"][0]
    assert set(skills["type"]) == {"general", "webshop"} and skills["type"]["webshop"]["n_episodes"] == N_TASKS


def test_report_reads_the_stage_s_intervals(stage, tmp_path):
    md = results_markdown(stage)
    same = "+0.0 [+0.0, +0.0], no detectable difference"
    main_table, ablation_table = md.split("Ablations (")
    assert f"| digiq_cql - digiq | {same} | {same} |" in main_table
    c = _metrics(stage, "comparisons")["general"]["digiq-base"]
    verdict = "" if c["ci95"][0] > 0 or c["ci95"][1] < 0 else ", no detectable difference"
    assert f"| digiq - base | {c['diff']:+.1f} [{c['ci95'][0]:+.1f}, {c['ci95'][1]:+.1f}]{verdict} |" in main_table
    assert "digiq_n1 - digiq" not in main_table and f"| digiq_n1 - digiq | {same} | {same} |" in ablation_table
    ablations = _metrics(stage, "ablations")
    assert save_results_chart(ablations, tmp_path / "ablations.png", "ablations").stat().st_size > 0


def test_report_puts_the_paper_s_first_96_beside_the_whole_list(tmp_path):
    def result(rate: float, first: float) -> dict:
        return {"success_rate": rate, "success_rate_std": 0.01, "per_seed": [rate - 0.01, rate + 0.01],
                "n_episodes": 300, "by_family": {"search": rate}, "tasks_by_family": {"search": 300},
                "first96": {"success_rate": first, "success_rate_std": 0.02, "per_seed": [first] * 2, "n_episodes": 96}}  # fmt: skip

    paths = Paths(tmp_path)
    write_metrics(paths, "eval", {p: {"general": result(r, f), "webshop": result(r, f)}
                                  for p, r, f in (("base", 0.2, 0.25), ("digiq", 0.4, 0.5))})  # fmt: skip
    md = results_markdown(paths)
    assert "| policy | General test, first 96 | General test | Web Shopping test, first 96 | Web Shopping test |" in md
    assert "| digiq | 50.0 ± 2.0 | 40.0 ± 1.0 | 50.0 ± 2.0 | 40.0 ± 1.0 |" in md
    assert "300 General and 300 Web Shopping test tasks per seed (first 96: the paper's protocol" in md


@pytest.fixture(scope="module")
def params_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("params") / "params.yaml"
    # One process: the stand-in expert is patched into this one, not into workers.
    path.write_text(yaml.safe_dump({"eval": EVAL, "env": {"width": WIDTH}, "experiment": {"seeds": 2},
                                    "compute": {"workers": 1}}))  # fmt: skip
    return path


def test_cli_runs_a_checkpoint_on_a_task_file_as_the_stage_does(stage, params_file, tmp_path, capsys, monkeypatch):
    """The stage's base checkpoint on the stage's test lists, both in one file: the stage's figures and episodes."""
    monkeypatch.setattr(evaluate, "load_agent", _expert)
    lines = []
    for ts in ("general", "webshop"):
        lines += stage.task_list(ts, "test").read_text().splitlines()[:N_TASKS] + [""]
    lines.insert(1, "Teach my cat to juggle")
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("\n".join(lines) + "\n")
    out = tmp_path / "out" / "base.json"
    report = main(["--policy", str(stage.base_policy), "--tasks", str(tasks), "--out", str(out),
                   "--params", str(params_file)])  # fmt: skip
    assert json.loads(out.read_text()) == report
    assert "2: cannot parse, skipped: Teach my cat to juggle" in capsys.readouterr().err
    assert [(u["line"], u["text"]) for u in report["unparsed"]] == [(2, "Teach my cat to juggle")]
    assert report["seeds"] == 2 and report["policy"] == [str(stage.base_policy)] and report["tasks_file"] == str(tasks)
    ev, outcomes = _metrics(stage, "eval")["base"], _metrics(stage, "eval_outcomes")["base"]
    for ts in ("general", "webshop"):  # each line went to its own task set, in file order
        assert report[ts]["n_episodes"] == N_TASKS and 0.0 <= report[ts]["success_rate"] <= 1.0
        assert report[ts]["per_seed"] == ev[ts]["per_seed"] and report["outcomes"][ts] == outcomes[ts]


def test_cli_as_a_module_with_one_task_set_and_two_workers(stage, params_file, tmp_path):
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("What time is it in Copenhagen?\n\nGo to costco.com\nfly me to the moon\n")
    out = tmp_path / "general.json"
    proc = subprocess.run([sys.executable, "-m", "digiq.evaluate", "--policy", str(stage.base_policy), "--tasks",
                           str(tasks), "--task-set", "general", "--seeds", "2", "--workers", "2", "--out", str(out),
                           "--params", str(params_file)], capture_output=True, text=True, cwd=ROOT, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert f"{tasks}:4: cannot parse, skipped: fly me to the moon" in proc.stderr
    assert "success %" in proc.stdout and "(all)" in proc.stdout and "go_to_site" in proc.stdout
    report = json.loads(out.read_text())
    assert set(report) == {"general", "outcomes", "unparsed", "policy", "tasks_file", "seeds"}
    r = report["general"]  # the shopping line too: --task-set puts every line in General
    assert r["n_episodes"] == 2 and r["tasks_by_family"] == {"go_to_site": 1, "search": 1}
    assert r["success_rate_std"] is not None and len(r["per_seed"]) == 2 and 0.0 <= r["success_rate"] <= 1.0
    assert report["seeds"] == 2 and [(u["line"], u["text"]) for u in report["unparsed"]] == [(4, "fly me to the moon")]
    assert "matches no task family" in report["unparsed"][0]["why"]


def _fails(args: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_cli_names_bad_input(stage, params_file, tmp_path, capsys):
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("What time is it in Copenhagen?\n")
    common = ["--params", str(params_file)]
    missing = tmp_path / "no_such_policy"
    assert f"--policy {missing}: no such checkpoint folder" in _fails(["--policy", str(missing), "--tasks", str(tasks),
                                                                       *common], capsys)  # fmt: skip
    assert "config.json missing" in _fails(["--policy", str(tmp_path), "--tasks", str(tasks), *common], capsys)
    policy = ["--policy", str(stage.base_policy), *common]
    assert f"--tasks {tmp_path / 'none.txt'}: no such file" in _fails([*policy, "--tasks", str(tmp_path / "none.txt")],
                                                                     capsys)  # fmt: skip
    junk = tmp_path / "junk.txt"
    junk.write_text("fly me to the moon\n\nteach my cat to juggle\n")
    err = _fails([*policy, "--tasks", str(junk)], capsys)
    assert "none of its 2 instruction(s) parses" in err and "3: cannot parse" in err
    assert "--seeds: seeds must be >= 1, got 0" in _fails([*policy, "--tasks", str(tasks), "--seeds", "0"], capsys)
    huge = "99999999999999999999"  # not a run to start: each seed is a whole evaluation
    assert "--seeds: seeds must be <= " in _fails([*policy, "--tasks", str(tasks), "--seeds", huge], capsys)
    two = ["--policy", str(stage.actor("digiq", 0, "general")), str(stage.actor("digiq", 1, "general")), *common]
    assert "give one folder per seed" in _fails([*two, "--tasks", str(tasks), "--seeds", "3"], capsys)
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0 and "--task-set" in capsys.readouterr().out


def test_cli_skips_odd_lines_naming_each_and_prints_none_raw(stage, params_file, tmp_path, capsys):
    """A byte that is not UTF-8, a line longer than a task may be, an escape sequence: each line skipped, named."""
    tasks = tmp_path / "tasks.txt"
    long = "What is " + "very " * 2000 + "far?"  # a search by its shape, but no task
    tasks.write_bytes(b"What time is it in Copenhagen?\nWhat time is it in Caf\xe9?\n" + long.encode()
                      + b"\n\x1b[2Jfly me to the moon\n")  # fmt: skip
    listed, unparsed = evaluate.read_task_file(tasks)
    assert [t.instruction for t in listed["general"]] == ["What time is it in Copenhagen?"]
    assert [u["line"] for u in unparsed] == [2, 3, 4] and unparsed[0]["why"] == "not UTF-8 (byte 0xe9 at offset 22)"
    assert unparsed[1]["why"] == (f"an instruction of {len(long)} characters, longer than the "
                                  f"{MAX_INSTRUCTION_CHARS} a task may have")  # fmt: skip
    assert unparsed[2]["why"].startswith("unsupported instruction '\\x1b[2Jfly me to the moon': it matches no")
    tasks.write_bytes(tasks.read_bytes().split(b"\n", 1)[1])  # the odd lines alone: nothing to run
    err = _fails(["--policy", str(stage.base_policy), "--tasks", str(tasks), "--params", str(params_file)], capsys)
    assert f"{tasks}:1: cannot parse, skipped: What time is it in Caf\\xe9? (not UTF-8" in err
    assert f"{tasks}:2: cannot parse, skipped: What is very" in err and f"... ({len(long)} characters)" in err
    assert f"{tasks}:3: cannot parse, skipped: \\x1b[2Jfly me to the moon" in err
    assert "\x1b" not in err and len(err) < 3000


def test_cli_names_a_checkpoint_config_of_the_wrong_type(stage, params_file, tmp_path, capsys):
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("What time is it in Copenhagen?\n")
    broken = shutil.copytree(stage.base_policy, tmp_path / "broken")
    (broken / "config.json").write_text(json.dumps({"policy": None}))
    err = _fails(["--policy", str(broken), "--tasks", str(tasks), "--params", str(params_file)], capsys)
    assert f"corrupt checkpoint config {broken / 'config.json'}: policy is None" in err


def test_cli_names_an_out_it_cannot_write_before_the_run(stage, params_file, tmp_path, capsys):
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("What time is it in Copenhagen?\n")
    args = ["--tasks", str(tasks), "--params", str(params_file), "--seeds", "1"]
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "out.json"  # its folder would be a file
    err = _fails(["--policy", str(stage.base_policy), *args, "--out", str(out)], capsys)
    assert f"--out: cannot write {out}" in err and "success %" not in capsys.readouterr().out  # nothing ran


def test_cli_names_out_when_its_disk_is_full_after_the_run(stage, params_file, tmp_path, capsys):
    """The disk fills during the run: the results are printed, and the error names --out, not its temporary file."""
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("What time is it in Copenhagen?\n")
    out = tmp_path / "out.json"
    out.with_name(f".{out.name}.tmp-{os.getpid()}").symlink_to("/dev/full")  # where the write goes: ENOSPC
    err = _fails(["--policy", str(stage.base_policy), "--tasks", str(tasks), "--params", str(params_file), "--seeds",
                  "1", "--out", str(out)], capsys)  # fmt: skip
    assert f"--out: cannot write {out}: No space left on device (the disk is full)" in err
    assert ".tmp-" not in err and err.count("cannot write") == 1 and list(tmp_path.iterdir()) == [tasks]


def test_cli_runs_one_checkpoint_per_seed(stage, params_file, tmp_path, monkeypatch):
    """Several --policy folders, as stage 07 trains one per seed: seed s runs the s-th, on seed s's devices."""
    used: list[Path] = []

    def record(checkpoint: Path, cfg: EvalConfig):
        used.append(checkpoint)
        return _expert(checkpoint, cfg)

    monkeypatch.setattr(evaluate, "load_agent", record)
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("\n".join(stage.task_list("general", "test").read_text().splitlines()[:N_TASKS]) + "\n")
    folders = [stage.actor("digiq", 0, "general"), stage.actor("digiq", 1, "general")]
    report = main(["--policy", *map(str, folders), "--tasks", str(tasks), "--params", str(params_file)])
    assert used == folders and report["seeds"] == 2
    assert report["policy"] == [str(f) for f in folders]
    assert report["general"]["per_seed"] == _metrics(stage, "eval")["digiq"]["general"]["per_seed"]


def _bad_copy(source: Path, folder: Path, how: str) -> Path:
    """A copy of checkpoint ``source`` whose weights are missing, truncated, or of other shapes than its config's."""
    shutil.copytree(source, folder)
    weights = folder / "model.safetensors"
    if how == "missing":
        weights.unlink()
    elif how == "truncated":
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    else:
        config = json.loads((folder / "config.json").read_text())
        config["policy"]["d_ff"] *= 2
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_cli_with_a_good_and_a_bad_policy_writes_the_good_one_and_names_the_bad(stage, params_file, tmp_path):
    """Seed 1's folder has truncated weights: found before any episode, named, its seed left out; seed 0 played,
    written, marked partial; status 2 and no traceback."""
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("What time is it in Copenhagen?\n")
    good = shutil.copytree(stage.base_policy, tmp_path / "good")
    bad = _bad_copy(stage.base_policy, tmp_path / "bad", "truncated")
    out = tmp_path / "out.json"
    proc = subprocess.run([sys.executable, "-m", "digiq.evaluate", "--policy", str(good), str(bad), "--tasks",
                           str(tasks), "--out", str(out), "--params", str(params_file)],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr and len(proc.stderr) < 2000
    assert f"--policy {bad}: " in proc.stderr and str(bad / "model.safetensors") in proc.stderr
    assert "seed(s) [1] skipped" in proc.stderr and "seed(s) [1] not evaluated" in proc.stderr
    assert "success %" in proc.stdout and f"wrote {out} (partial)" in proc.stdout
    report = json.loads(out.read_text())
    assert report["seeds"] == 1 and len(report["general"]["per_seed"]) == 1 and len(report["outcomes"]["general"]) == 1
    assert report["policy"] == [str(good), str(bad)]
    assert report["partial"]["seeds_done"] == [0]
    [missing] = report["partial"]["seeds_missing"]
    assert missing["seed"] == 1 and missing["policy"] == str(bad) and str(bad / "model.safetensors") in missing["why"]


@pytest.mark.parametrize("how", ["missing", "truncated", "shapes"])
def test_cli_names_bad_weights_before_any_episode(stage, params_file, tmp_path, capsys, how):
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("What time is it in Copenhagen?\n")
    bad = _bad_copy(stage.base_policy, tmp_path / "bad", how)
    out = tmp_path / "out.json"
    err = _fails(["--policy", str(bad), "--tasks", str(tasks), "--params", str(params_file), "--out", str(out)], capsys)
    assert f"--policy {bad}: " in err and str(bad / "model.safetensors") in err and "Traceback" not in err
    assert not out.exists() and "success %" not in capsys.readouterr().out  # nothing ran


def test_cli_keeps_the_seeds_done_when_a_later_one_fails(stage, params_file, tmp_path, capsys, monkeypatch):
    """Seed 1's job fails mid-run: seed 0's results, finished first, are on disk, saying why seed 1 is not."""
    second = stage.actor("digiq", 1, "general")

    def fail_second(checkpoint: Path, cfg: EvalConfig):
        if checkpoint == second:
            raise RuntimeError("the device caught fire")
        return _expert(checkpoint, cfg)

    monkeypatch.setattr(evaluate, "load_agent", fail_second)
    tasks = tmp_path / "tasks.txt"
    tasks.write_text("\n".join(stage.task_list("general", "test").read_text().splitlines()[:N_TASKS]) + "\n")
    out = tmp_path / "out.json"
    with pytest.raises(RuntimeError, match="caught fire"):
        main(["--policy", str(stage.actor("digiq", 0, "general")), str(second), "--tasks", str(tasks), "--params",
              str(params_file), "--out", str(out)])  # fmt: skip
    assert f"seed(s) [0] done, written to {out} (partial)" in capsys.readouterr().err
    report = json.loads(out.read_text())
    assert report["general"]["per_seed"] == _metrics(stage, "eval")["digiq"]["general"]["per_seed"][:1]
    assert report["seeds"] == 1 and report["partial"]["seeds_done"] == [0]
    assert report["partial"]["seeds_missing"] == [
        {"seed": 1, "policy": str(second), "why": "the run stopped: RuntimeError: the device caught fire"}
    ]
