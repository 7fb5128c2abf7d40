"""A released LLaVA-1.5 in the llava-hf layout, at tiny size: loaded, asked in its chat format, fine-tuned, reloaded.

The test writes the folder itself (``save_pretrained`` of a tiny
``LlavaForConditionalGeneration`` and a ``LlavaProcessor`` whose tokenizer
is SentencePiece-style, as llava-hf's is: answers are "▁Yes" / "▁No").
"""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from transformers import (
    CLIPImageProcessor,
    CLIPVisionConfig,
    LlamaConfig,
    LlavaConfig,
    LlavaForConditionalGeneration,
    LlavaProcessor,
)

from digiq.config import EmbedConfig, VLMFinetuneConfig, load_settings
from digiq.data.features import load_features
from digiq.env.actions import press_home, tap, type_text
from digiq.models.tokenizer import llava_style_tokenizer
from digiq.models.vlm import ScreenVLM, lr_factor, trainable
from digiq.models.vlm_recipes import LLAVA_TEMPLATE, OriginalRecipe, TinyRecipe
from digiq.paths import ROOT, Paths
from digiq.preset import read_preset
from digiq.stages.embed import run_embed
from digiq.stages.vlm_finetune import checkpoint_layers, run_vlm_finetune

SIZE, PATCH = 32, 8


@pytest.fixture(scope="module")
def llava_hf(tmp_path_factory):
    folder = tmp_path_factory.mktemp("llava-1.5-7b-hf")
    original = OriginalRecipe(SIZE, (0.5, 0.5, 0.5))
    corpus = ["USER: <image> Task: search Does tapping at the red circle change the screen? Answer: Yes ASSISTANT:",
              "Answer: No", "Answer: Yes", "What is on the screen? Answer:",
              original.template(original.question(tap(0.5, 0.5), "")), original.state_question("search")] * 50  # fmt: skip
    tok = llava_style_tokenizer(corpus)
    n = (SIZE // PATCH) ** 2
    torch.manual_seed(0)
    cfg = LlavaConfig(
        vision_config=CLIPVisionConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                       image_size=SIZE, patch_size=PATCH),
        text_config=LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                                num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256,
                                pad_token_id=tok.pad_token_id),
        image_token_index=tok.convert_tokens_to_ids("<image>"), image_seq_length=n,
        vision_feature_select_strategy="default", vision_feature_layer=-2)  # fmt: skip
    LlavaForConditionalGeneration(cfg).save_pretrained(folder)
    images = CLIPImageProcessor(size={"shortest_edge": SIZE}, crop_size={"height": SIZE, "width": SIZE})
    LlavaProcessor(image_processor=images, tokenizer=tok, patch_size=PATCH, vision_feature_select_strategy="default",
                   image_token="<image>", num_additional_image_tokens=1).save_pretrained(folder)  # fmt: skip
    return folder


def test_released_llava_is_asked_in_its_chat_format(llava_hf):
    vlm = ScreenVLM.from_pretrained(llava_hf)
    tok = vlm.processor.tokenizer
    assert tok.convert_ids_to_tokens(vlm.answer_ids) == ["▁No", "▁Yes"]
    assert vlm.cfg.image_size == SIZE and vlm.cfg.prompt_template == LLAVA_TEMPLATE and vlm.cfg.source == str(llava_hf)
    image = np.random.default_rng(0).integers(0, 256, (SIZE, SIZE, 3), np.uint8)
    prompt = vlm.recipe.question(tap(0.5, 0.5), "search")
    logits, rep = vlm.answer_logits([image], [prompt])
    # The same question through transformers' own processor and forward pass.
    ref = vlm.processor(text=[LLAVA_TEMPLATE.format(prompt)], images=[image], return_tensors="pt",
                        add_special_tokens=False)  # fmt: skip
    with torch.no_grad():
        out = vlm.model(**ref)
    torch.testing.assert_close(logits, out.logits[:, -1, vlm.answer_ids], atol=1e-4, rtol=1e-4)
    assert rep.shape == (1, 2 * 32)


def _stage_03(llava_hf, values_root, tmp_path, **changes) -> tuple[Paths, VLMFinetuneConfig]:
    """A copy of the small pipeline root and stage 04's params for one quick epoch on the llava-hf folder."""
    root = tmp_path / "root"
    shutil.copytree(values_root, root)
    cfg = load_settings(root / "params.yaml").vlm_finetune.but(
        **{"checkpoint": str(llava_hf), "epochs": 1, "batch_size": 8, **changes}
    )
    return Paths(root), cfg


def test_llava_stage_03_trains_the_chosen_layers_and_stage_04_reloads_it(llava_hf, values_root, tmp_path):
    paths, cfg = _stage_03(llava_hf, values_root, tmp_path, train_last_layers=1)
    before = {k: v.clone() for k, v in ScreenVLM.from_pretrained(llava_hf).model.state_dict().items()}
    run_vlm_finetune(cfg, paths)
    assert json.loads((paths.vlm / "config.json").read_text())["vlm"]["source"] == str(llava_hf)
    tuned = ScreenVLM.load(paths.vlm)
    after = tuned.model.state_dict()
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert changed and all("multi_modal_projector" in k or "layers.2." in k or "language_model.norm" in k
                           for k in changed)  # fmt: skip
    assert any("layers.2." in k for k in changed) and not any("vision_tower" in k for k in changed)
    run_embed(EmbedConfig(batch_size=16), paths, ["finetuned", "untuned"])
    tuned_f, raw_f = load_features(paths), load_features(paths, "untuned")
    assert tuned_f["state"].shape[1] == raw_f["state"].shape[1] == 64
    assert not np.allclose(tuned_f["candidates"], raw_f["candidates"])  # untuned = the released weights
    raw = ScreenVLM.from_pretrained(llava_hf).fresh()
    image = np.zeros((SIZE, SIZE, 3), np.uint8)
    np.testing.assert_allclose(raw.embed([image], ["<image>\nx"])[0], ScreenVLM.from_pretrained(llava_hf).embed(
        [image], ["<image>\nx"])[0], atol=1e-6)  # fmt: skip


def test_trainable_selects_every_weight_by_default(llava_hf):
    vlm = ScreenVLM.from_pretrained(llava_hf)
    assert len(trainable(vlm, 0)) == len(list(vlm.model.parameters()))
    with pytest.raises(ValueError, match="train_last_layers must be >= 0"):
        VLMFinetuneConfig(train_last_layers=-1)


def test_llava_lora_trains_adapters_and_projector_and_saves_a_plain_checkpoint(llava_hf, values_root, tmp_path):
    paths, cfg = _stage_03(llava_hf, values_root, tmp_path, lora_rank=4, train_last_layers=0)
    before = ScreenVLM.from_pretrained(llava_hf).model.state_dict()
    metrics = run_vlm_finetune(cfg, paths)
    # Rank 4 on 7 linear layers of each of 3 LM layers (width 32, MLP 64), plus the 2-layer projector (32 -> 32).
    adapters = 3 * (4 * 4 * (32 + 32) + 3 * 4 * (32 + 64))
    assert metrics["trained_weights"] == adapters + 2 * (32 * 32 + 32)
    # Merged: the saved folder is a plain llava-hf checkpoint, loadable without peft, with no adapter keys.
    after = LlavaForConditionalGeneration.from_pretrained(paths.vlm / "hf").state_dict()
    assert set(after) == set(before)
    changed = {k for k in before if not torch.equal(before[k], after[k])}
    assert any("language_model.layers.0.self_attn.q_proj" in k for k in changed)
    assert any("language_model.layers.2.mlp.down_proj" in k for k in changed)
    assert any("multi_modal_projector" in k for k in changed)
    assert not any("vision_tower" in k or "embed_tokens" in k or "lm_head" in k or "norm" in k for k in changed)
    np.testing.assert_allclose(ScreenVLM.load(paths.vlm).embed([np.zeros((SIZE, SIZE, 3), np.uint8)], ["<image>\nx"])[0],
                               ScreenVLM.from_pretrained(paths.vlm / "hf").embed([np.zeros((SIZE, SIZE, 3), np.uint8)],
                                                                                 ["<image>\nx"])[0], atol=1e-6)  # fmt: skip


def test_gradient_checkpointing_keeps_fewer_activations_and_the_same_gradients(llava_hf):
    rng = np.random.default_rng(0)
    images = [rng.integers(0, 256, (SIZE, SIZE, 3), np.uint8) for _ in range(3)]
    prompts, labels = [TinyRecipe(SIZE).question(tap(0.5, 0.5), "search")] * 3, torch.tensor([1, 0, 1])
    grads, kept = [], []
    for on in (False, True):
        vlm = ScreenVLM.from_pretrained(llava_hf)
        vlm.model.train()
        if on:
            checkpoint_layers(vlm)
        saved: list[int] = []  # the elements autograd keeps for backward
        with torch.autograd.graph.saved_tensors_hooks(
            lambda t, saved=saved: (saved.append(t.numel()), t)[1], lambda t: t
        ):
            loss = vlm.loss(images, prompts, labels)
        loss.backward()
        kept.append(sum(saved))
        grads.append({n: p.grad for n, p in vlm.model.named_parameters() if p.grad is not None})
    assert kept[1] < 0.5 * kept[0]
    assert grads[0].keys() == grads[1].keys()
    for name in grads[0]:
        torch.testing.assert_close(grads[1][name], grads[0][name], atol=1e-6, rtol=1e-5)


def test_stage_03_with_lora_and_checkpointing_trains_as_without(llava_hf, values_root, tmp_path):
    weights, kept = [], []
    for on in (False, True):
        paths, cfg = _stage_03(
            llava_hf, values_root, tmp_path / str(on), lora_rank=4, train_last_layers=0, gradient_checkpointing=on
        )
        saved: list[int] = []  # what autograd keeps over the whole stage (held-out accuracy runs without grad)
        with torch.autograd.graph.saved_tensors_hooks(lambda t, saved=saved: (saved.append(t.numel()), t)[1],
                                                      lambda t: t):  # fmt: skip
            run_vlm_finetune(cfg, paths)
        kept.append(sum(saved))
        weights.append(LlavaForConditionalGeneration.from_pretrained(paths.vlm / "hf").state_dict())
    assert kept[1] < 0.5 * kept[0]  # the parameter reached the model under peft's wrapper
    for name, w in weights[0].items():
        torch.testing.assert_close(weights[1][name], w, atol=1e-5, rtol=1e-4)


def test_lora_and_last_layers_are_exclusive():
    with pytest.raises(ValueError, match="lora_rank .4. and train_last_layers .2."):
        VLMFinetuneConfig(lora_rank=4, train_last_layers=2)
    with pytest.raises(ValueError, match="lora_rank must be >= 0"):
        VLMFinetuneConfig(lora_rank=-1)


def test_original_recipe_starts_with_bos_after_the_left_padding(llava_hf):
    vlm = ScreenVLM.from_pretrained(llava_hf, recipe="original")
    tok, n = vlm.processor.tokenizer, vlm.model.config.image_seq_length
    prompts = [vlm.recipe.question(tap(0.5, 0.5), ""), vlm.recipe.question(press_home(), "")]
    image = np.zeros((SIZE, SIZE, 3), np.uint8)
    ids, mask = (vlm._inputs([image, image], prompts)[k] for k in ("input_ids", "attention_mask"))
    system = ("A chat between a curious human and an artificial intelligence assistant. The assistant gives helpful, "
              "detailed, and polite answers to the human's questions.")  # fmt: skip
    for row, m, prompt in zip(ids, mask, prompts, strict=True):
        text = f"{system} USER: {'<image>' * n}{prompt.removeprefix('<image>')} ASSISTANT:"
        want = [tok.bos_token_id, *tok(text, add_special_tokens=False).input_ids]
        assert row[m.bool()].tolist() == want and not m[-len(want) :].eq(0).any()  # left-padded: BOS after padding
    assert mask[0].eq(0).any() or mask[1].eq(0).any()  # the two prompts differ in length


def test_original_representation_is_the_last_layer_at_the_greedy_answer_token(llava_hf):
    vlm = ScreenVLM.from_pretrained(llava_hf, recipe="original")
    rng = np.random.default_rng(1)
    images = [rng.integers(0, 256, (SIZE, SIZE, 3), np.uint8) for _ in range(2)]
    prompts = [vlm.recipe.question(tap(0.3, 0.6), ""), vlm.recipe.question(type_text("jazz"), "")]
    rep, p_yes = vlm.embed(images, prompts)
    assert rep.shape == (2, 32) == (2, vlm.cfg.representation_size)  # the LM width, not twice it as in the tiny recipe
    for i in range(2):  # each pair alone, the answer appended and run as one sequence (no cache, no padding)
        inputs = vlm._inputs(images[i : i + 1], prompts[i : i + 1])
        with torch.no_grad():
            slot = vlm.model(**inputs).logits[0, -1, vlm.answer_ids]
            answer = vlm.answer_ids[int(slot.argmax())]
            ids = torch.cat([inputs["input_ids"], torch.tensor([[answer]])], 1)
            full = vlm.model(input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=inputs["pixel_values"],
                             output_hidden_states=True)  # fmt: skip
        np.testing.assert_allclose(rep[i], full.hidden_states[-1][0, -1].numpy(), atol=1e-5)
        assert p_yes[i] == pytest.approx(float(torch.softmax(slot, -1)[1]), abs=1e-5)


def test_original_loss_is_llavas_next_token_loss_on_the_answer_and_end_token(llava_hf):
    vlm = ScreenVLM.from_pretrained(llava_hf, recipe="original")
    images = [np.zeros((SIZE, SIZE, 3), np.uint8)] * 2
    prompts = [vlm.recipe.question(tap(0.5, 0.5), "")] * 2
    labels = torch.tensor([1, 0])
    got = vlm.loss(images, prompts, labels)
    tok, losses = vlm.processor.tokenizer, []
    for label in labels.tolist():
        reply = tok.convert_tokens_to_ids("▁Yes" if label else "▁No")
        inputs = vlm._inputs(images[:1], prompts[:1])
        ids = torch.cat([inputs["input_ids"], torch.tensor([[reply, tok.eos_token_id]])], 1)
        logits = vlm.model(
            input_ids=ids, attention_mask=torch.ones_like(ids), pixel_values=inputs["pixel_values"]
        ).logits
        targets = ids[0, -2:]  # "▁Yes</s>" predicted from the answer slot and from the answer
        losses.append(torch.nn.functional.cross_entropy(logits[0, -3:-1], targets, reduction="none"))
    torch.testing.assert_close(got, torch.cat(losses).mean(), atol=1e-5, rtol=1e-5)


def test_stage_03_and_04_with_the_real_preset(llava_hf, values_root, tmp_path):
    """Stages 04 and 05 on the tiny llava-hf folder with every setting the real preset makes (a third of an epoch)."""
    real = {}
    for groups in read_preset(ROOT / "params" / "presets" / "real.yaml").values():
        real |= groups.get("vlm_finetune", {})
    assert real["recipe"] == "original" and real["autocast"] and real["shard"]
    paths, cfg = _stage_03(llava_hf, values_root, tmp_path, **{**real, "epochs": 0.3})
    metrics = run_vlm_finetune(cfg, paths)
    steps_per_epoch = -(-metrics["pairs_train"] // cfg.batch_size)
    saved = json.loads((paths.vlm / "config.json").read_text())
    assert saved["vlm"]["recipe"] == "original" and saved["meta"]["steps"] == -(-3 * steps_per_epoch // 10)
    assert metrics["trained_weights"] == sum(p.numel() for p in ScreenVLM.from_pretrained(llava_hf).model.parameters())
    assert ScreenVLM.load(paths.vlm).model.dtype == torch.bfloat16  # trained in float32, computed and saved in bf16
    run_embed(EmbedConfig(batch_size=16), paths)
    feats = load_features(paths)
    assert feats["state"].shape[1] == feats["candidates"].shape[2] == 32


def test_lr_schedule_is_the_transformers_trainers():
    from transformers import get_constant_schedule, get_cosine_schedule_with_warmup

    for total, warmup in ((100, 0.03), (7, 0.0), (3, 0.5)):
        ref = get_cosine_schedule_with_warmup(torch.optim.SGD([torch.zeros(1)], lr=1.0), math.ceil(warmup * total),
                                              total)  # fmt: skip
        ours = [lr_factor(step, total, warmup, "cosine") for step in range(total)]
        want = []
        for _ in range(total):
            want.append(ref.get_last_lr()[0])
            ref.optimizer.step()
            ref.step()
        np.testing.assert_allclose(ours, want, atol=1e-12)
    const = get_constant_schedule(torch.optim.SGD([torch.zeros(1)], lr=1.0))
    assert [lr_factor(s, 10, 0.0, "constant") for s in range(10)] == [const.get_last_lr()[0]] * 10
