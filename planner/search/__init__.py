"""The search: enumerate legal parallel degrees, prune by a lower bound, and let OR-Tools CP-SAT decide
the integer inside of each surviving layout: how many layers each (virtual) pipeline stage holds and how
many of them recompute fully or selectively, minimising the pipeline's step time within every rank's memory.

Outer loop (branch and bound): every legal (tp, cp, pp, vpp, dp, ep, micro-batch, sharding) is given a
lower bound on its step time (perfect balance, no recompute) and a lower bound on its memory (full
recompute everywhere, perfect balance). Layouts whose memory bound exceeds the limit are dropped; the
rest are taken in order of their time bound. By default the LEADERS (driver.py) layouts a cheap score ranks
first are evaluated exactly and the best of them is the first plan, whatever top_k (the layouts left out whose
bound is below it are counted: the report says whether it is proven); with exact=True (`--exact`) every layout
whose bound is below the best found is evaluated, until the next bound is no better. Layouts of at most
stages.ENUMERATE_CHOICES split x recompute choices play every choice instead of CP-SAT's. With pins, the user
fixes any of the degrees and the search does the rest.

Inner problem (exact, CP-SAT): integer variables per virtual stage j: layers n_j >= 1, full-recompute
layers f_j and selective layers s_j with f_j + s_j <= n_j; rank time
T_r = sum_{j on r} (n_j * t_layer + f_j * t_full + s_j * t_sel) + ends_r; rank memory linear in the same
variables with each chunk's in-flight micro-batch count (the schedule's in-flight peaks); objective the
schedule's closed form of the T_r in whole numbers (PipelineSchedule.objective_weights: for 1F1B and interleaved
1F1B (m*v - 1) * max_r T_r + sum_r T_r, v times their closed-form step). Times are integers in microseconds,
memory in KiB rounded up (so rounding never lets a plan past the limit).

Modules: result (Pins, SearchStats, SearchResult, Alternative), layouts (enumeration of candidate layouts), stages
(the greedy split and the CP-SAT model of a layout's stages), scoring (candidates scored by bounds and greedy
splits; the Plan of one), driver (`search`, the branch and bound), alternatives (`plan --why-not`: each other kind
of layout's best plan and where it loses time).
"""
from planner.search.driver import search
from planner.search.layouts import enumerate_layouts
from planner.search.result import Alternative, Pins, SearchResult, SearchStats
from planner.search.scoring import plan_provenance
from planner.search.stages import greedy_stages, solve_stages

__all__ = ["Alternative", "Pins", "SearchResult", "SearchStats", "enumerate_layouts", "greedy_stages",
           "plan_provenance", "search", "solve_stages"]
