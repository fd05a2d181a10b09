"""Context parallelism: ring attention over the CP group with a causally load-balanced sequence split.

Sequence layout ("zigzag", as Megatron-Core's CP and ring-flash-attention): the full sequence of length S
is cut into 2*cp chunks of c = S / (2*cp) tokens; CP rank r holds chunks r and 2*cp-1-r, concatenated in
that order. Under a causal mask every rank then does the same attention work. `shard_sequence` /
`unshard_sequence` apply this layout to any tensor (tokens, labels, positions, activations): shard the
tokens, the labels and the position ids with the same call and every rank's loss and rotary / learned
positions are those of the unsharded run.

Ring: with q, k, v of the local 2c tokens, rank r starts with its own K/V and passes K/V blocks to rank
r+1 (receiving from r-1) with `batch_isend_irecv`, posted before the current block computes, so the
transfer of step i+1's block runs beside step i's attention. After step i rank r holds the K/V of
src = (r - i) mod cp. With the zigzag layout the causal work of each step is:

  * i == 0 (own block): causal attention of the 2c local queries over the 2c local keys (the two chunks
    are in increasing position order, so the plain causal mask is the right one);
  * src < r: every local query sees the first chunk of the block (chunk src) in full, none of chunk
    2cp-1-src -> non-causal attention of all 2c queries over the first c keys;
  * src > r: the first local chunk (chunk r) sees nothing of the block, the second local chunk sees both
    chunks of the block in full -> non-causal attention of the last c queries over all 2c keys.

so each step after the first costs half of a full block. Partial results are merged with their
log-sum-exp (out = sum_b exp(lse_b - lse) out_b, lse = logaddexp over blocks), in fp32.

Backward runs the same ring: K/V travel again while each block computes its gradients with the final
out and lse (the flash-attention backward identity), dQ accumulates locally, and the dK/dV accumulator of
a block travels with it (rank r adds its contribution and sends it on to r+1; after cp hops it arrives
back at the block's owner).

Block kernels: on CUDA with fp16/bf16 inputs, cuDNN's fused attention when torch has it
(aten._scaled_dot_product_cudnn_attention[_backward], the kernel that F.scaled_dot_product_attention picks
on Hopper, so a CP rank runs the same attention kernel as the one-GPU model), else torch's flash-attention
(aten._scaled_dot_product_flash_attention[_backward], FlashAttention-2, which takes 1.7-2.0x cuDNN's time
on Hopper: benchmarks/results/attention-backends/); otherwise a plain fp32 math implementation. All three
return the natural-log log-sum-exp the merge needs, and their backward takes the final out and lse. GQA: K/V
travel with their own (fewer) heads and are expanded per block; their gradients are summed back over the
query-head groups before they travel.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist

__all__ = ["ring_attention", "shard_sequence", "unshard_sequence", "gather_sequence",
           "sequence_positions", "attention_block_forward", "attention_block_backward"]


# ---------------------------------------------------------------------------------------------------
# sequence layout

def shard_sequence(x: torch.Tensor, cp_rank: int, cp: int, dim: int = 1) -> torch.Tensor:
    """The local part of `x` for CP rank `cp_rank`: chunks cp_rank and 2*cp-1-cp_rank of 2*cp along `dim`."""
    if cp == 1:
        return x
    n = x.size(dim)
    if n % (2 * cp):
        raise ValueError(f"sequence length {n} is not divisible by 2*CP = {2 * cp}")
    chunks = x.chunk(2 * cp, dim=dim)
    return torch.cat([chunks[cp_rank], chunks[2 * cp - 1 - cp_rank]], dim=dim)


def unshard_sequence(shards: list[torch.Tensor], dim: int = 1) -> torch.Tensor:
    """Inverse of `shard_sequence`: `shards[r]` is rank r's local part; returns the full sequence."""
    cp = len(shards)
    if cp == 1:
        return shards[0]
    chunks: list[torch.Tensor | None] = [None] * (2 * cp)
    for r, s in enumerate(shards):
        a, b = s.chunk(2, dim=dim)
        chunks[r], chunks[2 * cp - 1 - r] = a, b
    return torch.cat(chunks, dim=dim)


def gather_sequence(x: torch.Tensor, cp_group, dim: int = 1) -> torch.Tensor:
    """All-gather the local parts over the CP group and return the full sequence (no autograd)."""
    cp = dist.get_world_size(cp_group)
    if cp == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(cp)]
    dist.all_gather(parts, x.contiguous(), group=cp_group)
    return unshard_sequence(parts, dim=dim)


def sequence_positions(seq_len: int, cp_rank: int, cp: int, device=None) -> torch.Tensor:
    """Position ids (global) of the local tokens of CP rank `cp_rank`: shape [seq_len // cp]."""
    return shard_sequence(torch.arange(seq_len, device=device), cp_rank, cp, dim=0)


# ---------------------------------------------------------------------------------------------------
# block kernels: exact attention returning the log-sum-exp, and its backward

def _use_flash(q: torch.Tensor) -> bool:
    return q.is_cuda and q.dtype in (torch.float16, torch.bfloat16) and q.size(-1) % 8 == 0 and q.size(-1) <= 256


# cuDNN's attention is the first choice on CUDA; if it ever raises (an older cuDNN, an unsupported shape) the
# ring falls back to flash for the rest of the process and says so once.
_cudnn_state = {"usable": None}


def _use_cudnn(q: torch.Tensor) -> bool:
    if not (_use_flash(q) and q.size(-1) <= 128 and _cudnn_state["usable"] is not False):
        return False
    return hasattr(torch.ops.aten, "_scaled_dot_product_cudnn_attention") and \
        torch.backends.cuda.cudnn_sdp_enabled()


def _disable_cudnn(err: Exception) -> None:
    import warnings
    _cudnn_state["usable"] = False
    warnings.warn(f"ring attention: cuDNN attention failed ({err!r:.200}); using flash attention instead")


def _expand_kv(k: torch.Tensor, heads: int) -> torch.Tensor:
    g = heads // k.size(1)
    return k if g == 1 else k.repeat_interleave(g, dim=1)


def _reduce_kv_grad(dk: torch.Tensor, kv_heads: int) -> torch.Tensor:
    b, h, s, d = dk.shape
    g = h // kv_heads
    return dk if g == 1 else dk.view(b, kv_heads, g, s, d).sum(2)


def attention_block_forward(q, k, v, causal: bool, scale: float):
    """Exact attention of one block. Returns (out in q's dtype, lse fp32 [b, h, sq], meta for backward).
    K/V may have fewer heads than Q (GQA). A causal block has sq == sk (aligned top-left)."""
    h = q.size(1)
    ke, ve = _expand_kv(k, h), _expand_kv(v, h)
    if _use_cudnn(q):
        try:
            res = torch.ops.aten._scaled_dot_product_cudnn_attention(
                q, ke, ve, None, True, 0.0, causal, False, scale=scale)
            out, lse = res[0], res[1]
            # lse comes as [b, h, sq] or [b, h, sq, 1] depending on the version; keep [b, h, sq] here
            meta = ("cudnn", lse.dim()) + tuple(res[2:8])  # cum_seq_q, cum_seq_k, max_q, max_k, seed, offset
            return out, lse.reshape(q.shape[:3]).float(), meta
        except RuntimeError as err:
            _disable_cudnn(err)
    if _use_flash(q):
        res = torch.ops.aten._scaled_dot_product_flash_attention(
            q, ke, ve, 0.0, causal, False, scale=scale)
        out, lse = res[0], res[1]
        meta = ("flash",) + tuple(res[2:8])  # cum_seq_q, cum_seq_k, max_q, max_k, philox seed, philox offset
        return out, lse.float(), meta
    qf, kf, vf = q.float(), ke.float(), ve.float()
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if causal:
        sq, sk = s.shape[-2:]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu_(1)
        s.masked_fill_(mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse.unsqueeze(-1))
    out = torch.matmul(p, vf)
    return out.to(q.dtype), lse, None


def attention_block_backward(dout, q, k, v, out, lse, causal: bool, scale: float, meta=None):
    """Gradients of one block given the *final* out and lse of these queries. Returns fp32
    (dq [b,h,sq,d], dk, dv [b,kvh,sk,d]) with dk/dv already summed over GQA groups."""
    h, kvh = q.size(1), k.size(1)
    ke, ve = _expand_kv(k, h), _expand_kv(v, h)
    if meta is not None and meta[0] == "cudnn":
        lse_dims, (cum_q, cum_k, max_q, max_k, seed, offset) = meta[1], meta[2:]
        lse_k = lse.contiguous() if lse_dims == 3 else lse.unsqueeze(-1).contiguous()
        dq, dk, dv = torch.ops.aten._scaled_dot_product_cudnn_attention_backward(
            dout.contiguous(), q, ke, ve, out.contiguous(), lse_k, seed, offset, None, cum_q, cum_k,
            max_q, max_k, 0.0, causal, scale=scale)
        return dq.float(), _reduce_kv_grad(dk.float(), kvh), _reduce_kv_grad(dv.float(), kvh)
    if meta is not None and meta[0] == "flash":
        cum_q, cum_k, max_q, max_k, seed, offset = meta[1:]
        dq, dk, dv = torch.ops.aten._scaled_dot_product_flash_attention_backward(
            dout.contiguous(), q, ke, ve, out.contiguous(), lse.contiguous(), cum_q, cum_k, max_q, max_k,
            0.0, causal, seed, offset, scale=scale)
        return dq.float(), _reduce_kv_grad(dk.float(), kvh), _reduce_kv_grad(dv.float(), kvh)
    if _use_flash(q):
        raise RuntimeError("the fused attention backward needs the forward's metadata")
    qf, kf, vf, of, gf = q.float(), ke.float(), ve.float(), out.float(), dout.float()
    s = torch.matmul(qf, kf.transpose(-1, -2)) * scale
    if causal:
        sq, sk = s.shape[-2:]
        mask = torch.ones(sq, sk, dtype=torch.bool, device=q.device).triu_(1)
        s.masked_fill_(mask, float("-inf"))
    p = torch.exp(s - lse.unsqueeze(-1))
    dv = torch.matmul(p.transpose(-1, -2), gf)
    dp = torch.matmul(gf, vf.transpose(-1, -2))
    delta = (gf * of).sum(-1, keepdim=True)
    ds = p * (dp - delta) * scale
    dq = torch.matmul(ds, kf)
    dk = torch.matmul(ds.transpose(-1, -2), qf)
    return dq, _reduce_kv_grad(dk, kvh), _reduce_kv_grad(dv, kvh)


# ---------------------------------------------------------------------------------------------------
# ring communication

_TAG_KV, _TAG_DKV = 11, 12


class _Ring:
    def __init__(self, group):
        self.group = group
        self.size = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        self.next = dist.get_global_rank(group, (self.rank + 1) % self.size)
        self.prev = dist.get_global_rank(group, (self.rank - 1) % self.size)

    def exchange(self, send: torch.Tensor, tag: int):
        """Post send of `send` to the next rank and a receive from the previous one; returns
        (receive buffer, requests). Wait on the requests before reading the buffer or reusing `send`."""
        recv = torch.empty_like(send)
        ops = [dist.P2POp(dist.isend, send, self.next, self.group, tag),
               dist.P2POp(dist.irecv, recv, self.prev, self.group, tag)]
        return recv, dist.batch_isend_irecv(ops)


def _wait(reqs):
    for r in reqs or ():
        r.wait()


def _merge(out, lse, blk_out, blk_lse):
    """In place: out, lse (fp32 accumulators) <- log-sum-exp merge with one block's result."""
    new_lse = torch.logaddexp(lse, blk_lse)
    out.mul_(torch.exp(lse - new_lse).unsqueeze(-1)).add_(blk_out.float() * torch.exp(blk_lse - new_lse).unsqueeze(-1))
    lse.copy_(new_lse)


def _step_kind(i: int, src: int, rank: int, causal: bool) -> str:
    if not causal:
        return "full"
    if i == 0:
        return "diag"
    return "kv_first_half" if src < rank else "q_second_half"


class _RingAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, group, scale):
        ring = _Ring(group)
        cp, r = ring.size, ring.rank
        b, h, sl, d = q.shape
        if causal and cp > 1 and sl % 2:
            raise ValueError(f"local sequence {sl} must be even (two chunks per CP rank)")
        c = sl // 2
        q = q.contiguous()
        kv = torch.stack([k, v]).contiguous()
        out = torch.zeros(b, h, sl, d, dtype=torch.float32, device=q.device)
        lse = torch.full((b, h, sl), float("-inf"), dtype=torch.float32, device=q.device)
        metas = {}
        for i in range(cp):
            reqs = None
            if i < cp - 1:
                nxt, reqs = ring.exchange(kv, _TAG_KV)
            src = (r - i) % cp
            kind = _step_kind(i, src, r, causal)
            kk, vv = kv[0], kv[1]
            if kind == "full":
                o, l, meta = attention_block_forward(q, kk, vv, False, scale)
                _merge(out, lse, o, l)
            elif kind == "diag":
                o, l, meta = attention_block_forward(q, kk, vv, True, scale)
                _merge(out, lse, o, l)
            elif kind == "kv_first_half":
                o, l, meta = attention_block_forward(q, kk[:, :, :c].contiguous(), vv[:, :, :c].contiguous(), False, scale)
                _merge(out, lse, o, l)
            else:
                o, l, meta = attention_block_forward(q[:, :, c:].contiguous(), kk, vv, False, scale)
                o_view, l_view = out[:, :, c:], lse[:, :, c:]
                _merge(o_view, l_view, o, l)
            metas.setdefault(kind, meta)
            _wait(reqs)
            if i < cp - 1:
                kv = nxt
        out = out.to(q.dtype)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.group, ctx.scale, ctx.metas = causal, group, scale, metas
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        causal, scale, metas = ctx.causal, ctx.scale, ctx.metas
        ring = _Ring(ctx.group)
        cp, r = ring.size, ring.rank
        sl = q.size(2)
        c = sl // 2
        dout = dout.contiguous()
        dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
        kv = torch.stack([k, v]).contiguous()
        kv_heads = k.size(1)
        dkv_reqs, dkv_recv = None, None
        for i in range(cp):
            kv_reqs = None
            if i < cp - 1:
                nxt, kv_reqs = ring.exchange(kv, _TAG_KV)
            src = (r - i) % cp
            kind = _step_kind(i, src, r, causal)
            kk, vv = kv[0], kv[1]
            dkv = torch.zeros((2,) + tuple(k.shape), dtype=torch.float32, device=q.device)
            meta = metas.get(kind)
            if kind in ("full", "diag"):
                gq, gk, gv = attention_block_backward(dout, q, kk, vv, out, lse, kind == "diag", scale, meta)
                dq += gq
                dkv[0] += gk
                dkv[1] += gv
            elif kind == "kv_first_half":
                gq, gk, gv = attention_block_backward(dout, q, kk[:, :, :c].contiguous(), vv[:, :, :c].contiguous(),
                                                      out, lse, False, scale, meta)
                dq += gq
                dkv[0, :, :, :c] += gk
                dkv[1, :, :, :c] += gv
            else:
                gq, gk, gv = attention_block_backward(dout[:, :, c:], q[:, :, c:].contiguous(), kk, vv,
                                                      out[:, :, c:], lse[:, :, c:], False, scale, meta)
                dq[:, :, c:] += gq
                dkv[0] += gk
                dkv[1] += gv
            if cp > 1:
                if i > 0:
                    _wait(dkv_reqs)
                    dkv += dkv_recv
                dkv_recv, dkv_reqs = ring.exchange(dkv, _TAG_DKV)
            _wait(kv_reqs)
            if i < cp - 1:
                kv = nxt
        if cp > 1:
            _wait(dkv_reqs)
            dkv = dkv_recv
        assert dkv.shape[1:] == k.shape and kv_heads == k.size(1)
        return dq.to(q.dtype), dkv[0].to(k.dtype), dkv[1].to(v.dtype), None, None, None


def ring_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, cp_group,
                   scale: float | None = None) -> torch.Tensor:
    """Exact attention over the whole sequence spread across `cp_group` (zigzag layout, see module doc).

    q: [batch, heads, seq_local, head_dim]; k, v: [batch, kv_heads, seq_local, head_dim] with kv_heads
    dividing heads (GQA). Returns [batch, heads, seq_local, head_dim] in q's dtype. With a CP group of
    one rank (or None) it is plain exact attention through the same kernels.
    """
    if q.size(1) % k.size(1):
        raise ValueError(f"{q.size(1)} query heads are not divisible by {k.size(1)} key/value heads")
    if scale is None:
        scale = 1.0 / math.sqrt(q.size(-1))
    if cp_group is None:
        cp_group = dist.group.WORLD if dist.is_initialized() else None
    if cp_group is None or dist.get_world_size(cp_group) == 1:
        return _LocalAttention.apply(q, k, v, causal, scale)
    return _RingAttention.apply(q, k, v, causal, cp_group, scale)


class _LocalAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, causal, scale):
        out, lse, meta = attention_block_forward(q.contiguous(), k.contiguous(), v.contiguous(), causal, scale)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.causal, ctx.scale, ctx.meta = causal, scale, meta
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        dq, dk, dv = attention_block_backward(dout.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(),
                                              out, lse, ctx.causal, ctx.scale, ctx.meta)
        return dq.to(q.dtype), dk.to(k.dtype), dv.to(v.dtype), None, None
