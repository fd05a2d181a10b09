"""Pipeline parallelism: the executor of any registered pipeline schedule (planner/schedules/) over the plan's
(non-uniform) virtual stages.

Stages: virtual stage j (of V = pp * vpp, in model order) lives on pipeline rank j % pp as that rank's
chunk j // pp; it holds the plan's `StagePlan.layers` consecutive layers with the plan's per-layer
recompute modes (`StagePlan.layer_modes()`), the embedding when j == 0 and the head + loss when j == V-1
(`build_pipeline_stages`, on top of runtime.model.build_stage).

Schedule: the layout's (Layout.schedule: 1F1B, interleaved 1F1B or any registered schedule whose `runs_on_ours`
is set, all on the placement above): each rank runs `PipelineSchedule.actions(pp, v, m, rank)` in order, the
order the planner plays to time the step and walks to count the micro-batches in flight. A schedule the runtime
does not run (DualPipe) is refused with its `refusal` sentence.
Why our own executor rather than torch.distributed.pipelining (Schedule1F1B / ScheduleInterleaved1F1B):
its stages take one tensor in and one out with a loss_fn on the last stage, while ours take tokens on the
first stage, labels on the last and positions on every stage, and the step needs control it does not give:
per-stage MoE auxiliary losses backpropagated on their own stage, the tied-embedding gradient summed
between the first and last stage, and the data-parallel optimizer told, per chunk, which backward is its
last (so gradient reduction starts while the pipeline still drains), plus the per-action timeline below.

Communication: every activation and gradient moves by point-to-point ops on the pipeline group. The whole
step is first simulated in unit time (each rank runs its action list in order; an action starts one tick
after its input was produced), which gives every message a tick. At each tick a rank posts, as one
`batch_isend_irecv`, the sends of what it produced in that tick and the receives of what its neighbours
produced in it. Every pair of ranks therefore posts matching batches in the same order (NCCL-safe: no
send/recv order deadlock even for pp = 2, where both directions share one pair), receives are posted long
before they are needed and sends right after the producing compute, and a rank waits only on the receive
an action consumes, so transfers overlap compute on both sides.

Step time in the planner: PipelineSchedule.play_s plays these same action lists with each virtual stage's
forward and backward time and a hop time between ranks. Its closed form, `analytic_step_time` here,
m * max_r t_r + (sum_r t_r - max_r t_r) / v, is what that play gives for equal stages and free transfers; with
uneven chunks (which pace the fill and drain) and hops that wait (the per-tick batches serialise on the NCCL
stream) replayed steps run above it, which the play models and calibration fits the hop of.
`measured_bubble_fraction(timelines)` measures the same quantity from the recorded action start/end
times: 1 - (busy time of the busiest rank) / (span of the step from its first action to its last).
"""
from __future__ import annotations

import time

import torch
import torch.distributed as dist

from planner.schedule import closed_form_s, megatron_schedule, rank_schedule  # noqa: F401 (re-exported)
from planner.schedules import PipelineSchedule, schedule_named
from planner.plan import stage_layer_ranges  # noqa: F401 (re-exported: where the runtime cuts the model)
from runtime.label_count import global_label_count
from runtime.parallel.tensor import group_size

__all__ = ["build_pipeline_stages", "stage_layer_ranges", "rank_schedule", "simulate", "train_step",
           "pipeline_train_step", "measured_bubble_fraction", "gather_timeline", "analytic_step_time", "analytic_bubble_fraction",
           "last_timeline"]


# ------------------------------------------------------------------------------------------------
# stages

def build_pipeline_stages(spec, groups, stage_plans, overlap: bool = True, device="cpu", seed: int = 1234):
    """This pipeline rank's Stage modules, one per chunk, in chunk order (virtual stage j = c * pp + rank)."""
    from runtime.model import build_stage
    pp, r = groups.layout.pp, groups.pp_rank
    V = len(stage_plans)
    if V % pp:
        raise ValueError(f"{V} virtual stages do not divide over {pp} pipeline ranks")
    ranges = stage_layer_ranges(stage_plans)
    stages = []
    for j in range(r, V, pp):
        lo, hi = ranges[j]
        st = build_stage(spec, groups, lo, hi, has_embedding=j == 0, has_head=j == V - 1,
                         layer_modes=stage_plans[j].layer_modes(), overlap=overlap, device=device, seed=seed)
        st.virtual_stage = j
        stages.append(st)
    return stages


# ------------------------------------------------------------------------------------------------
# the schedule

def simulate(pp: int, v: int, m: int, schedule: PipelineSchedule | None = None):
    """Unit-time execution of every rank's schedule (`schedule`, by default 1F1B for v == 1 and interleaved 1F1B for
    v > 1). Returns (ticks, messages):
    ticks[r] = list of (tick, Action); messages = list of
    (tick, kind, src_rank, src_chunk, dst_rank, dst_chunk, mb) where
    kind 'act' carries virtual stage j's output to j+1 and 'grad' carries j's input gradient to j-1."""
    schedule = schedule or megatron_schedule(v)
    V = pp * v
    scheds = [schedule.actions(pp, v, m, r) for r in range(pp)]
    pos = [0] * pp
    done = {}  # (kind, j, mb) -> tick
    ticks = [[] for _ in range(pp)]
    msgs = []
    t = 0
    while any(pos[r] < len(scheds[r]) for r in range(pp)):
        ran = []
        for r in range(pp):
            if pos[r] >= len(scheds[r]):
                continue
            a = scheds[r][pos[r]]
            j = a.chunk * pp + r
            if a.kind == "F":
                ready = j == 0 or done.get(("F", j - 1, a.mb), t) < t
            else:
                ready = done.get(("F", j, a.mb), t) < t and (j == V - 1 or done.get(("B", j + 1, a.mb), t) < t)
            if ready:
                ran.append((r, a, j))
        if not ran and t > 4 * (max(len(x) for x in scheds) + V):
            raise RuntimeError("pipeline schedule cannot make progress (deadlock in the action order)")
        for r, a, j in ran:
            done[(a.kind, j, a.mb)] = t
            ticks[r].append((t, a))
            pos[r] += 1
            if a.kind == "F" and j < V - 1:
                msgs.append((t, "act", r, a.chunk, (j + 1) % pp, (j + 1) // pp, a.mb))
            if a.kind == "B" and j > 0:
                msgs.append((t, "grad", r, a.chunk, (j - 1) % pp, (j - 1) // pp, a.mb))
        t += 1
    return ticks, msgs


def analytic_step_time(t_r: list[float], m: int, v: int) -> float:
    """The schedule's closed form, m * max t_r + (sum t_r - max t_r) / v (planner/schedule.py)."""
    return closed_form_s(t_r, m, v)


def analytic_bubble_fraction(t_r: list[float], m: int, v: int) -> float:
    return 1.0 - m * max(t_r) / analytic_step_time(t_r, m, v)


def measured_bubble_fraction(timelines) -> float:
    """timelines: one list per pipeline rank (or a flat list with a 'rank' field) of records with 'start'
    and 'end' (seconds on a clock common to the ranks, e.g. relative to a barrier). Returns
    1 - busiest rank's busy time / (last end - first start over all ranks)."""
    if timelines and isinstance(timelines[0], dict):
        per = {}
        for rec in timelines:
            per.setdefault(rec["rank"], []).append(rec)
        timelines = list(per.values())
    start = min(rec["start"] for tl in timelines for rec in tl)
    end = max(rec["end"] for tl in timelines for rec in tl)
    busy = max(sum(rec["end"] - rec["start"] for rec in tl) for tl in timelines)
    return 1.0 - busy / (end - start)


def gather_timeline(groups) -> list[list[dict]]:
    """Every pipeline rank's `last_timeline` (collective over the pipeline group), ready for
    `measured_bubble_fraction`. Times share the origin of the barrier at the step's start (on CUDA each
    rank's clock starts at its own event after that barrier, so cross-rank offsets are within the barrier's skew)."""
    out = [None] * group_size(groups.pp)
    dist.all_gather_object(out, list(last_timeline), group=groups.pp)
    return out


# ------------------------------------------------------------------------------------------------
# the step

last_timeline: list[dict] = []
"""The calling rank's action records of the latest `train_step` (kind, chunk, virtual stage, mb, start,
end; seconds from the step's start, after a barrier over the pipeline group)."""

_EMB_GROUPS: dict = {}


def _embedding_group(groups):
    """Process group of the two ranks holding the tied word embedding (first and last pipeline rank with
    the same dp/cp/tp coordinates). Every rank must call this the first time (new_group is collective)."""
    key = id(groups)
    if key not in _EMB_GROUPS:
        lay = groups.layout
        n = lay.tp * lay.cp * lay.dp
        mine = None
        for i in range(n):
            g = dist.new_group([i, i + (lay.pp - 1) * n])
            if groups.rank % n == i:
                mine = g
        _EMB_GROUPS[key] = mine
    return _EMB_GROUPS[key]


def _tied_params(stages):
    out = []
    for st in stages:
        emb = getattr(st, "embedding", None)
        if emb is not None and st.spec.tie_embeddings:
            out.append(emb.word.weight)
        head = getattr(st, "head", None)
        if head is not None and getattr(head, "word_weight", None) is not None:
            out.append(head.word_weight)
    return out


class _Batch:
    """The requests of one batch_isend_irecv, waited at most once (waiting twice on a completed gloo
    point-to-point request blocks forever)."""

    def __init__(self, reqs):
        self.reqs, self.done = reqs, False

    def wait(self):
        if not self.done:
            for q in self.reqs:
                q.wait()
            self.done = True

    def finished(self) -> bool:
        """True once every request has completed (polled, never waited twice)."""
        if not self.done and all(q.is_completed() for q in self.reqs):
            self.done = True
        return self.done


def _act_dtype(stages, opt):
    dt = getattr(opt, "compute_dtype", None)
    if dt is not None:
        return dt
    bufs = getattr(opt, "buffers", None)
    if bufs:
        return bufs[0].param_data.dtype
    return next(stages[0].parameters()).dtype


class _Clock:
    def __init__(self, device):
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.t0 = torch.cuda.Event(enable_timing=True)
            self.t0.record()
        else:
            self.t0 = time.perf_counter()

    def mark(self):
        if self.cuda:
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            return e
        return time.perf_counter() - self.t0

    def seconds(self, mark):
        return self.t0.elapsed_time(mark) / 1e3 if self.cuda else mark


def layout_schedule(layout) -> PipelineSchedule:
    """The schedule the runtime runs for `layout` (Layout.schedule); a schedule it does not run is refused in one
    sentence (PipelineSchedule.refusal)."""
    schedule = schedule_named(layout.schedule)
    if not schedule.runs_on_ours:
        raise ValueError(schedule.refusal)
    return schedule


class _RankProgram:
    """What one pipeline rank does in a step, from the unit-time simulation: its action at each tick, the transfers
    it posts at each tick, the ticks where it does either, and each chunk's micro-batch of its last backward."""

    def __init__(self, schedule: PipelineSchedule, pp: int, v: int, m: int, r: int):
        ticks, msgs = _schedule_cache(schedule, pp, v, m)
        self.tick_ops: dict[int, list] = {}
        for (t, kind, src, schunk, dst, dchunk, mb) in msgs:
            if src == r:
                self.tick_ops.setdefault(t, []).append(("send", kind, dst, schunk, mb))
            if dst == r:
                self.tick_ops.setdefault(t, []).append(("recv", kind, src, dchunk, mb))
        self.actions = dict(ticks[r])
        self.events = sorted(set(self.actions) | set(self.tick_ops))
        self.last_backward = {}  # chunk -> micro-batch of its last backward on this rank
        for (_, a) in ticks[r]:
            if a.kind == "B":
                self.last_backward[a.chunk] = a.mb


class _PipelineStep:
    """One rank's state through a pipeline step: the received, outgoing and saved tensors, the batches of
    point-to-point ops in flight, the loss and the timeline. train_step drives it tick by tick."""

    def __init__(self, stages, micro_batches, opt, groups, record_timeline: bool):
        lay = groups.layout
        self.stages, self.micro_batches, self.opt, self.groups = stages, micro_batches, opt, groups
        self.pp, self.r, self.v, self.m = lay.pp, groups.pp_rank, len(stages), len(micro_batches)
        self.V = self.pp * self.v
        self.overlap_pp = lay.overlap_pp
        self.device = micro_batches[0]["tokens"].device
        self.dtype = _act_dtype(stages, opt)
        self.dp_cp = group_size(groups.dp_cp)
        self.count = global_label_count(micro_batches, groups)
        self.program = _RankProgram(layout_schedule(lay), self.pp, self.v, self.m, self.r)
        self.capturing = self.device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        self.record_timeline = record_timeline and not self.capturing  # a replayed graph has no host-side timeline
        self.tied = _tied_params(stages) if (self.pp > 1 and stages[0].spec.tie_embeddings) else []
        self.emb_group = _embedding_group(groups) if (self.pp > 1 and stages[0].spec.tie_embeddings) else None
        self.dist_opt = hasattr(opt, "sync")
        self.hold_sync = self.dist_opt and bool(self.tied)  # reduce tied grads before the DP reduction launches
        seq = micro_batches[0]["tokens"].shape[1]
        bsz = micro_batches[0]["tokens"].shape[0]
        self.act_shape = (seq // group_size(groups.tp), bsz, stages[0].spec.hidden)
        self.recvs = {}     # (kind, chunk, mb) -> (buffer, batch)
        self.outgoing = {}  # (kind, chunk, mb) -> tensor to send (produced by this rank's action)
        self.sends = []     # (batch, sent tensor): each kept alive only until its batch has completed
        self.batches = []
        self.saved = {}     # (chunk, mb) -> (input, output, aux)
        self.total = torch.zeros((), dtype=torch.float32, device=self.device)
        self.timeline = []
        self.clock = None

    def peer(self, pp_rank):
        return dist.get_global_rank(self.groups.pp, pp_rank)

    def wait_recv(self, key):
        buf, batch = self.recvs.pop(key)
        batch.wait()
        return buf

    def run_action(self, a) -> None:
        """Run one forward or backward, its input waited for before its start mark, so the recorded span is the
        compute only (on CUDA the wait is a stream dependency: the start event fires once the data is in)."""
        j = a.chunk * self.pp + self.r
        pending = ("act", a.chunk, a.mb) if a.kind == "F" else ("grad", a.chunk, a.mb)
        if pending in self.recvs:
            self.recvs[pending][1].wait()
        t0 = self.clock.mark()
        if a.kind == "F":
            self.forward(a, j)
        else:
            self.backward(a, j)
        if self.record_timeline:
            self.timeline.append(dict(rank=self.r, kind=a.kind, chunk=a.chunk, stage=j, mb=a.mb, start=t0,
                                      end=self.clock.mark()))

    def forward(self, a, j: int) -> None:
        from runtime.parallel.expert import collect_aux_loss

        st, mb = self.stages[a.chunk], self.micro_batches[a.mb]
        x = mb["tokens"] if j == 0 else self.wait_recv(("act", a.chunk, a.mb)).requires_grad_()
        out = st(x, mb.get("positions"), mb.get("token_types") if j == 0 else None,
                 mb["labels"] if j == self.V - 1 else None)
        aux = collect_aux_loss(st)
        if j == self.V - 1:
            loss_sum, _ = out
            out = loss_sum / self.count
            self.total += out.detach()
        else:
            self.outgoing[("act", a.chunk, a.mb)] = out.detach()
        self.saved[(a.chunk, a.mb)] = (x if j > 0 else None, out, aux)

    def backward(self, a, j: int) -> None:
        """The backward of one micro-batch through chunk a.chunk; the data-parallel reduction is told whether it is
        the chunk's last."""
        st = self.stages[a.chunk]
        x, out, aux = self.saved.pop((a.chunk, a.mb))
        last = self.program.last_backward[a.chunk] == a.mb
        if self.dist_opt:
            self.opt.sync = (not self.hold_sync) and last
        elif hasattr(st, "set_requires_gradient_sync"):   # FSDP2
            st.set_requires_gradient_sync(last)
        # MoE load-balancing losses of this stage: a mean over micro-batches and dp*cp ranks
        aux = aux / (self.m * self.dp_cp) if aux is not None else None
        if j == self.V - 1:
            torch.autograd.backward(out + aux if aux is not None else out)
        else:
            g = self.wait_recv(("grad", a.chunk, a.mb))
            if aux is not None:
                torch.autograd.backward([out, aux], [g, torch.ones_like(aux)])
            else:
                torch.autograd.backward(out, g)
        if j > 0:
            self.outgoing[("grad", a.chunk, a.mb)] = x.grad

    def post_transfers(self, t: int) -> None:
        """Post this tick's sends and receives as one batch; drop sent tensors whose transfer is done."""
        ops, new_recvs, sent = [], [], []
        for (what, kind, other, chunk, mbi) in self.program.tick_ops.get(t, ()):
            if what == "send":
                tensor = self.outgoing.pop((kind, chunk, mbi)).contiguous()
                ops.append(dist.P2POp(dist.isend, tensor, self.peer(other), self.groups.pp))
                sent.append(tensor)
            else:
                buf = torch.empty(self.act_shape, dtype=self.dtype, device=self.device)
                ops.append(dist.P2POp(dist.irecv, buf, self.peer(other), self.groups.pp))
                new_recvs.append(((kind, chunk, mbi), buf))
        if ops:
            batch = _Batch(dist.batch_isend_irecv(ops))
            for key, buf in new_recvs:
                self.recvs[key] = (buf, batch)
            self.batches.append(batch)
            self.sends.extend((batch, tensor) for tensor in sent)
            if sent and not self.overlap_pp:
                # the plan turned the overlap off (planner/cost/comm.py p2p_s prices it): the sender waits for its
                # transfer before its next action, as Megatron's --no-overlap-p2p-communication does
                batch.wait()
        # drop sent activations and gradients as soon as their transfer is done, so a step does not keep every
        # micro-batch's boundary tensors alive to its end. While a CUDA graph captures the step nothing has run and
        # a captured transfer cannot be polled: a batch counts as done once this stream has waited for it (the
        # receive that shares the batch was consumed), which orders any reuse of the memory after the transfer.
        self.sends = [(b, x) for b, x in self.sends if not (b.done if self.capturing else b.finished())]

    def finish_gradients(self) -> None:
        """The tied embedding's gradient summed between the first and last stage, and the data-parallel reduction
        finished."""
        opt = self.opt
        if self.tied:
            if self.hold_sync:
                for p in self.tied:
                    dist.all_reduce(opt.buffer_of[p].grad_view(p), group=self.emb_group)
                opt.sync = True
            opt.finish_grads()
            if not self.hold_sync:   # FSDP2: the reduced shards of both copies line up (same shape, same dp_cp rank)
                for p in self.tied:
                    if p.grad is not None:
                        g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                        dist.all_reduce(g, group=self.emb_group)
        else:
            if self.dist_opt:
                opt.sync = True
            opt.finish_grads()

    def reduce_loss(self):
        """The global-batch mean loss, the same on every rank (the last stage's sum over data x context ranks)."""
        if self.r == self.pp - 1 and self.dp_cp > 1:
            dist.all_reduce(self.total, group=self.groups.dp_cp)
        if self.r != self.pp - 1:
            self.total.zero_()
        dist.all_reduce(self.total, group=self.groups.pp)
        return self.total

    def publish_timeline(self) -> None:
        """The recorded actions in seconds from the step's start, as `last_timeline`."""
        if self.clock.cuda:
            torch.cuda.synchronize()
        for rec in self.timeline:
            rec["start"], rec["end"] = self.clock.seconds(rec["start"]), self.clock.seconds(rec["end"])
        last_timeline[:] = self.timeline


def train_step(stages, micro_batches, opt, groups, lr=None, before_step=None, record_timeline: bool = True):
    """One optimizer step with the layout's pipeline schedule (the runtime.step.train_step signature, for pp > 1).

    stages: this rank's chunks in order (build_pipeline_stages); micro_batches: all m micro-batches of
    this rank (dicts with tokens/labels [b, s], optional positions [s], token_types [b, s]); every
    pipeline rank gets the same list (only the first stage reads tokens, only the last labels).
    Returns (global-batch mean loss, same on every rank; gradient norm)."""
    step = _PipelineStep(stages, micro_batches, opt, groups, record_timeline)
    opt.zero_grad()
    opt.begin_micro_batch(last=True)     # reset bucket counters once; `sync` is then set per backward
    if step.record_timeline:
        dist.barrier(group=groups.pp)
    step.clock = _Clock(step.device)
    for t in step.program.events:
        a = step.program.actions.get(t)
        if a is not None:
            step.run_action(a)
        step.post_transfers(t)
    for batch in step.batches:
        batch.wait()
    step.sends = []
    assert not step.recvs and not step.outgoing and not step.saved, "pipeline schedule left work behind"
    step.finish_gradients()
    total = step.reduce_loss()
    if step.record_timeline:
        step.publish_timeline()
    if before_step is not None:
        before_step()
    norm = opt.clip_grad_norm()
    opt.step(lr)
    return total, norm


pipeline_train_step = train_step

_SCHED: dict = {}


def _schedule_cache(schedule: PipelineSchedule, pp: int, v: int, m: int):
    key = (schedule.name, pp, v, m)
    if key not in _SCHED:
        _SCHED[key] = simulate(pp, v, m, schedule)
    return _SCHED[key]
