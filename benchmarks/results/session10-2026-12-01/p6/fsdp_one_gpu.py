"""Session 10: FullyShardedOptimizer (FSDP2 + torch's fused AdamW over DTensors + one foreach norm) on one CUDA
GPU, built directly (the planner allows sharding 'full' only with two data-parallel ranks or more), against the
unsharded DistributedOptimizer on the same tiny model and batches: the losses of 5 steps."""
import json
import os

import torch
import torch.distributed as dist

os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
CUDA = os.environ.get("FSDP_CHECK_DEVICE", "cuda") == "cuda"   # cpu: a dry run of this script with gloo
DEV = torch.device("cuda", 0) if CUDA else torch.device("cpu")
DTYPE = torch.bfloat16 if CUDA else torch.float32
if CUDA:
    torch.cuda.set_device(0)
dist.init_process_group("nccl" if CUDA else "gloo", rank=0, world_size=1)
from planner.model import tiny_model  # noqa: E402
from planner.plan import Layout  # noqa: E402
from runtime.mesh import build_groups  # noqa: E402
from runtime.model import build_stage  # noqa: E402
from runtime.parallel.data import AdamConfig, build_optimizer  # noqa: E402
from runtime.step import train_step  # noqa: E402

spec = tiny_model("llama", num_layers=4)
out = {}
for sharding in ("full", "none"):
    lay = Layout(dp=1, micro_batch=2, sharding=sharding)
    groups = build_groups(lay, DEV.type)
    model = build_stage(spec, groups, 0, 4, True, True, ["none"] * 4, device=DEV, seed=1234)
    opt = build_optimizer([model], groups, sharding, AdamConfig(lr=1e-3), compute_dtype=DTYPE)
    losses = []
    for step in range(5):
        g = torch.Generator().manual_seed(100 + step)
        seq = torch.randint(0, spec.vocab_size, (4, 33), generator=g).to(DEV)
        mbs = [dict(tokens=seq[i:i + 2, :-1], labels=seq[i:i + 2, 1:]) for i in (0, 2)]
        loss, norm = train_step([model], mbs, opt, groups)
        losses.append(float(loss))
    out[sharding] = losses
    out[sharding + "_optimizer"] = type(getattr(opt, "opt", opt)).__name__ + (
        f" fused={opt.opt.param_groups[0].get('fused')}" if hasattr(opt, "opt") else "")
print(json.dumps(out))
dist.destroy_process_group()
