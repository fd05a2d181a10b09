"""The learning-rate schedule and optimizer options of `plan launch` (planner/lr_schedule.py): values by hand, bad
options refused in one sentence, and the options carried unchanged from `plan launch` to its workers."""
import math

import pytest

from planner.errors import PlanError
from planner.launch_command import build_parser, torchrun_command
from planner.lr_schedule import LrSchedule, OptimizerSettings, from_args


def test_warmup_then_constant():
    s = LrSchedule(peak_lr=1e-3, warmup_steps=4)
    assert [s.at(i) for i in range(6)] == pytest.approx([2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3, 1e-3])
    assert LrSchedule(peak_lr=1e-3, warmup_steps=0).at(0) == 1e-3


def test_linear_decay_by_hand():
    s = LrSchedule(peak_lr=1.0, min_lr=0.1, warmup_steps=2, decay_style="linear", decay_steps=12)
    # steps 2..12 go from 1.0 to 0.1 in ten equal steps of 0.09
    assert [s.at(i) for i in (0, 1, 2, 3, 7, 12, 50)] == pytest.approx([0.5, 1.0, 1.0, 0.91, 0.55, 0.1, 0.1])


def test_cosine_decay_by_hand():
    s = LrSchedule(peak_lr=1.0, min_lr=0.1, warmup_steps=2, decay_style="cosine", decay_steps=12)
    # step 4: progress 0.2, cos(0.2 pi) = 0.809017; step 7: halfway, the mean of peak and minimum
    assert s.at(4) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + 0.8090169943749475))
    assert s.at(7) == pytest.approx(0.55)
    assert s.at(12) == pytest.approx(0.1) and s.at(1000) == pytest.approx(0.1)
    values = [s.at(i) for i in range(2, 13)]
    assert all(a > b for a, b in zip(values, values[1:]))


@pytest.mark.parametrize("shape, halfway", [
    ("linear", 0.5), ("cosine", 0.5), ("exponential", 2 * 0.5 ** 0.5 - 1), ("minus_sqrt", 1 - 0.5 ** 0.5)])
def test_wsd_is_stable_then_decays_over_its_last_steps(shape, halfway):
    """Megatron-LM's WSD: the peak after the warm-up until decay_steps - wsd_decay_steps, then the shape's fraction
    of (peak - min) left at each fraction r of the decay: 1 - r, (1 + cos(pi r)) / 2, 2 * 0.5^r - 1, 1 - sqrt(r)."""
    s = LrSchedule(peak_lr=1.0, min_lr=0.1, warmup_steps=2, decay_style="wsd", decay_steps=20, wsd_decay_steps=8,
                   wsd_decay_style=shape)
    assert [s.at(i) for i in (0, 1, 2, 11, 12)] == pytest.approx([0.5, 1.0, 1.0, 1.0, 1.0])
    assert s.at(16) == pytest.approx(0.1 + 0.9 * halfway)
    assert s.at(20) == pytest.approx(0.1) and s.at(99) == pytest.approx(0.1)


@pytest.mark.parametrize("kwargs, words", [
    (dict(peak_lr=0.0), "--lr must be a positive number"),
    (dict(peak_lr=math.nan), "--lr must be a positive number"),
    (dict(min_lr=1.0), "--min-lr must be between 0 and --lr"),
    (dict(warmup_steps=-1), "--lr-warmup-steps must be 0 or more"),
    (dict(decay_style="step"), "--lr-decay-style must be one of constant, linear, cosine, wsd"),
    (dict(decay_style="cosine"), "--lr-decay-style cosine needs --lr-decay-steps"),
    (dict(decay_steps=100), "--lr-decay-steps needs --lr-decay-style linear, cosine or wsd"),
    (dict(decay_style="wsd", decay_steps=100), "--lr-decay-style wsd needs --lr-wsd-decay-steps"),
    (dict(decay_style="wsd", decay_steps=100, wsd_decay_steps=95), "--lr-wsd-decay-steps must be between 1 and"),
    (dict(decay_style="cosine", decay_steps=100, wsd_decay_steps=20), "--lr-wsd-decay-steps needs --lr-decay-style wsd"),
    (dict(decay_style="wsd", decay_steps=100, wsd_decay_steps=20, wsd_decay_style="step"),
     "--lr-wsd-decay-style must be one of linear, cosine, exponential, minus_sqrt"),
    (dict(decay_style="linear", decay_steps=5, warmup_steps=5), "--lr-decay-steps (5) must be more than"),
])
def test_bad_schedules_are_one_sentence(kwargs, words):
    with pytest.raises(PlanError) as e:
        LrSchedule(**kwargs)
    assert words in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("kwargs, words", [
    (dict(weight_decay=-0.1), "--weight-decay must be at least 0"),
    (dict(weight_decay=1.5), "--weight-decay must be at least 0"),
    (dict(clip_grad=-1.0), "--clip-grad must be 0 (off) or a positive number"),
])
def test_bad_optimizer_settings_are_one_sentence(kwargs, words):
    with pytest.raises(PlanError, match=words.replace("(", r"\(").replace(")", r"\)")):
        OptimizerSettings(schedule=LrSchedule(), **kwargs)


@pytest.mark.parametrize("style, extra, expected_schedule", [
    ("cosine", [], LrSchedule(6e-4, 6e-5, 20, "cosine", 1000)),
    ("wsd", ["--lr-wsd-decay-steps", "200", "--lr-wsd-decay-style", "minus_sqrt"],
     LrSchedule(6e-4, 6e-5, 20, "wsd", 1000, wsd_decay_steps=200, wsd_decay_style="minus_sqrt")),
])
def test_launch_options_reach_the_workers_unchanged(tmp_path, style, extra, expected_schedule):
    """`plan launch`'s options, through the torchrun command it runs, parse to the same settings in runtime.train."""
    train = pytest.importorskip("runtime.train")
    opts = ["--lr", "6e-4", "--min-lr", "6e-5", "--lr-warmup-steps", "20", "--lr-decay-style", style,
            "--lr-decay-steps", "1000", "--weight-decay", "0.05", "--clip-grad", "0", *extra]
    launch_args = build_parser().parse_args([str(tmp_path / "p.json"), *opts])
    cmd = torchrun_command(launch_args, 1, tmp_path / "r.csv")
    worker_args = train.parse_args(cmd[cmd.index("runtime.train") + 1:])
    expected = OptimizerSettings(expected_schedule, weight_decay=0.05, clip_grad=0.0)
    assert from_args(launch_args) == from_args(worker_args) == expected
    # the defaults travel as no options at all, and parse back to the defaults
    default_cmd = torchrun_command(build_parser().parse_args([str(tmp_path / "p.json")]), 1, tmp_path / "r.csv")
    assert not any(a.startswith(("--lr", "--min-lr", "--weight-decay", "--clip-grad")) for a in default_cmd)
    assert from_args(train.parse_args(default_cmd[default_cmd.index("runtime.train") + 1:])) == \
        OptimizerSettings(LrSchedule())
