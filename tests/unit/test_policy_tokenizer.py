"""The tiny policy's character-level tokenizer (no model, no engine)."""

from __future__ import annotations

from pipeline.policy.tokenizer import train_char_tokenizer


def test_tokenizer_round_trip_is_exact():
    tok = train_char_tokenizer(["sort 230:2>2|3>23|0>023|ans 023"])
    for text in ["sort 98765:", "9>9|8>89|ans 89", "rev 01:1|10|ans 10", "a b\tc~{}"]:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert len(ids) == len(text)  # one token per character
        assert tok.decode(ids) == text
    with_bos = tok("sort 1:")["input_ids"]
    assert with_bos[0] == tok.bos_token_id and len(with_bos) == len("sort 1:") + 1
    assert tok.unk_token_id not in tok("~!@# xyz")["input_ids"]
