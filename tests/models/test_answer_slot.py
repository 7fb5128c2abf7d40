"""The VLM computes logits only where they are read, and reads the same numbers as with the whole vocabulary.

The references are the VLM's methods as they were before, copied here: one
forward pass with logits over the whole vocabulary at every position, the
read positions sliced out afterwards. Against them, on the pipeline's tiny
VLM (``tiny`` recipe) and on a tiny released-layout LLaVA (``original``
recipe, loaded through :meth:`ScreenVLM.from_pretrained`), in batches of
several widths (left-padded prompts of unlike lengths):

- stage 05's representations are the same bits, P(Yes) equal to float rounding
  and the same bits whatever rows share its batch;
- the fine-tune's loss and its gradients are equal to float rounding
  (within ``LOSS_TOLERANCE`` and within ``GRAD_TOLERANCE`` of the largest
  gradient);
- the pretraining's text loss and greedy answers are the same.
"""

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
)

from digiq.env.actions import Action, press_back, tap, type_text
from digiq.env.taskgen import generate_tasks
from digiq.models.tokenizer import default_corpus, llava_style_tokenizer, train_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig, trainable
from digiq.models.vlm_recipes import OriginalRecipe, TinyRecipe

BATCHES = (1, 5, 12)  # rows per forward pass: one row alone (no padding), then padded batches
# The head's GEMM over fewer positions can round a logit otherwise when its input needs a gradient (measured:
# the loss's last bit), though not in stage 05's no-grad passes.
LOSS_TOLERANCE = {"rtol": 1e-6, "atol": 0.0}
# The language model's head multiplies the gradient at fewer positions, so a GEMM of another shape may round it
# otherwise: each gradient is held within this fraction of the largest gradient of the model (measured: 2e-7).
# Per tensor a relative bound would not do: some gradients are zero but for rounding (an attention key's bias).
GRAD_TOLERANCE = 1e-6


@pytest.fixture(scope="module")
def tiny_vlm() -> ScreenVLM:
    """The pipeline's tiny VLM (VLMConfig's defaults) on the base policy's kind of tokenizer."""
    vlm = ScreenVLM.tiny(train_tokenizer(default_corpus(n_tasks=50)), VLMConfig(), seed=0)
    vlm.model.eval()
    return vlm


@pytest.fixture(scope="module")
def original_vlm(tmp_path_factory) -> ScreenVLM:
    """A tiny LLaVA-1.5 in the llava-hf layout, loaded as a released one and asked with Digi-Q's own recipe."""
    folder = tmp_path_factory.mktemp("llava-hf")
    recipe = OriginalRecipe(32, (0.5, 0.5, 0.5))
    corpus = [recipe.template(recipe.question(tap(0.5, 0.5), "search for shoes")), "Answer: No", "Answer: Yes",
              recipe.state_question("open the settings")] * 50  # fmt: skip
    tok = llava_style_tokenizer(corpus)
    torch.manual_seed(0)
    cfg = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       image_size=32, patch_size=8),
        text_config=LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                                pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id,
                                eos_token_id=tok.eos_token_id),
        image_token_index=tok.convert_tokens_to_ids("<image>"), image_seq_length=16,
        vision_feature_select_strategy="default", vision_feature_layer=-2)  # fmt: skip
    LlavaForConditionalGeneration(cfg).save_pretrained(folder)
    images = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=8, vision_feature_select_strategy="default",
                   image_token="<image>", num_additional_image_tokens=1).save_pretrained(folder)  # fmt: skip
    return ScreenVLM.from_pretrained(folder, recipe="original")


def batch(vlm: ScreenVLM, n: int, seed: int) -> tuple[list[np.ndarray], list[str], torch.Tensor]:
    """``n`` marked screens and their questions, of unlike lengths (taps, Back, typed texts), and random labels."""
    rng = np.random.default_rng(seed)
    tasks = generate_tasks("general", "train", n, seed=seed)
    actions: list[Action] = [[tap(*rng.random(2)), press_back(), type_text("red running shoes " * (i % 3))][i % 3]
                             for i in range(n)]  # fmt: skip
    screens = vlm.recipe.base([rng.integers(0, 256, (160, 90, 3), np.uint8) for _ in range(n)])
    images = [vlm.recipe.mark(s, a) for s, a in zip(screens, actions, strict=True)]
    prompts = [vlm.recipe.question(a, t) for a, t in zip(actions, tasks, strict=True)]
    return images, prompts, torch.as_tensor(rng.integers(0, 2, n))


def inputs(vlm: ScreenVLM, images: list[np.ndarray], prompts: list[str]) -> dict[str, torch.Tensor]:
    return {k: v.to(vlm.model.device) for k, v in vlm._inputs(images, prompts).items()}


def whole_vocabulary_answer_logits(vlm: ScreenVLM, images: list[np.ndarray], prompts: list[str]
                                   ) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """``ScreenVLM.answer_logits`` as it was: logits over the whole vocabulary at every position."""
    x = inputs(vlm, images, prompts)
    if vlm.recipe.name == "original":
        out = vlm.model(**x, use_cache=True)
        slot = out.logits[:, -1, vlm.answer_ids]
        answer = torch.tensor(vlm.answer_ids, device=slot.device)[slot.argmax(-1)]
        mask = torch.cat([x["attention_mask"], torch.ones_like(answer)[:, None]], 1)
        step = vlm.model(input_ids=answer[:, None], attention_mask=mask, cache=out.cache, output_hidden_states=True)
        return slot, step.hidden_states[-1][:, -1]
    out = vlm.model(**x, output_hidden_states=True)
    mask = x["attention_mask"][:, :, None].to(out.hidden_states[-1].dtype)
    pooled = torch.stack([(h * mask).sum(1) / mask.sum(1) for h in out.hidden_states]).mean(0)
    return out.logits[:, -1, vlm.answer_ids], torch.cat([out.hidden_states[-1][:, -1], pooled], -1)


def whole_vocabulary_loss(vlm: ScreenVLM, images: list[np.ndarray], prompts: list[str], labels: torch.Tensor
                          ) -> torch.Tensor:  # fmt: skip
    """``ScreenVLM.loss`` as it was."""
    if isinstance(vlm.recipe, TinyRecipe):
        logits, _ = whole_vocabulary_answer_logits(vlm, images, prompts)
        return F.cross_entropy(logits, labels)
    x = inputs(vlm, images, prompts)
    answer = torch.tensor(vlm.answer_ids)[labels]
    x["input_ids"] = torch.cat([x["input_ids"], answer[:, None]], 1)
    x["attention_mask"] = torch.cat([x["attention_mask"], torch.ones_like(answer)[:, None]], 1)
    logits = vlm.model(**x).logits[:, -2:]
    targets = torch.stack([answer, torch.full_like(answer, vlm.processor.tokenizer.eos_token_id)], 1)
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), targets.reshape(-1))


def whole_vocabulary_text_loss(vlm: ScreenVLM, images: list[np.ndarray], prompts: list[str], answers: list[str]
                               ) -> torch.Tensor:  # fmt: skip
    """``ScreenVLM.text_loss`` as it was."""
    x, answer, mask = vlm._with_answers(images, prompts, answers)
    start = x["input_ids"].shape[1] - answer.shape[1] - 1
    logits = vlm.model(**x).logits[:, start : start + answer.shape[1]].float()
    per_token = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), answer.reshape(-1), reduction="none")
    return (per_token * mask.reshape(-1)).sum() / mask.sum()


def whole_vocabulary_greedy_answers(vlm: ScreenVLM, images: list[np.ndarray], prompts: list[str], max_tokens: int
                                    ) -> list[str]:  # fmt: skip
    """``ScreenVLM.greedy_answers`` as it was."""
    tok = vlm.processor.tokenizer
    x = inputs(vlm, images, prompts)
    written = torch.empty(len(prompts), 0, dtype=torch.long)
    done = torch.zeros(len(prompts), dtype=torch.bool)
    for _ in range(max_tokens):
        ids = torch.cat([x["input_ids"], written], 1)
        mask = torch.cat([x["attention_mask"], torch.ones_like(written)], 1)
        logits = vlm.model(input_ids=ids, attention_mask=mask, pixel_values=x["pixel_values"]).logits
        nxt = logits[:, -1].argmax(-1).masked_fill(done, tok.eos_token_id)
        written = torch.cat([written, nxt[:, None]], 1)
        done |= nxt == tok.eos_token_id
        if done.all():
            break
    return [tok.decode([t for t in row if t != tok.eos_token_id], skip_special_tokens=True).strip()
            for row in written.tolist()]  # fmt: skip


def assert_close_gradients(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    """The same weights have gradients, each within ``GRAD_TOLERANCE`` of the largest gradient of ``want``."""
    assert got.keys() == want.keys() and want
    scale = max(float(g.abs().max()) for g in want.values())
    for name, grad in got.items():
        torch.testing.assert_close(grad, want[name], rtol=0, atol=GRAD_TOLERANCE * scale, msg=name)


def gradients(vlm: ScreenVLM, loss: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every trained weight's gradient of ``loss``, by name (and the gradients cleared)."""
    loss.backward()
    grads = {name: p.grad.clone() for name, p in vlm.model.named_parameters() if p.grad is not None}
    vlm.model.zero_grad(set_to_none=True)
    return grads


@pytest.fixture(params=["tiny", "original"])
def vlm(request, tiny_vlm, original_vlm) -> ScreenVLM:
    return tiny_vlm if request.param == "tiny" else original_vlm


def test_logits_are_computed_at_the_read_positions_only(vlm):
    """The language model's head sees one position per row for an answer, two for the fine-tune's original loss."""
    images, prompts, labels = batch(vlm, 5, seed=0)
    seen: list[torch.Size] = []
    hook = vlm.model.lm_head.register_forward_hook(lambda _m, args, _out: seen.append(args[0].shape[:2]))
    try:
        with torch.no_grad():
            vlm.embed(images, prompts)
            vlm.loss(images, prompts, labels)
    finally:
        hook.remove()
    read = 1 if vlm.recipe.name == "tiny" else 2
    answer_step = [(5, 1)] if vlm.recipe.name == "original" else []  # the greedy answer fed back: one position
    assert seen == [(5, 1), *answer_step, (5, read)]


def test_stage_05_representations_keep_their_bits_and_p_yes_its_value(vlm):
    for seed, n in enumerate(BATCHES):
        images, prompts, _ = batch(vlm, n, seed)
        rep, p_yes = vlm.embed(images, prompts)
        with torch.no_grad():
            logits, want = whole_vocabulary_answer_logits(vlm, images, prompts)
        assert np.array_equal(rep, want.float().numpy())
        # The head's product over one position or over all of them: its last bit may differ with the GEMM's shape
        # (seen under AVX2 kernels), so P(Yes) is equal to float rounding, the representation bit for bit.
        np.testing.assert_allclose(p_yes, torch.softmax(logits.float(), -1)[:, 1].numpy(), rtol=1e-6, atol=0)


def test_a_row_s_p_yes_does_not_depend_on_its_batch_mates(tiny_vlm):
    """Stage 05 embeds each distinct pair once, so a row's batch mates change with the data: its P(Yes) must not
    (the LM head's product over one row rounds otherwise than over several; the answer slot's dot products do not)."""
    for seed in range(4):  # the LM head's product rounded the first row otherwise in a batch of 4 or more
        images, prompts, _ = batch(tiny_vlm, 1, seed)
        alone = tiny_vlm.embed(images, prompts)
        for n in (2, 5, 9):
            together = tiny_vlm.embed(images * n, prompts * n)
            assert all(np.array_equal(got[i], want[0]) for got, want in zip(together, alone) for i in range(n)), n


@pytest.mark.parametrize("last_layers", [0, 1])  # every weight (the head included), and the pipeline's setting
def test_fine_tune_loss_and_gradients_equal_the_whole_vocabulary_ones(vlm, last_layers):
    for p in vlm.model.parameters():
        p.requires_grad_(True)
    trainable(vlm, last_layers)
    vlm.model.train()
    try:
        for seed, n in enumerate(BATCHES):
            images, prompts, labels = batch(vlm, n, seed)
            want = whole_vocabulary_loss(vlm, images, prompts, labels)
            want_grads = gradients(vlm, want)
            got = vlm.loss(images, prompts, labels)
            got_grads = gradients(vlm, got)
            torch.testing.assert_close(got, want, **LOSS_TOLERANCE)
            assert_close_gradients(got_grads, want_grads)
    finally:
        vlm.model.eval()
        for p in vlm.model.parameters():
            p.requires_grad_(True)


def test_pretraining_text_loss_and_greedy_answers_are_unchanged(tiny_vlm):
    vlm = tiny_vlm
    for seed, n in enumerate(BATCHES):
        images, prompts, _ = batch(vlm, n, seed)
        answers = [["Yes", "the search box", "a list of red running shoes"][i % 3] for i in range(n)]
        got, want = vlm.text_loss(images, prompts, answers), whole_vocabulary_text_loss(vlm, images, prompts, answers)
        torch.testing.assert_close(got, want, **LOSS_TOLERANCE)
        assert_close_gradients(gradients(vlm, got), gradients(vlm, want))
        with torch.no_grad():
            want_written = whole_vocabulary_greedy_answers(vlm, images, prompts, max_tokens=4)
        assert vlm.greedy_answers(images, prompts, max_tokens=4) == want_written
