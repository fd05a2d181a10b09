"""Ring attention (context parallelism) against single-process exact attention: forward and gradients."""
import itertools

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import _launch
from runtime.parallel.context import (ring_attention, shard_sequence, unshard_sequence,
                                      sequence_positions, attention_block_forward, attention_block_backward)


def _reference(q, k, v, causal):
    g = q.size(1) // k.size(1)
    return F.scaled_dot_product_attention(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1),
                                          is_causal=causal)


def _case(seed, heads, kv_heads, seq, b=2, d=16):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, heads, seq, d, generator=gen)
    k = torch.randn(b, kv_heads, seq, d, generator=gen)
    v = torch.randn(b, kv_heads, seq, d, generator=gen)
    dout = torch.randn(b, heads, seq, d, generator=gen)
    return q, k, v, dout


def _check(cp_group, cp, cp_rank, seed):
    for causal, (heads, kv_heads) in itertools.product((True, False), ((4, 4), (4, 2), (4, 1))):
        seq = 8 * cp
        q, k, v, dout = _case(seed, heads, kv_heads, seq)
        qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
        ref = _reference(qr, kr, vr, causal)
        ref.backward(dout)
        ql, kl, vl = (shard_sequence(t, cp_rank, cp, dim=2).clone().requires_grad_() for t in (q, k, v))
        out = ring_attention(ql, kl, vl, causal, cp_group)
        out.backward(shard_sequence(dout, cp_rank, cp, dim=2))
        tag = f"cp={cp} causal={causal} heads={heads}/{kv_heads}"
        torch.testing.assert_close(out, shard_sequence(ref, cp_rank, cp, 2), atol=2e-5, rtol=1e-5, msg=tag + " out")
        for name, got, want in (("dq", ql.grad, qr.grad), ("dk", kl.grad, kr.grad), ("dv", vl.grad, vr.grad)):
            torch.testing.assert_close(got, shard_sequence(want, cp_rank, cp, 2), atol=2e-5, rtol=1e-5,
                                       msg=f"{tag} {name}")


def _worker(rank, world):
    # cp = world (4) over all ranks, then cp = 2 over pairs {0,1} and {2,3}
    _check(dist.group.WORLD, world, rank, seed=1)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    g = pairs[rank // 2]
    _check(g, 2, dist.get_rank(g), seed=2)


def test_ring_attention_cp2_cp4_matches_single_process():
    _launch.run(_worker, 4)


def test_shard_unshard_roundtrip_and_positions():
    x = torch.arange(2 * 24).view(2, 24)
    for cp in (1, 2, 3, 4):
        shards = [shard_sequence(x, r, cp, dim=1) for r in range(cp)]
        assert torch.equal(unshard_sequence(shards, dim=1), x)
        for r in range(cp):
            assert torch.equal(sequence_positions(24, r, cp), shards[r][0])
    assert shard_sequence(x, 1, 2, 1)[0].tolist() == [6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17]
    with pytest.raises(ValueError):
        shard_sequence(x, 0, 5, 1)


def test_local_ring_attention_without_group_matches_sdpa():
    q, k, v, dout = _case(3, 4, 2, 12)
    for causal in (True, False):
        qr, kr, vr = (t.clone().requires_grad_() for t in (q, k, v))
        ref = _reference(qr, kr, vr, causal)
        ref.backward(dout)
        ql, kl, vl = (t.clone().requires_grad_() for t in (q, k, v))
        out = ring_attention(ql, kl, vl, causal, None)
        out.backward(dout)
        torch.testing.assert_close(out, ref, atol=2e-5, rtol=1e-5)
        for a, b in ((ql, qr), (kl, kr), (vl, vr)):
            torch.testing.assert_close(a.grad, b.grad, atol=2e-5, rtol=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (flash block kernels)")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_flash_block_kernels_match_math_cuda(dtype):
    """The CUDA flash path of one block (forward with lse, backward with given out/lse) against fp32 math."""
    q, k, v, dout = (t.cuda() for t in _case(4, 8, 2, 256, d=64))
    for causal in (True, False):
        qh, kh, vh, gh = (t.to(dtype) for t in (q, k, v, dout))
        o, lse, meta = attention_block_forward(qh, kh, vh, causal, 0.125)
        o32, lse32, _ = attention_block_forward(qh.float(), kh.float(), vh.float(), causal, 0.125)
        torch.testing.assert_close(o.float(), o32, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse, lse32, atol=2e-2, rtol=2e-2)
        g = attention_block_backward(gh, qh, kh, vh, o, lse, causal, 0.125, meta)
        g32 = attention_block_backward(gh.float(), qh.float(), kh.float(), vh.float(), o.float(), lse, causal, 0.125)
        for a, b in zip(g, g32):
            torch.testing.assert_close(a, b, atol=5e-2, rtol=5e-2)
