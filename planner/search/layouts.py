"""Enumeration of candidate layouts: every (tp, cp, pp, vpp, dp, ep, micro-batch, sharding, recompute pin) the
cluster and the user's pins allow; planner/legality.py then filters them. Virtual stages run up to layers / pp
(one layer per virtual stage); the schedules' own rules (planner/schedules/) decide which of those can run."""
from __future__ import annotations


from planner.cluster import ClusterSpec
from planner.legality import SHARDING_LEVELS, cuda_graph_violation
from planner.model import ModelSpec
from planner.plan import Layout, TrainingShape
from planner.search.result import Pins


MAX_MICRO_BATCH = 16

EVEN_SPLIT_VPP_ABOVE = 8
"""Virtual stages per pipeline rank searched whatever the split: 1 to this. Above it the search takes only the
counts that split the layers evenly (layers divisible by pp * vpp, down to one layer per virtual stage), the
layouts interleaved runs use at that depth (Nemotron-4 340B: 96 layers, PP 8, 12 virtual stages); uneven splits
there add many candidates and little throughput, and keep the search inside its plan-speed bars
(benchmarks/plan_speed.py)."""


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _pow2_upto(n: int) -> list[int]:
    out, x = [], 1
    while x <= n:
        out.append(x)
        x *= 2
    return out


def _virtual_stage_counts(layers: int, pp: int) -> list[int]:
    """The virtual-stage counts searched at pipeline depth pp: every count up to EVEN_SPLIT_VPP_ABOVE, and above it
    those that give every virtual stage the same whole number of layers; at most layers / pp."""
    return [v for v in range(1, layers // pp + 1) if v <= EVEN_SPLIT_VPP_ABOVE or layers % (pp * v) == 0]


def enumerate_layouts(model: ModelSpec, shape: TrainingShape, cluster: ClusterSpec, pins: Pins):
    """All layouts the rules allow (overlap switches on: in this cost model overlap never costs time)."""
    n = cluster.num_gpus
    tps = [pins.tp] if pins.tp else _pow2_upto(min(cluster.gpus_per_node, n))
    for tp in tps:
        cps = [pins.cp] if pins.cp else _pow2_upto(n // tp)
        for cp in cps:
            if n % (tp * cp):
                continue
            rest = n // (tp * cp)
            pps = [pins.pp] if pins.pp else [p for p in _divisors(rest) if p <= model.num_layers]
            for pp in pps:
                if rest % pp:
                    continue
                dp = rest // pp
                if pins.dp and pins.dp != dp:
                    continue
                vpps = [pins.vpp] if pins.vpp else ([1] if pp == 1 else _virtual_stage_counts(model.num_layers, pp))
                eps = [pins.ep] if pins.ep else [e for e in _divisors(model.num_experts) if (dp * cp) % e == 0]
                if shape.global_batch % dp:
                    mbs = [pins.micro_batch] if pins.micro_batch else []
                else:
                    per_replica = shape.global_batch // dp
                    mbs = [pins.micro_batch] if pins.micro_batch else \
                        [b for b in _divisors(per_replica) if b <= MAX_MICRO_BATCH]
                # with several data-parallel ranks, 'none' (plain DDP) is dominated by 'optimizer': the
                # distributed optimizer moves fewer bytes (fp32 reduce-scatter + bf16 all-gather against
                # an fp32 all-reduce), steps a smaller shard and holds less memory; it pays one more
                # collective latency (tens of microseconds a step), so 'none' is searched only when pinned
                shards = [pins.sharding] if pins.sharding else \
                    (["none"] if dp * cp == 1 else [s for s in SHARDING_LEVELS if s != "none"])
                for vpp in vpps:
                    for ep in eps:
                        for mb in mbs:
                            for sh in shards:
                                kw = dict(tp=tp, pp=pp, vpp=vpp, dp=dp, cp=cp, ep=ep, micro_batch=mb, sharding=sh,
                                          overlap_tp="tp" not in pins.no_overlap, overlap_dp="dp" not in pins.no_overlap,
                                          overlap_pp="pp" not in pins.no_overlap, fp8=pins.fp8,
                                          grad_dtype=pins.grad_dtype)
                                lay = Layout(**kw)
                                if pins.cuda_graph and cuda_graph_violation(model, lay, cluster.gpu) is None:
                                    lay = Layout(**kw, cuda_graph=True)  # (dataclasses.replace is 5x slower)
                                yield lay
