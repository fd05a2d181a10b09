"""MoE with expert parallelism against a single-process MoE holding all experts: loss and gradients."""
import pytest
import torch
import torch.distributed as dist

import _launch
from planner.model import tiny_model
from planner.plan import Layout
from runtime.parallel.expert import MoEMLP, collect_aux_loss

AUX = 0.01


def _spec(family="llama", experts=8, top_k=2):
    if family == "llama+shared":  # Qwen-style: gated shared experts beside the routed ones
        return tiny_model("llama", num_experts=experts, top_k=top_k, shared_expert_ffn=96, shared_expert_gate=True)
    return tiny_model(family, num_experts=experts, top_k=top_k)


def _batch(rank, spec, b=2, s=12):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(b, s, spec.hidden, generator=g), torch.randn(b, s, spec.hidden, generator=g)


def _loss(moe, x, dy):
    out = moe(x)
    return (out * dy).sum() / x.shape[0] + AUX * collect_aux_loss(moe)


def _reference(spec, world, capacity, grouped=None):
    torch.manual_seed(0)
    ref = MoEMLP(spec, None, capacity_factor=capacity)
    ref.grouped_mm = grouped
    losses = [_loss(ref, *_batch(r, spec)) for r in range(world)]
    total = sum(losses) / world
    total.backward()
    return ref, [l.item() for l in losses]


def _worker(rank, world, configs):
    for cfg in configs:
        _check(rank, world, *cfg)


def _check(rank, world, family, experts, top_k, ep, capacity, grouped=None, overlap=False):
    from runtime.mesh import build_groups
    spec = _spec(family, experts, top_k)
    ref, ref_losses = _reference(spec, world, capacity, grouped)
    lay = Layout(dp=world, ep=ep, sharding="none", overlap_ep=overlap)
    groups = build_groups(lay, "cpu")
    moe = MoEMLP(spec, groups, capacity_factor=capacity)
    moe.grouped_mm = grouped
    assert moe.local_experts == experts // ep and moe.ep_rank == groups.ep_rank
    assert moe.dispatch_chunks == (2 if overlap else 1)
    # names carry the global expert index and init is seeded by name: same weights as the reference
    ref_params = dict(ref.named_parameters())
    for name, p in moe.named_parameters():
        assert torch.equal(p, ref_params[name]), name
    loss = _loss(moe, *_batch(rank, spec))
    assert abs(loss.item() - ref_losses[rank]) < 1e-5, (loss.item(), ref_losses[rank])
    loss.backward()
    n = groups.dp_cp_size
    for name, p in moe.named_parameters():
        g = p.grad.clone()
        # what runtime.parallel.data_parallel does (summing convention): experts over expert_dp, the rest over dp_cp
        dist.all_reduce(g, group=groups.expert_dp if getattr(p, "expert", False) else groups.dp_cp)
        g /= n  # this test's losses are per-rank means
        want = ref_params[name].grad
        torch.testing.assert_close(g, want, atol=1e-5, rtol=1e-4,
                                   msg=f"{family} ep{ep} cap={capacity} grouped={grouped} overlap={overlap} {name}")


def test_moe_ep_matches_single_process():
    """4 processes (DP4 layouts): EP2 x expert-DP2 dropless; EP4 with capacity factor 1 (drops tokens);
    GELU experts with biases, top-1, EP2 x expert-DP2; the last two again with the experts as grouped GEMMs
    (forced: on CPU the default is the loop); then three with the dispatch in two overlapped chunks; then gated
    shared experts beside the routed ones, at once and in chunks."""
    _launch.run(_worker, 4, [("llama", 8, 2, 2, None), ("llama", 8, 2, 4, 1.0), ("gpt", 4, 1, 2, None),
                             ("llama", 8, 2, 4, 1.0, True), ("gpt", 4, 1, 2, None, True),
                             ("llama", 8, 2, 2, None, None, True), ("llama", 8, 2, 4, 1.0, True, True),
                             ("gpt", 4, 1, 2, None, True, True),
                             ("llama+shared", 8, 2, 2, None), ("llama+shared", 8, 2, 2, None, True, True)])


def _overlapped_main_grads(rank, world):
    """EP2 with the dispatch in two chunks, grouped experts, under the optimizer (main gradients in its flat
    buffers): two micro-batches per rank against one MoE that sees all four batches. The experts run once per
    chunk and only one of the two calls hands autograd placeholder gradients; the main gradients still hold
    both chunks' (overwritten by the step's first write, added to after)."""
    from runtime.mesh import build_groups
    from runtime.parallel.data_parallel import build_optimizer
    spec = _spec("llama", experts=4)
    torch.manual_seed(0)
    ref = MoEMLP(spec, None)
    ref.grouped_mm = True
    groups = build_groups(Layout(dp=2, ep=2, sharding="none", overlap_ep=True), "cpu")
    moe = MoEMLP(spec, groups)
    moe.grouped_mm = True
    opt = build_optimizer([moe], groups, "none", bucket_elems=100)
    opt.zero_grad()
    for i in range(2):
        opt.begin_micro_batch(last=i == 1)
        _loss(moe, *_batch(rank + 2 * i, spec)).backward()
        for r in range(2):
            _loss(ref, *_batch(r + 2 * i, spec)).backward()
    opt.finish_grads()
    ref_params = dict(ref.named_parameters())
    bad = []
    for n, p in moe.named_parameters():
        if getattr(p, "expert", False):
            got = opt.buffer_of[p].grad_view(p).view_as(p)
            want = ref_params[n].grad
            if not torch.allclose(got, want, atol=1e-5, rtol=1e-4):
                bad.append(f"rank {rank} {n}: max error {(got - want).abs().max():.3g}")
    opt.close()
    assert not bad, bad


def test_overlapped_dispatch_fills_main_grads_under_the_optimizer():
    _launch.run(_overlapped_main_grads, 2)


@pytest.mark.parametrize("family,dtype", [("llama", torch.float32), ("gpt", torch.float32), ("llama", torch.bfloat16),
                                          ("gpt", torch.bfloat16)],
                         ids=["swiglu-fp32", "gelu-bias-fp32", "swiglu-bf16", "gelu-bias-bf16"])
def test_grouped_experts_match_the_loop(family, dtype):
    """The grouped GEMM path against the per-expert loop: outputs, input gradient and every expert's weight
    (and bias) gradients, with experts that get no rows (first, middle, last) and with no rows at all."""
    spec = _spec(family, experts=6)
    moe = MoEMLP(spec, None).to(dtype)
    tol = dict(atol=1e-5, rtol=1e-5) if dtype == torch.float32 else dict(atol=2e-2, rtol=2e-2)
    g = torch.Generator().manual_seed(7)
    for counts in ([0, 5, 0, 3, 9, 0], [0, 0, 0, 0, 0, 0]):
        x = torch.randn(sum(counts), spec.hidden, generator=g).to(dtype)
        dy = torch.randn(sum(counts), spec.hidden, generator=g).to(dtype)
        results = []
        for grouped in (False, True):
            moe.zero_grad(set_to_none=True)
            moe.grouped_mm = grouped
            xg = x.clone().requires_grad_()
            y = moe._run_local_experts(xg, torch.tensor(counts))
            y.backward(dy)
            results.append((y, xg.grad, {n: p.grad for n, p in moe.experts.named_parameters()}))
        (y0, dx0, grads0), (y1, dx1, grads1) = results
        torch.testing.assert_close(y1, y0, **tol)
        torch.testing.assert_close(dx1, dx0, **tol)
        assert grads1.keys() == grads0.keys() and all(v is not None for v in grads1.values())
        for name, want in grads0.items():
            torch.testing.assert_close(grads1[name], want, **tol, msg=f"{family} {counts} {name}")
        for e in (0, 2, 5):  # no rows: a zero gradient, still delivered
            assert not grads1[f"{e}.w_down"].any()


def test_grouped_path_reads_nothing_back_to_the_host_at_ep1(monkeypatch):
    """Dropless EP1 with grouped GEMMs: the counts stay on the device (no .tolist() / .item())."""
    spec = _spec()
    moe = MoEMLP(spec, None)
    moe.grouped_mm = True
    x = torch.randn(2, 8, spec.hidden, requires_grad=True)

    def read_back(*args):
        raise AssertionError("host read-back")
    monkeypatch.setattr(torch.Tensor, "tolist", read_back)
    monkeypatch.setattr(torch.Tensor, "item", read_back)
    moe(x).square().sum().backward()
    assert moe.last_tokens_per_expert.shape == (spec.num_experts,)
    assert all(p.grad is not None for p in moe.parameters())


def test_cpu_runs_the_loop_unless_forced():
    from runtime.parallel.expert import grouped_mm_supported
    assert not grouped_mm_supported(torch.zeros(2, 64, dtype=torch.bfloat16), 64, 128)  # CPU: the loop
    assert MoEMLP(_spec(), None).use_grouped_mm(torch.zeros(2, 64)) is False


def test_param_count_matches_spec_at_ep1():
    for spec in (_spec("llama"), _spec("gpt", 4, 1), tiny_model("llama", num_experts=4, top_k=1)):
        moe = MoEMLP(spec, None)
        assert sum(p.numel() for p in moe.parameters()) == spec.mlp_params()
        assert all(getattr(p, "expert", False) for n, p in moe.named_parameters() if n != "router.weight")
        assert not getattr(moe.router.weight, "expert", False)


def test_capacity_drops_and_dropless_keeps_all():
    spec = _spec()
    torch.manual_seed(0)
    moe = MoEMLP(spec, None)
    x = torch.randn(4, 16, spec.hidden)
    moe(x)
    assert int(moe.last_tokens_per_expert.sum()) == 4 * 16 * spec.top_k
    moe.capacity_factor = 0.5
    moe(x)
    cap = -(-int(0.5 * 64 * 2) // 8)
    assert int(moe.last_tokens_per_expert.max()) <= cap


def test_routing_matches_mixtral_reference():
    """Dense evaluation of the same routing (every expert on every token, weights from renormalised top-k)."""
    spec = _spec()
    torch.manual_seed(1)
    moe = MoEMLP(spec, None)
    x = torch.randn(3, 5, spec.hidden)
    out = moe(x)
    x2 = x.reshape(-1, spec.hidden)
    probs = torch.softmax(x2 @ moe.router.weight.T, -1)
    v, i = probs.topk(2, -1)
    v = v / v.sum(-1, keepdim=True)
    want = torch.zeros_like(x2)
    for e in range(spec.num_experts):
        y = moe._expert(e, x2)
        w = (v * (i == e)).sum(-1, keepdim=True)
        want += w * y
    torch.testing.assert_close(out.reshape(-1, spec.hidden), want, atol=1e-5, rtol=1e-5)


def test_regroup_permutation_matches_the_block_by_block_order():
    """(source, expert) blocks -> (expert, source) blocks, empty blocks included, against a plain loop."""
    from runtime.parallel.expert_dispatch import regroup_permutation

    g = torch.Generator().manual_seed(3)
    for ep, El in ((2, 4), (3, 2), (4, 1)):
        rc = torch.randint(0, 4, (ep, El), generator=g)
        rc[0, 0] = 0
        starts = torch.cat([torch.zeros(1, dtype=torch.long), rc.reshape(-1).cumsum(0)[:-1]]).view(ep, El)
        want = [int(starts[s, e]) + i for e in range(El) for s in range(ep) for i in range(int(rc[s, e]))]
        assert regroup_permutation(rc, int(rc.sum())).tolist() == want


def _two_micro_batches(moe, ref, opt, batches):
    """One step's two micro-batches through `moe` under the optimizer `opt` (main_grad overwritten, then added to)
    and through `ref` (autograd's gradients); returns the experts' main gradients by name."""
    opt.zero_grad()
    for i, (x, dy) in enumerate(batches):
        opt.begin_micro_batch(last=i == 1)
        _loss(moe, x, dy).backward()
        _loss(ref, x, dy).backward()
    opt.finish_grads()
    buf = opt.buffer_of[next(iter(moe.experts.values())).w_down]
    return {n: buf.grad_view(p).view_as(p) for n, p in moe.experts.named_parameters()}


def _flat_buffer_check(family, bucket_elems):
    """Under the distributed optimizer each projection's expert weights lie back to back in its flat buffer
    (also when buckets are small: a run is never cut), so the grouped GEMMs read them as one view, and their
    gradients land in main_grad directly: overwritten on the step's first micro-batch, added on the next.
    Gradients against the same MoE without an optimizer (autograd's per-weight gradients)."""
    import copy

    from runtime.mesh import single_process_groups
    from runtime.parallel import expert_mlp as ex
    from runtime.parallel.data_parallel import build_optimizer

    spec = _spec(family, experts=4)
    torch.manual_seed(0)
    moe = MoEMLP(spec, None)
    moe.grouped_mm = True
    ref = copy.deepcopy(moe)
    opt = build_optimizer([moe], single_process_groups(), "none", bucket_elems=bucket_elems)
    experts = list(moe.experts.values())
    runs = ([[w for m in experts for w in (m.w_gate, m.w_up)]] if spec.gated_mlp else [[m.w_up for m in experts]]) \
        + [[m.w_down for m in experts]]
    bad = []
    for run in runs:
        if ex._adjacent_view(run, 1) is None:
            bad.append("expert weights not back to back in the flat buffer")
        if ex._adjacent_view([p.main_grad for p in run], 1) is None:
            bad.append("their main gradients neither")
    got = _two_micro_batches(moe, ref, opt, [_batch(r, spec) for r in range(2)])
    for n, p in ref.experts.named_parameters():
        if not torch.allclose(got[n], p.grad, atol=1e-5, rtol=1e-5):
            bad.append(f"{family} {n}: max error {(got[n] - p.grad).abs().max():.3g}")
    opt.close()
    return bad


@pytest.mark.parametrize("family,bucket_elems", [("llama", 40_000_000), ("llama", 100), ("gpt", 100)])
def test_grouped_experts_use_the_flat_buffers_in_place(family, bucket_elems):
    assert _flat_buffer_check(family, bucket_elems) == []


def _interpreted(rank, world):
    from runtime.grouped_wgrad import supported
    assert supported(torch.zeros(2, 4, 4), torch.zeros(3, 4), torch.zeros(3, 4))  # the fused weight gradient runs
    return _flat_buffer_check("llama", 100) + _flat_buffer_check("gpt", 40_000_000)


def test_grouped_experts_accumulate_in_the_gemm_interpreted(monkeypatch):
    """The same with the Triton kernels (the weight gradient accumulated into main_grad by the GEMM itself)."""
    from tests.runtime.dist_util import run_interpreted
    assert run_interpreted(_interpreted, monkeypatch) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_grouped_experts_accumulate_in_the_gemm_on_cuda():
    """bf16 on CUDA under the distributed optimizer (the Triton weight-gradient kernel writes main_grad) against
    the same MoE and inputs without an optimizer (torch._grouped_mm's gradients through autograd), two
    micro-batches."""
    import copy

    from runtime.mesh import single_process_groups
    from runtime.parallel.data_parallel import build_optimizer

    spec = _spec("llama", experts=4)
    torch.manual_seed(0)
    moe = MoEMLP(spec, None).cuda()
    ref = copy.deepcopy(moe).to(torch.bfloat16)
    opt = build_optimizer([moe], single_process_groups(), "none", compute_dtype=torch.bfloat16)
    batches = [tuple(t.cuda().to(torch.bfloat16) for t in _batch(r, spec, b=4, s=64)) for r in range(2)]
    got = _two_micro_batches(moe, ref, opt, batches)
    for n, q in ref.experts.named_parameters():
        want = q.grad.float()
        assert (got[n].float() - want).abs().max() <= 3e-2 * want.abs().max() + 1e-6, n
    opt.close()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_router_logits_on_cuda_tensor_cores_match_float64():
    """The router's logits and both gradients in bf16 on tensor cores (fp32 sums) against float64 autograd of
    the same operands, at bf16's precision."""
    from runtime.parallel.router import _RouterLogits

    torch.manual_seed(0)
    x = torch.randn(4096, 1024, device="cuda").to(torch.bfloat16).requires_grad_()
    w = (0.02 * torch.randn(8, 1024, device="cuda")).to(torch.bfloat16).requires_grad_()
    g = torch.randn(4096, 8, device="cuda")
    y = _RouterLogits.apply(x, w)
    assert y.dtype == torch.float32
    y.backward(g)
    x64, w64 = x.detach().double().requires_grad_(), w.detach().double().requires_grad_()
    y64 = x64 @ w64.t()
    y64.backward(g.double())
    for got, want in ((y, y64), (x.grad, x64.grad), (w.grad, w64.grad)):
        err = (got.double() - want).abs().max().item()
        assert err <= 1e-2 * want.abs().max().item(), (err, want.abs().max().item())
