"""Session 8: which part of the MoE layer (EP1, grouped GEMMs) breaks CUDA-graph capture? Each piece is captured
in its own process (a failed capture can leave the context unusable); then the eager step under sync debug."""
import subprocess, sys, torch

PIECES = ["route", "sort", "count", "gather", "experts_fwd", "layer_fwd", "layer_fwd_bwd"]

def run(piece):
    import torch.nn.functional as F
    from planner.model import resolve_model
    from runtime.mesh import single_process_groups
    from runtime.parallel.expert import MoEMLP, _count_per_expert, _inverse, _Gather
    spec = resolve_model("benchmarks/models/moe-small")
    torch.manual_seed(0)
    moe = MoEMLP(spec, single_process_groups()).cuda().to(torch.bfloat16)
    x = torch.randn(2048, 2, spec.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    x2d = x.detach().reshape(-1, spec.hidden)
    def f():
        if piece == "route":
            return moe.route(x2d)
        topi, topv, _ = moe.route(x2d)
        flat_e = topi.reshape(-1)
        if piece == "sort":
            return torch.argsort(flat_e, stable=True)
        order = torch.argsort(flat_e, stable=True)
        counts = _count_per_expert(flat_e[order], spec.num_experts)
        if piece == "count":
            return counts
        T, k = x2d.size(0), moe.top_k
        sorted_t = torch.arange(T, device="cuda").repeat_interleave(k)[order]
        tokens = _Gather.apply(x2d, sorted_t, _inverse(order), k)
        if piece == "gather":
            return tokens
        if piece == "experts_fwd":
            return moe._run_local_experts(tokens, counts)
        y = moe(x)
        if piece == "layer_fwd_bwd":
            y.float().sum().backward()
        return y
    for _ in range(2):
        f()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g):
            f()
        g.replay(); torch.cuda.synchronize()
        print(f"{piece}: captured and replayed", flush=True)
    except Exception as exc:
        print(f"{piece}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)

if __name__ == "__main__":
    if len(sys.argv) > 1:
        run(sys.argv[1])
    else:
        for p in PIECES:
            r = subprocess.run([sys.executable, __file__, p], capture_output=True, text=True, timeout=60)
            lines = [l for l in r.stdout.splitlines() if l.startswith(p)]
            print(lines[0] if lines else f"{p}: no result (rc {r.returncode}) {r.stderr.strip().splitlines()[-1:]}", flush=True)
        # the eager layer under sync debug: every op that makes the host wait
        from planner.model import resolve_model
        from runtime.mesh import single_process_groups
        from runtime.parallel.expert import MoEMLP
        import warnings
        spec = resolve_model("benchmarks/models/moe-small")
        moe = MoEMLP(spec, single_process_groups()).cuda().to(torch.bfloat16)
        x = torch.randn(2048, 2, spec.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        moe(x).float().sum().backward(); torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            moe(x).float().sum().backward()
            print("sync debug: no synchronising op in forward + backward")
        except Exception as exc:
            import traceback
            print("sync debug:", type(exc).__name__, str(exc).splitlines()[0])
            print("".join(traceback.format_exc().splitlines(keepends=True)[-12:]))
