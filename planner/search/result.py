"""What a search is asked (Pins) and what it returns (SearchResult: plans, alternatives, SearchStats)."""
from __future__ import annotations

from dataclasses import dataclass, field

from planner.plan import Plan


@dataclass(frozen=True)
class Pins:
    """Dimensions the user fixed; None leaves them to the search."""

    tp: int | None = None
    pp: int | None = None
    vpp: int | None = None
    dp: int | None = None
    cp: int | None = None
    ep: int | None = None
    micro_batch: int | None = None
    sharding: str | None = None
    recompute: str | None = None
    """none / selective / full for every layer, or None to let the search choose per stage."""
    fp8: bool = False
    """Plan the transformer layers' GEMMs in FP8 (every layout searched uses it)."""
    grad_dtype: str = "fp32"
    """Main-gradient precision of every layout searched (Layout.grad_dtype): a numerics choice, not searched."""
    no_overlap: frozenset = frozenset()
    """Dimensions ('tp', 'dp', 'pp') whose communication must not be overlapped with compute; the search
    otherwise turns every overlap on (in this cost model overlap never costs time)."""
    cuda_graph: bool = True
    """Capture the step as a CUDA graph wherever that is legal on a GPU (Layout.cuda_graph); it removes the
    host's time and costs nothing, so it is not a searched choice. False: every plan runs eagerly."""

    def every_dimension(self, model) -> bool:
        """Whether the pins leave the search no choice of layout: every degree, the micro-batch, the sharding level
        and the recompute mode given, and the virtual stages where there is a pipeline, the EP degree where the
        model has experts (what is left is the layer split, which a pinned recompute mode makes a balance)."""
        given = all(v is not None for v in (self.tp, self.pp, self.dp, self.cp, self.micro_batch, self.sharding,
                                             self.recompute))
        return given and (self.vpp is not None or self.pp == 1) and (self.ep is not None or not model.is_moe)


@dataclass
class SearchStats:
    layouts_enumerated: int = 0
    layouts_legal: int = 0
    layouts_bounded: int = 0
    """Legal layouts whose full bounds were worked out (the rest were ruled out by their compute bound)."""
    layouts_fit_bound: int = 0
    """Of those, the layouts within the memory bound."""
    layouts_greedy: int = 0
    layouts_solved: int = 0
    proven_optimal: int = 0
    cpsat_variables: int = 0
    gap_to_bound: float = 0.0
    """How far the first plan may be above the best plan of every layout: its step over the lowest bound of the
    layouts not evaluated exactly whose bound is below it, less one (0 when proven)."""
    phase_s: dict = field(default_factory=dict)
    exact: bool = False
    """search(exact=True): every layout whose bound is below the best step evaluated exactly."""
    unevaluated_below_best: int = 0
    """Default search: layouts not evaluated exactly whose lower bound is below the first plan's step (0: proven)."""
    faster_runner_up: bool = False
    """A runner-up (top_k beyond the evaluated leaders) plays faster than the first plan; it stays behind it."""
    first_split_proven: bool = True
    """Whether the first plan's layer split and recompute are proven the best of its layout: every choice played,
    or CP-SAT's solve ended optimal (after a second solve at FIRST_SOLVE_WORK where the first did not)."""

    @property
    def optimality(self) -> str:
        """Whether the first plan is proven the best of every legal layout, in one phrase."""
        split = "its layer split is CP-SAT's best within its work limit, not proven optimal"
        if self.exact or (not self.unevaluated_below_best and not self.faster_runner_up):
            return "proven" if self.first_split_proven else f"layout proven; {split}"
        n = self.unevaluated_below_best
        return (f"not proven: {n} layout{'s' if n != 1 else ''} with a lower bound below the best "
                f"{'were' if n != 1 else 'was'} not evaluated (use --exact)"
                + ("" if self.first_split_proven else f"; {split}"))


@dataclass
class Alternative:
    """The best plan of a kind the recommended one is not (another TP degree, no pipeline, another sharding
    level, ...): what a user comparing against a familiar configuration asks about."""

    label: str
    """What differs from the recommended layout, e.g. 'TP 8' or 'no pipeline (PP 1)'."""
    plan: Plan | None
    """Its best layout with its greedy split, the schedule played; None when none of its layouts fits."""
    why: str
    """Where it loses time against the recommended plan, or why none of its layouts fits."""


@dataclass
class SearchResult:
    plans: list[Plan]
    stats: SearchStats
    alternatives: list[Alternative] = field(default_factory=list)
    pinned: bool = False
    """Every dimension was pinned (Pins.every_dimension): the one layout given, evaluated as given; no search."""
    """With search(alternatives=True): the best plan of each kind of layout the first plan is not."""


PINNED_NOTE = ("pinned: every dimension given; this layout evaluated as given (its layers split over the stages by "
               "CP-SAT), no other layout searched")
