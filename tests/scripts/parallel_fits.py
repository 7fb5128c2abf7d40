"""Fit a tiny policy and a tiny VLM on fixed data; run by tests/test_parallel.py on 1 process and under
``accelerate launch --cpu --num_processes 2``. The main process saves the trained weights to OUT_DIR."""

import sys
from pathlib import Path

import numpy as np
import torch

from digiq import parallel
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.policy_fit import FitRow, fit_policy
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig


def main(out: Path) -> None:
    torch.set_num_threads(1)
    tok = train_tokenizer(default_corpus(n_tasks=30, seed=0), vocab_size=300)
    rng = np.random.default_rng(0)
    shots = {f"s{i}": torch.as_tensor(rng.integers(0, 256, (114, 54, 3), dtype=np.uint8)) for i in range(4)}
    # 11 rows in batches of 4: the last batch (3 rows) splits 2 / 1; uneven weights.
    rows = [FitRow(f"Goal: open app {i}", f"s{i % 4}", f"Action Decision: TYPE: app {i}", weight=1.0 + i % 3)
            for i in range(11)]  # fmt: skip
    torch.manual_seed(0)
    policy = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, d_kv=8, image_dim=32, dropout=0.0), tok)
    curve = fit_policy(policy, rows, shots, epochs=2, batch_size=4, lr=3e-3, seed=0)
    vlm = ScreenVLM.tiny(tok, VLMConfig(image_size=32, vision_hidden=32, hidden=32, layers=1), seed=0)
    vlm.model.to(parallel.device())
    opt = torch.optim.AdamW(vlm.model.parameters(), lr=1e-3)
    images = [rng.integers(0, 256, (32, 32, 3), dtype=np.uint8) for _ in range(5)]
    for step in range(3):  # stage 04's step: this process's share of the batch, then averaged gradients

        def loss(batch: list[int], step: int = step) -> dict[str, torch.Tensor]:
            prompts = [f"<image>\nTask: t{i}\nDoes tapping change the screen? Answer:" for i in batch]
            labels = torch.tensor([(i + step) % 2 for i in batch])
            return {"loss": vlm.loss([images[i] for i in batch], prompts, labels)}

        opt.zero_grad()
        parallel.backward_share(list(range(5)), loss, vlm.model.parameters())
        opt.step()
    if parallel.is_main():
        out.mkdir(parents=True, exist_ok=True)
        torch.save({"policy": policy.state_dict(), "vlm": vlm.model.state_dict()}, out / "weights.pt")
        (out / "losses.txt").write_text("\n".join(str(p["loss"]) for p in curve))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
