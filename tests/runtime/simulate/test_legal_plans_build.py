"""Legality against the runtime: every layout planner/legality.py calls legal is built and stepped by the runtime's own
code in the fake world (runtime/simulate), an illegal one is refused by `plan validate --simulate` in one sentence
naming the rule before any rank process starts, and one built anyway is refused by the runtime in a sentence naming
the same rule.

The grid crosses tiny models whose head, KV-head, vocabulary, MLP, expert and layer counts are chosen so that each
rule of planner/legality.py is hit, with TP 1/2/3/4/8, PP 1/2/4 with and without virtual stages, CP 1/2, EP 1/2/4,
every sharding level and a few batch shapes. The legal layouts built are a deterministic cover of the grid (for every
model, every value its legal layouts give each degree) plus hand-picked ones for the runtime's special paths (KV heads
shared over TP, TP 3 and 6, tied embeddings over an interleaved pipeline, uneven stages, FP8, ...). They run in one
child process (`python -m tests.runtime.simulate.test_legal_plans_build CASES RESULTS`), which joins a fresh fake
world for each rank it builds and leaves it (destroy_process_group) before the next.
"""
from __future__ import annotations

import itertools
import json
import random
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from planner.cluster import ClusterSpec
from planner.errors import PlanError
from planner.legality import layout_violation
from planner.model import ModelSpec, tiny_model
from planner.plan import Layout, Plan, StagePlan, TrainingShape, even_stages
from runtime.simulate.roles import rank_of

ROOT = Path(__file__).resolve().parents[3]

MODELS = (
    tiny_model("gpt", name="gpt-tied", tie_embeddings=True, max_seq_len=40),   # 4 heads; a 48-token sequence exceeds it
    tiny_model("llama", name="llama-h12-kv3", hidden=96, num_heads=12, num_kv_heads=3, ffn_hidden=192,
               vocab_size=250, num_layers=6),                                   # 12 heads, 3 KV heads, 6 layers
    tiny_model("llama", name="llama-ffn100", hidden=64, num_heads=8, num_kv_heads=8, ffn_hidden=100,
               num_layers=5),                                                   # MLP 100, 5 layers
    tiny_model("llama", name="moe-e4", num_experts=4, top_k=2),
    tiny_model("llama", name="moe-e6-shared", num_experts=6, top_k=2, shared_expert_ffn=64),
    tiny_model("gpt", name="gpt-moe-e4", num_experts=4, top_k=1),                # GELU experts with biases
    tiny_model("bert", name="bert"),                                            # bidirectional attention
)
SHAPES = (TrainingShape(32, 8), TrainingShape(48, 8), TrainingShape(42, 12))  # 42 tokens: TP 2 splits them, TP 4 not
SHARDING = ("none", "optimizer", "optimizer+grads", "full")
MAX_WORLD = 64
"""Larger worlds only add process groups to form; the rules do not depend on the world's size."""

RULES = ("attention heads are not divisible by TP", "KV heads are neither a multiple nor a divisor of TP",
         "MLP width", "padded vocabulary", "virtual stages need pipeline parallelism", "cannot fill",
         "is not divisible by 2*CP*TP", "(sequence parallelism)", "exceeds the model's maximum",
         "expert parallelism needs an MoE model", "experts are not divisible by EP", "does not divide DP*CP",
         "global batch", "micro-batches", "fully sharded data parallelism with expert parallelism",
         "needs more than one data-parallel rank")
"""A phrase of each rule of planner/legality.py's layout_violation that the grid must hit."""


@dataclass(frozen=True)
class Case:
    model: ModelSpec
    shape: TrainingShape
    layout: Layout
    stages: tuple[StagePlan, ...] = ()
    """The virtual stages (default: layers split evenly, no recompute)."""

    def plan(self) -> Plan:
        stages = list(self.stages) or even_stages(self.model.num_layers, self.layout.num_virtual_stages)
        world = self.layout.world_size  # one node: TP 3 or 6 worlds need not fill nodes of 8
        return Plan(self.model, ClusterSpec(num_gpus=world, gpus_per_node=world).to_dict(), self.shape, self.layout,
                    stages)

    def ranks(self) -> list[int]:
        """Rank 0 and the first rank of the last pipeline stage."""
        return sorted({0, rank_of(self.layout, self.layout.pp - 1)})

    def name(self) -> str:
        return f"{self.model.name} {self.layout.short()} {self.layout.sharding} mb{self.layout.micro_batch} " \
               f"seq{self.shape.seq_len} gb{self.shape.global_batch}"


def grid() -> list[Case]:
    """Every layout of the grid (worlds up to MAX_WORLD)."""
    cases = []
    for model, shape, tp, pp, vpp, cp, ep, dp, sharding, mb in itertools.product(
            MODELS, SHAPES, (1, 2, 3, 4, 8), (1, 2, 4), (1, 2), (1, 2), (1, 2, 4), (1, 2, 4), SHARDING, (1, 2)):
        lay = Layout(tp=tp, pp=pp, vpp=vpp, cp=cp, ep=ep, dp=dp, sharding=sharding, micro_batch=mb)
        if lay.world_size <= MAX_WORLD:
            cases.append(Case(model, shape, lay))
    return cases


def covering(legal: list[Case]) -> list[Case]:
    """A deterministic subset of the legal cases holding, for every model, every value that TP, PP, the virtual
    stages, CP, EP and the sharding level take among them, and every DP degree, micro-batch and shape."""
    pool = list(legal)
    random.Random(0).shuffle(pool)
    seen, chosen = set(), []
    for c in pool:
        lay = c.layout
        keys = {(c.model.name, k, v) for k, v in (("tp", lay.tp), ("pp", lay.pp), ("vpp", lay.vpp), ("cp", lay.cp),
                                                   ("ep", lay.ep), ("sharding", lay.sharding))}
        keys |= {("dp", lay.dp), ("mb", lay.micro_batch), ("shape", c.shape)}
        if keys - seen:
            seen |= keys
            chosen.append(c)
    return chosen


def special_cases() -> list[Case]:
    """Legal layouts that take the runtime's special paths, beside the grid's cover."""
    llama = tiny_model("llama")
    wide = dict(hidden=96, num_heads=12, ffn_hidden=192, vocab_size=384)  # padded vocabulary 384: TP 3 and 6 split it
    return [
        Case(tiny_model("llama", num_kv_heads=1), TrainingShape(32, 8), Layout(tp=4, dp=2)),  # one KV head over TP 4
        Case(tiny_model("llama", hidden=128, num_heads=8, num_kv_heads=2, qkv_bias=True), TrainingShape(32, 8),
             Layout(tp=8, sharding="none")),                                    # 2 KV heads over TP 8, with biases
        Case(tiny_model("llama", num_kv_heads=3, **wide), TrainingShape(48, 8), Layout(tp=6, sharding="none")),
        Case(tiny_model("llama", num_kv_heads=3, **wide), TrainingShape(48, 8), Layout(tp=3, dp=2)),
        Case(tiny_model("gpt", num_layers=8, tie_embeddings=True), TrainingShape(32, 8),
             Layout(tp=2, pp=4, vpp=2, sharding="none")),                       # tied embedding, interleaved
        Case(llama, TrainingShape(32, 8), Layout(tp=2, pp=2, dp=2),
             (StagePlan(1, full_recompute_layers=1), StagePlan(3, selective_recompute_layers=2))),
        Case(tiny_model("llama", num_layers=6), TrainingShape(32, 6), Layout(pp=3, vpp=2, sharding="none")),
        Case(tiny_model("llama", qk_norm=True), TrainingShape(32, 8), Layout(tp=2, cp=2, dp=2, sharding="optimizer+grads")),
        Case(tiny_model("llama", num_experts=8, top_k=2, shared_expert_ffn=64, shared_expert_gate=True),
             TrainingShape(32, 8), Layout(tp=2, pp=2, dp=2, ep=2, sharding="optimizer+grads")),
        Case(tiny_model("llama", num_experts=4, top_k=2), TrainingShape(32, 8), Layout(dp=4, ep=4, overlap_ep=True)),
        Case(llama, TrainingShape(32, 8), Layout(tp=2, pp=2, dp=2, fp8=True, grad_dtype="bf16")),
        Case(llama, TrainingShape(40, 8), Layout(tp=2, cp=2, dp=2, micro_batch=2, sharding="full")),
    ]


def _split() -> tuple[list[Case], list[tuple[Case, str]]]:
    legal, illegal = [], []
    for c in grid():
        why = layout_violation(c.model, c.shape, c.layout)
        if why is None:
            legal.append(c)
        else:
            illegal.append((c, why))
    return legal, illegal


def test_the_grid_hits_every_layout_rule():
    _, illegal = _split()
    reasons = {why for _, why in illegal}
    missed = [rule for rule in RULES if not any(rule in why for why in reasons)]
    assert not missed, missed


def test_an_illegal_layout_is_refused_in_one_sentence_naming_its_rule():
    """What `plan validate --simulate` loads (Plan.load -> Plan.from_dict) refuses an illegal layout of the grid with
    planner/legality.py's sentence (the first layout of each distinct sentence, and 2,000 drawn at random); a legal
    one loads."""
    legal, illegal = _split()
    first_of_each = list({why: (c, why) for c, why in reversed(illegal)}.values())
    for c, why in first_of_each + random.Random(1).sample(illegal, 2000):
        with pytest.raises(PlanError) as err:
            Plan.from_dict(c.plan().to_dict())
        assert why in str(err.value) and "\n" not in str(err.value), c.name()
    for c in legal[::50]:
        Plan.from_dict(c.plan().to_dict())


def runtime_refusals() -> list[tuple[Case, str]]:
    """Illegal layouts built anyway (bypassing planner/legality.py), each with the phrase of the one-sentence error
    the runtime's own check gives: the last line of defence names the rule too."""
    odd_vocab = tiny_model("llama", name="llama-vocab250", hidden=96, num_heads=12, num_kv_heads=3, ffn_hidden=192, vocab_size=250)
    return [
        (Case(tiny_model("llama", name="llama-h4"), TrainingShape(32, 8), Layout(tp=8, sharding="none")),
         "4 attention heads are not divisible by TP 8"),                          # its q width 64 divides by 8
        (Case(tiny_model("llama", name="llama-kv3", hidden=96, num_heads=12, num_kv_heads=3, ffn_hidden=192),
              TrainingShape(32, 8), Layout(tp=2, sharding="none")),
         "3 KV heads are neither a multiple nor a divisor of TP 2"),              # its KV width 24 divides by 2
        (Case(MODELS[2], TrainingShape(32, 8), Layout(tp=8, sharding="none")),           # 8 heads, MLP 100
         "the outputs [100, 100] of a column-parallel layer are not divisible by TP 8"),
        (Case(odd_vocab, TrainingShape(48, 8), Layout(tp=3, sharding="none")),
         "padded vocabulary 256 is not divisible by TP 3"),
        (Case(tiny_model("llama", name="llama-seq42"), TrainingShape(42, 8), Layout(tp=4, sharding="none")),
         "sequence 42 is not divisible by TP 4 (sequence parallelism)"),
    ]


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> dict[str, list[dict]]:
    """The legal cases (a cover of the grid and the special ones) and the runtime's refusals, built and stepped in one
    child process: case name -> its ranks' results."""
    legal, _ = _split()
    cases = [(c, True) for c in covering(legal) + special_cases()] + [(c, False) for c, _ in runtime_refusals()]
    assert len({c.name() for c, _ in cases}) == len(cases), "each case needs a name of its own"
    tmp = tmp_path_factory.mktemp("legal-builds")
    cases_file, results_file = tmp / "cases.json", tmp / "results.json"
    cases_file.write_text(json.dumps([{"name": c.name(), "plan": c.plan().to_dict(), "ranks": c.ranks(),
                                       "checked": checked} for c, checked in cases]))
    out = subprocess.run([sys.executable, "-m", "tests.runtime.simulate.test_legal_plans_build", str(cases_file),
                          str(results_file)], capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    by_name: dict[str, list[dict]] = {}
    for r in json.loads(results_file.read_text()):
        by_name.setdefault(r["name"], []).append(r)
    return by_name


def test_every_legal_layout_builds_and_steps_in_the_fake_world(built):
    legal, _ = _split()
    cases = covering(legal) + special_cases()
    failed = []
    for c in cases:
        assert layout_violation(c.model, c.shape, c.layout) is None, c.name()
        assert [r["rank"] for r in built[c.name()]] == c.ranks(), c.name()
        failed += [f"{c.name()} rank {r['rank']}: {r['error']}" for r in built[c.name()] if r["error"]]
    assert not failed, "\n".join(failed)


def test_the_runtime_refuses_an_illegal_layout_in_one_sentence_naming_the_rule(built):
    for c, phrase in runtime_refusals():
        assert layout_violation(c.model, c.shape, c.layout) is not None, c.name()
        error = built[c.name()][0]["error"]
        assert error is not None and error.startswith("ValueError: ") and phrase in error, (c.name(), error)
        assert "\n" not in error


def _plan_file(tmp_path, edit=None, **plan_fields) -> Path:
    """A legal tiny Llama plan at TP2 PP2 DP2 as JSON, with `edit` (a function of its dictionary) applied by hand."""
    plan = Case(tiny_model("llama"), TrainingShape(32, 8), Layout(tp=2, pp=2, dp=2)).plan()
    for name, value in plan_fields.items():
        setattr(plan, name, value)
    d = plan.to_dict()
    if edit is not None:
        edit(d)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(d))
    return path


def _to_tp8(d: dict) -> None:
    d["layout"]["tp"], d["cluster"]["num_gpus"] = 8, 32   # 4 attention heads over 8 TP ranks


def _refused_before_any_rank(monkeypatch, path: Path) -> str:
    """`plan validate PATH --simulate` in this process, with rank processes made impossible: the refusal's text."""
    import runtime.simulate.__main__ as simulate

    def no_rank(*args, **kwargs):
        raise AssertionError("a rank process was started")

    monkeypatch.setattr(simulate, "simulate_ranks", no_rank)
    with pytest.raises(PlanError) as err:
        simulate.main([str(path)])
    return str(err.value)


def test_plan_validate_simulate_refuses_a_hand_edited_illegal_plan_before_any_rank(tmp_path, monkeypatch):
    text = _refused_before_any_rank(monkeypatch, _plan_file(tmp_path, _to_tp8))
    assert text == "illegal layout TP8 PP2 DP2: 4 attention heads are not divisible by TP 8", text
    out = subprocess.run([sys.executable, "-m", "planner.cli", "validate", str(tmp_path / "plan.json"), "--simulate"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr == "plan: illegal layout TP8 PP2 DP2: 4 attention heads are not divisible by TP 8\n", out.stderr


def test_a_schedule_our_runtime_does_not_run_is_refused_before_any_rank(tmp_path, monkeypatch):
    """A plan priced for Megatron-Core with DualPipe is legal for that target, but the simulation builds our
    runtime's program, which cannot run it."""
    def dualpipe(d):
        d["layout"]["schedule"] = "dualpipe"

    text = _refused_before_any_rank(monkeypatch, _plan_file(tmp_path, dualpipe, runtime="megatron"))
    assert text.startswith("the simulation builds our runtime's program: our runtime does not run the DualPipe "
                           "schedule"), text
    assert "\n" not in text


def test_a_rank_that_fails_is_refused_in_one_sentence_naming_it(tmp_path):
    """A legal MoE plan whose experts drop tokens by capacity (a selection that fake tensors cannot size): its rank
    is refused in one sentence naming the rank, with no traceback."""
    spec = tiny_model("llama", num_experts=4, top_k=2, moe_capacity_factor=1.25)
    path = _plan_file(tmp_path, model=spec)
    out = subprocess.run([sys.executable, "-m", "planner.cli", "validate", str(path), "--simulate", "--ranks", "0"],
                         capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert out.returncode != 0 and "Traceback" not in out.stderr
    assert out.stderr.startswith("plan: rank 0 of the plan cannot be built and stepped: the step reads a tensor's "
                                 "values back to the host (aten.nonzero.default)"), out.stderr
    assert out.stderr.count("\n") == 1


def test_an_exception_becomes_one_line():
    import runtime.simulate.__main__ as simulate

    assert simulate._sentence(ValueError("the outputs [100] are not divisible by TP 8\n  detail")) == \
        "ValueError: the outputs [100] are not divisible by TP 8"
    assert simulate._sentence(KeyError()) == "KeyError"


def _build_each(cases_file: str, results_file: str) -> None:
    """Child process: build and step each case's ranks (one step, runtime/simulate/run.py step_rank), each in a fresh
    fake world, and write [{name, rank, error}] (error None where it built and stepped). A case whose `checked` is
    false is built without planner/legality.py's check."""
    from runtime.simulate.fake_world import prepare_process

    prepare_process()
    import warnings

    warnings.filterwarnings("ignore")
    import torch.distributed as dist

    from runtime.simulate.run import step_rank

    results = []
    for case in json.loads(Path(cases_file).read_text()):
        d = case["plan"]
        plan = Plan.from_dict(d) if case["checked"] else \
            Plan(ModelSpec.from_dict(d["model"]), d["cluster"], TrainingShape(**d["training"]), Layout(**d["layout"]),
                 [StagePlan(**stage) for stage in d["stages"]])
        for rank in case["ranks"]:
            error = None
            try:
                step_rank(plan, rank)
            except Exception as exc:  # noqa: BLE001 (reported by the parent with the case's name)
                error = f"{type(exc).__name__}: {str(exc).strip()[:300]}"  # the whole message: a newline fails
            finally:
                if dist.is_initialized():
                    dist.destroy_process_group()
            results.append({"name": case["name"], "rank": rank, "error": error})
    Path(results_file).write_text(json.dumps(results))


if __name__ == "__main__":
    _build_each(sys.argv[1], sys.argv[2])
