"""Token movement of an MoE layer (runtime/parallel/expert.py): the row gathers and the weighted combine,
and, under expert parallelism, the all-to-all dispatch to the experts' ranks and back.

Dispatch: dropless by default (every assignment computed); with `capacity_factor` set, each expert takes at
most ceil(capacity_factor * tokens * k / E) assignments per rank-local batch, in token order, and the rest
are discarded (they contribute zero; the other slots keep their weights). Assignments are sorted by expert,
the counts exchanged with one small all_to_all, the tokens sent with all_to_all_single with variable splits,
regrouped by local expert, computed, and sent back the same way. Dropless, every row movement (the gather of
tokens by expert, the regrouping, the weighted combine) is an index_select whose backward is an index_select
too (and a sum over the k copies of a token), because autograd's backward of advanced indexing sorts the
indices and accumulates with atomics (EP2 x DP2: 97k tokens/s per GPU through it, 101-105k through
index_select). The local experts run as grouped GEMMs (torch._grouped_mm: one kernel per projection for all of
them, the per-expert row counts as offsets on the device) where the device supports it (grouped_mm_supported: CUDA
bf16 on Hopper), else as a loop over the experts. The host waits for the GPU at most once per layer: at EP >
1, for the split sizes of the all-to-alls (one .tolist()); at EP1 the grouped path never waits (the loop
does, for its slices; dropping by capacity does, for its boolean selection).

Why the split sizes are read back rather than padded away: a dispatch with fixed-size buffers (every
(token, expert) pair, then every token once per destination rank with its ids and weights, in blocks of the
most a rank can send; grouped GEMMs on the real rows only) never waits for the host and removes most of the GPU
idle time the per-layer wait causes (69-77 ms down to 15-19 ms per traced step at EP2), yet its step is slower:
67.3% of the dense model's throughput against 75.0% for this exact dispatch. It moves more rows through the
all-to-alls, gathers and masks, and one rank waits about 100 ms per step in the all-to-alls.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from runtime.moe_rows import combine_backward, gather_sum


class _Pending:
    """The in-flight all-to-all between an _AllToAllStart and its _AllToAllWait, one each way: forward's
    transfer of the rows, and backward's of their gradient."""
    work = None
    reverse = None
    """(splits out, splits in, group, input shape) of the reverse transfer, for backward."""
    bwd_work = None
    bwd_out = None


class _AllToAllStart(torch.autograd.Function):
    """Launch all_to_all_single (async) and return its output buffer, not yet filled: _AllToAllWait on the
    same `pending` makes it safe to read. Backward waits for the reverse transfer that _AllToAllWait's
    backward launched, so whatever autograd runs between the two overlaps it."""

    @staticmethod
    def forward(ctx, x, out_splits, in_splits, group, pending):
        ctx.pending = pending
        x = x.contiguous()
        out = x.new_empty((sum(out_splits),) + tuple(x.shape[1:]))
        pending.work = dist.all_to_all_single(out, x, out_splits, in_splits, group=group, async_op=True)
        pending.reverse = (in_splits, out_splits, group, x.shape)
        return out

    @staticmethod
    def backward(ctx, g):
        p = ctx.pending
        p.bwd_work.wait()
        out, p.bwd_out, p.bwd_work = p.bwd_out, None, None
        return out, None, None, None, None


class _AllToAllWait(torch.autograd.Function):
    """Identity once the transfer started by _AllToAllStart on `pending` has arrived (on CUDA the stream
    waits, not the host). Backward launches the reverse transfer of the gradient and returns at once."""

    @staticmethod
    def forward(ctx, out, pending):
        ctx.pending = pending
        pending.work.wait()
        pending.work = None
        return out

    @staticmethod
    def backward(ctx, g):
        p = ctx.pending
        out_splits, in_splits, group, shape = p.reverse
        g = g.contiguous()
        p.bwd_out = g.new_empty((sum(out_splits),) + tuple(shape[1:]))
        p.bwd_work = dist.all_to_all_single(p.bwd_out, g, out_splits, in_splits, group=group, async_op=True)
        return g, None


def inverse(perm: torch.Tensor) -> torch.Tensor:
    """inv with inv[perm[i]] = i."""
    inv = torch.empty_like(perm)
    inv[perm] = torch.arange(perm.numel(), device=perm.device, dtype=perm.dtype)
    return inv


class Gather(torch.autograd.Function):
    """rows = x[src] where every row of x appears exactly k times in src, at the positions inv[k*r : k*r + k]
    (src = perm // k for a permutation perm of the k-fold repeated rows, inv its inverse). Backward gathers
    back and sums the k copies: autograd's backward of indexing accumulates with atomics after sorting."""

    @staticmethod
    def forward(ctx, x, src, inv, k):
        ctx.save_for_backward(inv)
        ctx.k = k
        return x.index_select(0, src)

    @staticmethod
    def backward(ctx, g):
        inv, = ctx.saved_tensors
        return gather_sum(g.contiguous(), inv, ctx.k), None, None, None


class Combine(torch.autograd.Function):
    """The reverse of Gather, weighted: out[r] = sum of the k rows of y that Gather made from row r, each
    times its router weight w (runtime/moe_rows.py: one pass each way on CUDA)."""

    @staticmethod
    def forward(ctx, y, w, inv, src, k):
        ctx.save_for_backward(y, w, src)
        return gather_sum(y, inv, k, w)

    @staticmethod
    def backward(ctx, g):
        y, w, src = ctx.saved_tensors
        gy, gw = combine_backward(g.contiguous(), src, y, w)
        return gy, gw, None, None, None


def count_per_expert(ids: torch.Tensor, num_experts: int) -> torch.Tensor:
    """torch.bincount(ids, minlength=num_experts) without its host synchronisation (CUDA's bincount reads the
    largest id back to size its output; here the size is known)."""
    return ids.new_zeros(num_experts).scatter_add_(0, ids, torch.ones_like(ids))


def regroup_permutation(recv_counts: torch.Tensor, total: int) -> torch.Tensor:
    """Rows received by the dispatch all-to-all arrive ordered (source rank s, local expert e), with
    recv_counts[s, e] rows in each block; the experts want them ordered (e, s). Returns perm such that
    rows[perm] is in that order, keeping the order inside each block: a stable sort of every row by its
    target block e * ep + s, on the device (no per-token host work)."""
    ep, El = recv_counts.shape
    dev = recv_counts.device
    target = torch.arange(El, device=dev).view(1, El) * ep + torch.arange(ep, device=dev).view(ep, 1)
    keys = target.reshape(-1).repeat_interleave(recv_counts.reshape(-1), output_size=total)
    return torch.argsort(keys, stable=True)



def host_split_sizes(sizes: torch.Tensor, rows: int, chunks: int, ep: int, local_experts: int) -> list[int]:
    """sizes on the host: [chunks x ep rows sent to each rank, chunks x ep received from each rank, chunks x
    local_experts rows for each local expert], of `rows` rows this rank dispatches. runtime/simulate replaces this
    with an evenly balanced routing's sizes (its fake tensors hold no values)."""
    return sizes.tolist()


def dispatch_compute_combine(tokens: torch.Tensor, counts: torch.Tensor, ep_group, ep: int, local_experts: int,
                             run_local_experts, beside_dispatch=None):
    """tokens: this rank's rows grouped by (chunk, global expert), counts [C, E] rows per group. Each chunk
    goes to its experts' ranks by all-to-all, through the local experts and back. With C > 1 the transfers
    run beside the experts of the other chunk, forward and backward (_AllToAllStart / _AllToAllWait):
    chunk c + 1's dispatch beside chunk c's experts, chunk c's combine beside chunk c + 1's experts.
    run_local_experts(rows, counts, host_counts, placeholders) runs this rank's experts on rows grouped by
    local expert. beside_dispatch (the shared experts), when given, runs once every dispatch is out. Returns
    (rows back in `tokens`' order, beside_dispatch's result or None)."""
    El, C = local_experts, counts.size(0)
    # [dest rank, chunk, local expert] out, [source rank, chunk, local expert] in
    recv_counts = torch.empty(ep * C * El, dtype=counts.dtype, device=counts.device)
    dist.all_to_all_single(recv_counts, counts.view(C, ep, El).transpose(0, 1).contiguous().view(-1),
                           group=ep_group)
    rc = recv_counts.view(ep, C, El)
    local_counts = rc.sum(0)                                             # [C, El]
    # the layer's one host synchronisation: all_to_all_single takes its split sizes as lists
    sizes = host_split_sizes(torch.cat([counts.view(C, ep, El).sum(2).view(-1), rc.sum(2).t().reshape(-1),
                                        local_counts.view(-1)]), tokens.size(0), C, ep, El)
    send = [sizes[c * ep:(c + 1) * ep] for c in range(C)]
    recv = [sizes[(C + c) * ep:(C + c + 1) * ep] for c in range(C)]
    host_local = [sizes[2 * C * ep + c * El:2 * C * ep + (c + 1) * El] for c in range(C)]
    chunks = tokens.split([sum(sc) for sc in send])
    dispatched = []
    for c in range(C):  # every dispatch goes out first: the link works while the experts compute
        pending = _Pending()
        dispatched.append((_AllToAllStart.apply(chunks[c], recv[c], send[c], ep_group, pending), pending))
    beside = beside_dispatch() if beside_dispatch is not None else None
    outs = []
    for c, (rows, pending) in enumerate(dispatched):
        rows = _AllToAllWait.apply(rows, pending)
        perm_t = regroup_permutation(rc[:, c], sum(recv[c]))
        inv = inverse(perm_t)
        y_local = run_local_experts(Gather.apply(rows, perm_t, inv, 1), local_counts[c], host_local[c],
                                          placeholders=c == C - 1)
        back = Gather.apply(y_local, inv, perm_t, 1)
        pending = _Pending()
        outs.append((_AllToAllStart.apply(back, send[c], recv[c], ep_group, pending), pending))
    ys = [_AllToAllWait.apply(y, pending) for y, pending in outs]
    return (ys[0] if C == 1 else torch.cat(ys)), beside
