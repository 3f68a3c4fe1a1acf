"""Why is fast slower in the workflow's timing than in the probes? Launches per graph, input."""
import statistics, sys, tempfile, importlib.util
import torch
from kbfuse import baselines, cudacache
from kbfuse.tails import tail_for
scratch = tempfile.mkdtemp()
cudacache.isolate(scratch)
from kbfuse.compile import compile_variant  # noqa
from kbfuse.launch import LoadedModule, run_tail  # noqa
from kbfuse.inputs import make_input  # noqa
KB = ".kb/KernelBench/KernelBench/level2/"
FILES = {53: "53_Gemm_Scaling_Hardtanh_GELU.py", 81: "81_Gemm_Swish_Divide_Clamp_Tanh_Clamp.py", 95: "95_Matmul_Add_Swish_Tanh_GELU_Hardtanh.py"}
def model_for(task):
    spec = importlib.util.spec_from_file_location(f"t{task}", KB + FILES[task]); mod = importlib.util.module_from_spec(spec); spec.loader.exec_module(mod)
    torch.manual_seed(42)
    model = mod.Model(*mod.get_init_inputs()).cuda().eval()
    return model, (mod.batch_size, mod.in_features)
def comp(kernel):
    out = f"{scratch}/{kernel}"
    meta = compile_variant(f"kernels/{kernel}.cu", kernel, {"route": "nvrtc-cubin", "kernel": kernel, "options": ["--std=c++11", "--fmad=false", "--ftz=false"]}, "sm_90", out + ".bin", out + ".json", out + ".log", scratch_dir=scratch)
    return LoadedModule.load(out + ".bin", meta)
def gm(fn, inner, reps=40):
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(3): fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(inner): fn()
    torch.cuda.synchronize(); ts = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record(); g.replay(); b.record(); b.synchronize(); ts.append(a.elapsed_time(b) * 1000 / inner)
    return statistics.median(ts)
mods = {k: comp(k) for k in ("naive", "fast")}
baselines.set_numerics()
for task in (53, 81, 95):
    tail = tail_for(task); model, shape = model_for(task)
    with torch.no_grad():
        x = make_input("uniform", shape, 42, "cuda")
        ylin = tail.linear(model)(x).contiguous()
        yrand = torch.randn_like(ylin) * 3
        ind = torch.compile(baselines.tail_module(model, tail)); ind(ylin); ind(yrand)
        out = torch.empty_like(ylin)
        row = {}
        for yname, y in (("linear", ylin), ("randn3", yrand)):
            for inner in (1, 20):
                row[f"{yname}/inner{inner}"] = {
                    "copy": gm(lambda: out.copy_(y), inner),
                    "inductor": gm(lambda: ind(y), inner),
                    "naive": gm(lambda: run_tail(mods["naive"], tail, model, y, out), inner),
                    "fast": gm(lambda: run_tail(mods["fast"], tail, model, y, out), inner),
                }
        print(task, "y range", float(ylin.min()), float(ylin.max()), flush=True)
        for k, v in row.items():
            print(task, k, {n: round(t, 2) for n, t in v.items()}, "fast/ind %.3f" % (v["fast"] / v["inductor"]), flush=True)
    del model, x, ylin, yrand, out, ind; torch.cuda.empty_cache()
