import pytest

from digiq.config import PARAMS, ConfigError, EnvConfig, TasksConfig, help_text, load_params, load_section


def test_repository_params_load():
    params = load_params()
    env = load_section(EnvConfig, "env", params)
    assert env.dynamics().popup_rate == params["env"]["popup_rate"]
    assert load_section(TasksConfig, "tasks", params).n_test == params["tasks"]["n_test"]


@pytest.mark.parametrize(
    "group, needle",
    [
        ({"env": {"width": "wide"}}, "env.width must be int, got 'wide'"),
        ({"env": {"popup_rate": True}}, "env.popup_rate must be float"),
        ({"env": {"popup_rate": 1.5}}, "popup_rate must be in [0, 1]"),
        ({"env": {"widht": 100}}, "unknown key(s) ['widht']"),
        ({"env": [1, 2]}, "env must be a mapping"),
    ],
)
def test_bad_values_name_the_key(group, needle):
    with pytest.raises(ConfigError) as e:
        load_section(EnvConfig, "env", group)
    assert needle in str(e.value) and PARAMS.name in str(e.value)


def test_ints_are_accepted_for_floats_and_defaults_fill_in():
    cfg = load_section(EnvConfig, "env", {"env": {"ad_rate": 0}})
    assert cfg.ad_rate == 0.0 and isinstance(cfg.ad_rate, float) and cfg.width == EnvConfig().width


def test_missing_or_broken_params_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read params file"):
        load_params(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("env: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_params(bad)


def test_help_text_lists_every_field():
    text = help_text(EnvConfig)
    assert all(name in text for name in ("width", "popup_rate", "delay_rate", "jitter_px", "ad_rate"))
