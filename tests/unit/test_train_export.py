"""The policy written one parameter at a time: shards cut by size, tensors in the model's
dtype, a layout that transformers loads back exactly."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

from pipeline.train import export


def test_shards_are_cut_by_size_and_a_large_tensor_stands_alone():
    sizes = [("a", 4), ("b", 4), ("c", 10), ("d", 1), ("e", 1)]
    assert export.plan_shards(sizes, 8) == [["a", "b"], ["c"], ["d", "e"]]
    assert export.plan_shards(sizes, 100) == [["a", "b", "c", "d", "e"]]
    assert export.shard_names(1) == ["model.safetensors"]
    assert export.shard_names(2) == ["model-00001-of-00002.safetensors",
                                     "model-00002-of-00002.safetensors"]


def small_model(dtype, tied: bool) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=2, num_key_value_heads=1, head_dim=16,
                      max_position_embeddings=64, tie_word_embeddings=tied)
    return LlamaForCausalLM(cfg).to(dtype)


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("shard_bytes", [export.SHARD_BYTES, 6000])
def test_streamed_model_loads_back_identical_in_its_dtype(tmp_path, tied, shard_bytes):
    model = small_model(torch.bfloat16, tied)
    named = list(model.named_parameters())
    sizes = [(n, p.numel() * p.element_size()) for n, p in named]
    handed: list[str] = []

    def stream():
        for n, p in named:
            handed.append(n)
            yield n, p.detach()

    files = export.write_streamed(stream(), sizes, tmp_path, shard_bytes)
    export.write_configs(model, tmp_path)
    assert handed == [n for n, _ in named]  # one pass, in order
    assert (len(files) > 1) == (shard_bytes < sum(b for _, b in sizes))
    for f in files:
        assert all(t.dtype == torch.bfloat16 for t in load_file(str(tmp_path / f)).values())
    if len(files) > 1:
        assert set(export.read_index(tmp_path)["weight_map"]) == {n for n, _ in named}
    back = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.bfloat16)
    for (n, p), (m, q) in zip(model.state_dict().items(), back.state_dict().items()):
        assert n == m and torch.equal(p, q), n


def test_out_of_order_tensors_are_refused(tmp_path):
    t = torch.zeros(2)
    with pytest.raises(RuntimeError, match="out of order"):
        export.write_streamed(iter([("b", t), ("a", t)]), [("a", 8), ("b", 8)], tmp_path)
