"""The policy's sampling (StepDecoder) against transformers' decoder with its own cache, measured in one run.

A policy checkpoint (default: the pipeline's base policy) samples actions
for batches of real test prompts and simulator screenshots, as stage 08
does: through ``AutoUIPolicy.sample``, and through the same loop calling
transformers' ``T5ForConditionalGeneration`` once per token with its
``EncoderDecoderCache``. Both draw each row's tokens from the same noise
keys (:mod:`digiq.noise`); the benchmark checks that they write the same
actions and times the two.

Last line: ``sampling_speedup=<number>`` (time of the transformers loop divided by StepDecoder's).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from transformers import DynamicCache, EncoderDecoderCache
from transformers.modeling_outputs import BaseModelOutput

from digiq.data.task_lists import read_tasks
from digiq.data.trajectories import observation_text
from digiq.env import AndroidSimEnv
from digiq.env.tasks import TASK_SETS
from digiq.models.policy import AutoUIPolicy, inverse_cdf_draw
from digiq.noise import noise_key, row_streams, token_uniforms
from digiq.paths import Paths


@torch.no_grad()
def sample_with_transformers_cache(policy: AutoUIPolicy, prompts: list[str], shots: np.ndarray, temperature: float,
                                   noise: list[int]) -> list[str]:  # fmt: skip
    """One action per prompt, each token from a call of the whole T5 model with transformers' cache."""
    enc = policy.encode(prompts, shots)
    pad, eos = policy.tokenizer.pad_token_id, policy.tokenizer.eos_token_id
    streams = row_streams(noise, 1)
    tokens = torch.full((len(prompts), 2), pad, dtype=torch.long)
    done = torch.zeros(len(prompts), dtype=torch.bool)
    cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
    for t in range(policy.cfg.max_action_tokens):
        out = policy.t5(encoder_outputs=BaseModelOutput(last_hidden_state=enc["states"]), attention_mask=enc["mask"],
                        decoder_input_ids=tokens[:, -1:], past_key_values=cache, use_cache=True,
                        output_hidden_states=policy.copy is not None)  # fmt: skip
        cache = out.past_key_values
        probs = policy._next_token_probs(enc, out.logits, out.decoder_hidden_states[-1], tokens[:, -2:])[:, -1]
        u = torch.from_numpy(token_uniforms(streams, t))
        nxt = inverse_cdf_draw(probs, temperature, u).masked_fill(done, pad)
        tokens = torch.cat([tokens, nxt[:, None]], 1)
        done |= nxt == eos
        if bool(done.all()):
            break
    return policy.tokenizer.batch_decode(tokens[:, 2:], skip_special_tokens=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", type=Path, default=Paths().base_policy, help="policy checkpoint folder")
    ap.add_argument("--batch", type=int, default=48, help="prompts per call (stage 08: eval.n_envs)")
    ap.add_argument("--batches", type=int, default=20)
    ap.add_argument("--temperature", type=float, default=0.8)
    args = ap.parse_args()
    torch.set_num_threads(1)  # as in a worker process on the 2-core machine

    policy = AutoUIPolicy.load(args.policy)
    tasks = [t for ts in TASK_SETS for t in read_tasks(Paths(), ts, "test", None, "benchmark")]
    env = AndroidSimEnv()
    batches = []
    for b in range(args.batches):
        prompts, shots = [], []
        for i in range(args.batch):
            task = tasks[(b * args.batch + i) % len(tasks)]
            obs, _ = env.reset(seed=b * args.batch + i, options={"task": task})
            prompts.append(observation_text([], task.instruction))
            shots.append(obs["screenshot"])
        batches.append((prompts, np.stack(shots)))

    times, written = {}, {}
    keys = [[noise_key(b, i) for i in range(args.batch)] for b in range(args.batches)]
    runs = {"transformers": lambda p, s, k: sample_with_transformers_cache(policy, p, s, args.temperature, k),
            "step_decoder": lambda p, s, k: [a[0] for a in policy.sample(p, s, temperature=args.temperature,
                                                                          noise=k)]}  # fmt: skip
    for name, run in runs.items():
        run(*batches[0], keys[0])  # warm-up
        t0 = time.perf_counter()
        written[name] = [a for (p, s), k in zip(batches, keys, strict=True) for a in run(p, s, k)]
        times[name] = time.perf_counter() - t0
    same = sum(a == b for a, b in zip(written["transformers"], written["step_decoder"], strict=True))
    n = len(written["transformers"])
    print(
        f"actions={n} same={same} transformers_s={times['transformers']:.2f} step_decoder_s={times['step_decoder']:.2f}"
    )
    print(f"sampling_speedup={times['transformers'] / times['step_decoder']:.2f}")


if __name__ == "__main__":
    main()
