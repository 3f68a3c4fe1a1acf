"""Launch each task's tail once per implementation, for a profiler to look at.

Loads the study's compiled artifacts (results/compile/<variant>/) and the pinned models, then
runs every chosen variant's fused tail and Inductor's compiled tail once on the timing input's
linear output, and prints instructions per element when run under Nsight Compute with
--metrics smsp__inst_executed.sum (see docs/device-runs.md for the command). Nothing is timed
here: the timings are the study's (benchmarks/tail_roofline.py).

    ncu --clock-control none -k regex:'tail|triton' --metrics smsp__inst_executed.sum,... \\
        python3 benchmarks/tail_kernels.py --results results --variants nvrtc-cubin-noftz ...

The second fused study's kernels the same way, in its results and its tasks' numerics modes:
`--results results/fused2 --tasks 4 65 --numerics kernelbench-defaults strict` (the KernelBench
checkout is the shared one, results/kernelbench/checkout).
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from kbfuse.compilation import cudacache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, default=Path("results"))
    parser.add_argument("--tasks", type=int, nargs="+", default=[53, 81, 95])
    parser.add_argument("--variants", nargs="+", required=True)
    parser.add_argument("--seed", type=int, default=42, help="model and input seed")
    parser.add_argument(
        "--checkout", type=Path, default=Path("results/kernelbench/checkout"), help="KernelBench"
    )
    parser.add_argument(
        "--numerics",
        nargs="+",
        default=None,
        help="numerics mode per task (kbfuse.survey.settings.NUMERICS; default: strict FP32)",
    )
    args = parser.parse_args()
    modes = args.numerics or [None] * len(args.tasks)
    if len(modes) != len(args.tasks):
        parser.error("--numerics names one mode per task of --tasks")

    with tempfile.TemporaryDirectory(prefix="kbfuse-tail-kernels-") as scratch:
        cudacache.isolate(scratch)
        import torch

        from kbfuse.compilation.launch import LoadedModule, run_tail
        from kbfuse.tasks import baselines, kernelbench
        from kbfuse.tasks.inputs import make_input
        from kbfuse.tasks.tails import tail_for

        results = args.results
        modules = {  # each tail's kernels are looked up on first use
            v: LoadedModule.load(
                results / "compile" / v / "tails.bin", results / "compile" / v / "meta.json", ()
            )
            for v in args.variants
        }
        pin = kernelbench.read_pin(results / "kernelbench" / "pin.json")
        for task, mode in zip(args.tasks, modes, strict=True):
            baselines.set_numerics(mode)
            spec = kernelbench.load_task(args.checkout, pin, task)
            tail = tail_for(task)
            model = kernelbench.build_model(spec, seed=args.seed)
            x = make_input("uniform", tail.input_shape(spec), args.seed, "cuda")
            with torch.no_grad():
                y = tail.library_output(model, x)
                compiled = torch.compile(baselines.tail_module(model, tail))
                compiled(y)  # compile outside the profiled launch below
                out = torch.empty(tail.output_shape(model, y), device="cuda")
                for variant, module in modules.items():
                    run_tail(module, tail, model, y, out)
                    print(f"task {task}: launched {variant} on {y.numel()} elements")
                compiled(y)
                print(f"task {task}: launched inductor on {y.numel()} elements")
            torch.cuda.synchronize()
            del model, x, y, out, compiled
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
