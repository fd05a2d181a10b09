"""What one simulated training step holds and sends: live tensor bytes by part, and every c10d collective.

`StepTracker` is a TorchDispatchMode entered inside the FakeTensorMode (runtime/simulate/fake_world.py). Every
operator's output storage is counted once, with its bytes, from its creation until the storage is freed (a
weak reference's callback), so the tracker knows the live bytes at every moment and keeps the parts of the
largest moment (`peak`); a storage resized in place (FSDP2's unsharded parameters) counts its new size. Parts:
  weights, gradients, optimizer   storages alive when the step began, named by `classify` (the optimizer's
                                  flat buffers); other storages alive then count as `other_state`
  activations                     storages created in the step and saved for backward (saved-tensor hooks),
                                  and the pipeline chunks' outputs, held until their backward (keep_outputs)
  temporaries                     every other storage created in the step (outputs, gradients in flight,
                                  communication buffers, the optimizer's scratch)
Collectives: each `c10d::` operator is recorded as (kind, group) with its bytes, those of its largest
argument (c10d passes the output buffers as arguments): the full buffer of a gather or a scatter, as the cost
model prices them.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

import torch
from torch.utils._python_dispatch import TorchDispatchMode, is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

PARTS = ("weights", "gradients", "optimizer", "other_state", "activations", "temporaries")

COLLECTIVE_KINDS = {
    "allreduce_": "all_reduce", "allreduce_coalesced_": "all_reduce",
    "reduce_scatter_": "reduce_scatter", "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "allgather_": "all_gather", "_allgather_base_": "all_gather", "allgather_into_tensor_coalesced_": "all_gather",
    "allgather_coalesced_": "all_gather",
    "alltoall_": "all_to_all", "alltoall_base_": "all_to_all",
    "send": "send", "recv_": "recv", "recv_any_source_": "recv",
    "broadcast_": "broadcast", "reduce_": "reduce", "gather_": "gather", "scatter_": "scatter", "barrier": "barrier",
}
"""c10d operator name -> the kind reported (and priced by the cost model)."""


@dataclass
class CollectiveRecord:
    kind: str
    group: str
    """The group's name in the runtime's ParallelGroups (tp, dp_cp, pp...; see StepTracker.group_names)."""
    group_size: int
    bytes: int = 0
    count: int = 0


@dataclass
class Peak:
    total_bytes: int = 0
    parts: dict = field(default_factory=lambda: dict.fromkeys(PARTS, 0))


def _tensors(obj) -> list[torch.Tensor]:
    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]


def storages_of(t: torch.Tensor) -> list:
    """The storages that hold `t`'s data: a wrapper subclass (a DTensor, FSDP2's sharded parameters, gradients and
    Adam states) holds none of its own (its nominal storage has the global shape's bytes), only its inner tensors'."""
    if is_traceable_wrapper_subclass(t):
        names, _ = t.__tensor_flatten__()
        inner = [getattr(t, name) for name in names]
        return [s for x in inner if isinstance(x, torch.Tensor) for s in storages_of(x)]
    return [t.untyped_storage()]


def _process_group(args):
    """The ProcessGroup among a c10d operator's arguments (passed boxed, as a ScriptObject), or None."""
    from torch._C._distributed_c10d import ProcessGroup

    for a in tree_flatten(args)[0]:
        if isinstance(a, ProcessGroup):
            return a
        if isinstance(a, torch.ScriptObject):
            try:
                return ProcessGroup.unbox(a)
            except RuntimeError:  # a script object that is no process group (a ReduceOp)
                continue
    return None


class StepTracker(TorchDispatchMode):
    """Live bytes by part and collectives of the steps run inside it (see the module docstring)."""

    def __init__(self, group_names: dict[str, str] | None = None):
        super().__init__()
        self.group_names = group_names or {}
        """ProcessGroup.group_name -> the name reported for it (groups not named are reported by size)."""
        self.live: dict[int, tuple[int, str]] = {}
        """id of a live storage -> (bytes, part)."""
        self._refs: dict[int, weakref.ref] = {}
        self.totals = dict.fromkeys(PARTS, 0)
        self.peak = Peak()
        self.collectives: dict[tuple[str, str], CollectiveRecord] = {}
        self.recording = False
        """Collectives are recorded (and the peak kept) only between begin_step() and end_step()."""

    # -- storages ------------------------------------------------------------------------------------
    def _add(self, storage, part: str) -> None:
        key = id(storage)
        if key in self.live:
            return
        n = storage.nbytes()
        self.live[key] = (n, part)
        self.totals[part] += n
        self._refs[key] = weakref.ref(storage, lambda _, key=key: self._drop(key))
        if self.recording:
            self._note_peak()

    def _drop(self, key: int) -> None:
        n, part = self.live.pop(key, (0, None))
        self._refs.pop(key, None)
        if part is not None:
            self.totals[part] -= n

    def _move(self, storage, part: str) -> None:
        key = id(storage)
        if key in self.live:
            n, old = self.live[key]
            self.totals[old] -= n
            self.totals[part] += n
            self.live[key] = (n, part)

    def _resized(self, storage) -> None:
        """A storage resized in place (FSDP2 frees and refills its unsharded parameters so): count its new size."""
        key = id(storage)
        if key in self.live:
            n, part = self.live[key]
            new = storage.nbytes()
            self.totals[part] += new - n
            self.live[key] = (new, part)
            if self.recording and new > n:
                self._note_peak()
        else:
            self._add(storage, "temporaries")

    def _note_peak(self) -> None:
        total = sum(self.totals.values())
        if total > self.peak.total_bytes:
            self.peak = Peak(total, dict(self.totals))

    def __enter__(self):
        tracker, original = self, torch.UntypedStorage.resize_

        def resize_(storage, size):
            out = original(storage, size)
            tracker._resized(storage)
            return out

        self._original_resize = original
        torch.UntypedStorage.resize_ = resize_
        return super().__enter__()

    def __exit__(self, *exc):
        torch.UntypedStorage.resize_ = self._original_resize
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if name.startswith("c10d::"):
            self._record_collective(name[len("c10d::"):], args, kwargs, out)
        for t in _tensors(out):
            for storage in storages_of(t):
                self._add(storage, "temporaries")
        return out

    def _record_collective(self, op: str, args, kwargs, out) -> None:
        kind = COLLECTIVE_KINDS.get(op)
        if kind is None or not self.recording:
            return
        pg = _process_group((args, kwargs))
        size = pg.size() if pg is not None else 0
        group = self.group_names.get(pg.group_name, f"{size} ranks") if pg is not None else "?"
        # c10d operators take their output buffers as arguments: the largest argument is the full buffer
        sizes = [sum(t.numel() * t.element_size() for t in _tensors(a)) for a in (*args, *(kwargs or {}).values())]
        rec = self.collectives.setdefault((kind, group), CollectiveRecord(kind, group, size))
        rec.bytes += max(sizes, default=0)
        rec.count += 1

    # -- steps ---------------------------------------------------------------------------------------
    def _pack(self, t: torch.Tensor):
        for storage in storages_of(t):
            key = id(storage)
            if key in self.live and self.live[key][1] == "temporaries":
                self._move(storage, "activations")
        return t

    def keep_outputs(self, module) -> None:
        """Count the outputs of `module` (a pipeline chunk) as activations: the schedule holds each until its
        backward, as the planner counts them (planner/memory/activations.py, pipeline_output_bytes)."""
        def hook(_module, _inputs, output):
            for t in _tensors(output):
                self._pack(t)

        module.register_forward_hook(hook)

    def saved_tensors_hooks(self):
        return torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

    def begin_step(self, classify) -> None:
        """Start a recorded step: storages alive now are state, named by classify(storage id) -> part or None."""
        for key, (n, part) in list(self.live.items()):
            new = classify(key) or "other_state"
            if new != part:
                self.totals[part] -= n
                self.totals[new] += n
                self.live[key] = (n, new)
        self.peak = Peak(sum(self.totals.values()), dict(self.totals))
        self.collectives = {}
        self.recording = True

    def end_step(self) -> None:
        self.recording = False
