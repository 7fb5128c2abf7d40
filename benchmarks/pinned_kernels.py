"""What pinned kernels cost each stage: its heavy work's CPU time pinned (AVX2) over unpinned (the machine's own).

``compute.pinned_kernels`` starts every stage process with
:func:`digiq.kernels.pinned_environ`'s variables: ATen's, MKL's and
oneDNN's AVX2 code (MKL in its strict reproducible mode) where the machine
may have wider (AVX-512), a fixed number of threads. Here a piece of each
stage's heavy work runs in a fresh process started with those variables,
and in one started with the machine's own (the variables removed, the same
number of threads), at the pipeline's tiny sizes and the committed run's
shapes (``params.yaml``, ``params/``, the defaults of ``digiq/config.py``):

- 00 base_policy: :func:`~digiq.models.policy_fit.fit_policy` steps of the
  base policy (``base_policy``'s T5 width and layers) on ``base_policy.batch_size``
  rows; 07 actor, 09 and 11's actor updates: steps on ``actor.batch_size``
  rows (released Digi-Q's Adam, clipped, constant rate);
- 01 collect (09 and 11 roll out alike), 12 eval: ``AutoUIPolicy.sample``,
  one action per state, ``collect.n_envs`` and ``eval.n_envs`` states a call,
  screenshots resampled as a rollout does; 02 augment: ``AutoUIPolicy.sample`` of
  ``augment.batch_states`` states, ``augment.n_candidates - 1`` each (the
  redraws of invalid candidates left out: a freshly initialised policy
  writes few valid ones, and a redraw is the same decoding);
- 03 vlm_pretrain, 04 vlm_finetune: optimizer steps of the tiny VLM
  (``vlm_pretrain``'s width and image size) on their batches, as
  ``benchmarks/answer_slot.py`` builds them; 05 embed: ``ScreenVLM.embed``
  of ``embed.batch_size`` (state, candidate) rows;
- critic_inputs: the base policy's T5 encoder over goals and the actions'
  type and typed text (:func:`~digiq.models.critic_inputs.encode_texts`);
- 06 critic: :func:`~digiq.algos.digiq.fit_critic` steps of the ``digiq``
  row (``critic``'s width and batch, the text features' widths) and of
  ``variants.digiq_hierarchy`` (its CQL term and wider candidates);
  07 actor and 08 diagnostics: ``Critic.advantage`` of every candidate;
  08's expert rankers: an epoch of each half's fit in
  :func:`~digiq.diagnostics.probes.expert_probe`, the MLP and the linear one.

The models are freshly initialised (their weights do not change the work,
but an untrained policy writes every action to ``max_action_tokens``, where
a trained one stops at about 20) and saved once, so both settings load the
same; the states are the simulator's, of test tasks of both task sets
(``benchmarks/policy_step.py``'s), the critics' features random, with the
repeats among a state's candidates that stage 02's samples have.

Each work runs on one torch thread, as in a worker process, and the work a
stage runs in its own process also on ``compute.threads`` (2). Per thread
count, one pinned and one unpinned process are started and take turns call
by call: a work's first call in a process sets it up and warms it up,
untimed; then ``--repeats`` timed calls of each work in each process, which
of the two goes first alternating, so that a change in the machine's load
falls on both. The figure is the process's CPU seconds over a call
(``time.process_time``): on a shared, loaded machine wall seconds count
other processes' turns on the core too. Waiting OpenMP threads sleep
(``OMP_WAIT_POLICY=PASSIVE``, in both settings) rather than spin: on a
loaded machine the thread waited for is often off the core, and spinning
adds CPU seconds of no work, as many as the load makes it. A row's ratio
is the median over the repeats of pinned's CPU time over unpinned's in the
adjacent call, with the lowest and highest; the median wall ratio beside
it. The work measured is the stages' heavy part: a stage's time also holds
the simulator, files and Python, which pinning leaves alone, so the
stage's own ratio is nearer 1.

Last line: ``pinned_kernels_cost=<number>`` (the largest row's median pinned/unpinned CPU-time ratio).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd
import torch
from answer_slot import candidate, pretraining_question, rows
from policy_step import states

from digiq.algos.digiq import fit_critic
from digiq.config import (
    load_settings,
)
from digiq.diagnostics.probes import expert_probe
from digiq.env.actions import format_action
from digiq.kernels import PINNED_ISA, in_use, pinned_environ
from digiq.models.critic import Critic, CriticNetConfig
from digiq.models.critic_inputs import action_features, encode_texts
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.policy_fit import FitRow, fit_policy
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig, trainable
from digiq.noise import noise_key

N_STATES = 2048  # stored states of the critics' and rankers' features
N_CANDIDATES_DISTINCT = 8  # each state's candidates drawn among this many (stage 02's: about 7.4 distinct of 16)


class Work(NamedTuple):
    """A piece of a stage's heavy work: ``build(context)`` sets it up and returns one call of it."""

    stage: str
    what: str
    own_process: bool  # run in the stage's own process (compute.threads); otherwise in one-thread workers
    build: Callable[[Context], Callable[[], object]]


class Context:
    """What every work reads, loaded from the prepared folder once per process, each part when first asked."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.data: dict[str, Any] = torch.load(folder / "data.pt", weights_only=False)
        self.settings = load_settings()
        self.variant = self.settings.variants["digiq_hierarchy"]
        self._policy: AutoUIPolicy | None = None
        self._vlm: ScreenVLM | None = None

    @property
    def policy(self) -> AutoUIPolicy:
        if self._policy is None:
            self._policy = AutoUIPolicy.load(self.folder / "policy").eval()
        return self._policy

    @property
    def vlm(self) -> ScreenVLM:
        if self._vlm is None:
            self._vlm = ScreenVLM.load(self.folder / "vlm")
        return self._vlm


# ---------------------------------------------------------------- the works


def fit_step(stage: str) -> Callable[[Context], Callable[[], object]]:
    """``fit_policy`` steps as stage 00 (``base_policy``) or the actors (``actor``) take them."""

    def build(ctx: Context) -> Callable[[], object]:
        model = copy.deepcopy(ctx.policy)
        d = ctx.data
        screens = dict(zip(d["screen_names"], ctx.policy.screen.prepare(d["shots"]), strict=True))
        fit_rows = [FitRow(p, n, a) for p, n, a in zip(d["prompts"], d["screen_names"], d["actions"], strict=True)]
        if stage == "base_policy":
            c = ctx.settings.base_policy
            return lambda: fit_policy(model, fit_rows, screens, updates=2, batch_size=c.batch_size, lr=c.lr, seed=0)
        a = ctx.settings.actor
        return lambda: fit_policy(model, fit_rows, screens, updates=1, batch_size=a.batch_size, lr=a.lr, seed=0,
                                  weight_decay=a.weight_decay, grad_clip=a.grad_clip, one_cycle=False)  # fmt: skip

    return build


def sampling(stage: str) -> Callable[[Context], Callable[[], object]]:
    """One action per state for ``collect.n_envs`` or ``eval.n_envs`` states, or stage 02's candidates."""

    def build(ctx: Context) -> Callable[[], object]:
        d, policy = ctx.data, ctx.policy
        if stage == "augment":
            cfg = ctx.settings.augment.but(max_resample=0)
            n = cfg.batch_states
            keys = [noise_key(cfg.seed, i) for i in range(n)]
            return lambda: policy.sample(d["prompts"][:n], policy.screen.prepare(d["shots"][:n]),
                                         n=cfg.n_candidates - 1, temperature=cfg.temperature, noise=keys)  # fmt: skip
        cfg = getattr(ctx.settings, stage)
        n = cfg.n_envs
        keys = [noise_key(cfg.seed, i) for i in range(n)]
        return lambda: policy.sample(d["prompts"][:n], d["shots"][:n], temperature=cfg.temperature, noise=keys)

    return build


def vlm_step(stage: str) -> Callable[[Context], Callable[[], object]]:
    """An optimizer step of stage 03 (every weight, the answers' text loss) or 04 (the trained layers, yes/no)."""

    def build(ctx: Context) -> Callable[[], object]:
        vlm = copy.deepcopy(ctx.vlm)
        vlm.model.train()
        if stage == "vlm_pretrain":
            images, prompts, answers = ctx.data["pretrain"]
            opt = torch.optim.AdamW(vlm.model.parameters(), lr=ctx.settings.vlm_pretrain.lr)

            def loss() -> torch.Tensor:
                return vlm.text_loss(images, prompts, answers)
        else:
            cfg = ctx.settings.vlm_finetune
            images, prompts, labels = ctx.data["finetune"]
            opt = torch.optim.AdamW(trainable(vlm, cfg.train_last_layers), lr=cfg.lr, weight_decay=cfg.weight_decay)

            def loss() -> torch.Tensor:
                return vlm.loss(images, prompts, labels)

        def step() -> None:
            opt.zero_grad()
            loss().backward()
            opt.step()

        return step

    return build


def embed(ctx: Context) -> Callable[[], object]:
    """Stage 05: one call of ``embed.batch_size`` (state, candidate) rows."""
    vlm = ctx.vlm
    vlm.model.eval()
    images, prompts = ctx.data["embed"]
    return lambda: vlm.embed(images, prompts)


def critic_text(ctx: Context) -> Callable[[], object]:
    """critic_inputs: the goals' and the actions' text features through the base policy's T5 encoder."""
    d = ctx.data
    return lambda: (encode_texts(ctx.policy, d["goals"]), action_features(ctx.policy, d["actions"]))


def critic_fit(variant: bool) -> Callable[[Context], Callable[[], object]]:
    """Stage 06: ``fit_critic`` of 20 TD steps (and its held-out check) on ``critic``'s or the variant's features."""

    def build(ctx: Context) -> Callable[[], object]:
        cfg = ctx.variant if variant else ctx.settings.critic
        feats = ctx.data["variant_feats" if variant else "feats"]
        scored = ctx.data["scored"] if variant else None
        steps = ctx.data["steps"]
        cfg = cfg.but(steps=20)
        return lambda: fit_critic(cfg, feats, steps, seed=0, scored=scored)

    return build


def critic_scores(ctx: Context) -> Callable[[], object]:
    """Stages 07 and 08: the critic's Q, V and A of every stored state's candidates."""
    feats = ctx.data["feats"]
    torch.manual_seed(0)
    cfg = ctx.settings.critic
    critic = Critic(CriticNetConfig(feature_dim=feats["state"].shape[1], hidden=cfg.hidden,
                                    action_dim=feats["candidates"].shape[2], text=True, twin=cfg.twin_heads)).eval()  # fmt: skip
    state, cands = torch.from_numpy(feats["state"]), torch.from_numpy(feats["candidates"])
    return lambda: critic.advantage(state, cands)


def ranker(hidden: int | None) -> Callable[[Context], Callable[[], object]]:
    """Stage 08: one epoch of an expert ranker's fit on the critic's inputs (its 40 epochs are alike)."""

    def build(ctx: Context) -> Callable[[], object]:
        f, d = ctx.data["feats"], ctx.data
        return lambda: expert_probe(f["state"], f["candidates"], d["right"], d["valid"], d["episodes"], seed=0,
                                    hidden=hidden, epochs=1)  # fmt: skip

    return build


WORKS = {
    "fit_sft": Work("00 base_policy", "policy fit, 2 steps of base_policy.batch_size rows", True, fit_step("base_policy")),
    "sample_collect": Work("01 collect, 09, 11", "sampling, 1 action for each of collect.n_envs states", True,
                           sampling("collect")),
    "sample_augment": Work("02 augment_actions", "sampling, n_candidates - 1 for each of batch_states states", False,
                           sampling("augment")),
    "vlm_pretrain": Work("03 vlm_pretrain", "VLM step, every weight, text loss", True, vlm_step("vlm_pretrain")),
    "vlm_finetune": Work("04 vlm_finetune", "VLM step, train_last_layers, yes/no loss", True, vlm_step("vlm_finetune")),
    "embed": Work("05 embed", "ScreenVLM.embed, embed.batch_size rows", False, embed),
    "critic_text": Work("critic_inputs", "T5 encoder, goals and actions' text", True, critic_text),
    "critic_td": Work("06 critic", "fit_critic, 20 TD steps (digiq)", False, critic_fit(False)),
    "critic_cql": Work("06 critic", "fit_critic, 20 TD steps (digiq_hierarchy: CQL)", False, critic_fit(True)),
    "fit_actor": Work("07 actor, 09, 11", "policy fit, 1 step of actor.batch_size rows", False, fit_step("actor")),
    "critic_scores": Work("07 actor, 08", "Critic.advantage of every candidate", False, critic_scores),
    "ranker_mlp": Work("08 diagnostics", "expert ranker (MLP), 1 epoch", False, ranker(256)),
    "ranker_linear": Work("08 diagnostics", "expert ranker (linear), 1 epoch", False, ranker(None)),
    "sample_eval": Work("12 eval", "sampling, 1 action for each of eval.n_envs states", False, sampling("eval")),
}  # fmt: skip


# ---------------------------------------------------------------- the inputs


def critic_features(rng: np.random.Generator, ds: int, dc: int, n: int) -> dict[str, np.ndarray]:
    """Random features of ``N_STATES`` states (width ``ds``) and ``n`` candidates each (``dc``), the candidates of
    a state drawn among ``N_CANDIDATES_DISTINCT`` (the action taken, column 0, among them)."""
    state = rng.normal(size=(N_STATES, ds)).astype(np.float32)
    distinct = (rng.normal(size=(N_STATES, N_CANDIDATES_DISTINCT, dc)) + 1.0).astype(np.float32)
    picks = rng.integers(0, N_CANDIDATES_DISTINCT, size=(N_STATES, n))
    picks[:, 0] = 0
    candidates = np.take_along_axis(distinct, picks[..., None], 1)
    return {"state": state, "next_state": np.roll(state, -1, 0), "candidates": candidates}


def prepare(folder: Path) -> dict[str, Any]:
    """Saves the policy, the VLM and every work's inputs in ``folder``; what they are, for the header."""
    settings = load_settings()
    base = settings.base_policy
    pre = settings.vlm_pretrain
    fine = settings.vlm_finetune
    augment = settings.augment
    critic = settings.critic
    variant = settings.variants["digiq_hierarchy"]
    actor = settings.actor
    n_states = max(augment.batch_states, settings.eval.n_envs,
                   settings.collect.n_envs, 2 * actor.batch_size)  # fmt: skip
    tok = train_tokenizer(default_corpus(), base.vocab_size)
    torch.manual_seed(base.seed)
    policy = AutoUIPolicy(PolicyConfig(d_model=base.d_model, num_layers=base.num_layers, d_ff=2 * base.d_model,
                                       image_dim=base.d_model), tok)  # fmt: skip
    policy.save(folder / "policy", stage="benchmark")
    vlm = ScreenVLM.tiny(tok, VLMConfig(image_size=pre.image_size, hidden=pre.hidden, recipe=fine.recipe), seed=0)
    vlm.save(folder / "vlm", stage="benchmark")

    prompts, shots = states(n_states)
    rng = np.random.default_rng(0)
    goals = [p.rsplit("Goal: ", 1)[-1] for p in prompts]
    actions = [format_action(candidate(g, rng)) for g in goals]
    images, _, asked = rows(vlm, pre.batch_size, 200)
    questions = [pretraining_question(t, rng) for t in asked]
    fine_images, fine_prompts, _ = rows(vlm, fine.batch_size, 100)
    embed_images, embed_prompts, _ = rows(vlm, settings.embed.batch_size, 0)

    # The critics' inputs: the VLM's representations, then the text features (digiq.data.features.critic_inputs).
    rep, d = vlm.cfg.representation_size, base.d_model
    ds, dc = rep + d + 2 * d, rep + 2 * d  # state: goal, previous action's type and text; candidate: type and text
    extra = d * variant.tap_targets + 2 * variant.typed_match + 2 * variant.list_entries
    n = augment.n_candidates
    episodes = np.repeat(np.arange(N_STATES // 8), 8)  # 8 steps an episode
    done = np.arange(N_STATES) % 8 == 7
    steps = pd.DataFrame({"traj_id": episodes, "reward": done.astype(np.float32), "done": done,
                          "mc_return": rng.random(N_STATES).astype(np.float32)})  # fmt: skip
    feats = critic_features(rng, ds, dc, n)
    variant_feats = critic_features(rng, ds, dc + extra, n)
    right = rng.random((N_STATES, n)) < 0.3
    data = {
        "prompts": prompts, "shots": shots, "actions": actions, "goals": goals,
        "screen_names": [f"screen{i}" for i in range(n_states)],
        "pretrain": (images, [q for q, _ in questions], [a for _, a in questions]),
        "finetune": (fine_images, fine_prompts, torch.as_tensor(rng.integers(0, 2, fine.batch_size))),
        "embed": (embed_images, embed_prompts),
        "feats": feats, "variant_feats": variant_feats, "steps": steps, "scored": np.ones((N_STATES, n), bool),
        "right": right, "valid": np.ones((N_STATES, n), bool), "episodes": episodes,
    }  # fmt: skip
    torch.save(data, folder / "data.pt")
    return {"policy": f"T5 d_model {base.d_model}, {base.num_layers} layers, vocabulary {len(tok)}",
            "vlm": f"hidden {pre.hidden}, image {pre.image_size}, representation {rep}",
            "critic": f"hidden {critic.hidden}, batch {critic.batch_size}, state {ds}, candidates {dc} "
                      f"(variant {dc + extra}), {n} a state, {N_STATES} states"}  # fmt: skip


# ---------------------------------------------------------------- the processes

REPLY = "pinned_kernels: "  # what starts a started process's replies on its stdout (anything else is skipped)


def serve(folder: Path, threads: int) -> None:
    """Runs in a started process: for each work named on stdin, one call of it (set up and warmed up by a first
    untimed call when first named); replies with the kernels, then each call's CPU and wall seconds."""
    torch.set_num_threads(threads)
    ctx = Context(folder)
    built: dict[str, Callable[[], object]] = {}
    print(REPLY + json.dumps({"kernels": in_use()}), flush=True)
    for line in sys.stdin:
        name = line.strip()
        if name not in built:
            built[name] = WORKS[name].build(ctx)
            built[name]()
        c0, w0 = time.process_time(), time.perf_counter()
        built[name]()
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
        print(REPLY + json.dumps({"cpu": cpu, "wall": wall}), flush=True)


def environ(pinned: bool, threads: int) -> dict[str, str]:
    """The environment a process starts with: pinned as a stage's, or the machine's own with as many threads."""
    env = {k: v for k, v in os.environ.items() if k not in PINNED_ISA and k != "PYTHONHASHSEED"}
    env.update(pinned_environ(threads) if pinned else {"OMP_NUM_THREADS": str(threads),
                                                       "MKL_NUM_THREADS": str(threads)})  # fmt: skip
    # A thread that waits for its sibling sleeps rather than spins: on a loaded machine the sibling is often not
    # running, and spinning adds CPU seconds of no work, as many as the load makes it (both settings alike).
    env.update(TQDM_DISABLE="1", OMP_WAIT_POLICY="PASSIVE")
    return env


class Started:
    """A process started with the pinned or the machine's own environment, running works on request."""

    def __init__(self, folder: Path, pinned: bool, threads: int) -> None:
        self.log = folder / f"{'pinned' if pinned else 'unpinned'}-{threads}.log"
        cmd = [sys.executable, __file__, "--serve", str(threads), "--folder", str(folder)]
        with self.log.open("w") as log:
            self.proc = subprocess.Popen(cmd, env=environ(pinned, threads), stdin=subprocess.PIPE,
                                         stdout=subprocess.PIPE, stderr=log, text=True)  # fmt: skip
        self.kernels = self._reply()["kernels"]

    def _reply(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if line.startswith(REPLY):
                return json.loads(line[len(REPLY) :])
        raise RuntimeError(f"a started process ended ({self.log.name}):\n{self.log.read_text()[-3000:]}")

    def run(self, name: str) -> dict[str, float]:
        """One timed call of the work ``name``: its CPU and wall seconds."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(name + "\n")
        self.proc.stdin.flush()
        return self._reply()

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait()


def measure(folder: Path, threads: int, names: list[str], repeats: int) -> tuple[dict[str, list[dict]], str]:
    """Each work's (pinned, unpinned) timings, ``repeats`` pairs, the two processes taking turns call by call
    (which goes first alternates); and the two processes' kernels."""
    both = {True: Started(folder, True, threads), False: Started(folder, False, threads)}
    try:
        pairs: dict[str, list[dict]] = {name: [] for name in names}
        for k in range(repeats):
            for i, name in enumerate(names):
                order = (True, False) if (k + i) % 2 == 0 else (False, True)
                pairs[name].append({pinned: both[pinned].run(name) for pinned in order})
        return pairs, f"pinned runs {both[True].kernels}; unpinned {both[False].kernels}"
    finally:
        for p in both.values():
            p.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=6, help="timed calls of each work in each setting, alternating")
    own = load_settings().compute.threads
    ap.add_argument("--threads", default=f"1,{own}", help="thread counts: 1 for every work, others for the work of "
                    "the stages' own processes (default: 1 and compute.threads)")  # fmt: skip
    ap.add_argument("--works", default=",".join(WORKS), help=f"works to run, of {', '.join(WORKS)}")
    ap.add_argument("--serve", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--folder", type=Path, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        serve(args.folder, args.serve)
        return
    names = [n for n in args.works.split(",") if n]
    if unknown := sorted(set(names) - set(WORKS)):
        ap.error(f"unknown works {unknown}; known: {list(WORKS)}")
    runs = {int(t): [n for n in names if int(t) == 1 or WORKS[n].own_process] for t in args.threads.split(",")}
    with tempfile.TemporaryDirectory() as tmp:
        for shape in prepare(Path(tmp)).items():
            print("%s: %s" % shape)
        measured = {t: measure(Path(tmp), t, ns, args.repeats) for t, ns in runs.items() if ns}
    for t, (_, kernels) in measured.items():
        print(f"{t} thread(s): {kernels}")
    print(f"{args.repeats} calls of each work in each setting, alternating; ratio = pinned / unpinned CPU seconds "
          "of adjacent calls, median (lowest-highest)")  # fmt: skip
    print(f"{'stage':<20} {'work':<58} {'threads':>7}  {'CPU ratio':<21} {'wall ratio':>10}")
    worst = 0.0
    for t, (pairs, _) in measured.items():
        for name, timed in pairs.items():
            w = WORKS[name]
            cpu = [p[True]["cpu"] / p[False]["cpu"] for p in timed]
            wall = float(np.median([p[True]["wall"] / p[False]["wall"] for p in timed]))
            mid = float(np.median(cpu))
            worst = max(worst, mid)
            print(f"{w.stage:<20} {w.what:<58} {t:>7}  {mid:5.3f} ({min(cpu):.3f}-{max(cpu):.3f})    {wall:>10.3f}")
    print(f"every work within 15% of unpinned: {worst <= 1.15}")
    print(f"pinned_kernels_cost={worst:.3f}")


if __name__ == "__main__":
    main()
