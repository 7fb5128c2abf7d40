"""Every knob of a run, typed: one root of settings (:class:`Settings`) read from ``params.yaml`` and ``params/*.yaml``.

Each group of knobs is a frozen pydantic model whose fields carry the
knob's one-line help, its default and its range: that is where a knob's
meaning is written. ``params.yaml`` sets the method's knobs, grouped by
stage; ``params/`` holds the settings of the machine rather than of the
method (devices and the simulator, the success judge, compute, released
checkpoints). A field that no file sets takes its default. A stage loads
the root once (:func:`load_settings`) and passes its groups down.

pydantic checks names, types (strictly: ``"3"`` is no number, ``true`` no
count) and ranges; :func:`load_settings` names the file, the group and the
key of anything wrong, so a typo stops a stage at once instead of deep in a
run. Every stage runs this module, so its fingerprint
(:mod:`digiq.fingerprint`) holds this module's code, defaults and ranges
included but not its docstrings or its ``help=`` texts: DVC reruns the
stages for a changed default and none for a reworded help.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.fields import FieldInfo

__all__ = [
    "ConfigError",
    "KnobError",
    "Knobs",
    "EnvConfig",
    "DeviceConfig",
    "JudgeConfig",
    "TasksConfig",
    "BasePolicyConfig",
    "CollectConfig",
    "AugmentConfig",
    "VLMPretrainConfig",
    "VLMFinetuneConfig",
    "EmbedConfig",
    "ComputeConfig",
    "ExperimentConfig",
    "AblationsConfig",
    "CriticConfig",
    "ActorConfig",
    "DigiRLConfig",
    "DiagnosticsConfig",
    "ProposeConfig",
    "PAEConfig",
    "EvalConfig",
    "Settings",
    "SECTIONS",
    "EXTRACTIONS",
    "ABLATION_NAMES",
    "ONLINE_ROWS",
    "PAE_ROWS",
    "Params",
    "params_files",
    "load_params",
    "load_settings",
    "with_defaults",
    "knob_default",
    "knob_range",
    "help_text",
    "type_name",
]

PARAMS = Path(__file__).resolve().parents[1] / "params.yaml"


BACKENDS = ("sim", "adb-sim", "emulator")  # where collect and eval step their devices
COMPUTE_BACKENDS = ("local", "ray")  # where independent jobs and rollouts' devices run
# The rows some knobs switch on (digiq.rows builds the table from them): policy extractions from Digi-Q's critic
# beside Best-of-N (ablations.extraction); DigiRL's online rows (digirl.online); PAE's practice rows (pae.rows).
EXTRACTIONS = ("awr", "reinforce")
# The rows the ablations switch on, besides digiq_n<N>: names a named variant may not take.
UNTUNED_ROW, BLIND_ROW, PERFECT_CRITIC_ROW = "digiq_untuned", "digiq_blind", "digiq_perfect_critic"
ABLATION_NAMES = (UNTUNED_ROW, BLIND_ROW, PERFECT_CRITIC_ROW, *(f"digiq_{e}" for e in EXTRACTIONS))
ONLINE_ROWS = ("digirl_online", "digirl_off2on", "filtered_bc_online")
PAE_ROWS = ("pae", "pae_oracle", "pae_human")


class ConfigError(ValueError):
    """A params file or key is missing or has the wrong type."""


class KnobError(ValueError):
    """What is wrong with a group's knobs (:class:`Knobs`): the knob ``key`` (None: a rule between knobs), whose file
    :func:`load_settings` names; with ``dotted`` it names the knob as ``group.key`` (a value of the wrong type, an
    unknown key), else after the group (a range)."""

    def __init__(self, message: str, key: str | None = None, dotted: bool = False) -> None:
        super().__init__(message)
        self.key, self.dotted = key, dotted


# Upper bounds of the counts: far above what any run of this pipeline asks for (the released-model runs of
# docs/real-models.md included) but finite, so that a stray digit stops the stage at once, naming its key,
# instead of running for days or out of memory.
MAX_TASKS = 100_000  # tasks, episodes, states or questions in one list or sample (AitW's largest split: ~9,000)
MAX_CANDIDATES = 1024  # candidate actions per state (Digi-Q: 16)
MAX_BATCH = 65_536  # rows of one batch
# How the actor scores an action (actor.token_loss) and which states Digi-Q's rows draw from (actor.draws).
TOKEN_LOSSES = ("sum", "mean")
ACTOR_DRAWS = ("critic_train", "all")
# The clamp of each token's probability in the actor's loss (actor.token_clamp), as released Digi-Q's.
TOKEN_CLAMP = (0.001, 0.99)
# How the critic reads its texts (critic.text_encoder): towers trained with it, or frozen averages.
TEXT_ENCODERS = ("trained", "frozen")
# How the critic joins its twin heads (critic.twin_heads): the pessimistic minimum, or each head on its own.
TWIN_HEADS = ("min", "each")
MAX_STEPS = 10_000_000  # optimizer steps of one fit
MAX_DEVICES = 1024  # devices stepped together, processes or workers
MAX_SEED = 2**31 - 1  # what numpy's, torch's and Python's generators all take, with room for the offsets stages add


def _knob(default: Any, *, help: str, at_least: float | None = None, above: float | None = None,
          at_most: float | None = None, below: float | None = None) -> Any:  # fmt: skip
    """A knob: its default, its help and the range it must lie in (pydantic checks it whenever its group is built).

    The help is a ``help=`` keyword so that a stage's fingerprint (:mod:`digiq.fingerprint`) leaves it out:
    rewording it reruns no stage, while a default or a range is code and reruns every stage that imports this.
    """
    bounds = {"ge": at_least, "gt": above, "le": at_most, "lt": below}
    if isinstance(default, list):  # a mutable default needs a factory
        return Field(default_factory=lambda: list(default), description=help, **bounds)
    return Field(default, description=help, **bounds)


def _seed(default: int, *, help: str) -> Any:
    """A seed knob: any whole number from 0 to :data:`MAX_SEED`."""
    return _knob(default, help=help, at_least=0, at_most=MAX_SEED)


class Knobs(BaseModel):
    """A group of knobs: frozen; unknown keys, a value of another type (strictly: ``"3"`` is no number and ``true``
    no count, while a whole number is a float), a non-finite float or one outside its range are refused when the
    group is built, then the group's own rules (:meth:`check_rules`) run.

    A float must be finite whatever its range: NaN fails every comparison, so a NaN threshold would keep nothing,
    and an infinite rate or count would never end a run.
    """

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True, allow_inf_nan=False)

    def __init__(self, **knobs: Any) -> None:
        """The group of ``knobs``, the rest at their defaults.

        Raises:
            KnobError: naming the first knob that is wrong, as :func:`load_settings` does without the file.
        """
        try:
            super().__init__(**knobs)
        except ValidationError as e:
            raise _problem(type(self), e.errors()[0], knobs) from None

    def check_rules(self) -> None:
        """The group's rules between its own knobs: raise ValueError naming what is wrong."""

    @model_validator(mode="after")
    def _rules(self) -> Knobs:
        self.check_rules()
        return self

    def but(self, **changes: Any) -> Any:
        """The same knobs with ``changes``, checked as the params files' are."""
        return type(self)(**{**self.model_dump(), **changes})


class EnvConfig(Knobs):
    """The simulated device: its screenshot size and its in-the-wild disturbances (docs/simulator.md)."""

    width: int = _knob(
        216, help="screenshot width in pixels; the height keeps 1080x2280's aspect", at_least=32, at_most=1080
    )
    popup_rate: float = _knob(0.25, help="P(dialog) when an app launches or a web site loads", at_least=0, at_most=1)
    delay_rate: float = _knob(0.15, help="P(a web page load shows only one step later)", at_least=0, at_most=1)
    jitter_px: int = _knob(
        48, help="content moves down by up to this many logical pixels per screen load", at_least=0, at_most=200
    )
    ad_rate: float = _knob(0.3, help="P(a sponsored entry heads a result list)", at_least=0, at_most=1)


class DeviceConfig(Knobs):
    """The device backend of stages that step devices (collect, eval)."""

    backend: str = _knob(
        "sim", help="sim (in process) | adb-sim (simulator over adb) | emulator (real, see env_setup/)"
    )
    adb_host: str = _knob("127.0.0.1", help="adb server host")
    adb_port: int = _knob(5037, help="adb server port; adb-sim: 0 starts an in-process simulator server")
    serials: list[str] = _knob([], help="devices to use, in order; empty: every device the server lists")
    sim_devices: int = _knob(
        48, help="adb-sim with adb_port 0: how many simulated phones the server has", at_least=1, at_most=1024
    )
    snapshot: str = _knob(
        "digiq_aitw", help="emulator: the snapshot each episode starts from (make_snapshot.sh saves it)"
    )
    console_token_file: str = _knob("~/.emulator_console_auth_token", help="emulator: the console auth token file")
    timeout_s: float = _knob(10.0, help="time-out of one adb call, seconds", above=0)
    reset_timeout_s: float = _knob(120.0, help="emulator: time-out of a snapshot load and boot wait, seconds", above=0)
    retries: int = _knob(2, help="retries of a failed adb call, each on a new connection", at_least=0, at_most=100)
    settle_s: float = _knob(1.0, help="emulator: pause after each input before the screenshot, seconds", at_least=0)

    def check_rules(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"backend must be one of {list(BACKENDS)}, got {self.backend!r}")
        if not 0 <= self.adb_port <= 65535 or (self.adb_port == 0 and self.backend == "emulator"):
            raise ValueError(f"adb_port must be in [1, 65535] (0 only for adb-sim), got {self.adb_port}")


class JudgeConfig(Knobs):
    """The VLM success judge for real screens (digiq.judge), over an OpenAI-compatible chat endpoint."""

    base_url: str = _knob(
        "http://127.0.0.1:8000/v1", help="endpoint up to /v1 (`vllm serve MODEL` listens here by default)"
    )
    model: str = _knob("Qwen/Qwen2-VL-7B-Instruct", help="the served chat VLM")
    api_key_env: str = _knob(
        "OPENAI_API_KEY", help="environment variable holding the key; empty: send none (a local server)"
    )
    timeout_s: float = _knob(60.0, help="deadline of one try, seconds, the wait before it included", above=0)
    retries: int = _knob(
        5,
        help="retries on rate limits (429), server errors, time-outs and dropped connections (the openai client's backoff, or the server's Retry-After within timeout_s)",
        at_least=0,
        at_most=100,
    )
    max_image_side: int = _knob(
        1024, help="screenshots are downscaled to fit this many pixels before sending", at_least=1, at_most=16_384
    )
    max_completion_tokens: int = _knob(
        2048,
        help="reply length limit: room for a reasoning model's thinking and the reasoned Status line (0: none sent)",
        at_least=0,
        at_most=1_000_000,
    )
    temperature: float | None = _knob(
        0.0, help="sampling temperature; null: not sent (reasoning models accept only their default)", at_least=0
    )
    few_shot: str = _knob(
        "", help="JSONL of worked examples (image, task, reasoned answer) shown before each question; '' = zero-shot"
    )
    bad_reply: str = _knob(
        "retry", help="a reply that is no verdict: retry (the episode starts again) | fail (the episode ends, failed)"
    )
    max_bad_in_a_row: int = _knob(
        10,
        help="this many bad replies in a row end the stage: the endpoint or its settings are wrong",
        at_least=1,
        at_most=10_000,
    )
    on_adb_sim: bool = _knob(False, help="judge adb-sim phones too, instead of the simulator's ground truth")

    def check_rules(self) -> None:
        if self.bad_reply not in ("retry", "fail"):
            raise ValueError(f"bad_reply must be retry or fail, got {self.bad_reply!r}")


class TasksConfig(Knobs):
    """Train, validation and test task lists from disjoint entities."""

    n_train: int = _knob(700, help="tasks per task set in the train lists", at_least=1, at_most=MAX_TASKS)
    n_val: int = _knob(
        320,
        help="tasks per task set in the validation lists (every choice is made on these)",
        at_least=1,
        at_most=MAX_TASKS,
    )
    n_test: int = _knob(
        320,
        help="tasks in General's test list (the paper's protocol reads the first 96)",
        at_least=1,
        at_most=MAX_TASKS,
    )
    n_test_webshop: int = _knob(
        450,
        help="tasks in Web Shopping's test list: a third of its lines are the five go-to-site "
        "instructions, so it needs more lines than General's for as many distinct tasks",
        at_least=1,
        at_most=MAX_TASKS,
    )
    seed: int = _seed(0, help="which tasks are drawn")
    split_seed: int = _seed(1, help="which entities are in which split")


def help_text(cls: type[Knobs]) -> str:
    """One line per knob: name, type, default, help."""
    return "\n".join(f"{name} ({type_name(f.annotation)}, default {knob_default(f)!r}): {f.description or ''}"
                     for name, f in cls.model_fields.items())  # fmt: skip


def knob_default(f: FieldInfo) -> Any:
    """The value a knob takes when no params file sets it."""
    return f.get_default(call_default_factory=True)


def knob_range(f: FieldInfo) -> tuple[float | None, float | None, float | None, float | None]:
    """A knob's bounds as :func:`_knob` takes them: (at_least, above, at_most, below), None where there is none."""
    bounds = {name: getattr(m, name) for m in f.metadata for name in ("ge", "gt", "le", "lt") if hasattr(m, name)}
    return bounds.get("ge"), bounds.get("gt"), bounds.get("le"), bounds.get("lt")


def type_name(tp: Any) -> str:
    return getattr(tp, "__name__", str(tp))


class Params(dict):
    """Groups of knobs merged from several files; ``source[group, key]`` names the file that set each key."""

    def __init__(self) -> None:
        super().__init__()
        self.source: dict[tuple[str, str], Path] = {}


yaml.SafeDumper.add_representer(Params, yaml.SafeDumper.represent_dict)  # merged params save as one plain file


def _read_yaml(p: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except OSError as e:
        raise ConfigError(f"cannot read params file {p}: {e.strerror}") from None
    except yaml.YAMLError as e:
        raise ConfigError(f"params file {p} is not valid YAML: {e}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"params file {p} must hold a mapping of stage groups, got {type(data).__name__}")
    return data


def params_files(path: Path | str = PARAMS) -> list[Path]:
    """``path`` and the ``params/*.yaml`` beside it, in the order :func:`load_params` merges them."""
    p = Path(path)
    return [p, *sorted((p.parent / "params").glob("*.yaml"))]


def load_params(path: Path | str = PARAMS) -> Params:
    """``path`` and every ``params/*.yaml`` beside it, merged group by group; a key set twice is an error."""
    merged = Params()
    for f in params_files(path):
        for group, keys in _read_yaml(f).items():
            if not isinstance(keys, dict):
                if group in merged:
                    raise ConfigError(f"{f.name}: group {group!r} is also set in {merged.source[group, '']}")
                merged[group], merged.source[group, ""] = keys, f
                continue
            earlier = merged.setdefault(group, {})
            if not isinstance(earlier, dict):
                raise ConfigError(f"{f.name}: group {group!r} is also set in {merged.source[group, '']}")
            for key, value in keys.items():
                if key in earlier:
                    raise ConfigError(f"{f.name}: {group}.{key} is also set in {merged.source[group, key].name}")
                earlier[key], merged.source[group, key] = value, f
    unknown = sorted(set(merged) - set(SECTIONS) - {"variants"})
    if unknown:  # a misspelt group would otherwise leave its stage on the defaults without a word
        names = ", ".join(f"{g!r} in {merged.source[g, ''].name if (g, '') in merged.source else _first(merged, g)}"
                          for g in unknown)  # fmt: skip
        raise ConfigError(f"unknown params group(s) {names}; the groups are {sorted([*SECTIONS, 'variants'])}")
    return merged


def _first(merged: Params, group: str) -> str:
    """The file that set a key of ``group``."""
    return next(f.name for (g, _), f in merged.source.items() if g == group)


class BasePolicyConfig(Knobs):
    """Stage 00: SFT of the base policy on noisy expert demonstrations."""

    # The base is weak by its slips more than by what it never saw: many demonstrated tasks, a large share of their
    # steps a mistake. Its data then hold right and wrong actions at like states, which is what offline RL sorts
    # out (AitW's base, AutoUI, leaves much for Filtered BC to gain). How each value was set: docs/experiments.md.
    demo_tasks: int = _knob(200, help="demonstrated train tasks per task set", at_least=1, at_most=MAX_TASKS)
    expert_noise: float = _knob(0.4, help="probability that a demonstrated step is a mistake", at_least=0, at_most=1)
    vocab_size: int = _knob(1024, help="BPE vocabulary of the offline tokenizer", at_least=64, at_most=1_000_000)
    d_model: int = _knob(128, help="T5 width (AutoUI-Base: 768)", at_least=1, at_most=16_384)
    num_layers: int = _knob(2, help="T5 encoder (and decoder) layers", at_least=1, at_most=256)
    epochs: int = _knob(12, help="passes over the demonstrations", at_least=1, at_most=10_000)
    batch_size: int = _knob(32, help="rows per optimizer step", at_least=1, at_most=MAX_BATCH)
    lr: float = _knob(0.002, help="peak learning rate (one-cycle schedule)", above=0)
    copy_augment: float = _knob(
        0.5, help="P(a word typed from the goal is renamed to a fresh pseudo-word in a demo row)", at_least=0, at_most=1
    )
    seed: int = _seed(1, help="seed of demonstrations, initialisation and batches")
    checkpoint: str = _knob("", help="local Auto-UI-Base folder: the base policy as released, instead of the SFT")
    blip2: str = _knob("", help="local BLIP-2 folder (blip2-opt-2.7b): image encoder of the policy; '' = the small CNN")
    screen_text: bool = _knob(
        False,
        help="the prompt also lists the screen's tappable elements and their positions "
        "(uiautomator's hierarchy; not AutoUI's input, docs/real-android.md)",
    )

    def check_rules(self) -> None:
        if self.checkpoint and self.screen_text:
            raise ValueError("screen_text: the released Auto-UI-Base was trained on prompts without the screen's text")
        if self.checkpoint and not self.blip2:
            raise ValueError("checkpoint (Auto-UI-Base) reads BLIP-2 image features: set blip2 to a BLIP-2 folder")


class CollectConfig(Knobs):
    """Stage 01: roll the base policy out on train tasks: the offline dataset."""

    tasks_per_set: int = _knob(
        500, help="train tasks per task set the episodes are drawn from", at_least=1, at_most=MAX_TASKS
    )
    episodes_general: int | None = _knob(
        1008,
        help="episodes rolled out on General, each on one of its tasks drawn uniformly with replacement (released "
        "Digi-Q: 1,008); null: each task once, in order",
        at_least=1,
        at_most=MAX_TASKS,
    )
    episodes_webshop: int | None = _knob(
        1296, help="the same for Web Shopping (released Digi-Q: 1,296)", at_least=1, at_most=MAX_TASKS
    )
    # AutoUI collected at 1.0. The tiny base spreads its probability wider than AutoUI's T5, so at 1.0 it solves far
    # fewer train tasks than AutoUI does; a lower temperature brings its train success to AutoUI's (docs/experiments.md).
    temperature: float = _knob(
        0.8, help="sampling temperature (AutoUI: 1.0; 0.8 matches its success on train tasks)", at_least=0
    )
    n_envs: int = _knob(32, help="devices stepped together", at_least=1, at_most=MAX_DEVICES)
    gamma: float = _knob(
        0.95,
        help="discount of the stored Monte-Carlo returns; the critics' too (critic.gamma): stage 06 refuses two",
        above=0,
        at_most=1,
    )
    seed: int = _seed(1, help="seed of the devices")
    view_hierarchy: bool = _knob(
        True,
        help="also store each screen's view hierarchy (uiautomator), which critic.tap_targets "
        "reads; costs one more adb call per step on a device",
    )
    # AutoUI solves its train tasks about as often as its test tasks (the Digi-Q paper's table). A base that
    # rolls out the very tasks it was shown solves them from memory, so its data would not hold the mistakes it
    # makes on new tasks, which are what offline RL has to correct.
    skip_demonstrated: bool = _knob(
        True,
        help="roll out the train tasks after the ones the base policy was demonstrated "
        "(base_policy.demo_tasks), which the "
        "base's demonstrations covered; false: from the first train task",
    )


class AugmentConfig(Knobs):
    """Stage 02: N candidate actions per state from the base policy."""

    n_candidates: int = _knob(
        16, help="candidates per state, index 0 = the action taken (Digi-Q: 16)", at_least=1, at_most=MAX_CANDIDATES
    )
    # As released Digi-Q samples AutoUI. The tiny base spreads its probability wider than AutoUI, so at 0.8 the
    # candidates hold the expert's action more often (docs/experiment-log.md); the row follows the release.
    temperature: float = _knob(
        1.2, help="sampling temperature of the candidates (released Digi-Q with AutoUI: 1.2)", at_least=0
    )
    max_resample: int = _knob(
        2, help="times an invalid candidate is drawn again before it is kept as invalid", at_least=0, at_most=100
    )
    batch_states: int = _knob(64, help="states per sampling batch", at_least=1, at_most=MAX_BATCH)
    seed: int = _seed(2, help="sampling seed")


# The VLM pretraining's questions (digiq.models.vlm_pretrain).
PRETRAIN_OBJECTIVES = ("element", "point", "presence")


class VLMPretrainConfig(Knobs):
    """Stage 03: pretraining of the tiny VLM: questions about train-split screens whose answers the view hierarchy gives."""

    objectives: list[str] = _knob(
        ["element", "point", "presence"],
        help="what the VLM is asked: element (what a tap at the red circle lands on) | point (where a named element is) | presence (is a named element on the screen); [] = no pretraining",
    )
    expert_noise: float = _knob(
        0.3, help="probability of a mistake in the expert's episodes the screens come from", at_least=0, at_most=1
    )
    steps: int = _knob(1500, help="optimizer steps", at_least=0, at_most=MAX_STEPS)
    batch_size: int = _knob(32, help="questions per step", at_least=1, at_most=MAX_BATCH)
    lr: float = _knob(0.001, help="learning rate (AdamW)", above=0)
    warmup: float = _knob(
        0.05, help="fraction of the steps with a linear warm-up, then a cosine decay", at_least=0, below=1
    )
    eval_questions: int = _knob(
        200, help="held-out questions per objective, on validation screens", at_least=1, at_most=MAX_TASKS
    )
    image_size: int = _knob(96, help="square input of the VLM's vision tower", at_least=16, at_most=4096)
    hidden: int = _knob(
        128,
        help="language-model width (tiny recipe's representation: twice this; original's: this)",
        at_least=8,
        at_most=16384,
    )
    seed: int = _seed(3, help="seed")

    def check_rules(self) -> None:
        unknown = [o for o in self.objectives if o not in PRETRAIN_OBJECTIVES]
        if unknown or len(set(self.objectives)) != len(self.objectives):
            raise ValueError(f"vlm_pretrain.objectives: {self.objectives} must be distinct names from "
                             f"{list(PRETRAIN_OBJECTIVES)}")  # fmt: skip


class VLMFinetuneConfig(Knobs):
    """Stage 04: fine-tune the VLM on "does this action change the screen?"."""

    threshold: float = _knob(
        30.0, help="mean squared pixel change (1/4 scale) above which the label is Yes", at_least=0
    )
    holdout: float = _knob(0.2, help="fraction of trajectories held out for accuracy", at_least=0, below=1)
    recipe: str = _knob(
        "tiny",
        help="how a pair is shown, asked and represented: tiny (red marker, a touch's point in the question, answer slot + pooled states) | tiny_no_point (the same without the point) | original (Digi-Q's click icon, padded 1/4-size screen, prompts, BOS, answer-token state)",
    )
    epochs: float = _knob(
        3,
        help="passes over the labelled transitions (a fraction stops part-way through the first)",
        above=0,
        at_most=10_000,
    )
    batch_size: int = _knob(32, help="pairs per optimizer step", at_least=1, at_most=MAX_BATCH)
    lr: float = _knob(0.001, help="learning rate", above=0)
    weight_decay: float = _knob(0.01, help="AdamW weight decay", at_least=0)
    warmup: float = _knob(
        0.0, help="fraction of the steps over which the learning rate rises linearly from 0", at_least=0, below=1
    )
    schedule: str = _knob(
        "constant", help="learning rate after warm-up: constant | cosine (decays to 0 at the last step)"
    )
    checkpoint: str = _knob("", help="local llava-hf folder (LLaVA-1.5) to fine-tune instead of the tiny VLM")
    dtype: str = _knob("float32", help="weights' dtype of a released VLM: float32 | bfloat16 | float16")
    train_last_layers: int = _knob(
        1, help="0: train every weight; N: only the projector and the last N LM layers", at_least=0, at_most=1000
    )
    lora_rank: int = _knob(
        0,
        help="0: no LoRA; R: rank-R LoRA (peft) on every LM linear layer, plus the projector",
        at_least=0,
        at_most=4096,
    )
    lora_alpha: float = _knob(
        16.0, help="LoRA scale numerator (the update is alpha / rank times the low-rank product)", above=0
    )
    gradient_checkpointing: bool = _knob(
        False, help="recompute each layer in backward instead of keeping its activations"
    )
    autocast: bool = _knob(
        False,
        help="compute in bfloat16 while weights, gradients and AdamW state stay in dtype (float32: mixed precision); the result is saved in bfloat16",
    )
    shard: bool = _knob(
        False,
        help="with compute.processes N > 1: each process keeps 1/N of the weights, gradients and optimizer state (FSDP2, ZeRO-3's layout)",
    )
    seed: int = _seed(3, help="seed")

    def check_rules(self) -> None:
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {self.dtype!r}")
        if self.recipe not in ("tiny", "tiny_no_point", "original") or self.schedule not in ("constant", "cosine"):
            raise ValueError(f"vlm_finetune: recipe must be tiny, tiny_no_point or original and schedule constant "
                             f"or cosine; got {self.recipe!r}, {self.schedule!r}")  # fmt: skip
        if self.shard and self.lora_rank:
            raise ValueError("vlm_finetune: shard and lora_rank exclude each other: shard a full or last-layers "
                             "fine-tune over several GPUs, or train LoRA adapters on one")  # fmt: skip
        if self.lora_rank and self.train_last_layers:
            raise ValueError(f"vlm_finetune: lora_rank ({self.lora_rank}) and train_last_layers "
                             f"({self.train_last_layers}) are two ways to cut the trained weights; set one to 0")  # fmt: skip


class EmbedConfig(Knobs):
    """Stage 05: VLM representations of every (state, candidate) pair."""

    batch_size: int = _knob(256, help="pairs per forward pass", at_least=1, at_most=MAX_BATCH)


class ComputeConfig(Knobs):
    """How stages use the machine, or a cluster: data-parallel processes (stages 00, 04, 06, 07), independent jobs
    (05-10) and the devices of rollouts."""

    processes: int = _knob(
        1,
        help="data-parallel processes (1: in the notebook's own process; N: accelerate launch)",
        at_least=1,
        at_most=MAX_DEVICES,
    )
    cpu: bool = _knob(False, help="run the processes on the CPU even where there are GPUs (the tests do)")
    workers: int = _knob(
        2,
        help="local backend: CPU processes that share stages 05-10's independent jobs: each VLM's features, the "
        "(row, seed) fits and, on the simulator, the evaluations (digiq.workers; 1: all in the stage's own process)",
        at_least=1,
        at_most=MAX_DEVICES,
    )
    backend: str = _knob(
        "local",
        help="local: jobs in this machine's processes, devices of this machine | ray: jobs as tasks of a Ray "
        "cluster, rollouts on the devices of every node that offers some (digiq.cluster, docs/cluster.md)",
    )
    address: str = _knob(
        "auto",
        help="ray backend: the cluster to join (auto: the one `ray start` began on this machine, or RAY_ADDRESS; "
        "host:port: a head node's address)",
    )
    job_cpus: int = _knob(1, help="ray backend: CPUs each job asks for (also its torch threads)", at_least=1,
                          at_most=1024)  # fmt: skip
    job_gpus: float = _knob(0.0, help="ray backend: GPUs each job asks for (a fraction shares one)", at_least=0,
                            at_most=MAX_DEVICES)  # fmt: skip
    retries: int = _knob(
        3, help="ray backend: times a job lost with its node or worker process starts again", at_least=0, at_most=100
    )
    pinned_kernels: bool = _knob(
        True,
        help="every stage process runs torch's, MKL's and oneDNN's AVX2 kernels with a fixed number of threads, so a "
        "run gives the same bits on any x86-64 machine with AVX2 (digiq.kernels; false: each machine's own)",
    )
    threads: int = _knob(
        2,
        help="pinned kernels: torch threads of a stage's own process (the notebook's kernel); workers run one each, "
        "Ray jobs job_cpus",
        at_least=1,
        at_most=1024,
    )

    def check_rules(self) -> None:
        if self.backend not in COMPUTE_BACKENDS:
            raise ValueError(f"backend must be one of {list(COMPUTE_BACKENDS)}, got {self.backend!r}")
        if self.workers > 1 and self.processes > 1:
            raise ValueError(f"workers {self.workers} with processes {self.processes}: a stage either shares its "
                             "jobs among workers or each job's batches among processes, not both")  # fmt: skip
        if not self.address.strip():
            raise ValueError("address must name a Ray cluster: auto, or a head node's host:port")


class ExperimentConfig(Knobs):
    """Repeats of the learning stages (critic, actors, their evaluation)."""

    seeds: int = _knob(
        3, help="independent repeats; eval reports the mean and standard deviation over them", at_least=1, at_most=1000
    )


class AblationsConfig(Knobs):
    """Variants of Digi-Q trained and evaluated beside it, each with its own metrics."""

    untuned_vlm: bool = _knob(
        True,
        help="also run Best-of-N on the features of the VLM without the representation fine-tune (the pretrained one)",
    )
    blind_vlm: bool = _knob(
        True, help="also run Best-of-N on the features of a VLM fine-tuned without pretraining (tiny VLM only)"
    )
    n_candidates: list[int] = _knob(
        [1, 4], help="also run Best-of-N over only this many candidates per state (each < N)"
    )
    perfect_critic: bool = _knob(
        True,
        help="also fit Digi-Q's actor on a perfect critic's picks (the simulator's expert decides; simulator data only)",
    )
    extraction: list[str] = _knob(
        list(EXTRACTIONS),
        help="also extract a policy from Digi-Q's critic and Best-of-N's drawn candidates by a policy-gradient-style update "
        "instead: awr (weight exp(A / beta)) | reinforce (weight A); a row digiq_<name> each",
    )

    def check_rules(self) -> None:
        if not all(n >= 1 for n in self.n_candidates):
            raise ValueError(f"n_candidates must be positive integers, got {self.n_candidates}")
        unknown = [e for e in self.extraction if e not in EXTRACTIONS]
        if unknown:
            raise ValueError(f"extraction: unknown {unknown}; known: {list(EXTRACTIONS)}")
        twice = sorted({e for e in self.extraction if self.extraction.count(e) > 1})
        if twice:
            raise ValueError(f"extraction: {twice} listed more than once in {self.extraction}")


class CriticConfig(Knobs):
    """Stage 06: double Q and V heads trained by TD on frozen VLM features and the texts, through text towers
    trained with them.

    The defaults are Digi-Q's critic (the ``digiq`` row): VLM features and trained text towers, plain TD. The
    CQL term and the view-hierarchy inputs go beyond the paper; they are turned on only by named variants
    (``variants``).
    """

    gamma: float = _knob(
        0.95,
        help="discount (Digi-Q: 0.95); the stored returns' too (collect.gamma): stage 06 refuses two",
        above=0,
        at_most=1,
    )
    tau: float = _knob(0.1, help="soft target update rate (Digi-Q: 0.1)", above=0, at_most=1)
    hidden: int = _knob(256, help="MLP width", at_least=1, at_most=16_384)
    steps: int = _knob(
        800,
        help="TD updates, each on batch_size transitions drawn at random from the training trajectories "
        "(released Digi-Q: 800 of 128 per critic)",
        at_least=1,
        at_most=MAX_STEPS,
    )
    batch_size: int = _knob(128, help="transitions per step (released Digi-Q: 128)", at_least=1, at_most=MAX_BATCH)
    lr: float = _knob(0.00001, help="learning rate (released Digi-Q: 1e-5)", above=0)
    weight_decay: float = _knob(
        0.0, help="AdamW's decoupled weight decay (0: Adam, as released Digi-Q trains its critic)", at_least=0, below=1
    )
    grad_clip: float | None = _knob(
        0.01, help="clip each step's gradient to this norm (released Digi-Q: 0.01); null: no clipping", above=0
    )
    twin_heads: str = _knob(
        "each",
        help="min: both heads regress on the minimum of the target heads, and A = min Q - min V; each: as "
        "released Digi-Q, head j regresses on target head j alone, and A = max(Q1, Q2) - max(V1, V2)",
    )
    holdout: float = _knob(0.2, help="fraction of trajectories held out for the V-vs-return check", at_least=0, below=1)
    conservative: float = _knob(
        0.0, help="weight of a CQL term over the stored candidates (0 = Digi-Q's plain TD)", at_least=0
    )
    penalty_states: int = _knob(
        16, help="states of each batch that the CQL term scores all candidates of", at_least=1, at_most=MAX_BATCH
    )
    conservative_floor: float | None = _knob(
        0.0,
        help="the CQL term pushes no untried candidate's Q below this: the lowest "
        "return an episode can earn (0 here); null: no floor (plain CQL)",
    )
    conservative_gate: bool = _knob(
        False,
        help="the CQL term lifts the data's action only at steps that moved forward (one-step "
        "advantage under the target critic > 0) or whose episode succeeded",
    )
    text_features: bool = _knob(
        True,
        help="also read the goal and the actions' type and typed text, as Digi-Q's critic does "
        "(through the base policy's T5 encoder)",
    )
    text_encoder: str = _knob(
        "trained",
        help="trained: the texts go through three towers (goal, action type, typed text), copies of the base "
        "policy's T5 encoder trained with the heads by TD, as released Digi-Q trains its three RoBERTa encoders; "
        "frozen: the base encoder's token average, computed once (for comparison)",
    )
    text_tokens: int = _knob(64, help="a text is cut to this many tokens before the towers read it", at_least=1,
                             at_most=4096)  # fmt: skip
    tap_targets: bool = _knob(
        False,
        help="also read, per tap candidate, the label of the element it lands on, from the view "
        "hierarchy (needs collect.view_hierarchy and text_features)",
    )
    typed_match: bool = _knob(
        False, help="also read, per TYPE candidate, how much of its text the goal holds (needs text_features)"
    )
    list_entries: bool = _knob(
        False,
        help="also read, per tap candidate, which entry of a list it lands on (the first result or "
        "a later one), from the view hierarchy (needs tap_targets)",
    )
    seed: int = _seed(4, help="seed")

    def check_rules(self) -> None:
        if self.twin_heads not in TWIN_HEADS:
            raise ValueError(f"twin_heads must be one of {list(TWIN_HEADS)}, got {self.twin_heads!r}")
        for name in ("tap_targets", "typed_match"):
            if getattr(self, name) and not self.text_features:
                raise ValueError(f"{name}: true needs text_features: true (it is one of the text features)")
        if self.list_entries and not self.tap_targets:
            raise ValueError("list_entries: true needs tap_targets: true (it reads the same view hierarchy)")
        if self.text_encoder not in TEXT_ENCODERS:
            raise ValueError(f"text_encoder must be one of {list(TEXT_ENCODERS)}, got {self.text_encoder!r}")

    @property
    def towers(self) -> bool:
        """Whether the critic encodes its texts with towers of its own."""
        return self.text_features and self.text_encoder == "trained"


class ActorConfig(Knobs):
    """Stage 07: Best-of-N policy extraction and the offline baselines."""

    k_candidates: int = _knob(
        16,
        help="candidates drawn per state from the N (always with the taken action)",
        at_least=1,
        at_most=MAX_CANDIDATES,
    )
    threshold_general: float = _knob(0.10, help="keep the best candidate when its advantage exceeds this (General)")
    threshold_webshop: float = _knob(0.05, help="the same for Web Shopping")
    updates: int = _knob(
        40,
        help="optimizer steps of each policy's fit: every method gets the same budget, however many rows it keeps "
        "(released Digi-Q: 900 per task set; 40 chosen on validation: the smallest budget whose doubling raises "
        "neither digiq nor filtered_bc by more than a point)",
        at_least=1,
        at_most=MAX_STEPS,
    )
    batch_size: int = _knob(
        128,
        help="stored states drawn per step, uniformly with replacement; Digi-Q's rows imitate only the states they "
        "kept, the baselines draw among their own rows (released Digi-Q: 128)",
        at_least=1,
        at_most=MAX_BATCH,
    )
    lr: float = _knob(0.0001, help="learning rate, constant (released Digi-Q: 1e-4)", above=0)
    weight_decay: float = _knob(0.0, help="AdamW's weight decay (0: Adam, as released Digi-Q)", at_least=0)
    grad_clip: float = _knob(0.01, help="largest gradient norm of a step (released Digi-Q: 0.01)", above=0)
    awr_beta: float = _knob(
        0.01,
        help="AWR's temperature: each state's best candidate is imitated with weight exp(A / beta), A clamped to "
        "[0, 1] (released Digi-Q: 0.01)",
        above=0,
    )
    token_loss: str = _knob(
        "sum",
        help="an action's log-probability: sum over its tokens (released Digi-Q) | mean: per token, so that a "
        "short action weighs as much as a long one",
    )
    token_clamp: bool = _knob(
        True,
        help="clamp each token's probability to [0.001, 0.99] (no gradient beyond), as released Digi-Q's actor",
    )
    dropout: bool = _knob(False, help="dropout on while fitting (released Digi-Q's actor: off)")
    draws: str = _knob(
        "critic_train",
        help="the states Digi-Q's rows imitate and draw from: critic_train, the trajectories their critic trained on "
        "(released Digi-Q) | all, the held-out ones too",
    )
    seed: int = _seed(5, help="seed")

    def check_rules(self) -> None:
        for name, allowed in (("token_loss", TOKEN_LOSSES), ("draws", ACTOR_DRAWS)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {list(allowed)}, got {getattr(self, name)!r}")

    def thresholds(self, task_sets: Sequence[str]) -> np.ndarray:
        """Best-of-N's advantage threshold for each state, by its task set."""
        return np.where(np.asarray(task_sets) == "webshop", self.threshold_webshop, self.threshold_general)


class DigiRLConfig(Knobs):
    """DigiRL's learning rule: offline on the collected data (stage 07) and online on train tasks (stage 09)."""

    lam: float = _knob(
        0.5,
        help="weight of the outcome in the doubly-robust step advantage, lam ** (steps to the end) x outcome (DigiRL: 0.5)",
        at_least=0,
        at_most=1,
    )
    replay_top: float = _knob(
        0.1,
        help="share of episodes the actor learns from, the top by outcome - V_inst (DigiRL's curriculum: 0.1)",
        above=0,
        at_most=1,
    )
    value_updates: int = _knob(
        200,
        help="optimizer steps of V_inst and of V_step per fit (offline once, online every round)",
        at_least=1,
        at_most=MAX_STEPS,
    )
    value_batch: int = _knob(128, help="rows per step of the value functions", at_least=1, at_most=MAX_BATCH)
    value_lr: float = _knob(0.001, help="learning rate of the value functions", above=0)
    online: list[str] = _knob(
        list(ONLINE_ROWS),
        help="online rows of stage 09: digirl_online (from the base) | digirl_off2on (from offline DigiRL, with the "
        "offline data in its buffer) | filtered_bc_online (from the base, imitating its successful episodes); [] = off",
    )
    rounds: int = _knob(
        12,
        help="most rounds of each online run: collect, fit the values, filter, update the actor",
        at_least=1,
        at_most=10_000,
    )
    episodes_per_round: int = _knob(
        32,
        help="episodes collected per round of each task set's run, with its current policy",
        at_least=1,
        at_most=MAX_TASKS,
    )
    env_steps: int | None = _knob(
        4000,
        help="environment-step budget of each task set's online run: no round starts once its episodes have taken "
        "this many (null: rounds alone)",
        at_least=1,
        at_most=1_000_000_000,
    )
    actor_updates: int = _knob(
        5,
        help="optimizer steps of the actor per round, fit as stage 07 fits its actors (actor.batch_size rows a step)",
        at_least=1,
        at_most=MAX_STEPS,
    )
    temperature: float = _knob(0.8, help="sampling temperature of the online episodes (collect's)", above=0)
    n_envs: int = _knob(32, help="devices stepped together", at_least=1, at_most=MAX_DEVICES)
    seed: int = _seed(11, help="seed of the task draws, the devices and the fits")

    def check_rules(self) -> None:
        unknown = [r for r in self.online if r not in ONLINE_ROWS]
        if unknown:
            raise ValueError(f"online: unknown rows {unknown}; known: {list(ONLINE_ROWS)}")


class DiagnosticsConfig(Knobs):
    """Stage 08: the critic's picks against what only the simulator knows (true values, the expert's choices)."""

    oracle_states: int = _knob(
        200,
        help="stored states whose candidates get true values from rollouts (0: the stage is off)",
        at_least=0,
        at_most=MAX_TASKS,
    )
    oracle_rollouts: int = _knob(
        32, help="continuation rollouts of the noisy expert per distinct candidate", at_least=1, at_most=10_000
    )
    oracle_noise: float = _knob(0.1, help="mistake rate of the continuation expert", at_least=0, at_most=1)
    oracle_tolerance: float = _knob(0.05, help="candidates this close to the best true value count as best", at_least=0)
    behaviour_rollouts: int = _knob(
        8,
        help="rollouts per distinct candidate continued by the base policy: the values Digi-Q's critic estimates (0: off)",
        at_least=0,
        at_most=10_000,
    )
    seed: int = _seed(5, help="seed of the sampled states, the rollouts and the probes")


# PAE's proposers and evaluators (digiq.pae), and its practice rows (digiq.stages.pae).
PROPOSERS = ("builtin", "llm")
PAE_EVALUATORS = ("learned", "judge", "oracle")


class ProposeConfig(Knobs):
    """Stage 10: PAE's tasks, proposed once from a crawl of a fresh device (digiq.pae)."""

    proposer: str = _knob("builtin", help="builtin (the crawl and the lexicon, offline) | llm (judge's endpoint)")
    per_group: int = _knob(
        25, help="proposals per task group (builtin) or per app (llm), as PAE asks 25 per website", at_least=1,
        at_most=10_000,
    )  # fmt: skip
    lexicon: str = _knob("", help="the built-in proposer's lexicon file; '' = digiq/pae/lexicon.txt")
    proposer_model: str = _knob("", help="llm: the chat model that proposes; '' = judge.model")
    crawl_depth: int = _knob(4, help="taps from the home screen the crawl goes at most", at_least=1, at_most=10)
    crawl_screens: int = _knob(30, help="distinct screens the crawl keeps per app", at_least=1, at_most=10_000)
    seed: int = _seed(13, help="seed of the crawl's devices and the proposals' draws")

    def check_rules(self) -> None:
        if self.proposer not in PROPOSERS:
            raise ValueError(f"proposer must be one of {list(PROPOSERS)}, got {self.proposer!r}")


class PAEConfig(Knobs):
    """Stage 11: PAE's practice on the proposals, judged without ground truth, beside its controls (digiq.pae)."""

    rows: list[str] = _knob(
        list(PAE_ROWS),
        help="practice rows: pae (the proposals, judged by pae.evaluator) | pae_oracle (the proposals, the device's "
        "own check) | pae_human (the human train lists, the device's own check); [] = off",
    )
    evaluator: str = _knob("learned", help="who judges the pae row's episodes: learned | judge | oracle")
    evaluator_epochs: float = _knob(1.0, help="passes of the learned evaluator's fine-tune over its examples", above=0)
    evaluator_batch: int = _knob(32, help="examples per update of the learned evaluator", at_least=1, at_most=MAX_BATCH)
    evaluator_lr: float = _knob(0.0003, help="learning rate of the learned evaluator's fine-tune", above=0)
    evaluator_last_layers: int = _knob(
        1, help="0: train every weight of the evaluator's VLM; N: only the projector and the last N LM layers",
        at_least=0, at_most=1000,
    )  # fmt: skip
    threshold_episodes: int = _knob(
        96,
        help="base-policy episodes per task set on the validation lists whose steps choose the learned evaluator's "
        "threshold (best F1 of 'finished')",
        at_least=1,
        at_most=MAX_TASKS,
    )
    seed: int = _seed(14, help="seed of the evaluator's fine-tune and its threshold episodes")

    def check_rules(self) -> None:
        unknown = [r for r in self.rows if r not in PAE_ROWS]
        if unknown:
            raise ValueError(f"rows: unknown rows {unknown}; known: {list(PAE_ROWS)}")
        if self.evaluator not in PAE_EVALUATORS:
            raise ValueError(f"evaluator must be one of {list(PAE_EVALUATORS)}, got {self.evaluator!r}")


# What stage 12's diagnostic can take from the simulator's expert (digiq.models.agents.ExpertSkill).
EXPERT_SKILLS = ("type", "tap", "action_type")


class EvalConfig(Knobs):
    """Stage 12: roll every policy out on held-out test tasks, and on the train tasks the offline data hold."""

    n_tasks: int | None = _knob(
        None,
        help="first tasks of each test list; null: the whole list, which carries the intervals "
        "(its first 96 are the paper's protocol)",
        at_least=1,
        at_most=MAX_TASKS,
    )
    train_tasks: int = _knob(
        96,
        help="also the first N distinct tasks per task set in the offline data: the paper's train columns (0 = off)",
        at_least=0,
        at_most=MAX_TASKS,
    )
    temperature: float = _knob(0.8, help="sampling temperature (AutoUI eval: 0.8); 0 = greedy", at_least=0)
    n_envs: int = _knob(48, help="devices stepped together", at_least=1, at_most=MAX_DEVICES)
    seed: int = _seed(7, help="seed of the devices")
    expert_skills: list[str] = _knob(
        list(EXPERT_SKILLS),
        help="sim: also run the base policy (first seed) with each of these skills taken "
        "from the expert: type | tap | action_type; [] = off",
    )

    def check_rules(self) -> None:
        unknown = [s for s in self.expert_skills if s not in EXPERT_SKILLS]
        if unknown:
            raise ValueError(f"expert_skills: unknown {unknown}; known: {list(EXPERT_SKILLS)}")


class Settings(BaseModel):
    """Every knob of a run: one group per stage and per machine setting, and the named critic variants.

    Built once per stage (:func:`load_settings`) and passed down, each group to the code it sets. Its own
    rules are those between groups (:meth:`_candidates_drawn`).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    env: EnvConfig = Field(default_factory=EnvConfig)
    devices: DeviceConfig = Field(default_factory=DeviceConfig)
    judge: JudgeConfig = Field(default_factory=JudgeConfig)
    tasks: TasksConfig = Field(default_factory=TasksConfig)
    base_policy: BasePolicyConfig = Field(default_factory=BasePolicyConfig)
    collect: CollectConfig = Field(default_factory=CollectConfig)
    augment: AugmentConfig = Field(default_factory=AugmentConfig)
    vlm_pretrain: VLMPretrainConfig = Field(default_factory=VLMPretrainConfig)
    vlm_finetune: VLMFinetuneConfig = Field(default_factory=VLMFinetuneConfig)
    embed: EmbedConfig = Field(default_factory=EmbedConfig)
    compute: ComputeConfig = Field(default_factory=ComputeConfig)
    experiment: ExperimentConfig = Field(default_factory=ExperimentConfig)
    ablations: AblationsConfig = Field(default_factory=AblationsConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    digirl: DigiRLConfig = Field(default_factory=DigiRLConfig)
    propose: ProposeConfig = Field(default_factory=ProposeConfig)
    pae: PAEConfig = Field(default_factory=PAEConfig)
    diagnostics: DiagnosticsConfig = Field(default_factory=DiagnosticsConfig)
    eval: EvalConfig = Field(default_factory=EvalConfig)
    # Named Digi-Q variants, each the critic group with the keys it changes: a row of its own (digiq.rows), trained
    # and evaluated on the same seeds as digiq, whose critic stays the paper's.
    variants: dict[str, CriticConfig] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _candidates_drawn(self) -> Settings:
        """Best-of-N over N' candidates (``actor.k_candidates``, and each of ``ablations.n_candidates``) draws them
        from the N that stage 02 sampled per state (``augment.n_candidates``): an N' above N would silently run
        over N."""
        n = self.augment.n_candidates
        for knob, counts in (("ablations.n_candidates", self.ablations.n_candidates),
                             ("actor.k_candidates", [self.actor.k_candidates])):  # fmt: skip
            if over := [c for c in counts if c > n]:
                raise ValueError(f"{knob} {over} exceed augment.n_candidates ({n}): Best-of-N over N' candidates "
                                 "draws them from the N that stage 02 sampled per state")  # fmt: skip
        return self


#: Every group of knobs and the class that reads it.
SECTIONS: dict[str, type[Knobs]] = {
    name: f.annotation for name, f in Settings.model_fields.items() if name != "variants"
}


def load_settings(path: Path | str = PARAMS, params: dict[str, Any] | None = None) -> Settings:
    """The settings of the params at ``path`` (and the ``params/*.yaml`` beside it), or of ``params`` already
    read from there (:func:`load_params`, whose record of which file set each key the errors name; a plain
    mapping is named as ``path``).

    Raises:
        ConfigError: naming the file, the group and the key of an unknown key, a value of the wrong type or out
            of range, a broken rule of one group or between groups, or a malformed variant.
    """
    params = load_params(path) if params is None else params
    groups: dict[str, Any] = {}
    for name in SECTIONS:
        raw = params.get(name, {})
        if not isinstance(raw, dict):
            raise ConfigError(f"{_where(params, name, path)} must be a mapping of keys, got {type(raw).__name__}")
        _named_keys(raw, _where(params, name, path))
        groups[name] = raw
    groups["variants"] = _variants(params, path)
    try:
        return Settings.model_validate(groups)
    except ValidationError as e:
        raise ConfigError(_explain(e.errors()[0], params, path)) from None


def _variants(params: dict[str, Any], path: Path | str) -> dict[str, dict[str, Any]]:
    """Group ``variants``: each named variant as the ``critic`` group's keys with its changes over them."""
    raw = params.get("variants") or {}
    where = f"{Path(path).name}: variants"
    if not isinstance(raw, dict):
        raise ConfigError(f"{where} must map variant names to critic keys, got {type(raw).__name__}")
    out = {}
    for name, changes in raw.items():
        if not (isinstance(name, str) and name.startswith("digiq_") and name.isidentifier()):
            raise ConfigError(f"{where}: variant name {name!r} must be an identifier starting with 'digiq_'")
        if name in ABLATION_NAMES or name.removeprefix("digiq_n").isdigit():
            raise ConfigError(f"{where}: variant name {name!r} is taken by an ablation row")
        if not isinstance(changes, dict) or not changes:
            raise ConfigError(f"{where}.{name} must be a non-empty mapping of critic keys to change")
        _named_keys(changes, f"{where}.{name}")
        out[name] = {**params.get("critic", {}), **changes}
    return out


def _named_keys(group: dict[Any, Any], where: str) -> None:
    """Refuse a key that is no name: YAML reads an unquoted ``on``, ``yes`` or ``no`` as a boolean, ``1`` as a number."""
    if odd := [key for key in group if not isinstance(key, str)]:
        raise ConfigError(f"{where}: key {odd[0]!r} is not a knob's name (quote it if it is one)")


def _files(params: dict[str, Any], name: str, path: Path | str, key: str = "") -> str:
    """The file that set ``name.key`` (or every file that set a key of group ``name``); ``path``'s where none
    is recorded."""
    raw, source = params.get(name, {}), getattr(params, "source", {})
    keys = [key] if key else list(raw) if isinstance(raw, dict) else []
    return ", ".join(sorted({source[name, k].name for k in keys if (name, k) in source}) or [Path(path).name])


def _where(params: dict[str, Any], name: str, path: Path | str, key: str = "") -> str:
    """:func:`_files` and the knob's name."""
    return f"{_files(params, name, path, key)}: {name}" + (f".{key}" if key else "")


# pydantic's range errors: which bound of knob_range, and its sign.
_BOUNDS = {"greater_than_equal": (0, ">="), "greater_than": (1, ">"), "less_than_equal": (2, "<="),
           "less_than": (3, "<")}  # fmt: skip


def _explain(error: Any, params: dict[str, Any], path: Path | str) -> str:
    """One of pydantic's errors in building the settings as a message that names the file, the group and the key."""
    loc, cause = error["loc"], error.get("ctx", {}).get("error")
    if not loc:  # a rule between groups: name each group.key's file
        return re.sub(r"\b([a-z_]+)\.([a-z_]+)\b",
                      lambda m: _where(params, m[1], path, m[2]) if m[1] in SECTIONS else m[0], str(cause))  # fmt: skip
    # Each group is built by Knobs.__init__, whose KnobError names what is wrong.
    variant = loc[0] == "variants"
    group = f"variants.{loc[1]}" if variant else str(loc[0])
    key, message = getattr(cause, "key", None), str(cause or error["msg"])
    files = Path(path).name if variant else _files(params, group, path, key or "")
    if key is None or not cause.dotted:
        return f"{files}: {group}: {message}"
    named = f"{files}: {group}.{key}"
    return f"{named}{message.removeprefix(key)}" if message.startswith(f"{key} ") else f"{named}: {message}"


def _problem(cls: type[Knobs], error: Any, values: dict[str, Any]) -> KnobError:
    """What is wrong with the knobs ``values`` of ``cls``, from the first of pydantic's errors: the knob, the rule
    it breaks and the value it was given."""
    kind = error["type"]
    if kind == "value_error":  # a group's own rule
        return KnobError(str(error["ctx"]["error"]))
    if kind == "extra_forbidden":
        unknown = sorted(set(values) - set(cls.model_fields))
        return KnobError(f"unknown key(s) {unknown}; known keys: {sorted(cls.model_fields)}", unknown[0], dotted=True)
    key = str(error["loc"][0])
    value = values[key]
    if kind in _BOUNDS:
        at, word = _BOUNDS[kind]  # the bound as the knob states it (pydantic's is a float for a float knob)
        return KnobError(f"{key} must be {word} {knob_range(cls.model_fields[key])[at]}, got {value}", key)
    if kind == "finite_number" or (kind == "float_type" and isinstance(value, int) and not isinstance(value, bool)):
        return KnobError(f"{key} must be a finite number, got {value}", key)  # the second: a whole no float holds
    annotation = cls.model_fields[key].annotation
    return KnobError(f"{key} must be {type_name(annotation)}, got {value!r} ({type(value).__name__})", key, True)


def with_defaults(params: dict[str, Any]) -> dict[str, Any]:
    """``params`` with every group's unset knobs at their defaults: the values the stages see.

    Keys are kept as given, unchecked, so that the params of a run made
    before a knob was removed still read (``digiq.rerun`` compares them).
    """
    out = {name: dict(value) if isinstance(value, dict) else value for name, value in params.items()}
    for name, cls in SECTIONS.items():
        given = out.get(name) if isinstance(out.get(name), dict) else {}
        out[name] = {key: knob_default(f) for key, f in cls.model_fields.items()} | given
    return out
