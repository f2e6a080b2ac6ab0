"""The draft model's warm-up before the first step (`pipeline.bench.draft_model_replay
--warm-corpus`, `pipeline.bench.warm_corpus`): the corpus file is checked, and the warm-up
trains the draft on it toward the policy."""

from __future__ import annotations

import json
from argparse import Namespace

import pytest
import torch
from safetensors.torch import load_file

from pipeline.bench.draft_model_replay import _warm_up
from pipeline.bench.warm_corpus import corpus_at, load_corpus
from pipeline.drafting.draft_model import from_policy, shape_for
from pipeline.drafting.draft_train import DraftTrainer, TrainSettings


def _corpus(n: int = 12) -> list[tuple[list[int], list[int]]]:
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        prompt = torch.randint(1, 24, (5,), generator=g).tolist()
        out.append((prompt, [(prompt[-1] + j) % 23 + 1 for j in range(8 + i % 5)]))
    return out


@pytest.mark.parametrize("text", ['{"a": 1}', '[[1, 2, 3]]', '[[1, 2]]', '[[[1], ["x"]]]',
                                  '[[[1], [2], [3]]]'])
def test_a_file_that_is_not_a_corpus_is_refused_with_what_to_do(tmp_path, text):
    path = tmp_path / "corpus.json"
    path.write_text(text)
    with pytest.raises(ValueError, match="not a warm-up corpus.*delete it"):
        load_corpus(path)


def test_a_stored_corpus_is_read_back_and_not_made_again(tmp_path):
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps(_corpus()))
    # cfg None: making a corpus would fail, so this must read the file
    assert corpus_at(path, None, 64, 4, 16) == [tuple(x) for x in _corpus()]


@pytest.mark.parametrize("distill", [0, 3])
def test_the_warm_up_trains_the_draft_on_the_corpus(tmp_path, random_llama_dir, distill):
    config = json.loads((random_llama_dir / "config.json").read_text())
    state = load_file(str(random_llama_dir / "model.safetensors"))
    model = from_policy(config, state, shape_for(config, max_fraction=1.0), seed=0)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer = DraftTrainer(model, TrainSettings(updates=5), seed=0)
    path = tmp_path / "corpus.json"
    path.write_text(json.dumps(_corpus()))
    args = Namespace(warm_corpus=path, warm_prompts=64, warm_samples=4, warm_max_new=16,
                     seed=0, warm_distill=distill, warm_updates=30, draft_vocab=0)
    out = _warm_up(trainer, None, random_llama_dir, args)
    assert out["responses"] == 12 and out["tokens"] == sum(len(r) for _, r in _corpus())
    assert out["loss_after"] < out["loss_before"]
    changed = [k for k, v in trainer.model.state_dict().items() if not torch.equal(v, before[k])]
    assert "model.layers.0.mlp.down_proj.weight" in changed


def test_warm_up_prompts_are_never_training_prompts(tmp_path):
    """A built-in task's come from another seed, none of them trained on; a data set's are
    the rows after data.train_size, and asking past its end names what is left."""
    from pipeline.config import load_config
    from pipeline.tasks.prompts import eval_prompts, train_rows, warmup_prompts

    cfg = load_config(None, ["data.task=sort", "data.train_size=32"])
    warm = [p.text for p in warmup_prompts(cfg.data, 20)]
    assert len(warm) == len(set(warm)) == 20
    assert not set(warm) & set(train_rows(cfg.data)["prompt"])
    assert not set(warm) & {p.text for p in eval_prompts(cfg.data, set())}
    rows = tmp_path / "rows.jsonl"
    rows.write_text("".join(json.dumps({"prompt": f"q{i}", "answer": str(i)}) + "\n"
                            for i in range(10)))
    data = load_config(None, [f"data.path={rows}", "data.train_size=6"]).data
    assert [(p.text, p.answer) for p in warmup_prompts(data, 4)] == \
        [("q6", "6"), ("q7", "7"), ("q8", "8"), ("q9", "9")]
    with pytest.raises(ValueError, match="6 of them trained on: ask for at most 4"):
        warmup_prompts(data, 5)
