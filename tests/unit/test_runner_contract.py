"""The names the vLLM adapter reads of vLLM's V1 model runner exist in the installed vLLM's
source (the CPU wheel ships the GPU runner's file, which the CPU runner subclasses), and
Model Runner V2, which the adapter cannot drive, lacks them: read with `ast`, no engine."""

from __future__ import annotations

import ast
import importlib.util
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipeline.errors import RuntimeFailure
from pipeline.rollout import runner_contract as rc

VLLM = Path(importlib.util.find_spec("vllm").origin).parent


def defined_names(path: Path, class_name: str) -> set[str]:
    """Methods, properties, class-level fields and `self.x = ...` attributes of a class."""
    tree = ast.parse(path.read_text())
    cls = next((n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)
                and n.name == class_name), None)
    assert cls is not None, f"{class_name} is not defined in {path}"
    names: set[str] = set()
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    for node in ast.walk(cls):
        targets = node.targets if isinstance(node, ast.Assign) else \
            [node.target] if isinstance(node, ast.AnnAssign) else []
        for t in targets:
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) \
                    and t.value.id == "self":
                names.add(t.attr)
    return names


@pytest.mark.parametrize("relative", sorted(rc.SOURCES))
def test_every_name_the_adapter_reads_is_in_the_installed_vllm(relative):
    class_name, needed = rc.SOURCES[relative]
    have = defined_names(VLLM / relative, class_name)
    assert sorted(set(needed) - have) == []


def test_the_custom_proposer_is_called_as_the_proposer_expects():
    """`propose(sampled_token_ids, num_tokens_no_spec, token_ids_cpu, slot_mappings=...)`
    in the runner's custom_class branch (pipeline.rollout.proposer.RhymeProposer.propose)."""
    source = (VLLM / rc.RUNNER_FILE).read_text()
    body = source[source.index("def propose_draft_token_ids"):]
    branch = body[body.index('method == "custom_class"'):]
    call = branch[branch.index(".propose("): branch.index(")", branch.index("slot_mappings"))]
    for arg in ("sampled_token_ids", "self.input_batch.num_tokens_no_spec",
                "self.input_batch.token_ids_cpu", "slot_mappings=slot_mappings"):
        assert arg in call


def test_model_runner_v2_lacks_what_the_adapter_needs():
    """Why the adapter forces V1: the check would refuse V2's runner."""
    v2 = defined_names(VLLM / rc.V2_RUNNER_FILE, "GPUModelRunner")
    assert {"propose_draft_token_ids", "input_batch"} - v2


def test_vllm_reads_the_variable_the_adapter_sets():
    envs = (VLLM / "envs.py").read_text()
    assert f'"{rc.RUNNER_ENV}"' in envs


def test_a_runner_without_a_name_is_refused_with_one_line():
    batch = SimpleNamespace(req_ids=[], req_id_to_index={}, num_prompt_tokens=None,
                            token_ids_cpu=None, num_tokens_no_spec=None)
    good = SimpleNamespace(execute_model=1, propose_draft_token_ids=1, get_model=1,
                           reload_weights=1, input_batch=batch, drafter=None, requests={},
                           _draft_probs=None, _draft_prob_req_ids=None,
                           _get_spec_decode_draft_probs=1)
    assert rc.missing(good) == []
    bad = SimpleNamespace(**{**vars(good), "input_batch": SimpleNamespace(req_ids=[])})
    del bad.reload_weights
    with pytest.raises(RuntimeFailure) as exc:
        rc.check(bad, "0.99.0")
    line = str(exc.value)
    assert "\n" not in line and "vLLM 0.99.0" in line and "runner.reload_weights" in line
    assert "runner.input_batch.token_ids_cpu" in line


def test_the_engine_forces_the_v1_runner(monkeypatch):
    from pipeline.config.schema import RolloutConfig
    from pipeline.rollout import engine

    monkeypatch.setenv(rc.RUNNER_ENV, "1")
    engine._prepare_environment(RolloutConfig())
    assert os.environ[rc.RUNNER_ENV] == "0"
