"""Rank order tp -> cp -> dp -> pp, and expert groups inside dp x cp, as the planner assumes."""
import torch.distributed as dist

from planner.plan import Layout
from runtime.mesh import build_groups, coordinates, expert_rank_lists
from tests.runtime.dist_util import run_workers


def test_coordinates_follow_the_planner_order():
    lay = Layout(tp=2, cp=2, dp=2, pp=2, ep=2)
    for rank in range(16):
        c = coordinates(rank, lay)
        assert rank == c["tp_rank"] + 2 * (c["cp_rank"] + 2 * (c["dp_rank"] + 2 * c["pp_rank"]))
    ep, edp = expert_rank_lists(Layout(tp=2, cp=1, dp=4, pp=1, ep=2))
    assert [0, 2] in ep and [4, 6] in ep and [1, 3] in ep
    assert [0, 4] in edp and [2, 6] in edp


def _groups_worker(rank, world, layouts):
    out = []
    for kw in layouts:
        g = build_groups(Layout(**kw), "cpu")
        ranks = {name: dist.get_process_group_ranks(getattr(g, name)) for name in
                 ("tp", "cp", "dp", "pp", "dp_cp", "ep", "expert_dp") if getattr(g, name) is not None}
        out.append(_gather(ranks))
    return out


def _gather(obj):
    objs = [None] * dist.get_world_size()
    dist.all_gather_object(objs, obj)
    return objs


def test_groups_on_eight_ranks():
    layouts = [dict(tp=2, cp=2, dp=2, ep=2), dict(tp=2, dp=2, pp=2)]
    per_layout = run_workers(_groups_worker, 8, layouts)
    for kw, per_rank in zip(layouts, per_layout):
        lay = Layout(**kw)
        for rank, groups in enumerate(per_rank):
            c = coordinates(rank, lay)
            assert groups["tp"] == [r for r in range(8) if r // lay.tp == rank // lay.tp]
            same = lambda r, keys: all(coordinates(r, lay)[k] == c[k] for k in keys)  # noqa: E731
            assert groups["dp"] == [r for r in range(8) if same(r, ("tp_rank", "cp_rank", "pp_rank"))]
            assert groups["cp"] == [r for r in range(8) if same(r, ("tp_rank", "dp_rank", "pp_rank"))]
            assert groups["pp"] == [r for r in range(8) if same(r, ("tp_rank", "cp_rank", "dp_rank"))]
            assert groups["dp_cp"] == [r for r in range(8) if same(r, ("tp_rank", "pp_rank"))]
            if lay.ep > 1:
                assert groups["ep"] == [r for r in groups["dp_cp"] if same(r, ("expert_dp_rank",))]
                assert groups["expert_dp"] == [r for r in groups["dp_cp"] if same(r, ("ep_rank",))]
