"""Whether Megatron-LM's own argument checks accept what `plan export --to megatron` writes.

For each case a plan is searched (pinned as the case says), exported with planner.export.megatron_args, and the
arguments are handed, in a child process run inside a Megatron-LM checkout, to Megatron-LM's parse_args,
validate_args and core_transformer_config_from_args (the TransformerConfig and its __post_init__ checks) at the
world size the plan needs, with the synthetic-data and tokenizer arguments that `plan export` leaves to the user.
The checks' GPU queries are answered as on a Hopper GPU (compute capability 9.0) and their Transformer Engine
checks as with TE 2.8 or later installed (its version checks pass, its fused rotary kernel is present), so the
check runs on a CPU machine without TE; what it checks is the arguments' consistency, not the installation. Megatron-LM's code is run from the checkout given, never copied here.

    python benchmarks/megatron_args_check.py --megatron-lm PATH --out benchmarks/results/megatron-args-check
"""
from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from planner.cluster import ClusterSpec  # noqa: E402
from planner.cost.targets import load_target  # noqa: E402
from planner.export import megatron_args  # noqa: E402
from planner.model import resolve_model  # noqa: E402
from planner.model.spec import VOCAB_PAD_MULTIPLE  # noqa: E402
from planner.plan import TrainingShape  # noqa: E402
from planner.profile import load_profile  # noqa: E402
from planner.provenance import commit_label  # noqa: E402
from planner.search import Pins, search  # noqa: E402

USER_ARGS = ["--train-iters", "10", "--mock-data", "--tokenizer-type", "NullTokenizer"]
"""What `plan export` leaves to the user: the run's length, data and tokenizer (synthetic here); --vocab-size comes
from the export's note (the model's vocabulary)."""

CHILD = r"""
import json, os, sys, typing
typing.__dict__.setdefault("override", lambda f: f)  # Python < 3.12: the decorator Megatron-LM imports
argv = json.loads(sys.argv[1])
sys.argv = ["pretrain_gpt.py", *argv]
try:
    import torch
    import megatron.training.arguments as arguments
    from megatron.training.arguments import parse_args, validate_args
    from megatron.training.argument_utils import core_transformer_config_from_args
    import megatron.core.transformer.transformer_config as transformer_config
    import megatron.core.models.common.embeddings.rope_utils as rope_utils
    # the GPU queries of validate_args answered as on a Hopper GPU (H100, H200: compute capability 9.0)
    arguments.get_device_arch_version = lambda: 9
    torch.cuda.get_device_capability = lambda *a, **k: (9, 0)
    # Transformer Engine (the export's --transformer-impl) stood in for: its version checks pass, as with TE 2.8
    # or later, and its fused rotary kernel is present
    arguments.is_te_min_version = transformer_config.is_te_min_version = lambda *a, **k: True
    rope_utils.fused_apply_rotary_pos_emb = rope_utils.fused_apply_rotary_pos_emb or (lambda *a, **k: None)
    args = parse_args()
    validate_args(args)
    cfg = core_transformer_config_from_args(args)
    print(json.dumps({"accepted": True, "num_query_groups": cfg.num_query_groups,
                      "tensor_model_parallel_size": cfg.tensor_model_parallel_size}))
except BaseException as exc:  # argparse exits, assertions and ValueErrors alike: the check's verdict
    print(json.dumps({"accepted": False, "error": f"{type(exc).__name__}: {exc}"[:400]}))
"""


def cases() -> list[dict]:
    """(name, model, GPUs, pins): query groups a multiple of TP, a divisor of it (one KV head at TP 4, four at
    TP 8), MoE, a pipeline with virtual stages; and a control whose exported arguments are altered (`tamper`) into
    ones the checks must refuse (`expect` False), showing that the check can fail."""
    llama8b = resolve_model("llama3-8b")
    return [
        dict(name="llama3-8b TP4 (8 KV heads, a multiple of TP)", model=llama8b, gpus=8, pins=Pins(tp=4)),
        dict(name="llama3-8b with one KV head, TP4 (a divisor of TP)",
             model=replace(llama8b, num_kv_heads=1, name="llama3-8b-mqa"), gpus=8, pins=Pins(tp=4)),
        dict(name="llama3-8b with four KV heads, TP8 (a divisor of TP)",
             model=replace(llama8b, num_kv_heads=4, name="llama3-8b-4kv"), gpus=16, pins=Pins(tp=8)),
        dict(name="qwen3-30b-a3b (4 KV heads) TP8 EP", model=resolve_model(str(ROOT / "benchmarks/models/qwen3-30b-a3b")),
             gpus=64, pins=Pins(tp=8)),
        dict(name="gpt-70b TP8 PP4 with virtual stages", model=resolve_model("gpt-70b"), gpus=64,
             pins=Pins(tp=8, pp=4, vpp=5)),
        dict(name="control: the first case with --num-query-groups 3 written in (neither a multiple nor a divisor "
                  "of TP 4), which the checks must refuse", model=llama8b, gpus=8, pins=Pins(tp=4),
             tamper={"--num-query-groups": "3"}, expect=False),
    ]


def vocab_args(model) -> list[str]:
    """The synthetic-data vocabulary the export's note asks for: the model's token ids, padded as the runtime pads
    them (ModelSpec.padded_vocab's multiple)."""
    return ["--vocab-size", str(model.vocab_size), "--make-vocab-size-divisible-by", str(VOCAB_PAD_MULTIPLE)]


def check(case: dict, megatron_lm: Path) -> dict:
    cluster = ClusterSpec(gpu="h200-sxm", num_gpus=case["gpus"], gpus_per_node=8)
    model = case["model"]
    target = load_target("megatron")
    res = search(model, TrainingShape(model.default_seq_len, 64), cluster, load_profile(None, "h200-sxm"),
                 case["pins"], top_k=1, target=target)
    plan = res.plans[0]
    export = megatron_args(plan)
    argv = list(export.args)
    for flag, value in case.get("tamper", {}).items():
        argv[argv.index(flag) + 1] = value
    argv += vocab_args(model) + USER_ARGS
    env = {"WORLD_SIZE": str(case["gpus"]), "RANK": "0", "PATH": "/usr/bin:/bin", "PYTHONPATH": str(megatron_lm),
           "CUDA_DEVICE_MAX_CONNECTIONS": "1"}  # as Megatron-LM asks its launches to set before Blackwell
    p = subprocess.run([sys.executable, "-c", CHILD, json.dumps(argv)], cwd=megatron_lm, env=env,
                       capture_output=True, text=True, timeout=300)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    verdict = json.loads(lines[-1]) if lines else {"accepted": False, "error": p.stderr.strip()[-400:]}
    expect = case.get("expect", True)
    return {"case": case["name"], "layout": plan.layout.short(), "kv_heads": model.num_kv_heads,
            "tp": plan.layout.tp, "world_size": case["gpus"], "argv": argv, "expected_accepted": expect,
            "as_expected": verdict["accepted"] == expect, **verdict}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--megatron-lm", type=Path, required=True, help="a Megatron-LM checkout (its repository root)")
    ap.add_argument("--out", type=Path, required=True, help="folder for results.json")
    args = ap.parse_args(argv)
    mlm = args.megatron_lm.resolve()
    if not (mlm / "megatron" / "training" / "arguments.py").is_file():
        print(f"'{mlm}' is not a Megatron-LM checkout (no megatron/training/arguments.py)", file=sys.stderr)
        return 1
    rows = [check(c, mlm) for c in cases()]
    for r in rows:
        print(f"{'accepted' if r['accepted'] else 'refused '} {'' if r['as_expected'] else '(UNEXPECTED) '}"
              f"{r['case']}: {r['layout']}" + ("" if r["accepted"] else f"  ({r['error']})"))
    commit = subprocess.run(["git", "-C", str(mlm), "log", "-1", "--format=%h %cs"], capture_output=True,
                            text=True).stdout.strip()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({
        "command": "python benchmarks/megatron_args_check.py --megatron-lm <Megatron-LM checkout> --out " + str(args.out),
        "commit": commit_label(), "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "megatron_lm": commit or "unknown (not a git checkout)", "python": sys.version.split()[0],
        "checks": "megatron.training.arguments parse_args + validate_args, "
                  "megatron.training.argument_utils core_transformer_config_from_args (TransformerConfig)",
        "rows": rows}, indent=1) + "\n")
    return 0 if all(r["as_expected"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
