import random
import string

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from transformers.modeling_outputs import BaseModelOutput

from digiq.env.actions import format_action, parse_action, press_home, swipe, tap, type_text
from digiq.models.critic import Critic, CriticNetConfig
from digiq.models.policy import AutoUIPolicy, PolicyConfig, StepDecoder, inverse_cdf_draw
from digiq.models.tokenizer import default_corpus, train_tokenizer
from digiq.models.vlm import ScreenVLM, VLMConfig, effect_label
from digiq.models.vlm_recipes import draw_marker
from digiq.noise import noise_key, row_streams, token_uniforms


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(default_corpus(n_tasks=200))


@pytest.mark.parametrize(
    "action", [tap(0.52, 0.31), swipe((0.8, 0.5), (0.2, 0.5)), type_text("What's the news in Peru"), press_home()]
)
def test_tokenizer_round_trips_actions_compactly(tok, action):
    text = format_action(action)
    ids = tok(text).input_ids
    assert tok.decode(ids, skip_special_tokens=True) == text
    assert ids[-1] == tok.eos_token_id and len(ids) < 40  # the fixed pieces are single tokens


def test_a_word_is_the_same_token_in_the_goal_and_at_the_start_of_typed_text(tok):
    # What lets the copy head point at the goal's words: "clock" after a space is not a different token.
    goal = tok("Goal: Open the clock").input_ids
    typed = tok(format_action(type_text("clock"))).input_ids
    word = tok("clock", add_special_tokens=False).input_ids
    assert all(any(ids[i : i + len(word)] == word for i in range(len(ids))) for ids in (goal, typed))


def test_tokenizer_encodes_unseen_text_through_bytes(tok):
    text = "Zürich → 東京 ☃"
    assert tok.decode(tok(text).input_ids, skip_special_tokens=True) == text


def test_policy_learns_a_mapping_and_checkpoints_rebuild_it(tok, tmp_path):
    torch.manual_seed(0)
    m = AutoUIPolicy(PolicyConfig(d_model=64, d_ff=128, image_dim=64, dropout=0.0), tok)
    shots = np.zeros((2, 228, 108, 3), np.uint8)
    shots[1, :100] = 255  # two screens that differ: the answer must come from the image
    prompts = ["Previous Actions: Goal: Open the clock"] * 2
    acts = [format_action(tap(0.1, 0.5)), format_action(press_home())]
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    for _ in range(150):
        loss = m.loss(prompts, shots, acts)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    out = m.sample(prompts, shots, greedy=True)
    assert [parse_action(o[0]) for o in out] == [parse_action(a) for a in acts]
    m.save(tmp_path / "ckpt", step=150)
    again = AutoUIPolicy.load(tmp_path / "ckpt")
    assert torch.allclose(
        again.action_logprobs(prompts, shots, acts), m.action_logprobs(prompts, shots, acts), atol=1e-5
    )
    with pytest.raises(FileNotFoundError, match="no policy checkpoint"):
        AutoUIPolicy.load(tmp_path / "nothing")


def test_copy_head_types_words_it_never_saw_from_the_goal(tok):
    # Every query is fresh pseudo-words, so only copying from the goal can type them; the copy head's
    # start term finds where the query begins (with it zeroed, this setting typed 1 of 16 exactly).
    def batch(rng: random.Random, n: int = 16) -> tuple[list[str], list[str]]:
        def word() -> str:
            return "".join(rng.choice(string.ascii_lowercase) for _ in range(rng.randint(3, 8)))

        queries = [f"{word()} {word()}" for _ in range(n)]
        return ([f'Previous Actions: Goal: Search for "{q}" on {rng.choice(["ebay", "costco"])}' for q in queries],
                [format_action(type_text(q)) for q in queries])  # fmt: skip

    torch.manual_seed(0)
    cfg = PolicyConfig(d_model=32, d_ff=64, d_kv=8, num_layers=1, image_dim=32, image_height=16, image_width=8,
                       image_grid=(1, 1), dropout=0.0)  # fmt: skip
    m = AutoUIPolicy(cfg, tok)
    shots = np.zeros((16, 16, 8, 3), np.uint8)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-2)
    rng = random.Random(0)
    for _ in range(60):
        prompts, actions = batch(rng)
        loss = m.loss(prompts, shots, actions)
        opt.zero_grad()
        loss.backward()
        opt.step()
    m.eval()
    prompts, actions = batch(random.Random(1))
    out = m.sample(prompts, shots, greedy=True)
    exact = sum(parse_action(o[0]) == parse_action(a) for o, a in zip(out, actions, strict=True))
    assert exact >= 12, [o[0].split('"typed_text": ')[-1] for o in out]


@pytest.mark.parametrize("encoder", ["cnn", "blip2"])
def test_policy_runs_in_bfloat16_on_float32_inputs(tok, encoder):
    """On a GPU the policy runs in bf16 while screenshots and preloaded BLIP-2 features stay uint8 / float32."""
    torch.manual_seed(0)
    m = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, image_dim=32, image_encoder=encoder, dropout=0.0), tok).eval()
    shots = np.random.default_rng(0).integers(0, 256, (2, 228, 108, 3), np.uint8) if encoder == "cnn" else (
        np.random.default_rng(0).normal(size=(2, 32)).astype(np.float32))  # fmt: skip
    prompts, acts = ["Previous Actions: Goal: Open the clock"] * 2, [format_action(press_home())] * 2
    want = m.action_logprobs(prompts, shots, acts)
    half = m.to(torch.bfloat16)
    got = half.action_logprobs(prompts, shots, acts)
    assert next(half.parameters()).dtype == torch.bfloat16 and got.dtype == torch.float32  # log-probs kept in fp32
    torch.testing.assert_close(got.float(), want, rtol=0.05, atol=0.5)
    assert len(half.sample(prompts, shots, n=3, noise=[0, 1])[0]) == 3


def test_screen_encoder_resamples_any_screenshot_size_as_area_interpolation_does(tok):
    m = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, image_dim=32), tok)
    rng = np.random.default_rng(0)
    # Blocks of 4, 1, 2, 3, a phone's 20 (sums past int16), and uneven ones.
    for h, w in ((456, 216), (114, 54), (228, 108), (342, 162), (2280, 1080), (300, 100)):
        shots = rng.integers(0, 256, (3, h, w, 3), np.uint8)
        want = F.interpolate(torch.as_tensor(shots).permute(0, 3, 1, 2).float(), size=(114, 54), mode="area")
        want = want.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1)
        assert torch.equal(m.screen.prepare(shots), want), (h, w)


@pytest.mark.parametrize("layout", ["copy, tied", "no copy, untied"])
def test_step_decoder_matches_transformers_decoder(tok, layout):
    """Token by token, StepDecoder gives the hidden states and logits of transformers' whole-sequence decoder."""
    torch.manual_seed(0)
    copy = layout.startswith("copy")
    m = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, image_dim=32, copy=copy, tie_word_embeddings=copy), tok).eval()
    shots = np.random.default_rng(1).integers(0, 256, (2, 228, 108, 3), np.uint8)
    enc = m.encode(["Previous Actions: Goal: Open the clock", "Goal: What's the news in Peru today"], shots)
    assert (enc["mask"] == 0).any()  # the shorter prompt is padded: cross-attention must skip its padding
    written = torch.randint(3, len(tok), (2, 7))
    with torch.no_grad():
        out = m.t5(encoder_outputs=BaseModelOutput(last_hidden_state=enc["states"]), attention_mask=enc["mask"],
                   decoder_input_ids=written, output_hidden_states=True)  # fmt: skip
        decoder = StepDecoder(m.t5, enc["states"], enc["mask"], max_len=7)
        steps = [decoder.step(written[:, t]) for t in range(7)]
    torch.testing.assert_close(torch.cat([h for h, _ in steps], 1), out.decoder_hidden_states[-1], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat([lg for _, lg in steps], 1), out.logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(RuntimeError, match="all are used"):
        decoder.step(written[:, 0])


def test_cross_attention_keys_and_values_are_projected_once_per_prompt(tok):
    """Rows decoded from one prompt (its n samples) share its keys and values: projected once, the same floats as
    projecting a copy of the prompt for each row."""
    torch.manual_seed(0)
    m = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, image_dim=32), tok).eval()
    shots = np.random.default_rng(1).integers(0, 256, (3, 228, 108, 3), np.uint8)
    enc = m.encode(["Goal: Open the clock", "Goal: What's the news in Peru today", "Goal: Search for jazz"], shots)
    rows = torch.tensor([0, 0, 0, 2, 1, 1, 2])
    projected: list[int] = []
    key = m.t5.decoder.block[0].layer[1].EncDecAttention.k
    key.register_forward_hook(lambda module, inputs, output: projected.append(len(inputs[0])))
    written = torch.randint(3, len(tok), (len(rows), 6))
    with torch.no_grad():
        shared = StepDecoder(m.t5, enc["states"], enc["mask"], max_len=6, rows=rows)
        copied = StepDecoder(m.t5, enc["states"][rows], enc["mask"][rows], max_len=6)
        assert projected == [3, len(rows)]
        for t in range(6):
            for got, want in zip(shared.step(written[:, t]), copied.step(written[:, t]), strict=True):
                assert torch.equal(got, want)


def test_prompts_encoded_once_are_sampled_again_as_sampling_them_anew_samples_them(tok):
    """Stage 02's redraws: rows of a batch encoded once, picked again (repeats too), draw what sampling those
    prompts afresh draws."""
    torch.manual_seed(0)
    m = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, image_dim=32, max_action_tokens=24), tok).eval()
    prompts = [f"Previous Actions: Goal: Search for item {i}" + " x" * i for i in range(6)]
    shots = np.random.default_rng(4).integers(0, 256, (6, 228, 108, 3), np.uint8)
    enc = m.encode_by_length(prompts, shots)
    first = m.sample_encoded(enc, n=2, temperature=1.0, noise=[noise_key(1, i) for i in range(6)])
    assert first == m.sample(prompts, shots, n=2, temperature=1.0, noise=[noise_key(1, i) for i in range(6)])
    again, keys = [4, 1, 4], [noise_key(2, k) for k in range(3)]
    want = m.sample([prompts[i] for i in again], shots[again], temperature=1.0, noise=keys)
    assert m.sample_encoded(enc, temperature=1.0, noise=keys, rows=again) == want
    assert len({row[0] for row in want}) == 3  # an untrained policy: each key its own string, so a mix-up shows
    with pytest.raises(ValueError, match="one noise key per prompt: 3 prompts, 2 keys"):
        m.sample_encoded(enc, temperature=1.0, noise=keys[:2], rows=again)


def test_sampling_draws_what_the_whole_sequence_decoder_gives(tok):
    """sample() equals a plain loop that reruns transformers' decoder over the whole prefix of every row, finished
    ones included, draw for draw: dropping finished rows and decoding a token at a time change nothing."""
    torch.manual_seed(0)
    m = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, image_dim=32, max_action_tokens=12), tok).eval()
    prompts = ["Previous Actions: Goal: Open the clock", "Goal: What's the news in Peru today"]
    shots = np.random.default_rng(2).integers(0, 256, (2, 228, 108, 3), np.uint8)
    got = m.sample(prompts, shots, n=3, temperature=0.8, noise=[11, 12])
    with torch.no_grad():
        enc = {k: v.repeat_interleave(3, 0) for k, v in m.encode(prompts, shots).items()}
        pad, streams = tok.pad_token_id, row_streams([11, 12], 3)
        tokens, done = torch.full((6, 2), pad), torch.zeros(6, dtype=torch.bool)
        for t in range(12):
            out = m.t5(encoder_outputs=BaseModelOutput(last_hidden_state=enc["states"]), attention_mask=enc["mask"],
                       decoder_input_ids=tokens[:, 1:], output_hidden_states=True)  # fmt: skip
            probs = m._next_token_probs(enc, out.logits, out.decoder_hidden_states[-1], tokens)[:, -1]
            nxt = inverse_cdf_draw(probs, 0.8, torch.from_numpy(token_uniforms(streams, t))).masked_fill(done, pad)
            tokens = torch.cat([tokens, nxt[:, None]], 1)
            done |= nxt == tok.eos_token_id
            if bool(done.all()):
                break
    assert 0 < int(done.sum()) < 6  # some rows ended early and left the batch, some ran on
    want = tok.batch_decode(tokens[:, 2:], skip_special_tokens=True)
    assert [a for row in got for a in row] == want


def test_a_sample_is_the_same_alone_in_a_batch_and_in_another_order(tok):
    """A row's action depends on its prompt, its screen and its noise key only, not on the rows sampled with it."""
    torch.manual_seed(0)
    m = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, image_dim=32, max_action_tokens=24), tok).eval()
    rng = np.random.default_rng(3)
    goals = ["Open the clock", "What's the news in Peru today", "Search for jazz", "Set an alarm for 7am"]
    prompts = [f"Previous Actions: Goal: {goals[i % 4]}" + " x" * (i % 7) for i in range(48)]
    shots = rng.integers(0, 256, (48, 228, 108, 3), np.uint8)
    keys = [noise_key(7, i) for i in range(48)]
    batch = [row[0] for row in m.sample(prompts, shots, temperature=1.0, noise=keys)]
    order = rng.permutation(48)
    shuffled = m.sample([prompts[i] for i in order], shots[order], temperature=1.0, noise=[keys[i] for i in order])
    assert [shuffled[k][0] for k in np.argsort(order)] == batch
    for i in (0, 17, 40):
        assert m.sample([prompts[i]], shots[i : i + 1], temperature=1.0, noise=[keys[i]])[0][0] == batch[i]
    assert len(set(batch)) > 40  # an untrained policy: nearly every row its own string, so a shift would show
    other = m.sample(prompts[:1], shots[:1], temperature=1.0, noise=[noise_key(8, 0)])[0][0]
    assert other != batch[0]  # the key decides the draw


def test_sampling_refuses_to_draw_without_a_key_per_prompt(tok):
    m = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, image_dim=32), tok).eval()
    shots = np.zeros((2, 228, 108, 3), np.uint8)
    with pytest.raises(ValueError, match="one noise key per prompt: 2 prompts, no keys"):
        m.sample(["Goal: a", "Goal: b"], shots)
    with pytest.raises(ValueError, match="2 prompts, 1 keys"):
        m.sample(["Goal: a", "Goal: b"], shots, noise=[1])
    assert len(m.sample(["Goal: a", "Goal: b"], shots, greedy=True)) == 2  # greedy draws nothing


def test_inverse_cdf_draws_follow_the_tempered_distribution():
    logp = torch.log_softmax(torch.tensor([[2.0, -1.0, 0.5, float("-inf"), 1.0]]), -1)
    u = torch.from_numpy(token_uniforms(row_streams([5], 20_000), 0))
    drawn = inverse_cdf_draw(logp.exp().expand(20_000, -1), 0.8, u)
    want = torch.softmax(logp[0] / 0.8, -1).numpy()
    freq = np.bincount(drawn.numpy(), minlength=5) / 20_000
    assert freq[3] == 0  # probability 0 is never drawn
    assert np.abs(freq - want).max() < 0.015, (freq, want)  # 20,000 draws: sd of a share below 0.0036
    edges = inverse_cdf_draw(logp.exp().expand(2, -1), 1.0, torch.tensor([0.0, 1.0 - 2.0**-53]))
    assert edges.tolist() == [0, 4]


def test_noise_keys_are_stable_and_their_uniforms_uniform():
    assert noise_key(1, 2, 3) == noise_key(1, 2, 3) != noise_key(1, 3, 2)
    assert noise_key(-1) == noise_key(2**64 - 1)  # negative parts wrap as 64-bit words
    assert noise_key(np.int64(3), 4) == noise_key(3, 4)  # numpy's integers (a table's ids) as Python's
    streams = row_streams([noise_key(0, i) for i in range(200)], 16)
    u = np.stack([token_uniforms(streams, t) for t in range(8)])  # (8 tokens, 3,200 streams)
    assert u.min() >= 0 and u.max() < 1 and len(np.unique(u)) == u.size
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.003
    assert abs(np.corrcoef(u[0], u[1])[0, 1]) < 0.05  # consecutive tokens of a stream unrelated


def test_vlm_yes_no_and_representation(tok, tmp_path):
    vlm = ScreenVLM.tiny(tok, VLMConfig(image_size=32, hidden=32))
    vlm.model.eval()
    (img,) = vlm.recipe.base([np.full((456, 216, 3), 128, np.uint8)])
    assert img.shape == (32, 32, 3)
    shown, asked = vlm.recipe.mark(img, tap(0.5, 0.5)), vlm.recipe.question(tap(0.5, 0.5), "Open the clock")
    rep, p_yes = vlm.embed([shown], [asked])
    assert rep.shape == (1, 64) == (1, vlm.cfg.representation_size) and 0 < p_yes[0] < 1  # answer slot + pooled
    vlm.save(tmp_path / "vlm")
    rep2, _ = ScreenVLM.load(tmp_path / "vlm").embed([shown], [asked])
    assert np.allclose(rep, rep2, atol=1e-5)
    # The touch-point experiment's recipe: the same model and representation, asked without the point; its name
    # is saved, so embedding asks as the fine-tune did.
    unplaced = ScreenVLM.tiny(tok, VLMConfig(image_size=32, hidden=32, recipe="tiny_no_point"))
    assert unplaced.cfg.representation_size == 64 and unplaced.recipe.question(tap(0.5, 0.5), "x") != vlm.recipe.question(
        tap(0.5, 0.5), "x")  # fmt: skip
    assert unplaced.loss([shown], [asked], torch.tensor([1])).ndim == 0  # the two answers' cross-entropy
    unplaced.save(tmp_path / "unplaced")
    assert ScreenVLM.load(tmp_path / "unplaced").recipe.name == "tiny_no_point"


def test_original_recipe_needs_a_tokenizer_with_bos(tok):
    with pytest.raises(ValueError, match="original recipe starts each prompt with the tokenizer's BOS token"):
        ScreenVLM.tiny(tok, VLMConfig(image_size=32, hidden=32, recipe="original"))


def test_marker_and_effect_label():
    img = np.zeros((128, 64, 3), np.uint8)
    ring = draw_marker(img, tap(0.5, 0.5))
    assert ring[64, 32].sum() == 0 and ring[64, 25].sum() > 0  # a ring around the touch point, hollow inside
    assert (draw_marker(img, press_home())[-1] > 0).all()
    assert (draw_marker(img, swipe((0.9, 0.5), (0.1, 0.5)))[20:100, 32] > 0).any(axis=-1).all()
    changed = img.copy()
    changed[:16] = 255
    assert not effect_label(img, img) and effect_label(img, changed)


def test_critic_advantage_and_soft_update(tmp_path):
    torch.manual_seed(0)
    c = Critic(CriticNetConfig(feature_dim=8, hidden=16))
    q, v, a = c.advantage(torch.randn(3, 8), torch.randn(3, 5, 8))
    assert q.shape == (3, 5) and v.shape == (3,) and torch.allclose(a, q - v[:, None])
    t = c.target()
    with torch.no_grad():
        for p in c.parameters():
            p.add_(1.0)
    before = [p.clone() for p in t.parameters()]
    t.soft_update(c, 0.1)
    for p0, p1, src in zip(before, t.parameters(), c.parameters()):
        assert torch.allclose(p1, 0.9 * p0 + 0.1 * src)
    c.save(tmp_path / "critic")
    assert torch.allclose(
        Critic.load(tmp_path / "critic").advantage(torch.ones(1, 8), torch.ones(1, 2, 8))[2],
        c.eval().advantage(torch.ones(1, 8), torch.ones(1, 2, 8))[2],
    )


def test_critic_takes_action_representations_of_another_size(tmp_path):
    # Released Digi-Q data: 1408-d BLIP-2 state features, 4096-d LLaVA action representations (here 6 and 10).
    c = Critic(CriticNetConfig(feature_dim=6, hidden=16, action_dim=10))
    q, v, _ = c.advantage(torch.randn(3, 6), torch.randn(3, 4, 10))
    assert q.shape == (3, 4) and v.shape == (3,)
    c.save(tmp_path / "critic")
    assert Critic.load(tmp_path / "critic").cfg.action_dim == 10
    with pytest.raises(ValueError, match=r"states \(3, 6\) and candidates \(3, 4, 6\) do not make the 16-wide rows"):
        c.advantage(torch.randn(3, 6), torch.randn(3, 4, 6))


def test_encoding_by_length_gives_each_row_what_encoding_the_whole_batch_gives(tok, monkeypatch):
    """Rows encoded in groups of similar length, padded back in the given order: the same ids and mask, the same
    states and start keys at every real token (to float rounding)."""
    torch.manual_seed(0)
    m = AutoUIPolicy(PolicyConfig(d_model=32, d_ff=64, image_dim=32), tok).eval()
    # As a VLM sharing the tokenizer leaves it: prompts are padded on the right regardless.
    monkeypatch.setattr(tok, "padding_side", "left")
    prompts = [f"Previous Actions: {'tap x ' * (i % 9)}Goal: Open the clock {i}" for i in range(21)]
    shots = np.random.default_rng(4).integers(0, 256, (21, 228, 108, 3), np.uint8)
    with torch.no_grad():
        whole, grouped = m.encode(prompts, shots), m.encode_by_length(prompts, shots, group=4)
    assert torch.equal(grouped["input_ids"], whole["input_ids"]) and torch.equal(grouped["mask"], whole["mask"])
    real = whole["mask"].bool()
    # Some rows are padded, and groups of 4 pad them less than the whole batch does.
    assert real[:, 0].all() and not real.all()
    for key in ("states", "start_keys"):
        torch.testing.assert_close(grouped[key][real], whole[key][real], atol=1e-5, rtol=1e-5)
