"""The micro-batches the runtime's pipeline step keeps at once, against the planner's memory count: the order each
rank runs its actions in, as runtime/parallel/pipeline.py dispatches them (the ticks of `simulate`, which posts
the transfers around them), replayed with train_step's bookkeeping (a forward stores (chunk, micro-batch) in
`saved`, its backward pops it)."""
from __future__ import annotations

import pytest

from planner import memory as mem
from planner.plan import Layout
from runtime.parallel.pipeline import simulate


@pytest.mark.parametrize("pp,v,m", [(2, 1, 5), (4, 1, 8), (2, 2, 4), (2, 3, 6), (4, 2, 8), (4, 5, 8), (3, 4, 9),
                                    (8, 6, 16)])
def test_runtime_dispatch_keeps_what_the_planner_counts(pp, v, m):
    ticks, _ = simulate(pp, v, m)
    for r in range(pp):
        saved: set[tuple[int, int]] = set()
        most = 0
        for _, a in ticks[r]:
            if a.kind == "F":
                saved.add((a.chunk, a.mb))
            else:
                saved.remove((a.chunk, a.mb))
            most = max(most, len(saved))
        assert not saved
        assert most == max(map(sum, mem.in_flight_peaks(r, Layout(pp=pp, vpp=v), m))), (pp, v, m, r)
