"""`init-model --family`: the BPE tokenizer, the chat templates, the model config and the
saved layout, on small vocabularies and without SFT (the built model: tests/engine)."""

from __future__ import annotations

import json
import random
import unicodedata

import pytest
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from pipeline.errors import UsageError
from pipeline.policy.bootstrap import InitOptions
from pipeline.policy.bpe import train_bpe_tokenizer
from pipeline.policy.corpus import tokenizer_corpus
from pipeline.policy.families import LLAMA, QWEN2, get_family
from pipeline.policy.family_build import FamilyOptions, chat_prompt, save_family, special_token_ids
from pipeline.policy.family_model import (FamilyArch, build_family_model, family_config,
                                          generation_config, padded_vocab, stop_ids)
from rhymectl.app import main

VOCAB = 1024
SMALL = FamilyArch(layers=2, hidden=64, heads=2, kv_heads=1, intermediate=128)


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return tokenizer_corpus(0, math_rows_each=300, paragraphs=300)


@pytest.fixture(scope="module")
def tokenizers(corpus):
    return {f.name: train_bpe_tokenizer(corpus, f, VOCAB) for f in (QWEN2, LLAMA)}


def random_text(rng: random.Random, n: int = 200) -> str:
    """Arbitrary unicode: ASCII, accents, CJK, emoji, combining marks, controls, tabs."""
    ranges = [(0x20, 0x7E), (0xC0, 0x17F), (0x4E00, 0x4FFF), (0x1F600, 0x1F64F), (0x300, 0x36F),
              (0x0, 0x1F), (0x600, 0x6FF)]
    return "".join(chr(rng.randint(*rng.choice(ranges))) for _ in range(n))


# -- tokenizer ---------------------------------------------------------------------------


def test_special_tokens_follow_the_bpe_vocabulary(tokenizers):
    qwen, llama = tokenizers["qwen2"], tokenizers["llama"]
    assert len(qwen) == VOCAB + 3 and len(llama) == VOCAB + 256
    assert special_token_ids(QWEN2, qwen) == {"<|endoftext|>": VOCAB, "<|im_start|>": VOCAB + 1,
                                              "<|im_end|>": VOCAB + 2}
    assert (qwen.bos_token, qwen.eos_token, qwen.pad_token) == (None, "<|im_end|>", "<|endoftext|>")
    assert special_token_ids(LLAMA, llama) == {
        "<|begin_of_text|>": VOCAB, "<|end_of_text|>": VOCAB + 1, "<|finetune_right_pad_id|>": VOCAB + 4,
        "<|start_header_id|>": VOCAB + 6, "<|end_header_id|>": VOCAB + 7, "<|eom_id|>": VOCAB + 8,
        "<|eot_id|>": VOCAB + 9, "<|python_tag|>": VOCAB + 10}
    assert (llama.bos_token, llama.eos_token, llama.pad_token) == ("<|begin_of_text|>", "<|eot_id|>", None)
    assert stop_ids(QWEN2, qwen) == [VOCAB, VOCAB + 2]
    assert stop_ids(LLAMA, llama) == [VOCAB + 1, VOCAB + 8, VOCAB + 9]


def test_byte_level_round_trip_of_arbitrary_unicode(tokenizers):
    rng = random.Random(0)
    for _ in range(20):
        text = random_text(rng)
        for name, tok in tokenizers.items():
            ids = tok(text, add_special_tokens=False)["input_ids"]
            assert max(ids) < VOCAB  # plain text never becomes a special token
            want = unicodedata.normalize("NFC", text) if name == "qwen2" else text
            assert tok.decode(ids) == want
    # Qwen2 NFC-normalises, as the real tokenizer does; Llama-3 keeps the bytes.
    decomposed = "e\u0301"
    assert tokenizers["qwen2"].decode(tokenizers["qwen2"](decomposed)["input_ids"]) == "\u00e9"
    assert tokenizers["llama"].decode(tokenizers["llama"](decomposed, add_special_tokens=False)["input_ids"]) == decomposed


def test_digits_split_as_the_families_do(tokenizers):
    def pieces(name: str) -> list[str]:
        return [p for p, _ in tokenizers[name].backend_tokenizer.pre_tokenizer.pre_tokenize_str("12345")]
    assert pieces("qwen2") == ["1", "2", "3", "4", "5"] and pieces("llama") == ["123", "45"]


def test_only_llama_prepends_bos(tokenizers):
    assert tokenizers["qwen2"]("hi")["input_ids"] == tokenizers["qwen2"]("hi", add_special_tokens=False)["input_ids"]
    ids = tokenizers["llama"]("hi")["input_ids"]
    assert ids[0] == tokenizers["llama"].bos_token_id and ids[1:] == tokenizers["llama"]("hi", add_special_tokens=False)["input_ids"]


def test_chat_templates_render_the_family_formats(tokenizers):
    user = [{"role": "user", "content": "What is 2+3?"}]
    assert chat_prompt(tokenizers["qwen2"], "What is 2+3?") == (
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+3?<|im_end|>\n<|im_start|>assistant\n")
    with_system = [{"role": "system", "content": "Be brief."}, *user, {"role": "assistant", "content": "5"}]
    assert tokenizers["qwen2"].apply_chat_template(with_system, tokenize=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+3?<|im_end|>\n"
        "<|im_start|>assistant\n5<|im_end|>\n")
    assert chat_prompt(tokenizers["llama"], "What is 2+3?") == (
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n")
    assert tokenizers["llama"].apply_chat_template(with_system, tokenize=False) == (
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nWhat is 2+3?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n5<|eot_id|>")
    # Tokenized, the rendered BOS is the only one (the template carries it).
    ids = tokenizers["llama"].apply_chat_template(user, add_generation_prompt=True, tokenize=True,
                                                  return_dict=False)
    assert ids.count(tokenizers["llama"].bos_token_id) == 1 and ids[0] == tokenizers["llama"].bos_token_id
    qwen_ids = tokenizers["qwen2"].apply_chat_template(user, add_generation_prompt=True, tokenize=True,
                                                       return_dict=False)
    assert qwen_ids[0] == VOCAB + 1 and qwen_ids == tokenizers["qwen2"](
        chat_prompt(tokenizers["qwen2"], "What is 2+3?"))["input_ids"]  # no BOS


def test_a_vocabulary_the_corpus_cannot_reach_is_refused(corpus):
    with pytest.raises(UsageError, match="the tokenizer corpus gives only [0-9]+ tokens, fewer than "
                                         "the 100000 asked for; use a smaller vocabulary"):
        train_bpe_tokenizer(corpus[:50], QWEN2, 100_000)
    with pytest.raises(UsageError, match="vocabulary size 300 is too small; use at least 512"):
        train_bpe_tokenizer(corpus, QWEN2, 300)


def test_the_tokenizer_is_the_same_for_the_same_corpus(corpus, tokenizers):
    again = train_bpe_tokenizer(corpus, QWEN2, VOCAB)
    assert again.backend_tokenizer.to_str() == tokenizers["qwen2"].backend_tokenizer.to_str()


# -- model config ------------------------------------------------------------------------


@pytest.mark.parametrize("family", [QWEN2, LLAMA], ids=lambda f: f.name)
def test_model_config_has_the_family_architecture(tokenizers, family):
    tok = tokenizers[family.name]
    config = family_config(family, tok, FamilyArch())
    model = AutoModelForCausalLM.from_config(config)
    assert type(model).__name__ == family.architecture
    assert config.num_key_value_heads == 2 < config.num_attention_heads == 4
    assert config.hidden_size // config.num_attention_heads == 32  # vLLM's CPU attention refuses 16
    assert config.tie_word_embeddings is family.tie_embeddings
    assert config.bos_token_id == tok.convert_tokens_to_ids(family.config_bos)
    if family is QWEN2:
        assert config.vocab_size == padded_vocab(len(tok), 128) == 1152 > len(tok)
        assert config.eos_token_id == tok.eos_token_id
        assert model.model.layers[0].self_attn.q_proj.bias is not None
        assert model.lm_head.weight is not model.model.embed_tokens.weight
    else:
        assert config.vocab_size == len(tok)
        assert config.eos_token_id == stop_ids(LLAMA, tok)
        assert config.rope_parameters["rope_type"] == "llama3"
        assert model.model.layers[0].self_attn.q_proj.bias is None
        assert model.lm_head.weight is model.model.embed_tokens.weight
    assert generation_config(family, tok).eos_token_id == tok.convert_tokens_to_ids(list(family.stop))


def test_a_head_count_that_does_not_divide_is_refused(tokenizers):
    with pytest.raises(UsageError, match="hidden 128, heads 4, kv_heads 3: hidden must divide by heads and heads by kv_heads"):
        family_config(QWEN2, tokenizers["qwen2"], FamilyArch(kv_heads=3))


@pytest.mark.parametrize("family", [QWEN2, LLAMA], ids=lambda f: f.name)
def test_the_saved_folder_is_laid_out_as_a_release(tokenizers, family, tmp_path):
    tok = tokenizers[family.name]
    model = build_family_model(family_config(family, tok, SMALL), seed=0)
    model.generation_config = generation_config(family, tok)
    save_family(tmp_path, model, tok)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"]
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["architectures"] == [family.architecture] and config["model_type"] == family.name
    assert json.loads((tmp_path / "generation_config.json").read_text())["eos_token_id"] == stop_ids(family, tok) \
        or family is QWEN2  # qwen2 lists im_end first, as the release does
    tok_config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tok_config["chat_template"] == family.chat_template
    with safe_open(tmp_path / "model.safetensors", "pt") as weights:
        assert ("lm_head.weight" in weights.keys()) is not family.tie_embeddings
    # transformers picks Qwen2Tokenizer for model_type qwen2 whatever tokenizer_class says,
    # and rebuilds the pipeline from vocab and merges: it must encode exactly as built.
    loaded = AutoTokenizer.from_pretrained(tmp_path)
    rng = random.Random(1)
    for text in ["Mia has 12 pens.", chat_prompt(tok, "q?"), *(random_text(rng) for _ in range(5))]:
        assert loaded(text)["input_ids"] == tok(text)["input_ids"]
        assert loaded.decode(loaded(text)["input_ids"]) == tok.decode(tok(text)["input_ids"])
    assert chat_prompt(loaded, "q?") == chat_prompt(tok, "q?")
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (
        tok.bos_token_id, tok.eos_token_id, tok.pad_token_id)
    assert special_token_ids(family, loaded) == special_token_ids(family, tok)
    assert AutoConfig.from_pretrained(tmp_path).tie_word_embeddings is family.tie_embeddings
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert all((a == b).all() for a, b in zip(again.state_dict().values(), model.state_dict().values()))


# -- options and command line ------------------------------------------------------------


def test_the_default_model_keeps_its_fingerprint():
    """The family models add nothing to the default build's cache key (it changes only
    with the default recipe: the held-out accuracy target changed it)."""
    assert InitOptions().fingerprint() == "e1a5109f6a13018f"
    assert FamilyOptions().fingerprint() != FamilyOptions(family="llama").fingerprint()
    assert get_family("llama") is LLAMA
    with pytest.raises(UsageError, match="unknown model family 'gpt2'; use one of qwen2, llama"):
        get_family("gpt2")


def cli_error(capsys, *args) -> str:
    with pytest.raises(SystemExit) as info:
        main([str(a) for a in args])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and out == "" and err.count("\n") == 1, err
    return err.removeprefix("error: ").rstrip("\n")


def test_init_model_family_usage_errors(capsys, tmp_path):
    assert cli_error(capsys, "init-model", "--family", "gpt2", "--out", tmp_path / "m") == (
        "unknown model family 'gpt2'; use one of qwen2, llama")
    assert cli_error(capsys, "init-model", "--family", "qwen2", "--task", "sort", "--out", tmp_path / "m") == (
        "--task chooses the default policy's SFT task; a --family model is SFT-trained on "
        "GSM8K-format rows: drop --task or --family")
    built = tmp_path / "tiny"
    built.mkdir()
    (built / "rhymectl_model.json").write_text('{"fingerprint": "x", "family": "llama", "seed": 3}')
    assert cli_error(capsys, "init-model", "--family", "qwen2", "--out", built) == (
        f"--out {built} holds a model built with other settings (family llama, seed 3); pass "
        f"--force to replace it, or give another folder")
    assert [p.name for p in built.iterdir()] == ["rhymectl_model.json"]


def test_init_model_help_says_what_the_family_models_are_for(capsys):
    with pytest.raises(SystemExit):
        main(["init-model", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "real tokenizer/chat template/architecture plumbing at CPU size; not a capable model" in text
