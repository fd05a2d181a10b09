"""Session 17: can a tile/wave quantization factor, or a better interpolation, fix the GEMM lookup's off-grid tail?

Sets (all H200; rate 2mnk/t; error = predicted / measured - 1, negative = predicted faster than measured):
- DEV s1, s2: the 2,896 + 5,439 shapes session 16 added to profiles/h200-sxm-calibrated.json (s1: gpt-2.7b,
  gpt-1.3b; s2: phi3-mini, qwen2-7b-8l, mistral-nemo-12b-8l), predicted from that base profile (both timed in
  bursts). Methods were developed and chosen on these.
- REPORT q3, q4, r4: the same 150 held-out shapes timed on three H200s (three passes, power cap) against
  profiles/h200-sxm.json. Not tuned on.
- LOO: every point of both base profiles' tables predicted from the rest of its table.
Kinds: fwd / dgrad read the 'mm' table, wgrad the 'wgrad' table (DEV kinds regenerated as extend.py made them).

Run from anywhere: python study.py > output.txt   (about a minute)"""
from __future__ import annotations

import collections
import math
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parents[3]))

from common import (BASE_DEV, BASE_REPORT, DEV_FILES, LAUNCH_S, Table, dev_cases, fmt,  # noqa: E402
                    load_profile, report_cases, stats)
from fallbacks import idw, plane  # noqa: E402
from quant import SINGLE_TILES, TILES, best, damped, splitk_wave_eff, tile_eff, wave_eff  # noqa: E402

ADOPTED = "I5 I1 + I3"   # what planner/profile.py does from session 17
GAP = 2.0                # octaves: a measured line whose bracket is wider is not interpolated along (I1)
DAMPED_WAVE = damped(best(wave_eff, TILES["T4"]), 0.25)   # 0.25: the slope fitted on DEV (section B)

METHODS = {
    "current": {},
    # the hypothesis: a quantization efficiency divided out of every point and multiplied into the query
    "Q1 wave 128x128": dict(adjust=best(wave_eff, [(128, 128)])),
    "Q2 wave best(128x128,128x256,256x128)": dict(adjust=best(wave_eff, TILES["T3"])),
    "Q3 wave best(+64-wide tiles)": dict(adjust=best(wave_eff, TILES["T4"])),
    "Q4 tile padding best(T3)": dict(adjust=best(tile_eff, TILES["T3"])),
    "Q5 split-K waves best(T3)": dict(adjust=lambda m, n, k: math.log(
        max(splitk_wave_eff(m, n, k, bm, bn) for bm, bn in TILES["T3"]))),
    "Q6 0.25 x Q3 (damped)": dict(adjust=DAMPED_WAVE),
    # the interpolation itself
    "I1 lines <= 2 octaves": dict(max_gap=GAP),
    "I2 IDW 8 nearest": dict(fallback=idw(8)),
    "I3 plane 20 nearest": dict(fallback=plane(20)),
    "I4 I1 + I2": dict(max_gap=GAP, fallback=idw(8)),
    "I5 I1 + I3": dict(max_gap=GAP, fallback=plane(20)),
    "I6 I5 + Q6": dict(max_gap=GAP, fallback=plane(20), adjust=DAMPED_WAVE),
}


def tables(base_doc, base, method):
    return {t: Table(base[t], base_doc["copy_bandwidth_bytes_per_s"], method.get("adjust")) for t in base if base[t]}


def predict(tabs, table, m, n, k, method, leave_out=None):
    return tabs[table].time_s(m, n, k, leave_out=leave_out, fallback=method.get("fallback"),
                              max_gap=method.get("max_gap"))


def report(label, errs_by_kind, out):
    for kind in ["all"] + [k for k in ("fwd", "dgrad", "wgrad", "mm", "fp8", "notdev") if errs_by_kind.get(k)]:
        out.append(f"  {label:8s} {kind:6s} {fmt(stats(errs_by_kind[kind]))}")


class Data:
    def __init__(self):
        self.dev_doc, self.dev_base = load_profile(BASE_DEV)
        self.rep_doc, self.rep_base = load_profile(BASE_REPORT)
        self.dev = {s: dev_cases(s) for s in ("s1", "s2")}
        self.rep = {s: report_cases(s) for s in ("q3", "q4", "r4")}
        self.dev_keys = {(c[0], c[1], c[2], c[4]) for s in self.dev for c in self.dev[s]}

    def dev_errors(self, method):
        tabs = tables(self.dev_doc, self.dev_base, method)
        return {s: [(c, predict(tabs, c[4], *c[:3], method)[0] / c[5] - 1) for c in cases]
                for s, cases in self.dev.items()}

    def rep_errors(self, method):
        tabs = tables(self.rep_doc, self.rep_base, method)
        return {s: [(c, predict(tabs, c[4], *c[:3], method)[0] / c[5] - 1) for c in cases]
                for s, cases in self.rep.items()}


def by_kind(pairs, dev_keys=None):
    errs = collections.defaultdict(list)
    for c, e in pairs:
        errs[c[3]].append(e)
        errs["all"].append(e)
        if dev_keys is not None and (c[0], c[1], c[2], c[4]) not in dev_keys:
            errs["notdev"].append(e)
    return errs


def section_checks(data, out):
    from planner.profile import Profile
    csv_dev = max(abs(predict(tables(data.rep_doc, data.rep_base, {}), c[4], *c[:3], {})[0] / c[6] - 1)
                  for s in data.rep for c in data.rep[s])
    adopted = METHODS[ADOPTED]
    worst = 0.0
    for path, cases in ((BASE_DEV, [c for s in data.dev for c in data.dev[s]]),
                        (BASE_REPORT, [c for s in data.rep for c in data.rep[s]])):
        prof = Profile.load(path)
        doc, base = load_profile(path)
        tabs = tables(doc, base, adopted)
        for m, n, k, kind, table, *_ in cases:
            ours = predict(tabs, table, m, n, k, adopted)[0]
            worst = max(worst, abs(ours / (prof.gemm_table_s(table, m, n, k) - LAUNCH_S) - 1))
    out.append(f"check: 'current' (this study's copy of the lookup before session 17) vs the REPORT csvs' predicted_s "
               f"(profiles/h200-sxm.json): max rel diff {csv_dev:.1e}")
    out.append(f"check: '{ADOPTED}' vs planner/profile.py now (Profile.gemm_table_s), DEV and REPORT shapes: "
               f"max rel diff {worst:.1e}")
    rep_keys = {(c[0], c[1], c[2], c[4]) for c in data.rep["q3"]}
    out.append(f"REPORT shapes also in DEV: {len(rep_keys & data.dev_keys)} of {len(rep_keys)} (same shapes, other "
               f"machine, timing and base profile); rows 'notdev' below are the other {len(rep_keys - data.dev_keys)}")


def section_methods(data, out):
    """A: every method on every set."""
    summary = []
    for name, method in METHODS.items():
        t0 = time.time()
        out.append(f"== {name}")
        row = [name]
        dev = data.dev_errors(method)
        for s, pairs in dev.items():
            errs = by_kind(pairs)
            report(f"DEV {s}", errs, out)
            st = stats(errs["all"])
            row.append(f"{st['med']:4.2f} {st['p99']:4.1f} {st['worst']:4.1f} {st['over15']:3.1f}")
        st = stats([e for pairs in dev.values() for _, e in pairs])
        out.append(f"  DEV both all    {fmt(st)}")
        row.append(f"{st['med']:4.2f} {st['p99']:4.1f} {st['worst']:4.1f} {st['over15']:3.1f}")
        for s, pairs in data.rep_errors(method).items():
            errs = by_kind(pairs, data.dev_keys)
            report(f"REP {s}", errs, out)
            st = stats(errs["all"])
            row.append(f"{st['med']:4.2f} {st['p99']:4.1f} {st['worst']:4.1f} {st['over15']:3.1f}")
        for label, doc, base, tabs_wanted in (("LOO cal", data.dev_doc, data.dev_base, ("mm", "wgrad")),
                                              ("LOO sxm", data.rep_doc, data.rep_base, ("mm", "wgrad", "fp8"))):
            tabs = tables(doc, base, method)
            errs = collections.defaultdict(list)
            for table in tabs_wanted:
                for (m, n, k), t in base[table].items():
                    e = predict(tabs, table, m, n, k, method, leave_out=(m, n, k))[0] / t - 1
                    errs[table].append(e)
                    if table != "fp8":
                        errs["all"].append(e)
            report(label, errs, out)
            st = stats(errs["all"])
            row.append(f"{st['med']:4.2f} {st['p99']:4.1f} {st['worst']:4.1f}")
        summary.append(row)
        print(f"{name}: {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
    head = ["method", "DEV s1", "DEV s2", "DEV both", "REP q3", "REP q4", "REP r4", "LOO cal", "LOO sxm"]
    width = [max(len(r[i]) for r in summary + [head]) for i in range(len(head))]
    table = [" | ".join(c.ljust(w) for c, w in zip(r, width)) for r in [head] + summary]
    return ["SUMMARY: abs error %: DEV and REPORT median / 99th pct / worst / % of shapes above 15%; "
            "LOO (mm + wgrad) median / 99th pct / worst"] + table


def section_hypothesis(data, out):
    """B: does quantization explain the off-grid residual? Slope and R^2 of the residual (log measured rate over
    the current lookup's) on each quantization term as the adjusted lookup would apply it (log q(query) minus
    log q interpolated from the same neighbours); slope 1 and high R^2 = the model is right."""
    out.append("== B. the quantization hypothesis on DEV (both sets): residual y = log(measured rate / current "
               "lookup's rate) regressed on x = the term the adjusted lookup adds (log q(query) - interpolated log q); "
               "if the model held, slope ~1 and R^2 high")
    cases = [c for s in data.dev for c in data.dev[s]]
    base = tables(data.dev_doc, data.dev_base, {})
    t0 = np.array([predict(base, c[4], *c[:3], {})[0] for c in cases])
    y = np.log(t0 / np.array([c[5] for c in cases]))
    kinds = np.array([c[3] for c in cases])
    feats = {f"wave {bm}x{bn}": (lambda bm, bn: lambda m, n, k: math.log(wave_eff(m, n, bm, bn)))(bm, bn)
             for bm, bn in SINGLE_TILES}
    feats["wave best(T3)"] = best(wave_eff, TILES["T3"])
    feats["wave best(T4)"] = best(wave_eff, TILES["T4"])
    feats["tile padding 256x256"] = best(tile_eff, [(256, 256)])
    feats["split-K waves best(T3)"] = METHODS["Q5 split-K waves best(T3)"]["adjust"]
    xs = {}
    for name, f in feats.items():
        adj = tables(data.dev_doc, data.dev_base, {"adjust": f})
        xs[name] = np.log(t0 / np.array([predict(adj, c[4], *c[:3], {"adjust": f})[0] for c in cases]))
    out.append(f"  {'term':24s} " + " ".join(f"{k:>17s}" for k in ("all", "fwd", "dgrad", "wgrad")))
    for name, x_all in xs.items():
        cells = []
        for sel in ("all", "fwd", "dgrad", "wgrad"):
            mask = np.ones(len(y), bool) if sel == "all" else kinds == sel
            yy, x = y[mask] - np.median(y[mask]), x_all[mask]
            slope = (x * yy).sum() / max((x * x).sum(), 1e-12)
            r2 = 1 - ((yy - slope * x) ** 2).sum() / (yy ** 2).sum()
            cells.append(f"slope {slope:+.2f} R2 {r2:.3f}")
        out.append(f"  {name:24s} " + " ".join(f"{c:>17s}" for c in cells))


def section_floor(data, out):
    """C: how rough is the measured surface? Each DEV point predicted from its own extended profile without it:
    session 16's shapes lie on dense lines (every micro-batch), so this reads it from its immediate neighbours."""
    out.append("== C. the neighbour floor: each DEV point predicted from the extended profile (base + the added "
               "shapes, on dense lines one micro-batch apart) without itself")
    for name in ("current", ADOPTED):
        method = METHODS[name]
        for s in ("s1", "s2"):
            doc, ext = load_profile(DEV_FILES[s])
            tabs = tables(doc, ext, method)
            errs = [predict(tabs, c[4], *c[:3], method, leave_out=c[:3])[0] / c[5] - 1 for c in data.dev[s]]
            out.append(f"  {name:12s} {s} {fmt(stats(errs))}")
    _, ext = load_profile(DEV_FILES["s1"])
    out.append("  e.g. the dense line n = 320, k = 2560 ('mm', s1; TFLOP/s by m): " + ", ".join(
        f"{m}:{2 * m * 320 * 2560 / t / 1e12:.0f}" for (m, n, k), t in sorted(ext["mm"].items())
        if n == 320 and k == 2560 and m >= 8192))
    _, ext2 = load_profile(DEV_FILES["s2"])
    allw = {**ext["wgrad"], **ext2["wgrad"]}
    out.append("  e.g. wgrad at k = 8192 near 2560 x 2560 (TFLOP/s; * = in the base grid; tiles 128x128, waves "
               "of 132): " + ", ".join(
                   f"{m}x{n}{'*' if (m, n, 8192) in data.dev_base['wgrad'] else ''}:{2 * m * n * 8192 / t / 1e12:.0f}"
                   f"({math.ceil(m / 128) * math.ceil(n / 128) / 132:.2f})"
                   for (m, n, k), t in sorted(allw.items()) if k == 8192 and 1536 <= m <= 3840 and 1536 <= n <= 3840))


def section_paired(data, out):
    """D: shape by shape against the current lookup."""
    out.append("== D. shape by shape against 'current': shapes whose prediction changed, got better / worse, and "
               "crossed 10% / 15% either way")
    cur = {**{("DEV", s): p for s, p in data.dev_errors({}).items()},
           **{("REP", s): p for s, p in data.rep_errors({}).items()}}
    for name in (ADOPTED, "Q6 0.25 x Q3 (damped)", "I6 I5 + Q6"):
        new = {**{("DEV", s): p for s, p in data.dev_errors(METHODS[name]).items()},
               **{("REP", s): p for s, p in data.rep_errors(METHODS[name]).items()}}
        for key in cur:
            cnt = collections.Counter()
            for (c, e0), (_, e1) in zip(cur[key], new[key]):
                if abs(e1 - e0) > 1e-9:
                    cnt["changed"] += 1
                    cnt["better" if abs(e1) < abs(e0) else "worse"] += 1
                for bar in (10, 15):
                    if abs(e0) > bar / 100 >= abs(e1):
                        cnt[f"fixed>{bar}"] += 1
                    if abs(e1) > bar / 100 >= abs(e0):
                        cnt[f"broke>{bar}"] += 1
            out.append(f"  {name:22s} {key[0]} {key[1]}: " + " ".join(
                f"{k}={cnt[k]}" for k in ("changed", "better", "worse", "fixed>10", "broke>10", "fixed>15",
                                          "broke>15")))
    out.append("  REPORT shapes missing by 10% or more anywhere, error % on q3 / q4 / r4 as current > " + ADOPTED +
               " > I6 (path of " + ADOPTED + ")")
    tabs = {name: tables(data.rep_doc, data.rep_base, METHODS[name]) for name in ("current", ADOPTED, "I6 I5 + Q6")}
    rows = collections.defaultdict(list)
    for s, cases in data.rep.items():
        for c in cases:
            errs = [predict(tabs[nm], c[4], *c[:3], METHODS[nm])[0] / c[5] - 1 for nm in tabs]
            path = predict(tabs[ADOPTED], c[4], *c[:3], METHODS[ADOPTED])[1]
            rows[(c[0], c[1], c[2], c[3], path)].append(errs)
    for key, v in sorted(rows.items(), key=lambda kv: min(min(e) for e in kv[1])):
        if max(max(abs(x) for x in e) for e in v) >= 0.10:
            out.append(f"    {key[0]:6d} x {key[1]:6d} x {key[2]:6d} {key[3]:5s} {key[4]:4s}  " + "   ".join(
                "/".join(f"{100 * x:+5.1f}" for x in e) for e in v))


def main():
    t_start = time.time()
    data = Data()
    head, detail = [], []
    section_checks(data, head)
    summary = section_methods(data, detail)
    extra = []
    section_hypothesis(data, extra)
    extra.append("")
    section_floor(data, extra)
    extra.append("")
    section_paired(data, extra)
    print("\n".join(head + [""] + summary + ["", "columns below: n, abs error % median / 95th / 99th percentile / "
                                                 "worst / share above 15%, signed median (negative: predicted "
                                                 "faster than measured)", ""] + extra + ["", "== A. every method "
                                                                                          "on every set"] + detail))
    print(f"\n(ran {time.time() - t_start:.0f} s)")


if __name__ == "__main__":
    main()
