"""What `plan export` prints beside what it writes: the plan's predicted step, throughput, MFU and memory for a
runtime (planner/cost/targets.py), worked out again for a runtime other than the one the plan was made for."""
from __future__ import annotations

from planner.plan import Plan


def prediction_line(p, runtime_line: str) -> str:
    """One line of a prediction: step time, tokens/s (and per GPU), MFU, peak memory."""
    return (f"prediction for {runtime_line}: step {p.step_s:.3f} s, {p.tokens_per_s:,.0f} tokens/s, MFU {p.mfu:.1%}, "
            f"peak memory {max(p.memory_gib_per_rank):.1f} GiB of {p.memory_limit_gib:.1f}")


def runtime_predictions(plan: Plan, runtimes: list[str], profile_path: str | None) -> list[str]:
    """The plan's predicted step, throughput, MFU and memory for each runtime (planner/cost/targets.py), its layout
    and stages held; the plan's own stored prediction where it is for that runtime."""
    from planner.cluster import ClusterSpec
    from planner.cost import evaluate
    from planner.cost.targets import load_target
    from planner.profile import load_profile

    lines, profile, cluster = [], None, None
    for runtime in runtimes:
        if plan.prediction is not None and plan.runtime == runtime and profile_path is None:
            p = plan.prediction
        else:
            if profile is None:
                cluster = ClusterSpec.from_dict(plan.cluster)
                profile = load_profile(profile_path, cluster.gpu)
            p = evaluate(plan, cluster, profile, runtime)
        lines.append(prediction_line(p, load_target(runtime).describe()))
    return lines
