"""The build part of the trainer: this rank's stages, optimizer, resumed state, step function, data prefetcher
and step log for one plan, held in a `Trainer`."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from planner.errors import PlanError
from planner.lr_schedule import OptimizerSettings
from planner.lr_schedule import from_args as optimizer_settings
from planner.plan import Plan, stage_layer_ranges
from runtime import checkpoint, supervise
from runtime.data import Prefetcher, open_source, step_micro_batches
from runtime.model import build_stage
from runtime.parallel.data_parallel import GRAD_DTYPES, AdamConfig, build_optimizer
from runtime.step import select_train_step
from runtime.trainer.log import StepLog, StopFlag
from runtime.trainer.results_csv import set_aside_rows_after
from runtime.trainer.step import StepClock


def build_rank_stages(plan: Plan, groups, device, overlap_tp: bool, seed: int, compile: bool = False):
    """This rank's Stage modules, one per virtual stage it holds (model order), each with its layers' recompute
    modes, FP8 setting and optional torch.compile."""
    ranges = stage_layer_ranges(plan.stages)
    last = len(plan.stages) - 1
    stages = []
    for j in plan.stages_of_rank(groups.pp_rank):
        a, b = ranges[j]
        stages.append(build_stage(plan.model, groups, a, b, j == 0, j == last, plan.stages[j].layer_modes(),
                                  overlap=overlap_tp, device=device, seed=seed, compile=compile,
                                  fp8=plan.layout.fp8))
    return stages


@dataclass
class Trainer:
    """One rank's training state for one plan, made by `build_trainer`: the stages and optimizer, the step
    function (a CUDA graph where the plan allows one), the prefetched data, the step log and the step that
    training starts from (0, or the checkpoint's step on --resume)."""
    plan: Plan
    args: object
    groups: object
    cuda: bool
    local_rank: int
    stages: list
    opt: object
    settings: OptimizerSettings
    plan_hash: str
    """sha256 of the plan's JSON, saved with every checkpoint."""
    start: int
    step_fn: object
    graphed: object | None
    """The GraphedStep when step_fn replays a CUDA graph, else None."""
    prefetch: Prefetcher
    clock: StepClock
    log: StepLog

    @property
    def queue_ahead(self) -> bool:
        """Whether one step stays queued ahead: step N+1 is launched before step N's numbers are read back, so
        the host launches N+1's first kernels while the GPU still runs N's optimizer, rather than the GPU idling
        at every step start until the host catches up. Pipelines (their timeline is read back per step) are
        read back at once, unless replayed as a CUDA graph; so are traced and checkpointed steps."""
        return self.plan.layout.pp == 1 or self.graphed is not None

    def save(self, step: int) -> None:
        """A checkpoint of `step` in --ckpt-dir (every rank calls it)."""
        checkpoint.save(self.args.ckpt_dir, step, self.opt, self.groups, self.settings, self.plan_hash)

    def save_hf(self, step: int, final: bool) -> None:
        """With --save-hf, the weights as a Hugging Face checkpoint (every rank calls it): in --save-hf at the end
        of the run, in --save-hf-stepNNNNNN at a --save-every step."""
        if not self.args.save_hf:
            return
        from runtime.hf import save_hf_weights
        out = self.args.save_hf if final else f"{self.args.save_hf}-step{step:06d}"
        config = self.args.hf_config or str(Path(self.args.init_from) / "config.json")
        save_hf_weights(self.stages, self.plan, self.groups, out, config)

    def close(self) -> None:
        """Stop the prefetcher, close the step CSV and release the optimizer."""
        self.prefetch.close()
        self.log.close()
        self.opt.close()


def build_trainer(plan: Plan, args, groups, cuda: bool, local_rank: int, results_path: str | None) -> Trainer:
    """The build part of the trainer: this rank's stages with the plan's recompute, the optimizer at the plan's
    sharding level, the checkpoint's state on --resume, the step function, the data prefetcher and the step log.

    Raises:
        PlanError: one sentence when the plan's FP8 needs a GPU this one is not, or the checkpoint cannot load.
    """
    spec, lay, shape = plan.model, plan.layout, plan.training
    source = open_source(args.data, spec.vocab_size, shape.seq_len, args.data_dtype, seed=args.seed)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    if lay.fp8:
        from runtime.parallel.fp8 import check_fp8_device
        why = check_fp8_device(device)
        if why:
            raise PlanError(why)
    stages = build_rank_stages(plan, groups, device, lay.overlap_tp, args.seed, args.compile)
    if args.init_from:  # before the optimizer takes its fp32 master copy of the weights
        from runtime.hf import load_hf_weights
        load_hf_weights(stages, plan, groups, args.init_from)
    compute = torch.bfloat16 if cuda else torch.float32
    settings = optimizer_settings(args)
    adam = AdamConfig(lr=settings.schedule.peak_lr, weight_decay=settings.weight_decay, grad_clip=settings.clip_grad)
    opt = build_optimizer(stages, groups, lay.sharding, adam, compute, lay.overlap_dp,
                          grad_dtype=GRAD_DTYPES[lay.grad_dtype])
    plan_hash = hashlib.sha256(json.dumps(plan.to_dict(), sort_keys=True).encode()).hexdigest()
    start = _resume(args, opt, groups, results_path) if args.resume else 0
    step_fn = select_train_step(lay)
    graphed = None
    if cuda and lay.cuda_graph:  # on CPU the same plan runs eagerly: graphs are a CUDA feature
        from runtime.graph import GraphedStep
        graphed = step_fn = GraphedStep(step_fn, opt)

    def make_step(step):
        return step_micro_batches(source, spec.family, spec.vocab_size, shape.seq_len, shape.global_batch,
                                  lay.micro_batch, lay.dp, groups.dp_rank, step, lay.cp, groups.cp_rank,
                                  seed=args.seed)

    prefetch = Prefetcher(make_step, start, device)
    clock = StepClock(cuda)
    log = StepLog(plan, args, groups, cuda, results_path, clock, StopFlag())
    return Trainer(plan=plan, args=args, groups=groups, cuda=cuda, local_rank=local_rank, stages=stages, opt=opt,
                   settings=settings, plan_hash=plan_hash, start=start, step_fn=step_fn, graphed=graphed,
                   prefetch=prefetch, clock=clock, log=log)


def _resume(args, opt, groups, results_path: str | None) -> int:
    """Load the newest complete checkpoint of --ckpt-dir into `opt` and return its step. Rank 0 says where it
    resumed from, names incomplete saves it skipped, and sets aside the step CSV's rows after that step."""
    start = checkpoint.load(args.ckpt_dir, opt, groups)
    supervise.progress(start)
    if dist.get_rank() == 0:
        print(f"resumed from {checkpoint.step_dir(args.ckpt_dir, start)}", flush=True)
        for leftover in checkpoint.incomplete_leftovers(args.ckpt_dir):
            print(f"note: skipped '{leftover}', left incomplete by an interrupted save", flush=True)
        if results_path:
            set_aside_rows_after(Path(results_path), start)
    return start
