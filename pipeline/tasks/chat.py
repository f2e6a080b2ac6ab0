"""How a data set's prompt becomes the policy's input ids: raw text, or a chat template.

An Instruct model (Qwen2.5-Instruct, Llama-3-Instruct) expects its chat format; fed a bare
question it continues the text instead of answering it. `data.chat_template` chooses:

- `auto`: the tokenizer's own template when it has one (`tokenizer.chat_template`), else
  the raw text — the tiny built-in policy has none;
- `none`: the raw text, tokenized with the tokenizer's special tokens (its BOS);
- a file path: a Jinja chat template (rendered by transformers' sandboxed Jinja
  environment, which runs no code from the file).

With a template the prompt is one user message, after an optional `data.system_prompt`
message, rendered with the generation prompt (the assistant turn's header) and tokenized
without adding special tokens again (the template writes them), as veRL and TRL do. The
same `PromptEncoder` serves training, evaluation and the benches, and its `fingerprint`
goes into `run.json`, so `--resume` refuses a run whose prompts would be encoded otherwise.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from pipeline.errors import UsageError

AUTO, NONE = "auto", "none"


@dataclass(frozen=True)
class PromptFormat:
    """template: Jinja text, None for raw prompts; source: where it came from (for messages)."""

    template: str | None
    system_prompt: str | None
    source: str

    def fingerprint(self) -> str:
        blob = f"{self.template}\0{self.system_prompt}".encode()
        return hashlib.sha256(blob).hexdigest()[:16]


def resolve_format(chat_template: str, system_prompt: str | None, tokenizer: Any) -> PromptFormat:
    """The prompt format `data.chat_template` / `data.system_prompt` ask for, given the
    model's tokenizer. UsageError (one line) for a template file that cannot be read or a
    system prompt without a template."""
    choice = chat_template.strip()
    if choice == NONE:
        template, source = None, NONE
    elif choice == AUTO:
        template, source = _tokenizer_template(tokenizer), "the tokenizer's chat template"
        if template is None:
            source = "raw text (the tokenizer has no chat template)"
    else:
        template, source = _read_template(Path(choice).expanduser()), choice
    if system_prompt is not None and template is None:
        raise UsageError(f"data.system_prompt needs a chat template, and the prompts are "
                         f"{source if choice != NONE else 'raw text (data.chat_template: none)'}; "
                         f"set data.chat_template to a template file or drop data.system_prompt")
    return PromptFormat(template, system_prompt, source)


def _tokenizer_template(tokenizer: Any) -> str | None:
    template = getattr(tokenizer, "chat_template", None)
    if isinstance(template, dict):  # named templates: the default one
        template = template.get("default")
    return template if isinstance(template, str) and template.strip() else None


def _read_template(path: Path) -> str:
    if not path.is_file():
        raise UsageError(f"data.chat_template = {str(path)!r} is neither auto, none nor an "
                         f"existing file; give the path of a Jinja chat template")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UsageError(f"data.chat_template file {str(path)!r} cannot be read "
                         f"({type(exc).__name__}); give a UTF-8 Jinja chat template") from None
    if "{{" not in text and "{%" not in text:
        raise UsageError(f"data.chat_template file {str(path)!r} holds no Jinja tags; give a "
                         f"chat template (see the tokenizer_config.json of an Instruct model)")
    return text


class PromptEncoder:
    """Prompt text -> input ids, and response ids -> text, for one tokenizer and format."""

    def __init__(self, tokenizer: Any, fmt: PromptFormat):
        self.tokenizer = tokenizer
        self.format = fmt

    @classmethod
    def from_config(cls, data: Any, tokenizer: Any) -> "PromptEncoder":
        """For a `DataConfig` (its chat_template and system_prompt)."""
        return cls(tokenizer, resolve_format(data.chat_template, data.system_prompt, tokenizer))

    @property
    def pad_id(self) -> int:
        """The id right-padding is written with (masked out everywhere): the tokenizer's pad
        token, else its end-of-sequence token (Llama-3's tokenizer has no pad token)."""
        tok = self.tokenizer
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        return 0 if pad is None else int(pad)

    def render(self, prompt: str) -> str:
        """The text the model sees (the prompt itself when there is no template)."""
        fmt = self.format
        if fmt.template is None:
            return prompt
        messages = ([{"role": "system", "content": fmt.system_prompt}]
                    if fmt.system_prompt is not None else [])
        messages.append({"role": "user", "content": prompt})
        try:
            return self.tokenizer.apply_chat_template(
                messages, chat_template=fmt.template, add_generation_prompt=True, tokenize=False)
        except Exception as exc:  # noqa: BLE001 — a template error is the template's fault
            raise UsageError(f"the chat template ({fmt.source}) fails to render a prompt "
                             f"({type(exc).__name__}: {str(exc)[:120]}); fix it or set "
                             f"data.chat_template: none") from None

    def encode(self, prompt: str) -> list[int]:
        if self.format.template is None:
            return list(self.tokenizer(prompt)["input_ids"])
        return list(self.tokenizer(self.render(prompt), add_special_tokens=False)["input_ids"])

    def encode_many(self, prompts: Sequence[str]) -> list[list[int]]:
        return [self.encode(p) for p in prompts]

    def decode(self, ids: Sequence[int]) -> str:
        """A response's text, special tokens dropped (what rewards read)."""
        return self.tokenizer.decode(list(ids), skip_special_tokens=True)


__all__ = ["AUTO", "NONE", "PromptEncoder", "PromptFormat", "resolve_format"]
