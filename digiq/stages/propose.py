"""Stage 10: PAE's tasks, proposed once before any practice, from a crawl of a fresh device.

1. **crawl** a fresh device of the configured backend (:func:`digiq.pae.crawl.crawl`): its apps, their
   screens, buttons, text fields and switches, read off view hierarchies;
2. **propose** tasks from what the crawl saw: the built-in proposer, with the declared lexicon as its world
   knowledge (:mod:`digiq.pae.propose`), or a chat LLM over the judge's endpoint, asked as PAE asks
   (:mod:`digiq.pae.propose_llm`).

Writes ``data/pae/crawl.json`` and ``data/pae/proposals.jsonl`` (one task per line with its context and
where each of its values came from), DVC outputs, so that practice reruns without an endpoint; and
``metrics/propose.json`` (how many per app, task set and source). The stage reads nothing of the task lists
or the stored episodes: the proposals are the same bytes whether they exist or not.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

from digiq.config import DeviceConfig, EnvConfig, JudgeConfig, ProposeConfig, Settings
from digiq.env.backends import EnvFactory
from digiq.env.state import Dynamics
from digiq.pae.crawl import crawl, nothing_done
from digiq.pae.lexicon import DEFAULT_LEXICON, Lexicon
from digiq.pae.proposals import write_proposals
from digiq.pae.propose import propose
from digiq.pae.propose_llm import propose_with_llm
from digiq.paths import Paths
from digiq.stages.common import one_run_at_a_time, timed, write_metrics

__all__ = ["run", "run_propose"]


@one_run_at_a_time("propose")
def run_propose(cfg: ProposeConfig, env: EnvConfig, paths: Paths, devices: DeviceConfig | None = None,
                judge: JudgeConfig | None = None) -> dict[str, Any]:  # fmt: skip
    """Crawl the first device of ``devices`` (default: the in-process simulator), then propose; the metrics."""
    devices = devices or DeviceConfig()
    metrics: dict[str, Any] = {}
    with timed(metrics):
        with EnvFactory(devices, Dynamics.of(env), env.width, evaluator=nothing_done) as factory:
            context = crawl(factory, depth=cfg.crawl_depth, max_screens_per_app=cfg.crawl_screens, seed=cfg.seed)
        if cfg.proposer == "builtin":
            lexicon = Lexicon.read(Path(cfg.lexicon) if cfg.lexicon else DEFAULT_LEXICON)
            proposals = propose(context, lexicon, per_group=cfg.per_group, seed=cfg.seed)
        else:
            proposals = propose_with_llm(context, judge or JudgeConfig(), per_app=cfg.per_group,
                                         model=cfg.proposer_model)  # fmt: skip
        paths.pae.mkdir(parents=True, exist_ok=True)
        context.save(paths.pae_crawl)
        write_proposals(paths.pae_proposals, proposals)
    sources = Counter(s.source for p in proposals for s in p.slots)
    metrics.update({
        "proposer": proposals[0].proposer if proposals else cfg.proposer,
        "crawl_screens": len(context.screens()),
        "crawl_taps": context.taps,
        "proposals": len(proposals),
        "by_app": dict(Counter(p.app for p in proposals)),
        "by_task_set": dict(Counter(p.task_set for p in proposals)),
        "slot_sources": dict(sorted(sources.items())),
    })  # fmt: skip
    write_metrics(paths, "propose", metrics)
    return metrics


def run(settings: Settings, paths: Paths) -> dict[str, Any]:
    """Stage 10 as ``params.yaml`` sets it."""
    return run_propose(settings.propose, settings.env, paths,
                       devices=settings.devices,
                       judge=settings.judge)  # fmt: skip
