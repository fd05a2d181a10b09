"""Mixed layouts with the core runtime (runtime.model / tensor / data / mesh): TP2 x PP2, CP2 x TP2 (dense, with
Qwen3's q/k norms, and MoE with EP2) and TP2 x EP2 x DP2 x PP2 against a single-process run of the same model: losses of two steps and gradients."""
import _launch
from planner.model import tiny_model
from planner.plan import Layout, StagePlan, even_stages

import _pp_common as C


def _four(rank, world):
    gpt = tiny_model("gpt")
    # Llama 3.1-style rotary (theta 500000, llama3 frequency scaling over the tiny model's positions) and a norm
    # epsilon of its own: every stage and CP rank must build the same tables and norms
    llama = tiny_model("llama", rope_theta=500000.0, norm_eps=1e-6, rope_scaling_factor=8.0, rope_low_freq_factor=1.0,
                       rope_high_freq_factor=4.0, rope_original_max_positions=16)
    # TP2 x PP2, tied embeddings (vocab-parallel, summed between first and last stage), uneven + recompute
    C.compare(C.reference(gpt), C.pipelined(gpt, Layout(tp=2, pp=2, micro_batch=2, sharding="none"),
                                            [StagePlan(1, 1), StagePlan(3, 0, 1)])[:2], f"rank {rank} tp2xpp2 gpt")
    # TP2 x PP2 interleaved, llama (GQA, rotary)
    C.compare(C.reference(llama), C.pipelined(llama, Layout(tp=2, pp=2, vpp=2, micro_batch=2, sharding="none"),
                                              even_stages(4, 4))[:2], f"rank {rank} tp2xpp2x2v llama")
    # CP2 x TP2 (ring attention inside the TP attention; positions sharded with the tokens), no pipeline
    ref = C.reference(llama)
    got = _cp_tp(llama)
    C.compare(ref, got, f"rank {rank} cp2xtp2 llama")
    # Qwen3-style per-head q/k norms (head_dim not hidden / heads): per token, so each CP rank normalises its own
    # chunks before the ring; their weights' gradients summed over TP, then over the CP ranks' shards
    qk = tiny_model("llama", qk_norm=True, head_dim_override=24, norm_eps=1e-6)
    C.compare(C.reference(qk), _cp_tp(qk), f"rank {rank} cp2xtp2 llama qk_norm")
    # MoE with its EP group across the CP ranks: the load-balancing loss sums its assignment counts over the
    # four sequence shards (cp x tp), so it is the whole micro-batch's loss; gated shared experts beside the
    # routed ones (their gradients summed over TP like the router's)
    moe = tiny_model("llama", num_experts=4, top_k=2, shared_expert_ffn=96, shared_expert_gate=True)
    C.compare(C.reference(moe), _cp_tp(moe, ep=2), f"rank {rank} cp2xtp2xep2 moe")


def _cp_tp(spec, ep=1):
    """CP2 x TP2 (EP over the CP ranks) through runtime.step.train_step (pp == 1)."""
    from runtime.mesh import build_groups
    from runtime.model import build_model
    from runtime.parallel.data_parallel import AdamConfig, build_optimizer
    from runtime.parallel.tensor import gather_logical
    from runtime.step import train_step
    lay = Layout(tp=2, cp=2, ep=ep, micro_batch=2, sharding="optimizer")
    groups = build_groups(lay, "cpu")
    model = build_model(spec, groups)
    opt = build_optimizer([model], groups, lay.sharding, AdamConfig(lr=1e-3), bucket_elems=20_000)
    named = dict(model.named_parameters())
    grads, losses = {}, []

    def capture():
        for n, g in opt.full_local_grads().items():
            grads[n] = gather_logical(g, named[n].tp_dim, named[n].tp_parts, groups.tp)

    for step in range(2):
        mbs = C.micro_batches(spec, step, 1, 0, 2, cp=2, cp_rank=groups.cp_rank)
        loss, _ = train_step([model], mbs, opt, groups, before_step=capture if step == 0 else None)
        losses.append(float(loss))
    return losses, grads


def test_tp2xpp2_and_cp2xtp2_match_single_process():
    _launch.run(_four, 4)


def _eight(rank, world):
    moe = tiny_model("llama", num_experts=4, top_k=2)
    ref = C.reference(moe)  # the load-balancing loss of the whole micro-batch, from sequence shards
    # EP2 x DP2 x PP2 with TP2 on top (8 processes): the MoE input is sequence-parallel-sharded, each TP
    # rank routes its own tokens; expert weights replicated over TP, sharded over EP
    lay = Layout(tp=2, pp=2, dp=2, ep=2, micro_batch=2, sharding="optimizer")
    losses, grads, groups = C.pipelined(moe, lay, [StagePlan(1, 0, 1), StagePlan(3, 1)])
    assert any(".experts." in n for n in grads)
    C.compare(ref, (losses, grads), f"rank {rank} tp2xep2xdp2xpp2 moe")


def test_ep2xdp2xpp2_moe_matches_single_process():
    _launch.run(_eight, 8)


def _zero2_pipelined(rank, world):
    """ZeRO-2 under a pipeline reduce-scatters every micro-batch's gradients (untied Llama), or holds them for the
    tied embedding's sum between the first and last stage (GPT): the same losses and gradients either way."""
    for family in ("llama", "gpt"):
        spec = tiny_model(family)
        lay = Layout(pp=2, dp=2, micro_batch=1, sharding="optimizer+grads")
        C.compare(C.reference(spec), C.pipelined(spec, lay, even_stages(4, 2))[:2], f"rank {rank} pp2xdp2 zero2 {family}")


def test_zero2_under_a_pipeline_matches_single_process():
    _launch.run(_zero2_pipelined, 4)
