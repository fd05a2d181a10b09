"""The distributed optimizer for sharding 'none' (DDP), 'optimizer' (ZeRO-1) and 'optimizer+grads' (ZeRO-2):
gradient hooks that accumulate into the flat buffers' fp32 main gradients (runtime/parallel/flat_buffer.py)
and launch each bucket's reduction as soon as backward has filled it, the global gradient norm, the fused
AdamW update of the local shards, the parameter all-gathers waited for per module, and the logical
(unsharded) state for checkpoints. runtime/parallel/data_parallel.py describes the sharding levels.
"""
from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn as nn

from runtime.parallel.adamw import AdamConfig, Segment, adamw_, adamw_scalars, write_scalars
from runtime.parallel.flat_buffer import Bucket, FlatBuffer, complement, squared_norm
from runtime.parallel.tensor import group_size
from runtime.triton_support import use_triton

_ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor


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
        self.buffers = [FlatBuffer(dense, groups.dp_cp, sharding, groups.tp, device, bucket_elems, compute_dtype,
                                grad_dtype)]
        if expert:
            self.buffers.append(FlatBuffer(expert, groups.expert_dp, sharding, groups.tp, device, bucket_elems,
                                        compute_dtype, grad_dtype))
        self.buffer_of = {p: buf for buf in self.buffers for p in buf.params}
        self.sync = True
        self.inflight: list[tuple[FlatBuffer, Bucket]] = []
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

    def _norm_beside_backward(self, buf: FlatBuffer, b: Bucket) -> None:
        """Without a data-parallel reduction a launched bucket's gradient is final: take its squared norm now,
        on a side stream, so this memory-bound pass runs under the rest of backward's GEMMs instead of after
        them (after backward, the norm takes 1.5 ms of a 131 ms GPT-1.3B step)."""
        dev = buf.param_data.device
        if self._norm_stream is None:
            self._norm_stream = torch.cuda.Stream(device=dev)
        ready = torch.cuda.Event()
        ready.record()
        with torch.cuda.stream(self._norm_stream):
            self._norm_stream.wait_event(ready)
            views = self._bucket_norm_views(self.buffers.index(buf))[b.index]
            b.sq = squared_norm(views, dev)

    def _launch(self, buf: FlatBuffer, b: Bucket):
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
                sq = squared_norm(views, dev)
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
                    for decay, segs in ((True, buf.decay[i]), (False, complement(buf.decay[i], hi - lo))):
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
