"""Prompts through the chat template: auto / none / a file, an optional system prompt, the
same encoding for every caller, and the run refuses to resume with another template."""

from __future__ import annotations

import json

import pytest

from pipeline.config import load_config
from pipeline.errors import UsageError
from pipeline.loop import rundir
from pipeline.policy.tokenizer import train_char_tokenizer
from pipeline.tasks.chat import PromptEncoder, resolve_format

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def tokenizer():
    return train_char_tokenizer(["sort 231: 1>1|ans 123", "<|im_start|><|im_end|> system user"])


def test_auto_uses_the_tokenizers_template_and_adds_no_second_bos(tokenizer):
    tokenizer.chat_template = CHATML
    enc = PromptEncoder(tokenizer, resolve_format("auto", None, tokenizer))
    text = enc.render("sort 231:")
    assert text == "<|im_start|>user\nsort 231:<|im_end|>\n<|im_start|>assistant\n"
    assert enc.encode("sort 231:") == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert enc.encode("sort 231:")[0] != tokenizer.bos_token_id


def test_a_system_prompt_comes_first(tokenizer):
    tokenizer.chat_template = CHATML
    enc = PromptEncoder(tokenizer, resolve_format("auto", "Be brief.", tokenizer))
    assert enc.render("q").startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nq")


def test_auto_without_a_template_and_none_are_the_raw_prompt_with_bos(tokenizer):
    tokenizer.chat_template = None
    raw = tokenizer("sort 231:")["input_ids"]
    assert PromptEncoder(tokenizer, resolve_format("auto", None, tokenizer)).encode("sort 231:") == raw
    tokenizer.chat_template = CHATML
    enc = PromptEncoder(tokenizer, resolve_format("none", None, tokenizer))
    assert enc.encode("sort 231:") == raw and raw[0] == tokenizer.bos_token_id


def test_a_template_file(tmp_path, tokenizer):
    tokenizer.chat_template = None
    path = tmp_path / "t.jinja"
    path.write_text("[{{ messages[-1]['content'] }}]{% if add_generation_prompt %}>{% endif %}")
    enc = PromptEncoder(tokenizer, resolve_format(str(path), None, tokenizer))
    assert enc.render("q") == "[q]>"


@pytest.mark.parametrize("setting, system, message", [
    ("missing.jinja", None, "neither auto, none nor an existing file"),
    ("plain.txt", None, "holds no Jinja tags"),
    ("none", "Be brief.", "data.system_prompt needs a chat template"),
    ("auto", "Be brief.", "data.system_prompt needs a chat template"),
])
def test_bad_settings_are_one_line(tmp_path, tokenizer, setting, system, message, monkeypatch):
    tokenizer.chat_template = None
    (tmp_path / "plain.txt").write_text("no tags here")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as exc:
        resolve_format(setting, system, tokenizer)
    assert message in str(exc.value) and "\n" not in str(exc.value)


def test_pad_id_falls_back_to_eos(tokenizer):
    enc = PromptEncoder(tokenizer, resolve_format("none", None, tokenizer))
    assert enc.pad_id == tokenizer.pad_token_id
    tokenizer.pad_token = None
    try:
        assert enc.pad_id == tokenizer.eos_token_id
    finally:
        tokenizer.pad_token = "<pad>"


def test_resume_refuses_a_changed_template_file(tmp_path, monkeypatch):
    from pathlib import Path

    template = tmp_path / "chat.jinja"
    template.write_text(CHATML)
    config = Path(__file__).resolve().parents[2] / "sample_configs/tiny.yaml"
    cfg = load_config(config, [f"run.dir={tmp_path / 'run'}", f"data.chat_template={template}"])
    run = tmp_path / "run"
    run.mkdir()
    (run / "run.json").write_text(json.dumps(rundir.identity(cfg)))
    (run / "config.yaml").write_text("{}")
    rundir.check_run_dir(cfg, resume=True, force=False)  # the same template: resumes
    template.write_text(CHATML.replace("assistant", "bot"))
    with pytest.raises(UsageError, match="another chat template"):
        rundir.check_run_dir(cfg, resume=True, force=False)
