"""The flat buffers of the distributed optimizer (runtime/parallel/distributed_optimizer.py): one per
reduction group, holding the model's compute-dtype parameters as views, the main gradients (fp32, or the
plan's grad_dtype), and this rank's shards of the fp32 master weights and Adam's m and v, split into buckets
in backward order.

A bucket is the unit of gradient reduction (all-reduce or reduce-scatter) and of the parameter all-gather;
each is padded to a multiple of 64 x (ranks of the group), so that every rank's shard is equally long.
Inside a bucket the weight-decayed matrices come first, so each shard has at most one decayed and one
undecayed segment. The runs of MoE expert weights (`stack_run`, runtime/parallel/expert.py) lie back to
back, so the grouped GEMMs take them and their gradients as one view.
"""
from __future__ import annotations

import math

import torch
import torch.nn as nn

from runtime.parallel.tensor import group_rank, group_size


def counts_in_grad_norm(p: nn.Parameter, tp_rank: int) -> bool:
    """Whether this rank adds p's gradient to the global norm, so that every logical parameter counts once:
    TP-sharded ones on every TP rank, replicated ones on TP rank 0 only, the last pipeline stage's copy of a
    tied embedding never."""
    return (p.tp_dim is not None or tp_rank == 0) and not getattr(p, "tied_copy", False)



def squared_norm(views: list, device) -> torch.Tensor:
    """Sum of squares of the tensors in `views` (fp32 accumulation, any gradient precision), one foreach pass; a
    0-d zero for none."""
    if not views:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.stack(torch._foreach_norm(views, 2.0, dtype=torch.float32)).square().sum()



def complement(segments: list, size: int) -> list:
    """The parts of [0, size) not covered by the sorted, disjoint segments."""
    out, pos = [], 0
    for a, z in segments:
        if a > pos:
            out.append((pos, a))
        pos = z
    if pos < size:
        out.append((pos, size))
    return out


def add_segment(segs: list, a: int, z: int) -> None:
    if segs and segs[-1][1] == a:
        segs[-1] = (segs[-1][0], z)
    else:
        segs.append((a, z))


class Bucket:
    def __init__(self, index, start, end, params):
        self.index, self.start, self.end, self.params = index, start, end, params
        self.pending = len(params)
        self.work = None
        self.full = None  # ZeRO-2: this micro-batch's full fp32 gradient of the bucket
        self.out = None   # ZeRO-2: the reduce-scatter output (ZeRO-1 reduces in place)
        self.sq = None    # squared norm of the bucket's counted gradient, taken beside backward (no DP group)

    @property
    def size(self):
        return self.end - self.start


def runs_together(params: list) -> list:
    """params with each run of MoE expert weights (`stack_run`, runtime/parallel/expert.py) moved back to back
    in `stack_index` order where the run's first member stood: the grouped GEMMs then read the weights, and
    write their gradients, as one view of the flat buffers instead of a stacked copy per use."""
    slots, runs = [], {}
    for p in params:
        key = getattr(p, "stack_run", None)
        if key is None:
            slots.append([p])
        elif key in runs:
            runs[key].append(p)
        else:
            runs[key] = [p]
            slots.append(runs[key])
    return [p for slot in slots for p in sorted(slot, key=lambda q: getattr(q, "stack_index", 0))]


class FlatBuffer:
    """One reduction group's flat parameter / gradient / optimizer storage."""

    def __init__(self, named, group, sharding, tp_group, device, bucket_elems, compute_dtype, grad_dtype):
        self.group, self.sharding, self.tp_group, self.grad_dtype = group, sharding, tp_group, grad_dtype
        n = group_size(group)
        self.n = n if sharding != "none" else 1  # shards of master / Adam state
        self.r = group_rank(group) if sharding != "none" else 0
        self.params = runs_together([p for _, p in reversed(named)])  # backward order, roughly
        self.offset, self.bucket_of, self.buckets = {}, {}, []
        start = pos = 0
        current = []
        align = max(n, 1) * 64
        # ZeRO-2 keeps whole buckets of gradients in flight (planner/memory/model.py bounds them by bucket_elems plus
        # the largest parameter): there a run may be cut, and its grouped GEMMs then stack a copy
        keep_runs = sharding != "optimizer+grads"
        for i, p in enumerate(self.params):
            pos += p.numel()
            current.append(p)
            nxt = self.params[i + 1] if i + 1 < len(self.params) else None
            inside_run = keep_runs and nxt is not None and getattr(p, "stack_run", None) is not None \
                and getattr(nxt, "stack_run", None) is p.stack_run
            if (pos - start >= bucket_elems and not inside_run) or nxt is None:
                # inside a bucket the weight-decayed matrices come first: each shard then has at most one
                # decayed and one undecayed segment (two optimizer kernel launches)
                current.sort(key=lambda q: q.dim() < 2)
                o = start
                for q in current:
                    self.offset[q] = o
                    o += q.numel()
                end = start + math.ceil((pos - start) / align) * align
                b = Bucket(len(self.buckets), start, end, current)
                self.buckets.append(b)
                for q in current:
                    self.bucket_of[q] = b
                start = pos = end
                current = []
        self.total = pos
        # fp32 master shards straight from the initial (fp32) parameters, then the compute-dtype flat buffer
        # that the parameters become views of; no full-size fp32 copy ever exists besides the originals
        # (so a 6.7B model builds within one 141 GB GPU)
        master_of = []
        for b in self.buckets:
            size = b.size // self.n
            lo = b.start + self.r * size
            master = torch.zeros(size, dtype=torch.float32, device=device)
            for p in b.params:
                a, z = max(self.offset[p], lo), min(self.offset[p] + p.numel(), lo + size)
                if a < z:
                    o = self.offset[p]
                    master[a - lo:z - lo].copy_(p.data.reshape(-1)[a - o:z - o])
            master_of.append(master)
        self.param_data = torch.zeros(self.total, dtype=compute_dtype, device=device)
        for p in self.params:
            o = self.offset[p]
            self.param_data[o:o + p.numel()].copy_(p.data.reshape(-1))
            p.data = self.param_data[o:o + p.numel()].view_as(p)
        zero2 = sharding == "optimizer+grads"
        self.main_grad = None if zero2 else torch.zeros(self.total, dtype=grad_dtype, device=device)
        for p in self.params:  # gradient-accumulation fusion (runtime/parallel/tensor.py: weight_grad)
            if self.main_grad is not None and getattr(p, "wgrad_fusable", False):
                p.main_grad = self.main_grad[self.offset[p]:self.offset[p] + p.numel()].view_as(p)
            elif hasattr(p, "main_grad"):
                del p.main_grad
        # what zero_grad clears: everything but the fused weights' views (their first GEMM overwrites them)
        self.fusable = [p for p in self.params if hasattr(p, "main_grad")]
        self.zero_views = []
        if self.main_grad is not None:
            taken = sorted((self.offset[p], self.offset[p] + p.numel()) for p in self.fusable)
            self.zero_views = [self.main_grad[a:z] for a, z in complement(taken, self.total)]
        # per bucket: this rank's shard [lo, hi) in buffer coordinates, and its optimizer tensors
        tp_rank = group_rank(tp_group)
        self.shard, self.master, self.m, self.v, self.grad_shard, self.decay, self.counted = [], [], [], [], [], [], []
        for b in self.buckets:
            size = b.size // self.n
            lo = b.start + self.r * size
            self.shard.append((lo, lo + size))
            self.master.append(master_of[b.index])
            self.m.append(torch.zeros(size, device=device))
            self.v.append(torch.zeros(size, device=device))
            self.grad_shard.append(torch.zeros(size, device=device) if zero2 else None)
            # segments [a, z) of the shard (no per-element masks: they would cost memory per parameter)
            decay, counted = [], []
            for p in b.params:
                a, z = max(self.offset[p], lo), min(self.offset[p] + p.numel(), lo + size)
                if a < z:
                    if p.dim() >= 2:
                        add_segment(decay, a - lo, z - lo)
                    if counts_in_grad_norm(p, tp_rank):
                        add_segment(counted, a - lo, z - lo)
            self.decay.append(decay)
            self.counted.append(counted)

    def grad_view(self, p):
        o = self.offset[p]
        if self.main_grad is not None:
            return self.main_grad[o:o + p.numel()]
        b = self.bucket_of[p]
        if b.full is None:
            b.full = torch.zeros(b.size, dtype=self.grad_dtype, device=self.param_data.device)
        return b.full[o - b.start:o - b.start + p.numel()]

    def shard_grad(self, i):
        if self.grad_shard[i] is not None:
            return self.grad_shard[i]
        lo, hi = self.shard[i]
        return self.main_grad[lo:hi]
