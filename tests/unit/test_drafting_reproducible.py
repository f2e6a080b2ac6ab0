"""Drafts are a function of what the requests emitted, never of the drafter thread's
timing: presumed drafts, background work cut short at random points, and inline work give
the same drafts pass by pass (docs/speculation.md, "Reproducible speculation")."""

from __future__ import annotations

import random

import pytest

from pipeline.drafting import background
from pipeline.drafting.drafter import GroupDrafter
from pipeline.drafting.inputs import DrafterConfig, HistoryResponse
from pipeline.history.store import prompt_hash

VOCAB = 12


def _workload(seed: int = 5, prompts: int = 6, group: int = 6, length: int = 90):
    """Prompts, their history (two epochs of noisy copies of a per-prompt pattern) and the
    responses the target 'samples' this step (another noisy copy): rhyming, not equal."""
    rng = random.Random(seed)
    out = []
    for p in range(prompts):
        prompt = [100 + p, 101 + p, 102 + p]
        pattern = [rng.randrange(VOCAB) for _ in range(length)]

        def noisy(rate):
            return [rng.randrange(VOCAB) if rng.random() < rate else t for t in pattern]

        history = [noisy(0.15) for _ in range(2 * group)]
        targets = [noisy(0.2)[: rng.randrange(length // 2, length)] for _ in range(group)]
        out.append((prompt, history, targets))
    return out


def _drafter(threaded: bool) -> GroupDrafter:
    return GroupDrafter(DrafterConfig(max_spec_factor=4.0, min_path_prob=0.5, chain=True,
                                      thin_pass_tokens=64, chain_longest=0.25,
                                      background=threaded))


def _rollout(d: GroupDrafter, groups, presume: bool = True, cap: int = 6,
             tag: str = "") -> list[list[list[int]]]:
    """One rollout of `groups` ((prompt, responses the target samples) pairs), the
    proposer's way: tokens in, drafts out, after_pass. Returns every pass's drafts."""
    targets, pos = {}, {}
    for p, (prompt, group) in enumerate(groups):
        d.expect_group(prompt, len(group))
        for g, target in enumerate(group):
            rid = f"{tag}{g}_{p}"
            d.start(rid, prompt)
            targets[rid], pos[rid] = target, 0
    passes, emitted = [], {}
    while targets:
        running = list(targets)
        if emitted:
            d.append_many(list(emitted), list(emitted.values()))
        drafts = d.draft_many(running, [cap] * len(running))
        passes.append([list(x.token_ids) for x in drafts])
        emitted = {}
        for rid, draft in zip(running, drafts):
            t, i = targets[rid], pos[rid]
            k = 0
            while k < len(draft.token_ids) and i + k < len(t) and draft.token_ids[k] == t[i + k]:
                k += 1
            emitted[rid] = t[i:i + k + 1]
            pos[rid] = i + len(emitted[rid])
        for rid in [r for r in running if pos[r] >= len(targets[r])]:
            d.append(rid, emitted.pop(rid))
            d.finish(rid)
            del targets[rid]
        d.after_pass(presume=presume)
    d.end_step()
    return passes


def _run(presume: bool, threaded: bool) -> list[list[list[int]]]:
    d = _drafter(threaded)
    work = _workload()
    for prompt, history, _ in work:
        d.set_history(prompt_hash(prompt), [HistoryResponse(h, None) for h in history])
    passes = _rollout(d, [(prompt, group) for prompt, _, group in work], presume)
    d.close()
    return passes


def test_presumed_drafts_are_the_drafts_a_fresh_query_gives():
    """Every presumed draft worked out (inline) against none (presume off): the same."""
    fresh = _run(presume=False, threaded=False)
    presumed = _run(presume=True, threaded=False)
    assert len(fresh) > 10 and sum(map(len, sum(fresh, []))) > 100
    assert presumed == fresh


def test_drafts_do_not_follow_the_drafter_threads_timing(monkeypatch):
    """The thread slowed by random sleeps, so that waits cut presuming at other points in
    every run: the drafts of an undisturbed inline run, pass by pass."""
    reference = _run(presume=True, threaded=False)
    monkeypatch.setenv(background.DELAY_ENV, "0.0004")
    for _ in range(2):
        assert _run(presume=True, threaded=True) == reference


def test_the_delay_hook_is_off_by_default_and_ignores_garbage(monkeypatch):
    monkeypatch.delenv(background.DELAY_ENV, raising=False)
    assert background.delay_hook_s() == 0.0
    monkeypatch.setenv(background.DELAY_ENV, "fast")
    assert background.delay_hook_s() == 0.0
    monkeypatch.setenv(background.DELAY_ENV, "0.01")
    assert background.delay_hook_s() == pytest.approx(0.01)


# ------------------------------------------------------------- the state through a resume

class _Run:
    """A run's steps as the loop drives the drafter: 8 prompts, 3 a step, the pool
    reshuffled every epoch (so a prompt can be in two adjacent steps); after each rollout
    the next step's prompts are prepared, then the step's responses become history (the
    held prompts' in place, the others' parked in the global tree)."""

    def __init__(self, seed: int = 11, prompts: int = 8, per_step: int = 3, group: int = 4):
        rng = random.Random(seed)
        self.patterns = {}
        for p in range(prompts):
            prompt = (200 + p, 201 + p, 202 + p)
            self.patterns[prompt] = [rng.randrange(40) for _ in range(70)]
        self.per_step, self.group, self.seed = per_step, group, seed
        self.store: dict[str, list[tuple[int, list[int]]]] = {}  # key -> (step, tokens)

    def prompts(self, step: int) -> list[tuple[int, ...]]:
        per_epoch = len(self.patterns) // self.per_step
        order = sorted(self.patterns)
        random.Random(self.seed + step // per_epoch).shuffle(order)
        i = step % per_epoch * self.per_step
        return order[i:i + self.per_step]

    def targets(self, step: int, prompt) -> list[list[int]]:
        rng = random.Random(hash((self.seed, step, prompt)) & 0xFFFF)
        pat = self.patterns[prompt]
        return [[rng.randrange(40) if rng.random() < 0.25 else t for t in pat][: rng.randrange(30, 70)]
                for _ in range(self.group)]

    def lookup(self, keys):
        """The history window: each prompt's responses of its last 2 steps, oldest first."""
        out = {}
        for key in keys:
            rows = self.store.get(key)
            if rows:
                steps = sorted({s for s, _ in rows})[-2:]
                out[key] = [HistoryResponse(t, None, s) for s, t in rows if s in steps]
        return out

    def step(self, d: GroupDrafter, step: int, loaded: set):
        prompts = self.prompts(step)
        keys = {prompt_hash(list(p)) for p in prompts}
        missing = [list(p) for p in prompts if prompt_hash(list(p)) not in loaded]
        d.prepare(missing, self.lookup, keep=keys | loaded)  # the generate's `before`
        loaded |= keys
        groups = [(list(p), self.targets(step, p)) for p in prompts]
        passes = _rollout(d, groups, tag=f"s{step}-")
        nxt = [list(p) for p in self.prompts(step + 1)]
        d.prepare(nxt, self.lookup)  # the next step's trees, while training runs
        loaded.clear()
        loaded |= {prompt_hash(p) for p in nxt}
        for prompt, group in groups:  # remember: the step's records
            key = prompt_hash(prompt)
            self.store.setdefault(key, []).extend((step, t) for t in group)
        touched = [p for p in nxt if prompt_hash(p) in {prompt_hash(q) for q, _ in groups}]
        if touched:
            d.prepare(touched, self.lookup, keep=loaded)
        parked = [prompt_hash(q) for q, _ in groups if prompt_hash(q) not in loaded]
        if parked:
            d.park_history(parked, self.lookup)
        return passes


def _budget(learnt: bool = True):
    from pipeline.drafting.budget_critical import CriticalBudget, CriticalConfig, fixed_pass_cost

    b = CriticalBudget(CriticalConfig(max_len=6), cost=fixed_pass_cost(), learn_cost=False)
    if learnt:
        b.calibrator.observe([0.9, 0.8, 0.3], 2)
        b.observe_draft("r", [0.95, 0.5], 1)
    return b


def test_a_resumed_drafter_drafts_as_the_uninterrupted_one(tmp_path):
    """Steps 0-3, a checkpoint, steps 4-6: the drafts of steps 4-6 are the same whether
    the drafter went on or was saved and restored into a new one (as --resume does);
    without the saved state they are not."""
    from pipeline.drafting import snapshot

    run = _Run()
    d, loaded = _drafter(threaded=True), set()
    for s in range(4):
        run.step(d, s, loaded)
    budget = _budget()
    snapshot.save(d, budget, tmp_path, rank=0)
    store = {k: list(v) for k, v in run.store.items()}
    after = [run.step(d, s, loaded) for s in range(4, 7)]
    d.close()

    run.store = {k: list(v) for k, v in store.items()}
    resumed, other = _drafter(threaded=True), _budget(learnt=False)
    assert snapshot.load(resumed, other, tmp_path, rank=0)
    assert other.state() == budget.state() != _budget(learnt=False).state()
    loaded2 = set()  # a resumed run's loop holds no prompt yet
    again = [run.step(resumed, s, loaded2) for s in range(4, 7)]
    resumed.close()
    assert sum(len(x) for x in after) > 20
    assert again == after

    run.store = {k: list(v) for k, v in store.items()}
    fresh, loaded3 = _drafter(threaded=True), set()
    assert [run.step(fresh, s, loaded3) for s in range(4, 7)] != after
    fresh.close()


def test_a_damaged_drafter_state_is_refused(tmp_path):
    from pipeline.drafting import snapshot

    run, d, loaded = _Run(), _drafter(threaded=False), set()
    run.step(d, 0, loaded)
    snapshot.save(d, _budget(), tmp_path, rank=1)
    json_path, tensors = snapshot.state_files(tmp_path, 1)
    assert not snapshot.load(_drafter(False), _budget(), tmp_path, rank=0)  # none for rank 0
    tensors.write_bytes(tensors.read_bytes()[:-8])
    with pytest.raises(ValueError, match="the drafter's state cannot be read"):
        snapshot.load(_drafter(False), _budget(), tmp_path, rank=1)


def test_a_tree_that_saw_a_removal_drafts_as_one_rebuilt_from_what_it_holds():
    """Suffix-tree ties follow the order counts changed in: holding [1 2 3] and [1 2 4],
    a tree built in that order drafts 3 after [1 2], one that also held and lost a second
    [1 2 4] drafts 4. `rebuild` (done before a checkpoint takes the state, and by the
    restore) makes the two alike."""
    import numpy as np

    from pipeline.drafting.global_tree import GlobalTree

    def tree(extra: bool) -> GlobalTree:
        g, owners = GlobalTree(8, 100, 1000), [[], [], []]
        for owner, toks in zip(owners, ([1, 2, 3], [1, 2, 4], [1, 2, 4])):
            if owner is owners[2] and not extra:
                break
            g.add_history(np.asarray(toks, dtype=np.int32), 1, owner)
        if extra:
            g.remove(owners[2])
        return g

    def draft(g: GlobalTree) -> list[int]:
        return g.speculate([9, 1, 2], 4, 0.0, 8.0).token_ids

    built, churned = tree(extra=False), tree(extra=True)
    assert draft(built) == [3] and draft(churned) == [4]
    churned.rebuild()
    assert draft(churned) == [3] and churned.history_tokens == built.history_tokens == 6


def test_an_online_pass_cost_is_refused_under_tensor_parallelism():
    """Ranks of a TP group must draft alike (vLLM schedules each rank's shard the same):
    drafts sized by each rank's own measured seconds would not."""
    from pipeline.config.load import ConfigError, load_config

    base = ["spec.method=history+group", "spec.budget=critical", "rollout.tensor_parallel_size=2"]
    assert load_config(None, base).spec.pass_cost == "fixed"
    with pytest.raises(ConfigError) as err:
        load_config(None, base + ["spec.pass_cost=online"])
    assert ("spec.pass_cost = online with rollout.tensor_parallel_size = 2: each rank of a "
            "tensor-parallel group would size drafts by its own measured seconds, and ranks "
            "that schedule different tokens hang in their collectives; use "
            "spec.pass_cost=fixed") in str(err.value)
    assert load_config(None, base[:2] + ["spec.pass_cost=online"]).spec.pass_cost == "online"


@pytest.mark.parametrize("device", ["cuda", "auto"])
def test_a_draft_model_on_a_gpu_is_refused_under_tensor_parallelism(device):
    """Every rank trains its own draft model: on the CPU bit for bit alike, on a GPU not
    promised, and ranks that draft differently hang."""
    from pipeline.config.load import ConfigError, load_config

    base = ["spec.method=history+group+model", "rollout.tensor_parallel_size=2"]
    assert load_config(None, base).spec.draft_device == "cpu"
    with pytest.raises(ConfigError) as err:
        load_config(None, base + [f"spec.draft_device={device}"])
    assert (f"spec.draft_device = {device} with rollout.tensor_parallel_size = 2" in
            str(err.value)) and "use spec.draft_device=cpu" in str(err.value)
    assert load_config(None, base[:1] + [f"spec.draft_device={device}"]).spec.draft_device == device
