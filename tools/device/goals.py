#!/usr/bin/env python3
"""goals.py DIR [--judge]: issue 35's goals, a line each, from the logs kit part 2 keeps
in DIR: ceilings.log (ceilings.py), b1.log and b32.log (vlmd-bench-engine
decode, 512 in, 256 out), prefill.log (the 8192-token prefill), ops.log
(vlmd-bench-ops --only attention) and ops-cores.log (the same with
--cuda-decode-attention cores). Each line: the goal, what was measured, its
ceiling measured in the same run, and with --judge (a GPU run at the 7B
shapes) met / missed or "not measured"; without it (the CPU's tiny shapes)
nothing is judged."""
import re
import sys
from pathlib import Path


def read(d, name):
    p = Path(d) / name
    return p.read_text() if p.exists() else ""


def number(pattern, text):
    m = re.search(pattern, text)
    return float(m.group(1)) if m else None


def attention_us(ops, what):
    """the time and rate columns of one vlmd-bench-ops attention line"""
    m = re.search(r"^attention\s+" + re.escape(what) + r"\s+([\d.]+) us\s+([\d.]+) (GB/s|TFLOP/s)",
                  ops, re.M)
    return (float(m.group(1)), float(m.group(2))) if m else (None, None)


JUDGE = "--judge" in sys.argv[2:]


def line(goal, value, verdict):
    print(f"goal {goal:<56} {value:<60} {verdict}")


def judge(ok):
    if not JUDGE:
        return "(not judged: not the 7B shapes on a GPU)"
    return "not measured" if ok is None else ("met" if ok else "MISSED")


def main():
    d = sys.argv[1]
    ceilings = read(d, "ceilings.log")
    bw = number(r"BANDWIDTH_GBS\s+([\d.]+)", ceilings)
    tf = number(r"GEMM_TFLOPS\s+([\d.]+)", ceilings)
    print(f"ceilings: copy {bw or '?'} GB/s (read + write), bf16 GEMM {tf or '?'} TFLOP/s")

    for b, limit in ((1, 4.3), (32, 5.5)):
        log = read(d, f"b{b}.log")
        ms = number(r"([\d.]+) ms/step", log)
        floor = number(r"weight-streaming floor ([\d.]+) ms/step", log)
        kernels = re.search(r"kernels a decode step of \d+ sequences: (\d+) \(([\d.]+) a layer",
                            log)
        value = "not run" if ms is None else f"{ms:.2f} ms/step"
        if ms is not None and floor:
            value += f", {100 * floor / ms:.0f}% of the copy floor {floor:.2f} ms"
        if kernels:
            value += f", {kernels.group(1)} kernels ({kernels.group(2)} a layer)"
        line(f"decode 7B batch {b}: <= {limit} ms a step", value,
             judge(None if ms is None else ms <= limit))

    s = number(r"prefill ([\d.]+) s", read(d, "prefill.log"))
    tfl = number(r"prefill: ([\d.]+) TFLOP/s", read(d, "prefill.log"))
    value = "not run" if s is None else f"{s:.3f} s" + (f", {tfl:.0f} TFLOP/s" if tfl else "")
    line("prefill 8192 tokens: <= 0.19 s", value, judge(None if s is None else s <= 0.19))

    ops = read(d, "ops.log")
    p_us, p_rate = attention_us(ops, "b=1 q=8192 kv=8192")
    value = "not run" if p_us is None else f"{p_rate:.0f} TFLOP/s ({p_us:.0f} us)"
    if p_rate and tf:
        value += f", {100 * p_rate / tf:.0f}% of GEMM"
    line("prefill attention 8192: >= 330 TFLOP/s", value,
         judge(None if p_rate is None else p_rate >= 330))

    for name, log in (("mma", ops), ("cores", read(d, "ops-cores.log"))):
        us, _ = attention_us(log, "b=1 q=1 kv=4096")
        line(f"decode attention b=1 4k keys ({name}): <= 8 us a layer",
             "not run" if us is None else f"{us:.1f} us",
             judge(None if us is None else us <= 8))
        us, gbs = attention_us(log, "b=1 q=1 kv=32768")
        share = 100 * gbs / bw if gbs and bw else None
        value = "not run" if us is None else f"{us:.1f} us, {gbs:.0f} GB/s"
        if share is not None:
            value += f", {share:.0f}% of copy"
        line(f"decode attention b=1 32k keys ({name}): >= 80% of copy", value,
             judge(None if share is None else share >= 80))
        us, gbs = attention_us(log, "b=1 q=1 kv=32768 fp8")
        if us is not None and name == "mma": # an FP8 cache: the decode kernel either way
            share = f", {100 * gbs / bw:.0f}% of copy" if bw else ""
            line(f"decode attention b=1 32k keys, FP8 cache ({name})",
                 f"{us:.1f} us, {gbs:.0f} GB/s{share}", "(no goal: half the bytes)")


if __name__ == "__main__":
    main()
