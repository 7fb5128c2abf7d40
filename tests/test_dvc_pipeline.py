"""dvc.yaml and params.yaml agree with the notebooks and the typed configs."""

import dataclasses

import yaml

from digiq import config
from digiq.paths import ROOT

DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text())
SECTIONS = {
    "env": config.EnvConfig,
    "tasks": config.TasksConfig,
    "base_policy": config.BasePolicyConfig,
    "collect": config.CollectConfig,
    "augment": config.AugmentConfig,
    "vlm_finetune": config.VLMFinetuneConfig,
    "embed": config.EmbedConfig,
    "critic": config.CriticConfig,
    "actor": config.ActorConfig,
    "diagnostics": config.DiagnosticsConfig,
    "eval": config.EvalConfig,
    "experiment": config.ExperimentConfig,
    "ablations": config.AblationsConfig,
    "devices": config.DeviceConfig,
    "compute": config.ComputeConfig,
    "judge": config.JudgeConfig,
}


EXPLORATION = {"09_explore_values.ipynb"}  # notebooks for people, run after the pipeline; not stages


def test_every_notebook_is_one_stage_that_depends_on_it():
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb") if p.name not in EXPLORATION)
    staged = sorted(
        n
        for s in DVC.values()
        for n in [s["cmd"].split("papermill notebooks/")[-1].split()[0]]
        if "papermill" in s["cmd"]
    )
    assert staged == notebooks
    for stage in DVC.values():
        if "papermill" in stage["cmd"]:
            assert stage["cmd"].split("papermill ")[1].split()[0] in stage["deps"]
            assert any(str(m).startswith("metrics/") for item in stage["metrics"] for m in item)


def test_params_match_the_typed_configs_and_their_defaults():
    assert set(PARAMS) == set(SECTIONS) | {"variants"}  # variants: named critics, each the critic group changed
    assert set(config.load_variants(PARAMS)) == {"digiq_cql", "digiq_hierarchy"}
    for name, cls in SECTIONS.items():
        cfg = config.load_section(cls, name, PARAMS)
        for f in dataclasses.fields(cls):
            assert f.name in PARAMS[name], f"params.yaml lacks {name}.{f.name}"
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            assert getattr(cfg, f.name) == default, f"params.yaml {name}.{f.name} differs from the config default"


def test_stage_params_are_declared():
    for stage in DVC.values():
        for key in stage.get("params", []):
            group, *leaf = key.split(".")
            assert group in PARAMS and (not leaf or leaf[0] in PARAMS[group]), key


def test_the_digiq_row_is_the_papers_critic_and_the_variants_go_beyond_it():
    """The digiq row is plain TD on VLM and text features; anything more is a named variant."""
    paper = config.load_section(config.CriticConfig, "critic", PARAMS)
    assert paper.conservative == 0 and paper.text_features and (paper.gamma, paper.tau) == (0.95, 0.1)
    assert not (paper.tap_targets or paper.typed_match or paper.list_entries)
    variants = config.load_variants(PARAMS)
    assert variants["digiq_cql"].conservative > 0 and not variants["digiq_cql"].tap_targets
    assert variants["digiq_hierarchy"].conservative > 0 and variants["digiq_hierarchy"].list_entries
