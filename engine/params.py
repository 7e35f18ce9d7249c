"""Generation parameters: what the user can change between (or during) answers."""
from __future__ import annotations

from dataclasses import dataclass, field

from .errors import ConfigError

MAX_BUDGET = 1024
MAX_WIDTH = 64
MAX_DEPTH = 64  # no head drafts deeper (block sizes are 16 or less); a parse-time bound
# The tree algorithms by name; tree.TREE_BUILDERS maps each to its builder (and imports torch).
TREE_ALGOS = ("accum_logp", "chain", "adaptive")
GPU_BUDGET = 64  # engine bench, 1.5B on an H200: budget 64 is the fastest (README)
CPU_BUDGET = 4  # the verify forward is compute-bound on a CPU: 4 beats AR there, 64 does not (docs/performance.md)
# Per-depth top-K candidates. 1.5B + shipped head on an H200, bf16 (docs/training.md): 32
# drafts 2-3% more tokens a round than 8 at budget 64 and 5% more at 256, at the same round time;
# a tree of at most 9 nodes (the CPU's budget 4) is the same at either width.
DEFAULT_WIDTH = 32


# The budgets a comparison runs by default (0 = plain AR): on a GPU the verify forward costs about
# one AR step up to ~64 nodes, so the curve is worth seeing up to 256; on a CPU it is
# compute-bound and speculation pays only at small budgets (2-8), and a 256-node tree of the 1.5B
# takes minutes there.
GPU_COMPARE_BUDGETS = (0, 16, 32, 64, 128, 256)
CPU_COMPARE_BUDGETS = (0, 2, 4, 8, 16)


def auto_budget(device: str) -> int:
    """The default budget for `device` (app and `generate`) when the user has not chosen one."""
    return GPU_BUDGET if device.startswith("cuda") else CPU_BUDGET


def auto_compare_budgets(device: str) -> tuple[int, ...]:
    """The budgets a comparison on `device` runs unless the user has chosen a list (0 = AR)."""
    return GPU_COMPARE_BUDGETS if device.startswith("cuda") else CPU_COMPARE_BUDGETS


def check_head_depth(depth: int | None, max_depth: int | None) -> None:
    """A tree depth must not exceed what the draft head drafts (None: no depth or no head)."""
    if depth is not None and max_depth is not None and depth > max_depth:
        raise ConfigError(f"depth {depth} exceeds what the draft head drafts (block_size - 1 = {max_depth})")


@dataclass(frozen=True)
class SpecParams:
    """Shape of the draft tree. `depth=None` means the head's full block (block_size - 1)."""

    budget: int = 64  # max tree nodes including the root (the anchor)
    depth: int | None = None
    width: int = DEFAULT_WIDTH  # per-depth top-K candidates
    tree_algo: str = "accum_logp"
    enabled: bool = True  # False: plain autoregressive decoding on the same engine

    def validate(self, max_depth: int | None) -> None:
        if not 1 <= self.budget <= MAX_BUDGET:
            raise ConfigError(f"budget must be between 1 and {MAX_BUDGET}, got {self.budget}")
        if not 1 <= self.width <= MAX_WIDTH:
            raise ConfigError(f"width must be between 1 and {MAX_WIDTH}, got {self.width}")
        if self.depth is not None and not 1 <= self.depth <= MAX_DEPTH:
            raise ConfigError(f"depth must be between 1 and {MAX_DEPTH}, got {self.depth}")
        check_head_depth(self.depth, max_depth)
        if self.tree_algo not in TREE_ALGOS:
            raise ConfigError(
                f"unknown tree algorithm {self.tree_algo!r}; choose one of {', '.join(sorted(TREE_ALGOS))}"
            )


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 means greedy. top_k 0 and top_p 1.0 disable those filters."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0.0

    def validate(self) -> None:
        if self.temperature < 0:
            raise ConfigError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k must be >= 0, got {self.top_k}")


@dataclass(frozen=True)
class GenerationParams:
    max_new_tokens: int = 512
    stop: tuple[str, ...] = ()
    spec: SpecParams = field(default_factory=SpecParams)
    sampling: SamplingParams = field(default_factory=SamplingParams)

    def validate(self, max_depth: int | None) -> None:
        if self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be at least 1, got {self.max_new_tokens}")
        if self.spec.enabled:
            self.spec.validate(max_depth)
        self.sampling.validate()
