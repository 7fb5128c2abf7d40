import subprocess
import sys
import typing

import pytest
import yaml

from digiq.config import (
    PARAMS,
    SECTIONS,
    ConfigError,
    EnvConfig,
    help_text,
    knob_range,
    load_params,
    load_settings,
)
from digiq.env.state import Dynamics
from digiq.paths import Paths
from digiq.stages.actor import run as actor_stage
from digiq.stages.diagnostics import run as diagnostics_stage
from digiq.stages.launch import run_stage


def test_repository_params_load():
    params = load_params()
    settings = load_settings(params=params)
    assert Dynamics.of(settings.env).popup_rate == params["env"]["popup_rate"]
    assert settings.tasks.n_test == params["tasks"]["n_test"]


@pytest.mark.parametrize(
    "group, needle",
    [
        ({"env": {"width": "wide"}}, "env.width must be int, got 'wide'"),
        ({"env": {"popup_rate": True}}, "env.popup_rate must be float"),
        ({"env": {"popup_rate": 1.5}}, "popup_rate must be <= 1, got 1.5"),
        ({"env": {"widht": 100}}, "unknown key(s) ['widht']"),
        ({"env": [1, 2]}, "env must be a mapping"),
        ({"base_policy": {"copy_augment": -0.1}}, "copy_augment must be >= 0, got -0.1"),
        ({"base_policy": {"demo_tasks": 0}}, "demo_tasks must be >= 1, got 0"),
        ({"compute": {"workers": 0}}, "workers must be >= 1, got 0"),
        ({"compute": {"workers": 2, "processes": 2}}, "either shares its jobs among workers or each job's batches"),
        ({"actor": {"updates": 0}}, "updates must be >= 1, got 0"),
        ({"actor": {"awr_beta": 0}}, "awr_beta must be > 0, got 0"),
        ({"ablations": {"extraction": ["awr", "ppo"]}}, "extraction: unknown ['ppo']; known: ['awr', 'reinforce']"),
        (
            {"ablations": {"extraction": ["reinforce", "awr", "reinforce"]}},
            "extraction: ['reinforce'] listed more than once in ['reinforce', 'awr', 'reinforce']",
        ),
        ({"ablations": {"extraction": "awr"}}, "ablations.extraction must be list, got 'awr' (str)"),
    ],
)
def test_bad_values_name_the_key(group, needle):
    with pytest.raises(ConfigError) as e:
        load_settings(params=group)
    assert needle in str(e.value) and PARAMS.name in str(e.value)


def test_ints_are_accepted_for_floats_and_defaults_fill_in():
    cfg = load_settings(params={"env": {"ad_rate": 0}}).env
    assert cfg.ad_rate == 0.0 and isinstance(cfg.ad_rate, float) and cfg.width == EnvConfig().width


def test_missing_or_broken_params_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read params file"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(bad)


def test_params_merge_group_by_group_and_errors_name_the_file_that_set_the_key(tmp_path):
    (tmp_path / "params").mkdir()
    (tmp_path / "params.yaml").write_text("critic:\n  steps: 5\n")
    (tmp_path / "params" / "machine.yaml").write_text("critic:\n  lr: 0.1\ndevices:\n  timeout_s: -1.0\n")
    params = load_params(tmp_path / "params.yaml")
    assert params["critic"] == {"steps": 5, "lr": 0.1}
    params["devices"] = {}
    critic = load_settings(params=params).critic
    assert (critic.steps, critic.lr) == (5, 0.1)
    with pytest.raises(ConfigError, match=r"machine\.yaml: devices"):
        load_settings(tmp_path / "params.yaml")
    (tmp_path / "params" / "more.yaml").write_text("critic:\n  steps: 7\n")
    with pytest.raises(ConfigError, match=r"more\.yaml: critic\.steps is also set in params\.yaml"):
        load_params(tmp_path / "params.yaml")


def test_a_variant_may_not_take_an_extraction_row_s_name():
    for name in ("digiq_awr", "digiq_reinforce"):
        with pytest.raises(ConfigError, match=f"variant name '{name}' is taken by an ablation row"):
            load_settings(params={"variants": {name: {"conservative": 0.3}}})


def test_help_text_lists_every_field():
    text = help_text(EnvConfig)
    assert all(name in text for name in ("width", "popup_rate", "delay_rate", "jitter_px", "ad_rate"))


def test_simulator_only_diagnostics_are_refused_on_real_devices(tmp_path):
    """Emulator episodes cannot be replayed in the simulator: stages 07 and 08 say which key to change."""
    params = load_params()
    params["devices"]["backend"] = "emulator"
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ValueError, match="ablations.perfect_critic must be false with devices.backend emulator"):
        run_stage(actor_stage, Paths(tmp_path), tmp_path / "params.yaml")
    with pytest.raises(ValueError, match="diagnostics.oracle_states must be 0 with devices.backend emulator"):
        diagnostics_stage(load_settings(params=params), Paths(tmp_path))


def test_a_variant_that_moves_the_critics_split_is_refused_by_the_actor_stage(tmp_path):
    """Digi-Q's rows draw among the trajectories the critic group's split trains on: a variant keeps it."""
    params = load_params()
    params["variants"] = {"digiq_other_split": {"holdout": 0.3}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ValueError, match=r"variants \['digiq_other_split'\] change critic.holdout or critic.seed"):
        run_stage(actor_stage, Paths(tmp_path), tmp_path / "params.yaml")


def test_an_unknown_expert_skill_is_named():
    with pytest.raises(ConfigError, match=r"eval: expert_skills: unknown \['swipe'\]"):
        load_settings(params={"eval": {"expert_skills": ["type", "swipe"]}})


def test_layers_import_downward_only():
    """The config reads no simulator, and the simulator's command line loads no model, stage or torch."""
    code = (
        "import sys, digiq.config\n"
        "assert not [m for m in sys.modules if m.startswith('digiq.env')], 'config imports the simulator'\n"
        "import digiq.env.__main__\n"
        "heavy = ('torch', 'digiq.models', 'digiq.stages', 'digiq.diagnostics', 'digiq.data')\n"
        "loaded = sorted(m for m in sys.modules if m.startswith(heavy))\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# Knobs that may take any finite number: advantage thresholds, the floor of a conservative term; and the adb
# port, whose range depends on the backend (its own check).
ANY_NUMBER = {"threshold_general", "threshold_webshop", "conservative_floor", "adb_port"}


def _ranged():
    for group, cls in SECTIONS.items():
        for key, f in cls.model_fields.items():
            if any(b is not None for b in knob_range(f)):
                yield group, cls, key


def _outside(cls, key):
    """A value just outside each bound of the knob's range: below the lower one, above the upper one."""
    at_least, above, at_most, below = knob_range(cls.model_fields[key])
    lower = at_least - 1 if at_least is not None else above
    upper = at_most + 1 if at_most is not None else below
    return [b for b in (lower, upper) if b is not None]


def _numbers_of(cls):
    """``cls``'s knobs that hold a number (or null): (name, float or int).

    Not lists: their numbers have their group's own checks (``ablations.n_candidates``: at most ``augment``'s).
    """
    for key, f in cls.model_fields.items():
        if typing.get_origin(f.annotation) is list:
            continue
        kinds = {f.annotation} | set(typing.get_args(f.annotation))
        for kind in (float, int):
            if kind in kinds:
                yield key, kind


@pytest.mark.parametrize(
    ("group", "cls", "key", "bad"),
    [(group, cls, key, bad) for group, cls, key in _ranged() for bad in _outside(cls, key)],
    ids=lambda x: getattr(x, "__name__", str(x)),
)
def test_every_ranged_knob_refuses_a_value_outside_and_names_it(group, cls, key, bad, tmp_path):
    bad = float(bad) if cls.model_fields[key].annotation is float else int(bad)
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({group: {key: bad}}))
    with pytest.raises(ConfigError, match=rf"params.yaml: {group}.*{key} must be"):
        load_settings(tmp_path / "params.yaml")


@pytest.mark.parametrize(
    ("group", "key"),
    [(group, key) for group, cls in SECTIONS.items() for key, kind in _numbers_of(cls) if kind is float],
)
def test_every_float_knob_refuses_nan_and_infinity_and_names_it(group, key, tmp_path):
    """NaN passes no comparison (a NaN threshold keeps nothing) and an infinity ends no run: both stop at once."""
    for bad in (float("nan"), float("inf"), float("-inf"), 10**400):  # the last: a whole number no float holds
        (tmp_path / "params.yaml").write_text(yaml.safe_dump({group: {key: bad}}))
        with pytest.raises(ConfigError, match=rf"params.yaml: {group}.*{key} must be a finite number"):
            load_settings(tmp_path / "params.yaml")


def test_every_whole_number_knob_has_an_upper_bound():
    """A count, size or seed with no maximum takes a stray digit as a run of days or an out-of-memory error."""
    unbounded = [f"{group}.{key}" for group, cls in SECTIONS.items() for key, kind in _numbers_of(cls)
                 if kind is int and knob_range(cls.model_fields[key])[2:] == (None, None)
                 and key not in ANY_NUMBER]  # fmt: skip
    assert unbounded == []


def test_ablation_candidates_may_not_exceed_the_candidates_stage_02_drew(tmp_path):
    """Best-of-N over N' candidates draws from the N per state stage 02 sampled: the settings refuse an N' above N,
    naming both keys and their files."""
    (tmp_path / "params").mkdir()
    (tmp_path / "params.yaml").write_text("augment:\n  n_candidates: 4\n")
    (tmp_path / "params" / "ablation.yaml").write_text("ablations:\n  n_candidates: [1, 4, 8]\n")
    message = (r"ablation.yaml: ablations.n_candidates \[8\] exceed params.yaml: augment.n_candidates \(4\): "
               "Best-of-N over N' candidates draws them from the N")  # fmt: skip
    with pytest.raises(ConfigError, match=message):
        load_settings(tmp_path / "params.yaml")
    (tmp_path / "params" / "ablation.yaml").write_text(
        "ablations:\n  n_candidates: [1, 4]\nactor:\n  k_candidates: 4\n"
    )
    assert load_settings(tmp_path / "params.yaml").ablations.n_candidates == [1, 4]


def test_actor_candidates_may_not_exceed_the_candidates_stage_02_drew(tmp_path):
    """The actor draws k of the N candidates per state: k above N is refused."""
    (tmp_path / "params.yaml").write_text("augment:\n  n_candidates: 4\nactor:\n  k_candidates: 16\n")
    message = r"params.yaml: actor.k_candidates \[16\] exceed params.yaml: augment.n_candidates \(4\)"
    with pytest.raises(ConfigError, match=message):
        load_settings(tmp_path / "params.yaml")
    (tmp_path / "params.yaml").write_text("augment:\n  n_candidates: 4\nactor:\n  k_candidates: 4\n")
    assert load_settings(tmp_path / "params.yaml").actor.k_candidates == 4


def test_every_count_rate_and_size_has_a_range():
    """A new numeric knob needs a range unless any number is meaningful for it."""
    unranged = [f"{group}.{key}" for group, cls in SECTIONS.items() for key, f in cls.model_fields.items()
                if f.annotation in (int, float) and not any(b is not None for b in knob_range(f))
                and key not in ANY_NUMBER]  # fmt: skip
    assert unranged == []


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"critic": {"steps": -1}}, r"critic: steps must be >= 1, got -1"),
        ({"critic": {"batch_size": 0}}, r"critic: batch_size must be >= 1, got 0"),
        ({"eval": {"n_tasks": -1}}, r"eval: n_tasks must be >= 1, got -1"),
        ({"experiment": {"seeds": 10**12}}, r"experiment: seeds must be <= 1000, got 1000000000000"),
        ({"actor": {"threshold_webshop": float("nan")}}, r"actor: threshold_webshop must be a finite number, got nan"),
        ({"tasks": {"seed": -1}}, r"tasks: seed must be >= 0, got -1"),
    ],  # fmt: skip
)
def test_out_of_range_values_that_once_passed(params, message, tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    with pytest.raises(ConfigError, match=message):
        load_settings(tmp_path / "params.yaml")


def test_a_misspelt_group_is_an_error_not_the_defaults(tmp_path):
    (tmp_path / "params.yaml").write_text("collects:\n  tasks_per_set: 10\ncritic:\n  epochs: 3\n")
    with pytest.raises(ConfigError, match=r"unknown params group\(s\) 'collects' in params.yaml"):
        load_params(tmp_path / "params.yaml")
