"""The EAGLE-1 head of the offline comparison (`pipeline.bench.eagle_head`,
`pipeline.bench.eagle_replay`): its batched drafts are each row's own, training on a
corpus lowers its loss and lets it draft what it learnt, it stays within its parameter
budget, and each recorded step's features come from the policy that sampled it."""

from __future__ import annotations

import pytest
import torch

from pipeline.bench.eagle_head import (EagleHead, HeadTrainer, draft, draft_cached,
                                       draft_steps, examples_of, policy_features,
                                       prefix_states)
from pipeline.bench.eagle_replay import replay_passes, sampler_dir
from pipeline.drafting.draft_model import policy_parameters, policy_state


def _corpus(n: int, seed: int) -> tuple[list[list[int]], list[list[int]]]:
    """Prompts of 5 random tokens and responses that count on from the prompt's last."""
    g = torch.Generator().manual_seed(seed)
    prompts, responses = [], []
    for i in range(n):
        prompt = torch.randint(1, 24, (5,), generator=g).tolist()
        prompts.append(prompt)
        responses.append([(prompt[-1] + j) % 23 + 1 for j in range(8 + i % 5)])
    return prompts, responses


def _head(policy_dir, seed: int = 0) -> EagleHead:
    config, state = policy_state(policy_dir)
    return EagleHead(config, state, max_fraction=2.0, seed=seed)


def test_a_batch_of_contexts_drafts_what_each_row_drafts_alone(random_llama_dir):
    prompts, responses = _corpus(6, seed=3)
    seqs = [p + r for p, r in zip(prompts, responses)]
    feats = policy_features(random_llama_dir, seqs)
    head = _head(random_llama_dir)
    contexts = [s[:4 + i] for i, s in enumerate(seqs)]  # lengths 4..9: left padding
    toks, preds = draft_steps(head, contexts, feats, 5)
    assert toks.shape == (6, 5)
    for i, (c, f) in enumerate(zip(contexts, feats)):
        alone_toks, alone_preds = draft_steps(head, [c], [f], 5)
        assert torch.equal(toks[i], alone_toks[0])
        torch.testing.assert_close(preds[i], alone_preds[0], rtol=1e-4, atol=1e-5)
    assert draft(head, contexts, feats, 5) == toks.tolist()
    # from states computed once over each whole sequence, as the replay drafts
    states = prefix_states(head, seqs, feats)
    cached_toks, cached_preds = draft_cached(head, states, [len(c) for c in contexts], 5)
    assert torch.equal(cached_toks, toks)
    torch.testing.assert_close(cached_preds, preds, rtol=1e-4, atol=1e-5)


def test_training_lowers_the_loss_and_the_head_then_drafts_the_continuation(random_llama_dir):
    torch.manual_seed(0)
    prompts, responses = _corpus(24, seed=1)
    feats = policy_features(random_llama_dir, [p + r for p, r in zip(prompts, responses)])
    head = _head(random_llama_dir)
    held_p, held_r = _corpus(6, seed=2)
    held_f = policy_features(random_llama_dir, [p + r for p, r in zip(held_p, held_r)])
    cold = sum(replay_passes(head, held_p, held_r, held_f, k=4))
    trainer = HeadTrainer(head, lr=3e-3, batch=8, seed=0)
    report = trainer.warm_up(examples_of(prompts, responses, feats), updates=150)
    assert report.loss_after < 0.5 * report.loss_before
    warm = sum(replay_passes(head, held_p, held_r, held_f, k=4))
    assert warm < cold
    # every pass emits at least one token and at most k + 1
    tokens = sum(map(len, held_r))
    assert -(-tokens // 5) <= warm <= tokens


def test_the_head_stays_within_its_share_of_the_policy_parameters():
    config = {"hidden_size": 128, "num_attention_heads": 4, "num_key_value_heads": 4,
              "head_dim": 32, "intermediate_size": 512, "num_hidden_layers": 4,
              "vocab_size": 101, "tie_word_embeddings": True, "max_position_embeddings": 256}
    g = torch.Generator().manual_seed(0)
    state = {"model.embed_tokens.weight": torch.randn(101, 128, generator=g),
             "model.norm.weight": torch.ones(128)}
    for name, shape in (("input_layernorm.weight", (128,)),
                        ("post_attention_layernorm.weight", (128,)),
                        ("self_attn.q_proj.weight", (128, 128)),
                        ("self_attn.k_proj.weight", (128, 128)),
                        ("self_attn.v_proj.weight", (128, 128)),
                        ("self_attn.o_proj.weight", (128, 128)),
                        ("mlp.gate_proj.weight", (512, 128)), ("mlp.up_proj.weight", (512, 128)),
                        ("mlp.down_proj.weight", (128, 512))):
        state["model.layers.0." + name] = torch.randn(*shape, generator=g)
    head = EagleHead(config, state, max_fraction=0.1)
    assert head.own_parameters() <= 0.1 * policy_parameters(config)
    # its layer is the policy's layer 0, the MLP cut to the head's width
    width = head.shape.intermediate_size
    assert torch.equal(head.layer.self_attn.q_proj.weight,
                       state["model.layers.0.self_attn.q_proj.weight"])
    assert torch.equal(head.layer.mlp.down_proj.weight,
                       state["model.layers.0.mlp.down_proj.weight"][:, :width])


@pytest.mark.parametrize("tool", ["eagle_replay", "draft_model_replay"])
def test_a_directory_that_is_not_a_run_is_one_line_and_exit_2(tmp_path, capsys, tool):
    import importlib

    from pipeline.bench.draft_model_replay import run_tool

    main = importlib.import_module(f"pipeline.bench.{tool}").main
    assert run_tool(main, [str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not a run directory" in err


def test_each_step_reads_the_features_of_the_policy_that_sampled_it(tmp_path):
    start = tmp_path / "start"
    for n in (2, 4):
        policy = tmp_path / "run" / "checkpoints" / f"step-{n:06d}" / "policy"
        policy.mkdir(parents=True)
        (policy / "config.json").write_text("{}")
    (tmp_path / "run" / "checkpoints" / "step-000006").mkdir()  # no policy kept
    run = tmp_path / "run"
    assert [sampler_dir(run, s, start).parent.name if sampler_dir(run, s, start) != start
            else "start" for s in range(8)] == ["start", "start", "step-000002", "step-000002",
                                                 "step-000004", "step-000004", "step-000004",
                                                 "step-000004"]
