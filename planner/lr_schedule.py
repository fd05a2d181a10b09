"""The learning rate of each step and the optimizer's other training settings, from `plan launch`'s options.

The schedule has Megatron-LM's shapes (OptimizerParamScheduler, --lr-decay-style): a linear warm-up to the peak,
then constant, linear or cosine decay to the minimum at `decay_steps`, or warm-up-stable-decay (WSD: the peak until
the last `wsd_decay_steps` before `decay_steps`, then linear, cosine, exponential or 1 - sqrt decay), and the
minimum after `decay_steps` (the warm-up's first step trains at peak / warmup_steps, where Megatron's starts at 0).
It is a function of the step alone, so a resumed run continues it exactly. Plain arithmetic with no torch: `plan launch` checks the options with it before
any worker starts, and every worker reads the same values from it. It sits in planner/ beside
launch_command.py (the command line it belongs to), which the planner's torch-free `plan export` uses too.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from planner.errors import PlanError

DECAY_STYLES = ("constant", "linear", "cosine", "wsd")
WSD_DECAY_STYLES = ("linear", "cosine", "exponential", "minus_sqrt")

DEFAULT_PEAK_LR = 3e-4
DEFAULT_WARMUP_STEPS = 10
DEFAULT_WEIGHT_DECAY = 0.1
DEFAULT_CLIP_GRAD = 1.0
ADAM_BETAS = (0.9, 0.95)
"""AdamW's betas (GPT-3's and Megatron-LM recipes'; not an option)."""
ADAM_EPS = 1e-8


@dataclass(frozen=True)
class LrSchedule:
    peak_lr: float = DEFAULT_PEAK_LR
    """Learning rate reached at the end of the warm-up."""
    min_lr: float = 0.0
    """Learning rate at decay_steps and after (linear, cosine and WSD decay)."""
    warmup_steps: int = DEFAULT_WARMUP_STEPS
    """Steps of linear warm-up: step s (0-based) of the warm-up trains at peak_lr * (s + 1) / warmup_steps."""
    decay_style: str = "constant"
    """constant: peak_lr after the warm-up; linear / cosine: from peak_lr at the warm-up's end to min_lr at
    decay_steps; wsd: peak_lr until wsd_decay_steps before decay_steps, then down to min_lr there."""
    decay_steps: int | None = None
    """The step (0-based, counted from the run's first step, across resumes) at which the decay reaches min_lr;
    needed by linear, cosine and WSD decay."""
    wsd_decay_steps: int | None = None
    """WSD: how many steps before decay_steps the decay starts (Megatron-LM's --lr-wsd-decay-iters)."""
    wsd_decay_style: str = "linear"
    """WSD: the decay's shape over those steps (linear, cosine, exponential: 2 * 0.5^r - 1, minus_sqrt: 1 - sqrt(r),
    r the fraction of them done)."""

    def __post_init__(self):
        if not self.peak_lr > 0 or not math.isfinite(self.peak_lr):
            raise PlanError(f"--lr must be a positive number, got {self.peak_lr}")
        if not 0 <= self.min_lr <= self.peak_lr:
            raise PlanError(f"--min-lr must be between 0 and --lr ({self.peak_lr}), got {self.min_lr}")
        if self.warmup_steps < 0:
            raise PlanError(f"--lr-warmup-steps must be 0 or more, got {self.warmup_steps}")
        if self.decay_style not in DECAY_STYLES:
            raise PlanError(f"--lr-decay-style must be one of {', '.join(DECAY_STYLES)}, got '{self.decay_style}'")
        if self.decay_style == "constant":
            if self.decay_steps is not None:
                raise PlanError("--lr-decay-steps needs --lr-decay-style linear, cosine or wsd (the learning rate is "
                                "constant after the warm-up)")
        elif self.decay_steps is None:
            raise PlanError(f"--lr-decay-style {self.decay_style} needs --lr-decay-steps, the step at which the "
                            "learning rate reaches --min-lr (counted across resumes, so it cannot follow from --steps)")
        elif self.decay_steps <= self.warmup_steps:
            raise PlanError(f"--lr-decay-steps ({self.decay_steps}) must be more than --lr-warmup-steps "
                            f"({self.warmup_steps})")
        if self.wsd_decay_style not in WSD_DECAY_STYLES:
            raise PlanError(f"--lr-wsd-decay-style must be one of {', '.join(WSD_DECAY_STYLES)}, got "
                            f"'{self.wsd_decay_style}'")
        if self.decay_style != "wsd":
            if self.wsd_decay_steps is not None:
                raise PlanError("--lr-wsd-decay-steps needs --lr-decay-style wsd")
        elif self.wsd_decay_steps is None:
            raise PlanError("--lr-decay-style wsd needs --lr-wsd-decay-steps, how many steps before --lr-decay-steps "
                            "the decay starts")
        elif not 0 < self.wsd_decay_steps <= self.decay_steps - self.warmup_steps:
            raise PlanError(f"--lr-wsd-decay-steps must be between 1 and --lr-decay-steps - --lr-warmup-steps "
                            f"({self.decay_steps - self.warmup_steps}), got {self.wsd_decay_steps}")

    def at(self, step: int) -> float:
        """The learning rate of step `step` (0-based)."""
        if step < self.warmup_steps:
            return self.peak_lr * (step + 1) / self.warmup_steps
        if self.decay_style == "constant":
            return self.peak_lr
        if self.decay_style == "wsd":
            decay_start = self.decay_steps - self.wsd_decay_steps
            if step <= decay_start:
                return self.peak_lr
            progress, shape = min(1.0, (step - decay_start) / self.wsd_decay_steps), self.wsd_decay_style
        else:
            progress = min(1.0, (step - self.warmup_steps) / (self.decay_steps - self.warmup_steps))
            shape = self.decay_style
        return self.min_lr + (self.peak_lr - self.min_lr) * _fraction_of_peak_left(shape, progress)


def _fraction_of_peak_left(shape: str, progress: float) -> float:
    """How much of (peak - min) is left after `progress` (0..1) of a decay of this shape."""
    if shape == "linear":
        return 1.0 - progress
    if shape == "cosine":
        return 0.5 * (1.0 + math.cos(math.pi * progress))
    if shape == "exponential":
        return 2.0 * 0.5 ** progress - 1.0
    return 1.0 - math.sqrt(progress)  # minus_sqrt


@dataclass(frozen=True)
class OptimizerSettings:
    schedule: LrSchedule
    weight_decay: float = DEFAULT_WEIGHT_DECAY
    """AdamW's decoupled weight decay of every matrix (the embeddings included); norms and biases are not decayed."""
    clip_grad: float = DEFAULT_CLIP_GRAD
    """Global gradient-norm clipping threshold; 0 turns clipping off."""

    def __post_init__(self):
        if not 0 <= self.weight_decay < 1 or not math.isfinite(self.weight_decay):
            raise PlanError(f"--weight-decay must be at least 0 and below 1, got {self.weight_decay}")
        if not self.clip_grad >= 0 or not math.isfinite(self.clip_grad):
            raise PlanError(f"--clip-grad must be 0 (off) or a positive number, got {self.clip_grad}")


def add_options(ap) -> None:
    """The options of `plan launch` and of the workers it starts (runtime.train), declared once."""
    ap.add_argument("--lr", type=float, default=DEFAULT_PEAK_LR, help="peak learning rate (default 3e-4)")
    ap.add_argument("--min-lr", type=float, default=0.0, help="learning rate at the end of the decay (default 0)")
    ap.add_argument("--lr-warmup-steps", type=int, default=DEFAULT_WARMUP_STEPS,
                    help="steps of linear warm-up to --lr (default 10)")
    ap.add_argument("--lr-decay-style", choices=DECAY_STYLES, default="constant",
                    help="after the warm-up: constant (default), linear / cosine decay to --min-lr, or wsd (stable "
                         "at --lr, then the last --lr-wsd-decay-steps decay)")
    ap.add_argument("--lr-decay-steps", type=int, default=None,
                    help="step at which the decay reaches --min-lr, counted from the first step across resumes "
                         "(Megatron-LM's --lr-decay-iters)")
    ap.add_argument("--lr-wsd-decay-steps", type=int, default=None,
                    help="wsd: how many steps before --lr-decay-steps the decay starts")
    ap.add_argument("--lr-wsd-decay-style", choices=WSD_DECAY_STYLES, default="linear",
                    help="wsd: the decay's shape (default linear)")
    ap.add_argument("--weight-decay", type=float, default=DEFAULT_WEIGHT_DECAY,
                    help="AdamW weight decay of the weight matrices (default 0.1)")
    ap.add_argument("--clip-grad", type=float, default=DEFAULT_CLIP_GRAD,
                    help="clip the global gradient norm to this (default 1.0; 0: no clipping)")


def add_resume_option(ap) -> None:
    """`plan launch`'s (and its workers') answer to a checkpoint saved under other settings."""
    ap.add_argument("--override-lr-schedule", action="store_true",
                    help="with --resume: go on with this launch's learning-rate schedule and AdamW options where "
                         "they differ from the checkpoint's (otherwise refused)")


def from_args(args) -> OptimizerSettings:
    """The settings of parsed `add_options` options; a bad value raises PlanError with one sentence."""
    schedule = LrSchedule(peak_lr=args.lr, min_lr=args.min_lr, warmup_steps=args.lr_warmup_steps,
                          decay_style=args.lr_decay_style, decay_steps=args.lr_decay_steps,
                          wsd_decay_steps=args.lr_wsd_decay_steps, wsd_decay_style=args.lr_wsd_decay_style)
    return OptimizerSettings(schedule=schedule, weight_decay=args.weight_decay, clip_grad=args.clip_grad)


def settings_from_dict(d: dict) -> OptimizerSettings:
    """The settings of `dataclasses.asdict(settings)` (as a checkpoint's training.json holds them)."""
    return OptimizerSettings(schedule=LrSchedule(**d["schedule"]), weight_decay=d["weight_decay"],
                             clip_grad=d["clip_grad"])


def to_argv(settings: OptimizerSettings) -> list[str]:
    """The worker options that carry `settings` (the defaults left out, so that commands stay short)."""
    s, out = settings.schedule, []
    if s.peak_lr != DEFAULT_PEAK_LR:
        out += ["--lr", repr(s.peak_lr)]
    if s.min_lr:
        out += ["--min-lr", repr(s.min_lr)]
    if s.warmup_steps != DEFAULT_WARMUP_STEPS:
        out += ["--lr-warmup-steps", str(s.warmup_steps)]
    if s.decay_style != "constant":
        out += ["--lr-decay-style", s.decay_style, "--lr-decay-steps", str(s.decay_steps)]
    if s.decay_style == "wsd":
        out += ["--lr-wsd-decay-steps", str(s.wsd_decay_steps), "--lr-wsd-decay-style", s.wsd_decay_style]
    if settings.weight_decay != DEFAULT_WEIGHT_DECAY:
        out += ["--weight-decay", repr(settings.weight_decay)]
    if settings.clip_grad != DEFAULT_CLIP_GRAD:
        out += ["--clip-grad", repr(settings.clip_grad)]
    return out
