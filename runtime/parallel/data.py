"""Data parallelism over the dp*cp group, at the planner's four sharding levels, with AdamW.

  none             every rank keeps fp32 master weights, Adam m and v; gradients all-reduced (DDP)
  optimizer        the distributed optimizer (ZeRO-1): master, m, v sharded over dp*cp; gradients
                   reduce-scattered; updated parameters all-gathered after the step
  optimizer+grads  ZeRO-2: also the accumulated fp32 gradient is sharded; each bucket's full-size fp32
                   gradient lives only until its reduce-scatter is done (so it reduce-scatters after every
                   micro-batch, as DeepSpeed ZeRO-2 does: there is no full gradient to accumulate into)
  full             FSDP2 (`torch.distributed.fsdp.fully_shard`, PyTorch's): parameters too, gathered per
                   layer ahead of use and freed after

Ours for the first three (as Megatron-Core's DistributedDataParallel + DistributedOptimizer): the model's
parameters (bf16 on GPU) are views into one flat buffer per reduction group, split into buckets in
backward order. A post-accumulate-grad hook adds each parameter's gradient into an fp32 main-grad buffer
(fp32 accumulation over micro-batches) and frees the low-precision one; when the last micro-batch has
filled a bucket, its reduction is launched asynchronously while backward continues. After the step,
parameter all-gathers are launched for every bucket and each module's forward pre-hook waits only for the
buckets of its own parameters, so the gather overlaps the next forward.

Memory per parameter (what the planner counts): compute-dtype weight (2 B bf16) + main grad (4 B fp32, or 2 B
with grad_dtype bf16; ZeRO-2 keeps an fp32 shard, /n, plus the in-flight buckets) + fp32 master (4 B, /n when
sharded) + Adam m, v (8 B, /n). The main gradients' precision is also that of their reduction (the plan's
Layout.grad_dtype: Megatron-Core's grad_reduce_in_fp32 on or off).
Loss convention: each micro-batch loss is a sum divided by the labelled tokens of the global batch, so
gradients are SUMMED (not averaged) over dp*cp.
Sequence-parallel parameters (p.sequence_parallel) get their partial gradients all-reduced over TP first.
Expert parameters (p.expert, MoE) reduce over the expert-data-parallel group in a buffer of their own.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn as nn

from planner.lr_schedule import ADAM_BETAS, ADAM_EPS, DEFAULT_CLIP_GRAD, DEFAULT_PEAK_LR, DEFAULT_WEIGHT_DECAY
from runtime.parallel.adamw import Segment, adamw_, adamw_scalars, write_scalars
from runtime.triton_support import use_triton
from runtime.parallel.tensor import group_rank, group_size, param_meta, restore_param_meta

_ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


GRAD_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
"""The plan's Layout.grad_dtype names -> torch dtypes (on CPU too: the plan's numerics are kept exactly)."""


class AdamConfig:
    """AdamW's settings (defaults: planner/lr_schedule.py, where `plan launch`'s options are declared)."""

    def __init__(self, lr=DEFAULT_PEAK_LR, betas=ADAM_BETAS, eps=ADAM_EPS, weight_decay=DEFAULT_WEIGHT_DECAY,
                 grad_clip=DEFAULT_CLIP_GRAD):
        self.lr, self.betas, self.eps, self.weight_decay, self.grad_clip = lr, betas, eps, weight_decay, grad_clip


def counts_in_grad_norm(p: nn.Parameter, tp_rank: int) -> bool:
    """Whether this rank adds p's gradient to the global norm, so that every logical parameter counts once:
    TP-sharded ones on every TP rank, replicated ones on TP rank 0 only, the last pipeline stage's copy of a
    tied embedding never."""
    return (p.tp_dim is not None or tp_rank == 0) and not getattr(p, "tied_copy", False)


def _squared_norm(views: list, device) -> torch.Tensor:
    """Sum of squares of the tensors in `views` (fp32 accumulation, any gradient precision), one foreach pass; a
    0-d zero for none."""
    if not views:
        return torch.zeros((), dtype=torch.float32, device=device)
    return torch.stack(torch._foreach_norm(views, 2.0, dtype=torch.float32)).square().sum()


def _complement(segments: list, size: int) -> list:
    """The parts of [0, size) not covered by the sorted, disjoint segments."""
    out, pos = [], 0
    for a, z in segments:
        if a > pos:
            out.append((pos, a))
        pos = z
    if pos < size:
        out.append((pos, size))
    return out


def _add_segment(segs: list, a: int, z: int) -> None:
    if segs and segs[-1][1] == a:
        segs[-1] = (segs[-1][0], z)
    else:
        segs.append((a, z))


class _Bucket:
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


def _runs_together(params: list) -> list:
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


class _Buffer:
    """One reduction group's flat parameter / gradient / optimizer storage."""

    def __init__(self, named, group, sharding, tp_group, device, bucket_elems, compute_dtype, grad_dtype):
        self.group, self.sharding, self.tp_group, self.grad_dtype = group, sharding, tp_group, grad_dtype
        n = group_size(group)
        self.n = n if sharding != "none" else 1  # shards of master / Adam state
        self.r = group_rank(group) if sharding != "none" else 0
        self.params = _runs_together([p for _, p in reversed(named)])  # backward order, roughly
        self.offset, self.bucket_of, self.buckets = {}, {}, []
        start = pos = 0
        current = []
        align = max(n, 1) * 64
        # ZeRO-2 keeps whole buckets of gradients in flight (planner/memory.py bounds them by bucket_elems plus
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
                b = _Bucket(len(self.buckets), start, end, current)
                self.buckets.append(b)
                for q in current:
                    self.bucket_of[q] = b
                start = pos = end
                current = []
        self.total = pos
        # fp32 master shards straight from the initial (fp32) parameters, then the compute-dtype flat buffer
        # that the parameters become views of; no full-size fp32 copy ever exists besides the originals
        # (a 6.7B model builds within one H200 this way)
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
            self.zero_views = [self.main_grad[a:z] for a, z in _complement(taken, self.total)]
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
                        _add_segment(decay, a - lo, z - lo)
                    if counts_in_grad_norm(p, tp_rank):
                        _add_segment(counted, a - lo, z - lo)
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


class DistributedOptimizer:
    """AdamW over flat buffers with sharding 'none', 'optimizer' or 'optimizer+grads' (see module doc).

    Per step:  zero_grad(); for each micro-batch: begin_micro_batch(last); loss.backward();
               finish_grads(); norm = clip_grad_norm(); step(lr)."""

    def __init__(self, modules: list[nn.Module], groups, sharding: str, cfg: AdamConfig | None = None,
                 compute_dtype=torch.float32, bucket_elems: int = 40_000_000, overlap: bool = True,
                 grad_dtype=torch.float32):
        assert sharding in ("none", "optimizer", "optimizer+grads")
        self.groups, self.sharding, self.cfg, self.overlap = groups, sharding, cfg or AdamConfig(), overlap
        self.compute_dtype = compute_dtype
        self.modules = modules
        named, seen = [], set()
        for mod in modules:
            for name, p in mod.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    named.append((name, p))
        self.names = {p: n for n, p in named}
        device = named[0][1].device
        dense = [(n, p) for n, p in named if not getattr(p, "expert", False)]
        expert = [(n, p) for n, p in named if getattr(p, "expert", False)]
        self.buffers = [_Buffer(dense, groups.dp_cp, sharding, groups.tp, device, bucket_elems, compute_dtype,
                                grad_dtype)]
        if expert:
            self.buffers.append(_Buffer(expert, groups.expert_dp, sharding, groups.tp, device, bucket_elems,
                                        compute_dtype, grad_dtype))
        self.buffer_of = {p: buf for buf in self.buffers for p in buf.params}
        self.sync = True
        self.inflight: list[tuple[_Buffer, _Bucket]] = []
        self.pending_gathers: dict[int, tuple] = {}
        self.step_count = 0
        self._segs, self._norm_views, self._step_t, self._grad_divisor = None, None, None, None
        self._norm_stream = None  # CUDA side stream of the bucket norms taken while backward runs
        self._scalars, self._lr = None, self.cfg.lr
        self.captured = False
        """True while runtime/graph.py captures a step: step() leaves counting and all-gathers to the replay."""
        self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for buf in self.buffers for p in buf.params]
        self._hooks += [m.register_forward_pre_hook(self._wait_params_of) for mod in modules for m in mod.modules()
                        if any(True for _ in m.parameters(recurse=False))]

    def close(self):
        """Detach from the model: remove the hooks and main_grad views. The hooks live in C++ autograd state,
        where Python's garbage collector cannot see the optimizer <-> parameter cycle; without this a
        worker that trains several plans in a row would keep every earlier plan's memory."""
        self.wait_params()
        for h in self._hooks:
            h.remove()
        self._hooks = []
        for buf in self.buffers:
            for p in buf.params:
                if hasattr(p, "main_grad"):
                    del p.main_grad

    # -- gradients ---------------------------------------------------------------------------------
    def zero_grad(self):
        for buf in self.buffers:
            if buf.main_grad is not None:
                if buf.zero_views:  # empty when every parameter of the buffer writes its main_grad itself
                    torch._foreach_zero_(buf.zero_views)
                for p in buf.fusable:  # overwritten by their first weight-gradient GEMM (tensor.weight_grad)
                    p.main_grad_fresh = True
            for g in buf.grad_shard:
                if g is not None:
                    g.zero_()

    def begin_micro_batch(self, last: bool):
        """Gradients of non-last micro-batches only accumulate (ZeRO-2 reduces every micro-batch)."""
        self.sync = last or self.sharding == "optimizer+grads"
        while self.inflight:  # ZeRO-2: the previous micro-batch's last buckets are reused from here on
            self._complete_oldest()
        for buf in self.buffers:
            for b in buf.buckets:
                b.pending = len(b.params)

    def _on_grad(self, p):
        buf = self.buffer_of[p]
        if getattr(p, "grad_in_main_grad", False):  # the weight-gradient GEMM accumulated it already
            p.grad_in_main_grad = False
        elif getattr(p, "main_grad_fresh", False):  # not zeroed by zero_grad (a fused weight's view)
            buf.grad_view(p).copy_(p.grad.reshape(-1))
            p.main_grad_fresh = False
        else:
            buf.grad_view(p).add_(p.grad.reshape(-1))
        p.grad = None
        if not self.sync:
            return
        if getattr(p, "sequence_parallel", False) and group_size(self.groups.tp) > 1:
            dist.all_reduce(buf.grad_view(p), group=self.groups.tp)
        b = buf.bucket_of[p]
        b.pending -= 1
        if b.pending == 0:
            self._launch(buf, b)

    def _bucket_norm_views(self, k: int) -> list[list[torch.Tensor]]:
        """Per bucket of buffer k, the gradient pieces the global norm counts (TP-replicated ones on TP rank
        0): views into persistent buffers, built once, not every step."""
        if self._norm_views is None:
            self._norm_views = [[[buf.shard_grad(i)[a:z] for a, z in buf.counted[i]] for i in range(len(buf.buckets))]
                                for buf in self.buffers]
        return self._norm_views[k]

    def _norm_beside_backward(self, buf: _Buffer, b: _Bucket) -> None:
        """Without a data-parallel reduction a launched bucket's gradient is final: take its squared norm now,
        on a side stream, so this memory-bound pass runs under the rest of backward's GEMMs instead of after
        them (session 9: the norm took 1.5 ms of a 131 ms GPT 1.3B step, after backward)."""
        dev = buf.param_data.device
        if self._norm_stream is None:
            self._norm_stream = torch.cuda.Stream(device=dev)
        ready = torch.cuda.Event()
        ready.record()
        with torch.cuda.stream(self._norm_stream):
            self._norm_stream.wait_event(ready)
            views = self._bucket_norm_views(self.buffers.index(buf))[b.index]
            b.sq = _squared_norm(views, dev)

    def _launch(self, buf: _Buffer, b: _Bucket):
        b.pending = -1  # launched
        n = group_size(buf.group)
        if n == 1 and self.overlap and buf.param_data.is_cuda:
            self._norm_beside_backward(buf, b)
        if n > 1:
            if self.sharding == "none":
                b.work = dist.all_reduce(buf.main_grad[b.start:b.end], group=buf.group, async_op=True)
            else:
                if b.full is not None:  # ZeRO-2: into a new shard, added to the accumulated one when done
                    b.out = torch.empty(b.size // n, dtype=b.full.dtype, device=b.full.device)
                    b.work = _rs(b.out, b.full, group=buf.group, async_op=True)
                else:  # ZeRO-1: in place, the rank's own shard of the bucket receives the sum (NCCL's in-place
                    # reduce-scatter, output = input + rank * count, as Megatron-Core's distributed optimizer
                    # issues it): no output buffer, no copy back after backward
                    lo, hi = buf.shard[b.index]
                    b.work = _rs(buf.main_grad[lo:hi], buf.main_grad[b.start:b.end], group=buf.group, async_op=True)
        self.inflight.append((buf, b))
        if not self.overlap:
            self._complete_oldest()
        elif buf.main_grad is None:  # ZeRO-2: bound the full-size buckets alive at once
            while len(self.inflight) > 2:
                self._complete_oldest()

    def _complete_oldest(self):
        buf, b = self.inflight.pop(0)
        if b.work is not None:
            b.work.wait()
        b.work = None
        i = b.index
        if b.full is not None:   # ZeRO-2: accumulate the reduced shard, free the full bucket
            buf.grad_shard[i].add_(b.out if b.out is not None else b.full)
            b.full = None
        b.out = None

    def finish_grads(self):
        """After backward: launch buckets whose parameters got no gradient, wait for every reduction."""
        if self.sync:
            for buf in self.buffers:  # fused weights that got no gradient this step: zero, not last step's
                for p in buf.fusable:
                    if getattr(p, "main_grad_fresh", False):
                        p.main_grad.zero_()
                        p.main_grad_fresh = False
            for buf in self.buffers:
                for b in buf.buckets:
                    if b.pending > 0:
                        for p in b.params:
                            if getattr(p, "sequence_parallel", False) and group_size(self.groups.tp) > 1 \
                                    and p.grad is None and b.pending > 0:
                                dist.all_reduce(buf.grad_view(p), group=self.groups.tp)
                        self._launch(buf, b)
        while self.inflight:
            self._complete_oldest()

    # -- optimizer step ------------------------------------------------------------------------------
    def clip_grad_norm(self, max_norm: float | None = None) -> torch.Tensor:
        """Global gradient norm over all ranks (TP-replicated parameters counted once), as a 0-d tensor
        (no host synchronisation). Clipping is not a separate pass: `step` hands the clip factor to the
        fused AdamW kernel, which divides the gradients by it as it reads them."""
        max_norm = self.cfg.grad_clip if max_norm is None else max_norm
        dev = self.buffers[0].param_data.device
        total = torch.zeros((), dtype=torch.float32, device=dev)
        if self._norm_stream is not None:
            torch.cuda.current_stream().wait_stream(self._norm_stream)
        for k, buf in enumerate(self.buffers):
            if buf.buckets and all(b.sq is not None for b in buf.buckets):  # taken beside backward
                sq = torch.stack([b.sq for b in buf.buckets]).sum()
            else:
                views = [v for bucket in self._bucket_norm_views(k) for v in bucket]
                sq = _squared_norm(views, dev)
            for b in buf.buckets:
                b.sq = None
            if buf.n > 1:
                dist.all_reduce(sq, group=buf.group)
            if k > 0 and group_size(self.groups.ep) > 1:
                dist.all_reduce(sq, group=self.groups.ep)
            total += sq
        for g in (self.groups.tp, self.groups.pp):
            if group_size(g) > 1:
                dist.all_reduce(total, group=g)
        norm = total.sqrt()
        # grads are divided by this in the update: norm / max_norm when above max_norm, else 1
        self._grad_divisor = (norm / max_norm).clamp_min(1.0) if max_norm else None
        return norm

    def _segments(self) -> list[Segment]:
        """The contiguous pieces of every local shard the AdamW kernel updates (views into persistent buffers,
        built once): per bucket the decayed matrices, then the rest (vectors and alignment padding)."""
        if self._segs is None:
            self._segs = []
            for buf in self.buffers:
                for i in range(len(buf.buckets)):
                    lo, hi = buf.shard[i]
                    grad = buf.shard_grad(i)
                    for decay, segs in ((True, buf.decay[i]), (False, _complement(buf.decay[i], hi - lo))):
                        for a, z in segs:
                            self._segs.append(Segment(buf.master[i][a:z], grad[a:z], buf.m[i][a:z], buf.v[i][a:z],
                                                      buf.param_data[lo + a:lo + z], decay))
        return self._segs

    def prepare_step(self, lr: float | None = None) -> None:
        """Count the step and write its AdamW scalars (learning rate, bias corrections) into the device tensor
        the update kernel reads. `step` does this itself; a CUDA graph that captured `step` (runtime/graph.py)
        calls it before each replay instead, outside the graph."""
        self.step_count += 1
        self._lr = self.cfg.lr if lr is None else lr
        dev = self.buffers[0].param_data.device
        if self._scalars is None:
            self._scalars = torch.empty(4, dtype=torch.float32, device=dev)
        if use_triton(dev):
            write_scalars(self._scalars, adamw_scalars(self.step_count, self._lr, self.cfg.betas, self.cfg.weight_decay))

    @torch.no_grad()
    def step(self, lr: float | None = None):
        """AdamW (decoupled weight decay on matrices only) over the local fp32 shards, writing the bf16
        parameters in the same pass (runtime/parallel/adamw.py); then the ZeRO parameter all-gathers.
        Under CUDA-graph capture (self.captured) neither the step count nor the scalars move (prepare_step
        does that before each replay) and the all-gathers are left to the start of the next replay."""
        if not self.captured:
            self.prepare_step(lr)
        if self._step_t is None:
            self._step_t = torch.zeros((), dtype=torch.float32, device=self.buffers[0].param_data.device)
        adamw_(self._segments(), self.step_count, self._lr, self.cfg.betas, self.cfg.eps, self.cfg.weight_decay,
               self._grad_divisor, self._step_t, scalars=self._scalars, scalars_written=use_triton(self._scalars.device))
        self._grad_divisor = None
        if not self.captured:
            self.gather_params()

    def gather_params(self):
        """ZeRO-1/2: all-gather updated parameters, forward-order, waited for by module pre-hooks (after each
        update; a CUDA graph's replay starts with this instead)."""
        for buf in self.buffers:
            if buf.n == 1 or group_size(buf.group) == 1:
                continue
            for i in reversed(range(len(buf.buckets))):
                b = buf.buckets[i]
                lo, hi = buf.shard[i]
                work = _ag(buf.param_data[b.start:b.end], buf.param_data[lo:hi].clone(), group=buf.group,
                           async_op=True)
                if self.overlap:
                    self.pending_gathers[id(b)] = work
                else:
                    work.wait()

    def _wait_params_of(self, module, args):
        if not self.pending_gathers:
            return
        for p in module.parameters(recurse=False):
            buf = self.buffer_of.get(p)
            if buf is not None:
                work = self.pending_gathers.pop(id(buf.bucket_of[p]), None)
                if work is not None:
                    work.wait()

    def wait_params(self):
        for work in self.pending_gathers.values():
            work.wait()
        self.pending_gathers.clear()

    def named_params(self):
        return [(self.names[p], p) for buf in self.buffers for p in buf.params]

    @torch.no_grad()
    def full_local_grads(self) -> dict:
        """name -> TP-local fp32 gradient summed over dp*cp (after finish_grads; tests, debugging)."""
        out = {}
        for buf in self.buffers:
            for i, b in enumerate(buf.buckets):
                g = buf.shard_grad(i)
                if buf.n > 1:
                    full = torch.empty(b.size, dtype=g.dtype, device=g.device)
                    _ag(full, g.contiguous(), group=buf.group)
                else:
                    full = g
                for p in b.params:
                    o = buf.offset[p] - b.start
                    out[self.names[p]] = full[o:o + p.numel()].view(p.shape).to(torch.float32, copy=True)
        return out

    # -- logical state for checkpoints ---------------------------------------------------------------
    @torch.no_grad()
    def full_local_state(self):
        """Yield (name, param, {'master','exp_avg','exp_avg_sq'}) with TP-local, dp-unsharded fp32 tensors."""
        self.wait_params()
        for buf in self.buffers:
            for i, b in enumerate(buf.buckets):
                full = {}
                for key, shards in (("master", buf.master), ("exp_avg", buf.m), ("exp_avg_sq", buf.v)):
                    if buf.n > 1:
                        t = torch.empty(b.size, dtype=torch.float32, device=shards[i].device)
                        _ag(t, shards[i].contiguous(), group=buf.group)
                    else:
                        t = shards[i]
                    full[key] = t
                for p in b.params:
                    o = buf.offset[p] - b.start
                    yield self.names[p], p, {k: t[o:o + p.numel()].view(p.shape) for k, t in full.items()}

    @torch.no_grad()
    def load_full_local_state(self, states: dict, step_count: int):
        """states: name -> {'master','exp_avg','exp_avg_sq'} TP-local fp32 tensors (dp-unsharded)."""
        self.wait_params()
        self.step_count = step_count
        for buf in self.buffers:
            for i, b in enumerate(buf.buckets):
                lo, hi = buf.shard[i]
                for p in b.params:
                    st = states[self.names[p]]
                    o = buf.offset[p]
                    p.data.copy_(st["master"])
                    a, z = max(o, lo), min(o + p.numel(), hi)
                    if a < z:
                        for key, shards in (("master", buf.master), ("exp_avg", buf.m), ("exp_avg_sq", buf.v)):
                            shards[i][a - lo:z - lo].copy_(st[key].reshape(-1)[a - o:z - o])


class FullyShardedOptimizer:
    """sharding 'full': FSDP2 over dp*cp (each layer its own unit, embedding + head in the root unit) and
    torch's AdamW on the sharded fp32 parameters (which are the master weights). Same interface as
    DistributedOptimizer. TP shards are plain local tensors to FSDP, so it shards each TP shard further."""

    def __init__(self, modules: list[nn.Module], groups, cfg: AdamConfig | None = None,
                 compute_dtype=torch.float32, overlap: bool = True, grad_dtype=torch.float32):
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
        self.groups, self.cfg = groups, cfg or AdamConfig()
        self.compute_dtype = compute_dtype
        # the gradients are reduce-scattered in grad_dtype; FSDP2 keeps the sharded result in the fp32 parameter's dtype
        mp = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=grad_dtype)
        self.modules = modules
        metas = [param_meta(mod) for mod in modules]
        for mod in modules:
            for layer in getattr(mod, "layers", {}).values():
                fully_shard(layer, mesh=groups.dp_cp_mesh, mp_policy=mp, reshard_after_forward=True)
            fully_shard(mod, mesh=groups.dp_cp_mesh, mp_policy=mp, reshard_after_forward=True)
        for m in [mm for mod in modules for mm in mod.modules() if hasattr(mm, "set_gradient_divide_factor")]:
            m.set_gradient_divide_factor(1.0)  # our losses are already global means: sum, don't average
            m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
        for mod, meta in zip(modules, metas):
            restore_param_meta(mod, meta)
        named, seen = [], set()
        for mod in modules:
            for n, p in mod.named_parameters():
                if id(p) not in seen:
                    seen.add(id(p))
                    named.append((n, p))
        self.named = named
        decay = [p for _, p in named if p.dim() >= 2]
        no_decay = [p for _, p in named if p.dim() < 2]
        # fused on CUDA (one kernel launch per group of tensors; torch's DTensor AdamW supports it): the default
        # per-parameter path issued the update tensor by tensor, about 0.17 ms of host time per parameter
        # tensor on n6's host (session 10 analysis of the FSDP runs: 40-50 ms per gpt-1.3b step)
        cuda = named[0][1].device.type == "cuda"
        self.opt = torch.optim.AdamW([{"params": decay, "weight_decay": self.cfg.weight_decay},
                                      {"params": no_decay, "weight_decay": 0.0}], lr=self.cfg.lr,
                                     betas=self.cfg.betas, eps=self.cfg.eps,
                                     **({"fused": True} if cuda else {"foreach": True}))
        tp_rank = group_rank(groups.tp)
        self.norm_params = [p for _, p in named if counts_in_grad_norm(p, tp_rank)]
        self.step_count = 0

    def zero_grad(self):
        self.opt.zero_grad(set_to_none=True)

    def begin_micro_batch(self, last: bool):
        """Gradients are reduce-scattered after every micro-batch's backward, as the planner prices 'full'
        (planner.cost.dp_comm_s) and as the pipeline schedules run it. Skipping the sync on all but the last
        micro-batch would make FSDP2 keep every layer's unsharded gradient in fp32 until then: an allocator
        trace of a gpt-1.3b CP2 step (session 6, 2x H200) showed FSDP2 allocating 4.5 GiB of them, the whole
        model's."""
        for mod in self.modules:
            mod.set_requires_gradient_sync(True)

    def finish_grads(self):
        if group_size(self.groups.tp) > 1:
            for _, p in self.named:
                if getattr(p, "sequence_parallel", False) and p.grad is not None:
                    dist.all_reduce(p.grad.to_local(), group=self.groups.tp)

    def clip_grad_norm(self, max_norm: float | None = None) -> torch.Tensor:
        """Global gradient norm as a 0-d tensor; gradients scaled on the device when it exceeds max_norm (no host
        synchronisation: the training loop keeps the next step queued behind this one)."""
        max_norm = self.cfg.grad_clip if max_norm is None else max_norm
        # one foreach norm over the local shards (not a loop of small kernels per parameter: host time)
        local = [p.grad.to_local() for p in self.norm_params if p.grad is not None]
        sq = _squared_norm(local, self.named[0][1].to_local().device)
        for g in (self.groups.dp_cp, self.groups.tp, self.groups.pp):
            if group_size(g) > 1:
                dist.all_reduce(sq, group=g)
        norm = sq.sqrt()
        if max_norm:
            coef = torch.where(norm > max_norm, max_norm / (norm + 1e-6), torch.ones_like(norm))
            grads = [p.grad.to_local() for _, p in self.named if p.grad is not None]
            if grads:
                torch._foreach_mul_(grads, coef)
        return norm

    def step(self, lr: float | None = None):
        for g in self.opt.param_groups:
            g["lr"] = self.cfg.lr if lr is None else lr
        self.step_count += 1
        self.opt.step()

    def wait_params(self):
        pass

    def close(self):
        pass

    def named_params(self):
        return list(self.named)

    @torch.no_grad()
    def full_local_grads(self) -> dict:
        return {n: p.grad.full_tensor().float().clone() for n, p in self.named if p.grad is not None}

    @torch.no_grad()
    def full_local_state(self):
        for name, p in self.named:
            st = self.opt.state.get(p, {})
            out = {"master": p.full_tensor()}
            for k in ("exp_avg", "exp_avg_sq"):
                out[k] = st[k].full_tensor() if k in st else torch.zeros_like(out["master"])
            yield name, p, out

    @torch.no_grad()
    def load_full_local_state(self, states: dict, step_count: int):
        n, r = group_size(self.groups.dp_cp), group_rank(self.groups.dp_cp)
        self.step_count = step_count

        def shard_of(full, like):
            piece = full.chunk(n, dim=0)[r] if r < len(full.chunk(n, dim=0)) else full[:0]
            local = like.to_local()
            out = torch.zeros_like(local)
            out[:piece.shape[0]].copy_(piece)
            return out

        for name, p in self.named:
            st = states[name]
            p.to_local().copy_(shard_of(st["master"], p))
            s = self.opt.state[p]
            fused = self.opt.param_groups[0].get("fused")  # fused AdamW keeps its step count on the device
            s["step"] = torch.tensor(float(step_count), device=p.device if fused else "cpu")
            for k in ("exp_avg", "exp_avg_sq"):
                t = torch.zeros_like(p)
                t.to_local().copy_(shard_of(st[k], p))
                s[k] = t


def build_optimizer(modules, groups, sharding, cfg=None, compute_dtype=torch.float32, overlap=True,
                    bucket_elems=40_000_000, grad_dtype=torch.float32):
    """The optimizer for `sharding`; grad_dtype is the main gradients' precision and their reduction's."""
    if sharding == "full":
        return FullyShardedOptimizer(modules, groups, cfg, compute_dtype, overlap, grad_dtype)
    return DistributedOptimizer(modules, groups, sharding, cfg, compute_dtype, bucket_elems, overlap, grad_dtype)
