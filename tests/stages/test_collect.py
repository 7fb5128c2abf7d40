"""Stage 01's episodes: as released Digi-Q's data, tasks drawn with repetition from the train tasks."""

from collections import Counter

import pytest

from digiq.config import CollectConfig
from digiq.env.taskgen import generate_tasks
from digiq.env.tasks import parse_task
from digiq.stages.collect import episode_tasks


def _pool(task_set: str, n: int) -> list:
    return [parse_task(t, task_set) for t in generate_tasks(task_set, "train", n, seed=3)]


def test_each_task_set_draws_its_episode_count_with_repetition_from_its_pool():
    general, webshop = _pool("general", 5), _pool("webshop", 4)
    cfg = CollectConfig(episodes_general=40, episodes_webshop=30)
    drawn_general, drawn_webshop = episode_tasks(cfg, "general", general), episode_tasks(cfg, "webshop", webshop)
    assert len(drawn_general) == 40 and len(drawn_webshop) == 30
    assert set(drawn_general) <= set(general) and set(drawn_webshop) <= set(webshop)
    assert max(Counter(drawn_general).values()) > 1  # with repetition
    assert len(set(drawn_general)) == 5  # 40 draws from 5 tasks miss none (probability 5 x 0.8^40)
    assert episode_tasks(cfg, "general", general) == drawn_general  # seeded by collect.seed and the task set
    assert episode_tasks(CollectConfig(episodes_general=40, seed=2), "general", general) != drawn_general


def test_without_an_episode_count_each_task_is_rolled_out_once_in_order():
    general = _pool("general", 5)
    assert episode_tasks(CollectConfig(episodes_general=None), "general", general) == general
    with pytest.raises(ValueError, match="episodes_general"):
        CollectConfig(episodes_general=0)
