"""CUDA-graph steps (Layout.cuda_graph, runtime/graph.py): where the planner allows them, what it prices, and on a
GPU that a replayed step trains exactly as the eager step does."""
from __future__ import annotations

import csv
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from planner.cluster import ClusterSpec
from planner.cost import CostModel
from planner.errors import PlanError
from planner.legality import check_layout, cuda_graph_violation
from planner.model import resolve_model, tiny_model
from planner.plan import Layout, Plan, StagePlan, TrainingShape
from planner.profile import HostOverheads, load_profile
from planner.search import Pins, search

REPO = Path(__file__).resolve().parents[2]


def test_graph_is_legal_only_without_host_synchronisation():
    dense, moe = resolve_model("gpt-1.3b"), resolve_model("mixtral-8x7b")
    assert cuda_graph_violation(dense, Layout(tp=2, dp=2, sharding="optimizer+grads")) is None
    assert cuda_graph_violation(dense, Layout(pp=2, vpp=2, sharding="none")) is None
    assert "split sizes" in cuda_graph_violation(moe, Layout(dp=2, ep=2))
    assert cuda_graph_violation(moe, Layout(dp=2), "h200-sxm") is None  # EP1: grouped GEMMs, counts on the device
    assert "expert loop" in cuda_graph_violation(moe, Layout(dp=2), "a100-80gb")
    assert "fully sharded" in cuda_graph_violation(dense, Layout(dp=2, sharding="full"))
    with pytest.raises(PlanError, match="CUDA-graph step is not possible here: the fully sharded"):
        check_layout(dense, TrainingShape(2048, 8), Layout(dp=2, sharding="full", cuda_graph=True), 2)


def test_search_turns_graphs_on_where_legal_and_on_gpus_only():
    shape = TrainingShape(32, 8)
    prof = load_profile("h200-sxm", "h200-sxm")
    plans = search(tiny_model("gpt"), shape, ClusterSpec(gpu="h200-sxm", num_gpus=2, gpus_per_node=2), prof,
                   top_k=50).plans
    assert plans and all(p.layout.cuda_graph == (p.layout.sharding != "full") for p in plans)
    moe = search(tiny_model("gpt", num_experts=4, top_k=2), shape, ClusterSpec(gpu="h200-sxm", num_gpus=2,
                 gpus_per_node=2), prof, top_k=50).plans
    assert all(p.layout.cuda_graph == (p.layout.ep == 1 and p.layout.sharding != "full") for p in moe)
    assert any(p.layout.ep == 2 for p in moe) and any(p.layout.cuda_graph for p in moe)
    assert any(p.layout.cuda_graph and p.layout.pp > 1 for p in plans)
    off = search(tiny_model("gpt"), shape, ClusterSpec(gpu="h200-sxm", num_gpus=2, gpus_per_node=2), prof,
                 Pins(cuda_graph=False), top_k=5).plans
    assert not any(p.layout.cuda_graph for p in off)
    cpu = search(tiny_model("gpt"), shape, ClusterSpec(gpu="cpu", num_gpus=2, gpus_per_node=2),
                 prof, top_k=5).plans  # the profile only prices; the cluster says CPU
    assert not any(p.layout.cuda_graph for p in cpu)


def test_a_graph_step_is_priced_without_host_time():
    host = HostOverheads(layer_s={"none": 1e-2, "selective": 1e-2, "full": 1e-2}, tp_extra_s={}, cp_extra_s=0.0,
                         fsdp_extra_s=0.0, expert_s=0.0, ep_extra_s=0.0, pp_chunk_s=0.0)
    prof = replace(load_profile("h200-sxm", "h200-sxm"), host=host)
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=2, gpus_per_node=2)
    st = StagePlan(layers=24)
    eager = CostModel(resolve_model("gpt-1.3b"), TrainingShape(2048, 8), Layout(tp=2), cluster, prof)
    graph = CostModel(resolve_model("gpt-1.3b"), TrainingShape(2048, 8), Layout(tp=2, cuda_graph=True), cluster, prof)
    assert eager.stage_time_s(0, st) == pytest.approx(24 * 1e-2)  # host-paced: 10 ms a layer
    assert graph.stage_host_s(0, st) == 0.0
    assert graph.stage_time_s(0, st) == pytest.approx(graph.stage_gpu_s(0, st))


# -- on CUDA: a replayed step trains as the eager step does --------------------------------------------------

def _losses(path: Path) -> list[float]:
    with open(path) as fh:
        return [float(r["loss"]) for r in csv.DictReader(fh)]


def _losses_and_norms(path: Path) -> list[tuple[float, float]]:
    with open(path) as fh:
        return [(float(r["loss"]), float(r["grad_norm"])) for r in csv.DictReader(fh)]


def _train_on_cuda(tmp_path: Path, names: list[str], gpus: int, steps: int) -> None:
    """`runtime.train` over the plans tmp_path/<name>.json, one after another in one torchrun of `gpus`
    processes; each plan's rows go to tmp_path/<name>.csv."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={gpus}", f"--master-port={port}",
           "-m", "runtime.train", "--plan", *(str(tmp_path / f"{n}.json") for n in names),
           "--steps", str(steps), "--lr-warmup-steps", "2", "--device", "cuda", "--results", str(tmp_path)]
    p = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)), timeout=300,
                       cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("tp,pp,vpp,sharding,moe", [(1, 1, 1, "none", False), (2, 1, 1, "none", False),
                                                   (1, 1, 1, "optimizer", False), (1, 1, 1, "optimizer+grads", False),
                                                   (1, 2, 1, "none", False), (1, 2, 2, "none", False),
                                                   (1, 1, 1, "none", True)])
def test_replayed_steps_match_eager_steps(tmp_path, tp, pp, vpp, sharding, moe):
    n = 2 if (tp == 2 or pp == 2 or sharding != "none") else 1
    if torch.cuda.device_count() < n:
        pytest.skip(f"needs {n} GPUs")
    # built by hand, not searched: the GPU machine that runs this test need not have OR-Tools
    spec = tiny_model("llama", num_layers=4, **({"num_experts": 4, "top_k": 2} if moe else {}))
    dp = n // (tp * pp)
    stages = [StagePlan(layers=4 // (pp * vpp), selective_recompute_layers=1) for _ in range(pp * vpp)]
    plan = Plan(model=spec, cluster={"gpu": "h200-sxm", "num_gpus": n, "gpus_per_node": n},
                training=TrainingShape(32, 8), layout=Layout(tp=tp, pp=pp, vpp=vpp, dp=dp, micro_batch=2,
                                                             sharding=sharding, cuda_graph=True),
                stages=stages)
    assert plan.layout.cuda_graph
    for name, graph in (("graph", True), ("eager", False)):
        replace(plan, layout=replace(plan.layout, cuda_graph=graph)).save(tmp_path / f"{name}.json")
    _train_on_cuda(tmp_path, ["graph", "eager"], n, 6)
    graph, eager = _losses(tmp_path / "graph.csv"), _losses(tmp_path / "eager.csv")
    assert len(graph) == len(eager) == 6
    # the same kernels on the same data: the losses agree to bf16 noise, through steps 3-6 (the replays)
    assert graph == pytest.approx(eager, rel=2e-3)
    assert len({round(x, 4) for x in graph}) > 1  # training moved


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_a_thread_pinning_batches_during_the_capture_does_not_break_it():
    """The data Prefetcher pins batches in its own thread whenever the queue has room, so it may run during the
    capture; the step's capture (runtime/graph.py CAPTURE_ERROR_MODE) must survive it. The step waits inside the
    capture until the thread has pinned fresh memory, with page-locked blocks of earlier copies still awaiting
    their events, so the two always overlap."""
    import threading
    from types import SimpleNamespace

    from runtime.graph import GraphedStep

    w = torch.randn(256, 256, device="cuda", requires_grad=True)
    for _ in range(4):  # page-locked blocks whose copies' events the host allocator has yet to query
        torch.randn(1 << 16).pin_memory().to("cuda", non_blocking=True)
    capturing, pinned, done = threading.Event(), threading.Event(), threading.Event()

    def pin_while_capturing():
        capturing.wait(30)
        for i in range(8):
            torch.randn((1 << 18) + 4096 * i).pin_memory()  # sizes the host allocator has not cached
        pinned.set()
        done.wait(30)

    def step_fn(stages, mbs, opt, groups, lr, before_step):
        x = mbs[0]["x"]
        if torch.cuda.is_current_stream_capturing():
            capturing.set()
            assert pinned.wait(30)
        loss = (x @ w).square().mean()
        (g,) = torch.autograd.grad(loss, w)
        return loss, g.norm()

    opt = SimpleNamespace(captured=False, prepare_step=lambda lr: None, wait_params=lambda: None,
                          gather_params=lambda: None)
    thread = threading.Thread(target=pin_while_capturing, daemon=True)
    thread.start()
    step = GraphedStep(step_fn, opt)
    x = torch.randn(64, 256, device="cuda")
    try:
        eager = [step(None, [{"x": x}], opt, None)[0].item() for _ in range(2)]
        replayed = step(None, [{"x": x}], opt, None)[0].item()  # the capture, then its first replay
    finally:
        done.set()
        thread.join(30)
    assert step.replaying and pinned.is_set()
    assert replayed == pytest.approx(eager[0], rel=1e-5)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_gradient_norm_taken_beside_backward_equals_the_norm_after_it(tmp_path):
    """Without a data-parallel group each bucket's norm is taken on a side stream as backward finishes it
    (runtime/parallel/distributed_optimizer.py); with overlap_dp off it is taken after backward. Same norms, same losses."""
    spec = tiny_model("gpt", num_layers=4)
    plan = Plan(model=spec, cluster={"gpu": "h200-sxm", "num_gpus": 1, "gpus_per_node": 1},
                training=TrainingShape(32, 4), layout=Layout(micro_batch=2, sharding="none", cuda_graph=True),
                stages=[StagePlan(layers=4)])
    for name, overlap in (("beside", True), ("after", False)):
        replace(plan, layout=replace(plan.layout, overlap_dp=overlap)).save(tmp_path / f"{name}.json")
    _train_on_cuda(tmp_path, ["beside", "after"], 1, 5)
    rows = {name: _losses_and_norms(tmp_path / f"{name}.csv") for name in ("beside", "after")}
    assert len(rows["beside"]) == len(rows["after"]) == 5
    for (la, na), (lb, nb) in zip(rows["beside"], rows["after"]):
        assert na == pytest.approx(nb, rel=1e-4) and la == pytest.approx(lb, rel=2e-3)


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_fully_sharded_step_on_cuda_trains_as_the_sharded_optimizer_one(tmp_path):
    """Sharding 'full' runs torch's fused AdamW over FSDP2's DTensor shards and one foreach norm on CUDA
    (runtime/parallel/fsdp.py). On two GPUs it must train as the ZeRO-1 step of the same plan."""
    spec = tiny_model("llama", num_layers=4)
    plan = Plan(model=spec, cluster={"gpu": "h200-sxm", "num_gpus": 2, "gpus_per_node": 2},
                training=TrainingShape(32, 8), layout=Layout(dp=2, micro_batch=2, sharding="optimizer"),
                stages=[StagePlan(layers=4)])
    for name in ("full", "optimizer"):
        replace(plan, layout=replace(plan.layout, sharding=name)).save(tmp_path / f"{name}.json")
    _train_on_cuda(tmp_path, ["full", "optimizer"], 2, 5)
    full, zero1 = _losses(tmp_path / "full.csv"), _losses(tmp_path / "optimizer.csv")
    assert len(full) == len(zero1) == 5
    assert full == pytest.approx(zero1, rel=2e-3)
    assert len({round(x, 4) for x in full}) > 1  # training moved


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
@pytest.mark.parametrize("family", ["gpt", "llama"])
def test_bf16_main_gradients_train_as_fp32_ones_on_cuda(tmp_path, family):
    """Layout.grad_dtype bf16 on CUDA: the weight-gradient GEMMs, the fused norms' partial sums, the bias sums
    and the embedding write bf16 main gradients, the AdamW kernel reads them; replayed as a CUDA graph. Same
    losses as fp32 main gradients within bf16 noise, and the gradient norms within 1%."""
    spec = tiny_model(family, num_layers=4)
    plan = Plan(model=spec, cluster={"gpu": "h200-sxm", "num_gpus": 1, "gpus_per_node": 1},
                training=TrainingShape(32, 8), layout=Layout(micro_batch=2, sharding="none", cuda_graph=True),
                stages=[StagePlan(layers=4, selective_recompute_layers=1)])
    for name in ("fp32", "bf16"):
        replace(plan, layout=replace(plan.layout, grad_dtype=name)).save(tmp_path / f"{name}.json")
    _train_on_cuda(tmp_path, ["fp32", "bf16"], 1, 6)
    rows = {name: _losses_and_norms(tmp_path / f"{name}.csv") for name in ("fp32", "bf16")}
    assert len(rows["fp32"]) == len(rows["bf16"]) == 6
    for (la, na), (lb, nb) in zip(rows["fp32"], rows["bf16"]):
        assert lb == pytest.approx(la, rel=5e-3) and nb == pytest.approx(na, rel=1e-2)
    assert len({round(x, 4) for x, _ in rows["bf16"]}) > 1  # training moved
