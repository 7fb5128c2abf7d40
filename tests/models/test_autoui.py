"""The real-checkpoint paths at tiny size: Auto-UI-Base's weight layout and BLIP-2 image features.

Nothing is downloaded: each test builds a tiny checkpoint in the released
layout (parameter names, config.json, tokenizer, a pickled pytorch_model.bin
as AutoUI ships it), and checks that our classes load it and compute what
the original forward pass computes.
"""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torch import nn
from transformers import Blip2Config, Blip2Model, BlipImageProcessor, T5Config, T5ForConditionalGeneration
from transformers.modeling_outputs import BaseModelOutput

from digiq.models.blip2 import Blip2ImageFeatures
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, train_tokenizer

IMG_DIM = 48  # BLIP-2 ViT-g's pooled width is 1408; tiny here


class ReleasedAutoUI(nn.Module):
    """AutoUI's forward pass as its paper and code describe it, with its parameter names, written independently.

    T5 encoder -> the one pooled image feature projected by ``image_dense``
    -> single-head ``mha_layer`` from text states to it -> a sigmoid gate from
    ``gate_dense`` over [text, attended] -> T5 decoder.
    """

    def __init__(self, t5: T5Config) -> None:
        super().__init__()
        self.t5 = T5ForConditionalGeneration(t5)
        if not t5.scale_decoder_outputs:  # flan-T5: an output layer of its own (transformers ties it by default)
            self.t5.lm_head.weight = nn.Parameter(torch.randn_like(self.t5.lm_head.weight) * 0.05)
        d = t5.d_model
        self.image_dense = nn.Linear(IMG_DIM, d)
        self.mha_layer = nn.MultiheadAttention(embed_dim=d, kdim=d, vdim=d, num_heads=1, batch_first=True)
        self.gate_dense = nn.Linear(2 * d, d)

    def encoder_states(self, ids: torch.Tensor, mask: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        h = self.t5.encoder(input_ids=ids, attention_mask=mask).last_hidden_state
        img = self.image_dense(image).unsqueeze(1)
        att, _ = self.mha_layer(h, img, img)
        gate = torch.sigmoid(self.gate_dense(torch.cat([h, att], -1)))
        return (1 - gate) * h + gate * att

    def released_state_dict(self) -> dict[str, torch.Tensor]:
        """Names as in the released file: T5's at the top level, the fusion's beside them."""
        sd = {k: v.clone() for k, v in self.t5.state_dict().items()}
        sd["encoder.embed_tokens.weight"] = sd["decoder.embed_tokens.weight"] = sd["shared.weight"]
        for name in ("image_dense", "mha_layer", "gate_dense"):
            sd.update({f"{name}.{k}": v.clone() for k, v in getattr(self, name).state_dict().items()})
        return sd


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(default_corpus(n_tasks=100), vocab_size=400)


def _t5_config(tok, **kw) -> T5Config:
    base = dict(vocab_size=len(tok) + 28, d_model=32, d_ff=64, d_kv=8, num_heads=4, num_layers=2,
                num_decoder_layers=2, feed_forward_proj="gated-gelu", tie_word_embeddings=False,
                pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, decoder_start_token_id=tok.pad_token_id,
                dropout_rate=0.0)  # fmt: skip
    return T5Config(**{**base, **kw})


def _released(tok, folder: Path, **t5_kw) -> ReleasedAutoUI:
    torch.manual_seed(0)
    ref = ReleasedAutoUI(_t5_config(tok, **t5_kw)).eval()
    with torch.no_grad():  # a trained gate is not the init's near-0.5 everywhere; make the fusion matter
        ref.gate_dense.weight.normal_(0, 0.5)
        ref.image_dense.weight.normal_(0, 0.5)
    folder.mkdir(parents=True, exist_ok=True)
    ref.t5.config.save_pretrained(folder)
    torch.save(ref.released_state_dict(), folder / "pytorch_model.bin")
    tok.save_pretrained(folder)
    return ref


PROMPTS = ["Previous Actions: Goal: Open the clock", "Previous Actions: TYPE: Peru Goal: What's the news in Peru"]


def test_released_autoui_layout_loads_and_matches_its_forward_pass(tok, tmp_path):
    ref = _released(tok, tmp_path / "Auto-UI-Base")
    model = AutoUIPolicy.from_autoui(tmp_path / "Auto-UI-Base")
    assert model.cfg.image_encoder == "blip2" and not model.cfg.copy and not model.cfg.tie_word_embeddings
    image = torch.randn(2, IMG_DIM)
    enc = tok(PROMPTS, padding=True, return_tensors="pt")
    actions = ["Action Decision: PRESS_HOME", "Action Decision: TYPE: Peru"]
    lab = tok(actions, padding=True, return_tensors="pt").input_ids
    dec_in = ref.t5._shift_right(lab)
    # Targets anywhere in the padded vocabulary (len(tok) + 28 rows, all kept), and the actions' own tokens.
    targets = torch.randint(0, len(tok) + 28, dec_in.shape, generator=torch.Generator().manual_seed(0))
    targets[:, 0] = len(tok) + 27
    with torch.no_grad():
        states = ref.encoder_states(enc.input_ids, enc.attention_mask, image)
        want = ref.t5(encoder_outputs=BaseModelOutput(last_hidden_state=states), attention_mask=enc.attention_mask,
                      decoder_input_ids=dec_in).logits.log_softmax(-1)  # fmt: skip
        for target in (targets, lab):
            got = model._target_logprobs(model.encode(PROMPTS, image), torch.nn.functional.pad(dec_in, (1, 0)), target)
            torch.testing.assert_close(got, want.gather(-1, target[..., None])[..., 0], atol=1e-5, rtol=1e-5)

    # Greedy decoding agrees with transformers' own generate on the reference's encoder states.
    with torch.no_grad():
        out = ref.t5.generate(encoder_outputs=BaseModelOutput(last_hidden_state=states),
                              attention_mask=enc.attention_mask, do_sample=False, max_new_tokens=12)  # fmt: skip
    want_text = tok.batch_decode(out, skip_special_tokens=True)
    model.cfg = PolicyConfig(**{**model.cfg.__dict__, "max_action_tokens": 12})
    assert [o[0] for o in model.sample(PROMPTS, image, greedy=True)] == want_text

    # Saved in our format, it comes back identical (and names its BLIP-2 folder, overridable).
    model.save(tmp_path / "ours")
    back = AutoUIPolicy.load(tmp_path / "ours", image_encoder_path="/somewhere/blip2")
    assert back.cfg.image_encoder_path == "/somewhere/blip2"
    with torch.no_grad():
        again = back._target_logprobs(back.encode(PROMPTS, image), torch.nn.functional.pad(dec_in, (1, 0)), lab)
    torch.testing.assert_close(again, got)


def test_tied_embeddings_follow_the_checkpoint_config(tok, tmp_path):
    ref = _released(tok, tmp_path / "tied", tie_word_embeddings=True)
    sd = ref.released_state_dict()
    del sd["lm_head.weight"]  # a tied checkpoint may leave it out
    torch.save(sd, tmp_path / "tied" / "pytorch_model.bin")
    model = AutoUIPolicy.from_autoui(tmp_path / "tied")
    assert model.cfg.tie_word_embeddings
    image = torch.randn(1, IMG_DIM)
    enc = tok(PROMPTS[:1], return_tensors="pt")
    with torch.no_grad():
        states = ref.encoder_states(enc.input_ids, enc.attention_mask, image)
        want = ref.t5(encoder_outputs=BaseModelOutput(last_hidden_state=states), attention_mask=enc.attention_mask,
                      decoder_input_ids=torch.zeros(1, 1, dtype=torch.long)).logits.log_softmax(-1)  # fmt: skip
        every = torch.arange(want.shape[-1])[:, None]  # each token of the vocabulary as the target, one row each
        got = model._target_logprobs(model.encode(PROMPTS[:1] * len(every), image.expand(len(every), -1)),
                                     torch.zeros(len(every), 2, dtype=torch.long), every)  # fmt: skip
    torch.testing.assert_close(got[:, 0], want[0, 0], atol=1e-5, rtol=1e-5)


def test_broken_autoui_folders_are_rejected_by_name(tok, tmp_path):
    with pytest.raises(FileNotFoundError, match="no AutoUI checkpoint"):
        AutoUIPolicy.from_autoui(tmp_path / "empty")
    ref = _released(tok, tmp_path / "plain")
    sd = {k: v for k, v in ref.released_state_dict().items() if not k.startswith(("image_dense", "mha", "gate"))}
    torch.save(sd, tmp_path / "plain" / "pytorch_model.bin")
    with pytest.raises(ValueError, match="no image_dense weights"):
        AutoUIPolicy.from_autoui(tmp_path / "plain")
    sd = ref.released_state_dict()
    del sd["gate_dense.bias"]
    sd["extra.weight"] = torch.zeros(1)
    torch.save(sd, tmp_path / "plain" / "pytorch_model.bin")
    with pytest.raises(ValueError, match=r"missing \['fusion.gate_dense.bias'\], unexpected \['extra.weight'\]"):
        AutoUIPolicy.from_autoui(tmp_path / "plain")
    _released(tok, tmp_path / "relu", feed_forward_proj="relu")
    with pytest.raises(ValueError, match="feed_forward_proj='relu' is not supported"):
        AutoUIPolicy.from_autoui(tmp_path / "relu")


@pytest.fixture(scope="module")
def blip2_folder(tmp_path_factory) -> tuple[Path, Blip2Model, BlipImageProcessor]:
    """A tiny full BLIP-2 (vision tower, Q-Former, OPT) saved as Salesforce/blip2-opt-2.7b is laid out."""
    cfg = Blip2Config(
        vision_config=dict(hidden_size=IMG_DIM, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
                           image_size=32, patch_size=8),
        qformer_config=dict(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                            encoder_hidden_size=IMG_DIM),
        text_config=dict(model_type="opt", hidden_size=32, num_hidden_layers=1, num_attention_heads=2, ffn_dim=64,
                         vocab_size=100, word_embed_proj_dim=32),
        num_query_tokens=4,
    )  # fmt: skip
    torch.manual_seed(0)
    model = Blip2Model(cfg).eval()
    with torch.no_grad():  # the init's features barely depend on the image; spread the weights
        for p in model.vision_model.parameters():
            p.normal_(0, 0.3)
    folder = tmp_path_factory.mktemp("blip2")
    model.save_pretrained(folder)
    proc = BlipImageProcessor(size={"height": 32, "width": 32})
    proc.save_pretrained(folder)
    return folder, model, proc


def _screens(n: int, seed: int = 0) -> np.ndarray:
    """Blocky screenshots (UI-like flat regions) at the phone's aspect."""
    rng = np.random.default_rng(seed)
    return np.repeat(np.repeat(rng.integers(0, 256, (n, 19, 9, 3), dtype=np.uint8), 4, 1), 4, 2)


def test_blip2_features_match_transformers_pooled_image_features(blip2_folder):
    folder, model, proc = blip2_folder
    feats = Blip2ImageFeatures.from_pretrained(folder)
    assert feats.dim == IMG_DIM and feats.size == (32, 32)
    shots = _screens(4)
    pv = proc(images=[Image.fromarray(s) for s in shots], return_tensors="pt").pixel_values
    # Our torch resize vs the processor's PIL one: the same up to bicubic rounding.
    assert float((feats.pixel_values(shots) - pv).abs().mean()) < 0.01
    with torch.no_grad():
        want = model.get_image_features(pixel_values=pv).pooler_output
    got = feats(shots, batch_size=3)
    err = (got - want).abs().mean(1)
    between = torch.cdist(want, want, p=1)[~torch.eye(4, dtype=torch.bool)].min() / IMG_DIM
    assert float(err.max()) < 0.2 * float(between)  # far closer to its own image's feature than to any other's


def test_blip2_policy_reads_screenshots_or_precomputed_features(blip2_folder, tok):
    folder, _, _ = blip2_folder
    cfg = PolicyConfig(d_model=32, d_ff=64, image_dim=IMG_DIM, copy=False, image_encoder="blip2",
                       image_encoder_path=str(folder), dropout=0.0)  # fmt: skip
    torch.manual_seed(0)
    model = AutoUIPolicy(cfg, tok).eval()
    shots = _screens(2, seed=1)
    prepared = model.screen.prepare(shots)
    assert prepared.shape == (2, 1, IMG_DIM)
    precomputed = Blip2ImageFeatures.from_pretrained(folder)(shots).numpy()  # as the released data stores them
    acts = ["Action Decision: PRESS_HOME"] * 2
    a = model.action_logprobs(PROMPTS, shots, acts)
    b = model.action_logprobs(PROMPTS, precomputed, acts)
    torch.testing.assert_close(a, b)
    assert not any(n.startswith("screen.") for n in model.state_dict())  # the frozen tower stays out of checkpoints
    with pytest.raises(ValueError, match="width 5, the policy expects 48"):
        model.screen.prepare(np.zeros((2, 5), np.float32))
    no_tower = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, image_dim=IMG_DIM, image_encoder="blip2"), tok)
    with pytest.raises(ValueError, match="set image_encoder_path"):
        no_tower.screen.prepare(shots)
    with pytest.raises(ValueError, match="image_encoder must be"):
        PolicyConfig(image_encoder="clip")


def test_stage_00_saves_the_released_autoui_as_the_base_policy(tok, tmp_path, blip2_folder):
    import json

    from digiq.config import BasePolicyConfig, ConfigError, EnvConfig, load_settings
    from digiq.paths import Paths
    from digiq.stages.base_policy import run_base_policy

    folder, _, _ = blip2_folder
    _released(tok, tmp_path / "Auto-UI-Base", vocab_size=len(tok))
    with pytest.raises(ConfigError, match="set blip2"):
        load_settings(params={"base_policy": {"checkpoint": str(tmp_path / "Auto-UI-Base")}})
    cfg = BasePolicyConfig(checkpoint=str(tmp_path / "Auto-UI-Base"), blip2=str(folder))
    paths = Paths(tmp_path / "repo")
    metrics = run_base_policy(cfg, EnvConfig(), paths)
    assert json.loads((paths.metrics / "base_policy.json").read_text()) == metrics
    assert metrics["source"] == cfg.checkpoint
    base = AutoUIPolicy.load(paths.base_policy)
    direct = AutoUIPolicy.from_autoui(cfg.checkpoint, image_encoder_path=folder)
    shots = _screens(2, seed=3)  # screenshots go through the BLIP-2 tower named in the checkpoint
    acts = ["Action Decision: PRESS_HOME", "Action Decision: TYPE: Peru"]
    torch.testing.assert_close(base.action_logprobs(PROMPTS, shots, acts), direct.action_logprobs(PROMPTS, shots, acts))
    assert (paths.plots / "base_policy_loss.png").exists() and paths.demos.is_dir()


def test_released_weights_are_read_from_sharded_folders_and_filtered(tmp_path):
    from safetensors.torch import save_file

    from digiq.models.checkpoint import read_released_weights

    a, b = {"vision_model.w": torch.ones(2)}, {"language_model.w": torch.zeros(3), "vision_model.b": torch.ones(1)}
    save_file(a, tmp_path / "model-00001-of-00002.safetensors")
    save_file(b, tmp_path / "model-00002-of-00002.safetensors")
    index = {"weight_map": {"vision_model.w": "model-00001-of-00002.safetensors",
                            "language_model.w": "model-00002-of-00002.safetensors",
                            "vision_model.b": "model-00002-of-00002.safetensors"}}  # fmt: skip
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    got = read_released_weights(tmp_path, lambda k: k.startswith("vision_model."))
    assert sorted(got) == ["vision_model.b", "vision_model.w"]
    with pytest.raises(FileNotFoundError, match="no weights in"):
        read_released_weights(tmp_path / "nothing")
