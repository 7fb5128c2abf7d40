"""The VLM's pretraining: screens with their elements, the questions, free-text answers, and the stage."""

import json
import random
import shutil

import numpy as np
import pytest
import torch

from digiq.config import VLMFinetuneConfig, VLMPretrainConfig, load_settings
from digiq.data.screen_corpus import LabelledScreen, labelled_screens
from digiq.env import parse_task
from digiq.env.hierarchy import Element, screen_elements
from digiq.env.state import Dynamics
from digiq.env.taskgen import generate_tasks
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig
from digiq.models.vlm_pretrain import NOTHING, Question, ask, correct
from digiq.paths import Paths
from digiq.stages.vlm_pretrain import record_screens, run_vlm_pretrain
from tests.conftest import ROOT

SMALL = VLMConfig(image_size=32, patch_size=16, vision_hidden=16, hidden=32, layers=1, heads=2)


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(default_corpus(n_tasks=100), vocab_size=500)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The noisy expert's screens on three General train tasks, with their hierarchies."""
    tasks = [parse_task(t, "general") for t in generate_tasks("general", "train", 3, seed=3)]
    store = record_screens(tmp_path_factory.mktemp("screens") / "train", tasks, noise=0.3, seed=0,
                           dynamics=Dynamics(), width=108)  # fmt: skip
    return store, labelled_screens(store)


def test_screen_elements_read_labels_and_boxes_from_a_dump():
    xml = ("<hierarchy rotation='0'><node class='android.widget.FrameLayout' bounds='[0,0][100,200]'>"
           "<node text='Clock' clickable='true' class='android.widget.TextView' bounds='[0,0][50,20]' />"
           "<node text='' clickable='false' class='android.widget.TextView' bounds='[0,20][50,40]' />"
           "<node text='Wi-Fi' checkable='true' checked='true' clickable='true' class='android.widget.Switch' "
           "bounds='[50,100][100,120]' />"
           "<node text='Search' clickable='false' class='android.widget.EditText' bounds='[0,160][100,180]' />"
           "</node></hierarchy>")  # fmt: skip
    assert screen_elements(xml, (100, 200)) == [Element("Clock", (0.0, 0.0, 0.1, 0.5)),
                                                Element("Wi-Fi on", (0.5, 0.5, 0.6, 1.0), "switch"),
                                                Element("Search", (0.8, 0.0, 0.9, 1.0), "input")]  # fmt: skip


def test_corpus_holds_distinct_labelled_screens_and_excludes_seen_ones(corpus):
    store, screens = corpus
    assert len(screens) >= 5 and all(s.elements for s in screens)
    assert len({s.xml for s in screens}) == len(screens)
    assert labelled_screens(store, exclude=screens) == []


def _screen() -> LabelledScreen:
    return LabelledScreen("x.png", (Element("clock", (0.1, 0.1, 0.2, 0.4)), Element("maps", (0.5, 0.5, 0.7, 0.9))), "")


def test_questions_are_answered_from_the_hierarchy():
    recipe = ScreenVLM.tiny(train_tokenizer(default_corpus(n_tasks=20), vocab_size=300), SMALL).recipe
    base = np.full((32, 32, 3), 255, np.uint8)
    rng = random.Random(0)
    element = [ask("element", _screen(), base, recipe, rng, []) for _ in range(100)]
    assert {q.answer for q in element} == {"clock", "maps", NOTHING}
    assert all((q.image != base).any() for q in element)  # the red circle is drawn
    point = ask("point", _screen(), base, recipe, rng, [])
    target = {"clock": "0.15 0.25", "maps": "0.60 0.70"}
    assert point.answer == target[point.prompt.split("Where is ")[1].split("?")[0]]
    presence = [ask("presence", _screen(), base, recipe, rng, ["clock", "gmail"]) for _ in range(60)]
    assert {q.answer for q in presence} == {"Yes", "No"}
    assert all(("gmail" in q.prompt) == (q.answer == "No") for q in presence)
    with pytest.raises(ValueError, match="unknown pretraining objective 'read'"):
        ask("read", _screen(), base, recipe, rng, [])


def test_answers_are_judged_by_words_or_by_the_element_a_point_falls_in():
    point = Question("point", np.zeros(1), "", "0.15 0.25", (0.1, 0.1, 0.2, 0.4))
    assert correct(point, "0.12 0.39") and not correct(point, "0.25 0.25") and not correct(point, "clock")
    element = Question("element", np.zeros(1), "", "wi-fi on")
    assert correct(element, " Wi-Fi  ON") and not correct(element, "wi-fi off")


def test_text_loss_teaches_free_text_answers(tok):
    torch.manual_seed(0)
    vlm = ScreenVLM.tiny(tok, SMALL)
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 255, (32, 32, 3), dtype=np.uint8) for _ in range(2)]
    prompts = ["<image>\nWhat is this? Answer:"] * 2
    answers = ["settings", "0.35 0.70"]
    opt = torch.optim.AdamW(vlm.model.parameters(), lr=3e-3)
    first = vlm.text_loss(images, prompts, answers).item()
    for _ in range(60):
        loss = vlm.text_loss(images, prompts, answers)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.1 * first
    assert vlm.greedy_answers(images, prompts) == answers


def test_stage_pretrains_and_measures_on_heldout_screens(tmp_path):
    paths = Paths(tmp_path)
    for ts in ("general", "webshop"):
        for split in ("train", "val"):
            paths.task_list(ts, split).parent.mkdir(parents=True, exist_ok=True)
            paths.task_list(ts, split).write_text("\n".join(generate_tasks(ts, split, 2, seed=3)) + "\n")
    train_tokenizer(default_corpus(n_tasks=50), vocab_size=400).save_pretrained(paths.base_policy / "tokenizer")
    settings = load_settings(ROOT / "params.yaml")
    cfg = VLMPretrainConfig(steps=4, batch_size=4, eval_questions=6, image_size=32, hidden=32)
    env = settings.env
    metrics = run_vlm_pretrain(cfg, VLMFinetuneConfig(), env, paths)
    assert metrics["steps"] == 4 and metrics["screens_train"] > 0 and metrics["screens_heldout"] > 0
    assert set(metrics["accuracy_heldout"]) == {"element", "point", "presence"}
    assert all(0 <= v <= 1 for v in metrics["most_common_answer_heldout"].values())
    assert json.loads((paths.metrics / "vlm_pretrain.json").read_text())["steps"] == 4
    assert ScreenVLM.load(paths.vlm_pretrained).cfg.image_size == 32
    # A released LLaVA is pretrained: nothing trains, the stage records which checkpoint.
    shutil.rmtree(paths.vlm_pretrained)
    run_vlm_pretrain(cfg, VLMFinetuneConfig(checkpoint="/models/llava"), env, paths)
    assert json.loads((paths.vlm_pretrained / "released.json").read_text()) == {"checkpoint": "/models/llava"}


def test_objectives_are_checked():
    with pytest.raises(ValueError, match="vlm_pretrain.objectives"):
        VLMPretrainConfig(objectives=["element", "read"])
