"""The torch.compile anchor (../shared/anchors/gpt_step_anchor.py, `run_torch`) with its objective
made non-degenerate, everything else unchanged. As given, the anchor's loss is cross_entropy(logits, idx): it
predicts the input token itself through tied embeddings initialised N(0, 1) (PyTorch's nn.Embedding default),
so the correct logit is about |e|^2 = 2048 and the loss is exactly 0 in fp32: every gradient of its backward is
exactly zero (checked on CPU at hidden 2048), and its backward GEMMs and AdamW run on zeros, which
draw less power. Variants, each a textual patch of the anchor's source (asserted to apply), run in its own process:

  given      the anchor unchanged (its loss and gradient statistics reported after timing)
  next       labels = the next token (idx rolled by one), as a language model trains
  next_init  next, and the word and position embeddings initialised N(0, 0.02) (GPT-2's init, as ours)

Timing: the anchor's own protocol (mean of 10 steps after 3) and 40 steps between CUDA events. Prints one JSON
line per variant. Run from a folder holding the anchors as anchors/ (the device copy of ../shared/anchors):

    python benchmarks/anchor_variants.py next_init      # given | next | next_init
"""
import json
import statistics
import sys
import time

import torch

SRC = open("anchors/gpt_step_anchor.py").read()
STEPS = 40
PATCHES = {
    "next": [("return F.cross_entropy(logits.float().view(-1, VOCAB), idx.view(-1))",
              "return F.cross_entropy(logits.float().view(-1, VOCAB), idx.roll(-1, 1).reshape(-1))")],
    "next_init": [("return F.cross_entropy(logits.float().view(-1, VOCAB), idx.view(-1))",
                   "return F.cross_entropy(logits.float().view(-1, VOCAB), idx.roll(-1, 1).reshape(-1))"),
                  ("    model = GPT().cuda().to(torch.bfloat16)",
                   "    model = GPT()\n    nn.init.normal_(model.emb.weight, std=0.02); nn.init.normal_(model.pos.weight, std=0.02)\n"
                   "    model = model.cuda().to(torch.bfloat16)")],
}
STATS = ("    dt = timed(step)\n    report(f\"plain torch",
         "    dt = timed(step)\n    _l = fwd(idx); _l.backward()\n"
         "    _g = [p.grad.float() for p in model.parameters() if p.grad is not None]\n"
         "    STATS.update(loss=float(_l), grad_zero_fraction=sum(int((x == 0).sum()) for x in _g) / sum(x.numel() for x in _g),\n"
         "                 grad_max_abs=max(float(x.abs().max()) for x in _g))\n"
         "    opt.zero_grad(set_to_none=True)\n    report(f\"plain torch")


def sustained(step, iters=10, warm=3):
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(STEPS + 1)]
    ev[0].record()
    for i in range(STEPS):
        step()
        ev[i + 1].record()
    torch.cuda.synchronize()
    per = [ev[i].elapsed_time(ev[i + 1]) / 1e3 for i in range(STEPS)]
    TIMES.update(first10_mean_s=round(sum(per[:iters]) / iters, 5), median_steps_5_16_s=round(statistics.median(per[4:16]), 5),
                 median_steps_16_40_s=round(statistics.median(per[15:]), 5), per_step_s=[round(x, 5) for x in per])
    return sum(per[:iters]) / iters


variant = sys.argv[1]
src = SRC.split('if __name__ == "__main__":')[0]
for old, new in PATCHES.get(variant, []) + [STATS]:
    assert src.count(old) == 1, f"patch does not apply: {old!r}"
    src = src.replace(old, new)
STATS, TIMES = {}, {}
ns = {"__name__": "anchor_variant", "STATS": STATS}
exec(compile(src, "gpt_step_anchor.py (patched: " + variant + ")", "exec"), ns)
ns["timed"] = sustained
ns["TIMES"] = TIMES
t0 = time.time()
ns["report"] = lambda *a, **k: None   # the figures are printed below, with the variant's statistics
ns["run_torch"](24, 2048, 16, 2048, 4, compile_=True)
print(json.dumps({"anchor_variant": variant, **STATS, **TIMES, "tokens_per_s_first10": round(4 * 2048 / TIMES["first10_mean_s"]),
                  "tokens_per_s_steps_16_40": round(4 * 2048 / TIMES["median_steps_16_40_s"])}), flush=True)
