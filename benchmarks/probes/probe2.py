"""Scratch probe (not part of the workflow): fast vs naive tails on the GPU before wiring.

Bits: timing-shaped random input and all 2^32 float32 bit patterns (task 95 with add = -0.0)
against the model's own eager tail. Time: CUDA-graph medians of eager / inductor / naive /
fast (several grids) / a device copy of the same bytes.
"""

import importlib.util
import json
import statistics
import sys
import tempfile
import time

import torch

from kbfuse import baselines, cudacache
from kbfuse.tails import tail_for

scratch = tempfile.mkdtemp()
cudacache.isolate(scratch)
from kbfuse.compile import compile_variant  # noqa: E402
from kbfuse.launch import LoadedModule, run_tail  # noqa: E402

KB = ".kb/KernelBench/KernelBench/level2/"
FILES = {
    53: "53_Gemm_Scaling_Hardtanh_GELU.py",
    81: "81_Gemm_Swish_Divide_Clamp_Tanh_Clamp.py",
    95: "95_Matmul_Add_Swish_Tanh_GELU_Hardtanh.py",
}
report = {}


def model_for(task):
    spec = importlib.util.spec_from_file_location(f"t{task}", KB + FILES[task])
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = mod.Model(*mod.get_init_inputs()).eval()
    return model, mod.batch_size, mod.out_features


def compile_kernel(kernel):
    out = f"{scratch}/{kernel}"
    meta = compile_variant(
        f"kernels/{kernel}.cu",
        f"{kernel}-noftz",
        {"route": "nvrtc-cubin", "kernel": kernel, "options": ["--std=c++11", "--fmad=false", "--ftz=false"]},
        "sm_90",
        out + ".bin",
        out + ".json",
        out + ".log",
        scratch_dir=scratch,
    )
    print(kernel, "launch", meta["launch"], "sha", meta["artifact_sha256"][:12], flush=True)
    return LoadedModule.load(out + ".bin", meta)


def same_bits(a, b):
    ai, bi = a.view(torch.int32), b.view(torch.int32)
    eq = ai == bi
    both_nan = torch.isnan(a) & torch.isnan(b)
    return int(eq.sum()), int((~eq & both_nan).sum())


def graph_median(fn, reps=30, inner=20):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner):
            fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) * 1000 / inner)
    return statistics.median(times)


import pathlib
fast_text = pathlib.Path("kernels/fast.cu").read_text()
CONFIGS = {}
for unroll in (1, 2, 4):
    for hints in ("stream", "plain"):
        text = f"#define KBFUSE_FAST_UNROLL {unroll}\n" + fast_text
        if hints == "plain":
            text = text.replace('#include "eager_ops.cuh"', '#include "eager_ops.cuh"\n__device__ __forceinline__ void kb_st(float4* p, float4 v) { *p = v; }')
            text = text.replace("__ldcs(", "__ldg(").replace("__stcs(", "kb_st(")
        name = f"fast_u{unroll}_{hints}"
        pathlib.Path(f".probe/{name}.cu").write_text(text)
        CONFIGS[name] = name


def compile_path(path, name):
    out = f"{scratch}/{name}"
    meta = compile_variant(path, name, {"route": "nvrtc-cubin", "kernel": name, "options": ["--std=c++11", "--fmad=false", "--ftz=false"]}, "sm_90", out + ".bin", out + ".json", out + ".log", scratch_dir=scratch)
    return LoadedModule.load(out + ".bin", meta)


mods = {k: compile_kernel(k) for k in ("naive", "fast")}
variants = {name: compile_path(f".probe/{name}.cu", name) for name in CONFIGS}
if "--ncu" in sys.argv:
    for task in (53, 81, 95):
        tail = tail_for(task)
        model, batch, cols = model_for(task)
        y = torch.randn(batch, cols, device="cuda") * 3
        out = torch.empty_like(y)
        ind = torch.compile(baselines.tail_module(model, tail))
        with torch.no_grad():
            for k, m in mods.items():
                run_tail(m, tail, model, y, out)
            ind(y)
            ind(y)
        torch.cuda.synchronize()
    sys.exit(0)
sms = mods["fast"].sm_count
for task in (53, 81, 95):
    t0 = time.time()
    tail = tail_for(task)
    model, batch, cols = model_for(task)
    rec = report.setdefault(task, {})
    y = torch.randn(batch, cols, device="cuda") * 3
    ref = tail.reference(model, y)
    times = {}
    for k, m in mods.items():
        got = run_tail(m, tail, model, y)
        rec[f"random_{k}"] = same_bits(ref, got) + (ref.numel(),)
    # exhaustive: every float32 bit pattern
    saved = None
    if task == 95:
        add = tail.add_value(model)
        saved = add.detach().clone()
        with torch.no_grad():
            add.fill_(-0.0)
    rows = (1 << 28) // cols
    mism = {k: [0, 0] for k in mods}
    examples = {k: [] for k in mods}
    for chunk in range(16):
        bits = torch.arange(chunk << 28, (chunk + 1) << 28, device="cuda", dtype=torch.int64)
        signed = (bits - (1 << 32) * (bits >= (1 << 31))).to(torch.int32)
        x = signed.view(torch.float32).view(rows, cols)
        r = tail.reference(model, x)
        for k, m in mods.items():
            o = run_tail(m, tail, model, x)
            eq, nanonly = same_bits(r, o)
            bad = x.numel() - eq
            mism[k][0] += bad - nanonly
            mism[k][1] += nanonly
            if bad - nanonly and len(examples[k]) < 3:
                idx = ((r.view(torch.int32) != o.view(torch.int32)) & ~(torch.isnan(r) & torch.isnan(o))).nonzero()[0]
                examples[k].append([float(x[tuple(idx)]), float(r[tuple(idx)]), float(o[tuple(idx)])])
        del bits, x, r, o
    if saved is not None:
        with torch.no_grad():
            tail.add_value(model).copy_(saved)
    rec["exhaustive_mismatch_nonnan_nanpayload"] = mism
    rec["exhaustive_examples"] = examples
    torch.cuda.empty_cache()
    # timing
    out = torch.empty_like(y)
    eager_tail = baselines.tail_module(model, tail)
    ind = torch.compile(eager_tail)
    with torch.no_grad():
        ind(y)
        times |= {
            "eager": graph_median(lambda: eager_tail(y)),
            "inductor": graph_median(lambda: ind(y)),
            "copy": graph_median(lambda: out.copy_(y)),
            "naive": graph_median(lambda: run_tail(mods["naive"], tail, model, y, out)),
        }
        for name, m in variants.items():
            got = run_tail(m, tail, model, y)
            rec[f"random_{name}"] = same_bits(ref, got)
            base = m.launch_geometry
            for bps in (4, 8, 16):
                m.launch_geometry = type(base)(**{**base.record(), "blocks_per_sm": bps})
                times[f"{name}_bps{bps}"] = graph_median(lambda: run_tail(m, tail, model, y, out), reps=50)
            m.launch_geometry = base
        times["inductor_again"] = graph_median(lambda: ind(y), reps=50)
        times["copy_again"] = graph_median(lambda: out.copy_(y), reps=50)
        base_geo = mods["fast"].launch_geometry
        for bps in (8,):
            mods["fast"].launch_geometry = type(base_geo)(**{**base_geo.record(), "blocks_per_sm": bps})
            times[f"fast_bps{bps}"] = graph_median(lambda: run_tail(mods["fast"], tail, model, y, out))
        mods["fast"].launch_geometry = base_geo
        # one element-per-thread-sized grid, for comparison
    nbytes = tail.bytes_moved(y)
    rec["bytes"] = nbytes
    rec["times_us"] = times
    floor_bw = 2 * y.numel() * 4 / (times["copy"] * 1e-6)
    rec["copy_GBps"] = floor_bw / 1e9
    rec["pct_floor"] = {k: 100 * (nbytes / floor_bw * 1e6) / v for k, v in times.items()}
    rec["vs_inductor"] = {k: v / times["inductor"] for k, v in times.items()}
    rec["seconds"] = time.time() - t0
    print(task, {k: round(v, 2) for k, v in sorted(times.items(), key=lambda kv: kv[1])}, flush=True)
    del model, y, ref, out, ind, eager_tail
    torch.cuda.empty_cache()

json.dump(report, open(sys.argv[1] if len(sys.argv) > 1 else "probe.json", "w"), indent=1)
