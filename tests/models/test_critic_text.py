"""The critic's text towers: copies of the base policy's T5 encoder, trained with the heads."""

import pytest
import torch

from digiq.models.critic_text import TOWERS, TextTable, TextTowers
from digiq.models.policy import AutoUIPolicy, PolicyConfig
from digiq.models.tokenizer import default_corpus, train_tokenizer

TEXTS = ["Search for seagate 2tb on ebay", "TYPE", "seagate 2tb", "ateseag 2tbse", "PRESS_BACK", ""]


@pytest.fixture(scope="module")
def policy() -> AutoUIPolicy:
    torch.manual_seed(0)
    return AutoUIPolicy(PolicyConfig(d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1, image_dim=16),
                        train_tokenizer(default_corpus(n_tasks=50))).eval()  # fmt: skip


def test_an_untrained_tower_pools_the_frozen_average_the_critic_read_before(policy):
    towers = TextTowers(policy.t5.encoder, policy.cfg.d_model).eval()
    table = TextTable.of(TEXTS, policy.tokenizer, policy.cfg.max_input_tokens)
    with torch.no_grad():
        for name in TOWERS:
            pooled = towers(name, table, table.rows(TEXTS))
            torch.testing.assert_close(pooled, torch.tanh(policy.text_features(TEXTS)), rtol=1e-5, atol=1e-6)


def test_each_distinct_text_is_encoded_once_and_in_place(policy):
    towers = TextTowers(policy.t5.encoder, policy.cfg.d_model).eval()
    table = TextTable.of(TEXTS, policy.tokenizer, policy.cfg.max_input_tokens)
    seen: list[int] = []
    towers.towers["typed_text"].register_forward_hook(lambda module, args, out: seen.append(len(args[0])))
    rows = table.rows([TEXTS[2], TEXTS[3], TEXTS[2], TEXTS[2]]).view(2, 2)
    with torch.no_grad():
        out = towers("typed_text", table, rows)
        alone = towers("typed_text", table, table.rows([TEXTS[3]]))
    assert seen == [2, 1] and out.shape == (2, 2, policy.cfg.d_model)
    torch.testing.assert_close(out[0, 1], alone[0], rtol=1e-5, atol=1e-6)  # the padding of others changes nothing
    torch.testing.assert_close(out[0, 0], out[1, 1])


def test_the_towers_learn_and_are_copies_the_policy_does_not_share(policy):
    towers = TextTowers(policy.t5.encoder, policy.cfg.d_model)
    table = TextTable.of(TEXTS, policy.tokenizer, policy.cfg.max_input_tokens)
    before = {name: p.detach().clone() for name, p in policy.t5.encoder.named_parameters()}
    opt = torch.optim.Adam(towers.parameters(), lr=1e-2)
    typed, scrambled = table.rows([TEXTS[2]]), table.rows([TEXTS[3]])
    gap = []
    for _ in range(30):  # tell a query from its scramble: the frozen average barely does
        score = towers("typed_text", table, typed).sum() - towers("typed_text", table, scrambled).sum()
        opt.zero_grad()
        (-score).backward()
        opt.step()
        gap.append(float(score.detach()))
    assert gap[-1] > gap[0] + 1.0
    assert all(torch.equal(p, before[name]) for name, p in policy.t5.encoder.named_parameters())
    goal = towers.towers["goal"].stack.block[0].layer[0].SelfAttention.q.weight
    text = towers.towers["typed_text"].stack.block[0].layer[0].SelfAttention.q.weight
    assert not torch.equal(goal, text)  # three towers: the text tower moved alone


def test_a_text_outside_the_table_is_named(policy):
    table = TextTable.of(TEXTS, policy.tokenizer, policy.cfg.max_input_tokens)
    with pytest.raises(KeyError, match="not in the critic's text table, e.g. 'type garbage'"):
        table.rows(["TYPE", "type garbage"])


def test_encoding_a_step_s_texts_together_gives_each_input_s_own(policy):
    """TextTowers.encode calls each tower once on the distinct texts of all its inputs: the same states as asking
    input by input."""
    towers = TextTowers(policy.t5.encoder, policy.cfg.d_model).eval()
    table = TextTable.of(TEXTS, policy.tokenizer, policy.cfg.max_input_tokens)
    requests = {"goal": ("goal", table.rows([TEXTS[0], TEXTS[0]])),
                "typed": ("typed_text", table.rows([TEXTS[2], TEXTS[3], TEXTS[5]]).view(3, 1)),
                "kind": ("action_type", table.rows([TEXTS[1], TEXTS[4]]))}  # fmt: skip
    with torch.no_grad():
        together = towers.encode(table, requests)
        for key, (tower, rows) in requests.items():
            torch.testing.assert_close(together[key], towers(tower, table, rows), rtol=1e-5, atol=1e-6)
        every = towers.encode_all(table, chunk=2)  # each text once, in order of length, put back in table order
    for tower in TOWERS:
        torch.testing.assert_close(every[tower], towers(tower, table, table.rows(TEXTS)), rtol=1e-5, atol=1e-6)


def test_the_towers_run_without_dropout_in_either_mode_and_a_long_text_keeps_its_end(policy):
    """As released: the encoders never drop units, and a text over the limit loses its start, not its end."""
    torch.manual_seed(1)
    noisy = AutoUIPolicy(PolicyConfig(d_model=16, d_ff=32, d_kv=8, num_heads=2, num_layers=1, image_dim=16,
                                      dropout=0.5), policy.tokenizer)  # fmt: skip
    towers = TextTowers(noisy.t5.encoder, noisy.cfg.d_model).train()
    table = TextTable.of(TEXTS, policy.tokenizer, policy.cfg.max_input_tokens)
    rows = table.rows(TEXTS)
    with torch.no_grad():
        torch.testing.assert_close(towers("goal", table, rows), towers.eval()("goal", table, rows))
    short = TextTable.of([TEXTS[0]], policy.tokenizer, 4)
    assert short.ids[0].tolist() == policy.tokenizer(TEXTS[0]).input_ids[-4:]
    assert policy.tokenizer.truncation_side == "right"  # the shared tokenizer is left as it was
