"""KernelBench's own verdict on the same candidates, for the table beside kbfuse check's.

For each candidate file (a `# kbfuse-task: 2/N` line names its task) this runs, from a
KernelBench checkout at the pin, the evaluator KernelBench scores submissions with:
`kernelbench.eval.eval_kernel_against_ref(task_source, candidate_source, seed_num=42,
num_correct_trials=TRIALS, num_perf_trials=PERF, measure_performance=True)` (its defaults
otherwise: cuda-event timing, the excessive-speedup flag at 10x), and its static checker
`kernelbench.kernel_static_checker.validate_kernel_static(source, backend="cuda",
precision="fp32")`. Each candidate is evaluated in a child process of its own (a candidate that
patches torch would otherwise change the next one's result). Needs a GPU. The package's
`__init__` (LLM client imports, torch.rand_mix aliases) is not run; modules the evaluation
imports but never calls (`requests`, and `dotenv`, `openai`, `litellm`, `tqdm` through its
utils module) and pydantic's BaseModel (the result container) are stood in for when
missing, and the JSON says so (`stubs`). Writes one JSON and one Markdown table:

    python tools/kernelbench_eval.py --kernelbench results/kernelbench/checkout \\
        --out results/check/kernelbench_eval tests/candidates/*.py

`--static-only` runs the static checker alone (no GPU needed). `--jobs N` evaluates N candidates
at once (their builds overlap; their timings then share the GPU and are not comparable).
`--trials` defaults to 1 (KernelBench's default `num_correct_trials`); the Markdown table puts
kbfuse check's verdicts beside when `--verdicts` names their folder (results/check).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from kbfuse.candidates.check import find_task_file  # noqa: E402
from kbfuse.candidates.spec import task_of_file  # noqa: E402

CHILD = r"""
import copy, importlib, json, sys, types
checkout, task_file, candidate, trials, perf = sys.argv[1:6]
# kernelbench/__init__.py imports its LLM helpers (openai, litellm, dotenv, tqdm) and only adds
# torch.rand_mix aliases: the evaluator is loaded without it, from the same source files.
package = types.ModuleType("kernelbench")
package.__path__ = [checkout + "/src/kernelbench"]
sys.modules["kernelbench"] = package
stubs = []
class Absent(types.ModuleType):  # a missing module the evaluation imports but never calls
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        def absent(*args, **kwargs):
            raise RuntimeError(f"{self.__name__}.{name} stands in for a missing module")
        return absent
# eval.py imports requests; utils.py (imported by eval.py for get_gpu_vendor) imports the LLM
# clients and calls dotenv's load_dotenv at import: a no-op here.
for name in ("requests", "dotenv", "openai", "litellm", "tqdm"):
    try:
        importlib.import_module(name)
    except ImportError:
        sys.modules[name] = Absent(name)
        stubs.append(name)
if "dotenv" in stubs:
    sys.modules["dotenv"].load_dotenv = lambda *args, **kwargs: False
try:
    import pydantic  # noqa: F401
except ImportError:
    class BaseModel:  # the result container only: fields with defaults, model_dump
        def __init__(self, **values):
            for cls in reversed(type(self).__mro__):
                for name in getattr(cls, "__annotations__", {}):
                    setattr(self, name, copy.deepcopy(getattr(cls, name, None)))
            for name, value in values.items():
                setattr(self, name, value)
        def model_dump(self):
            return {k: v for k, v in vars(self).items()}
    sys.modules["pydantic"] = types.SimpleNamespace(BaseModel=BaseModel)
    stubs.append("pydantic")
from kernelbench.eval import eval_kernel_against_ref
from kernelbench.kernel_static_checker import validate_kernel_static
task_src, cand_src = open(task_file).read(), open(candidate).read()
valid, errors, warnings = validate_kernel_static(cand_src, backend="cuda", precision="fp32")
if int(trials) == 0:  # --static-only: the text checks, no GPU
    print("KBFUSE-RESULT " + json.dumps({"static": {"valid": valid, "errors": errors,
          "warnings": warnings}, "stubs": stubs, "result": None}))
    sys.exit(0)
result = eval_kernel_against_ref(task_src, cand_src, seed_num=42,
    num_correct_trials=int(trials), num_perf_trials=int(perf), measure_performance=True)
out = {"static": {"valid": valid, "errors": errors, "warnings": warnings}, "stubs": stubs}
if result is None:
    out["result"] = None
else:
    data = result.model_dump() if hasattr(result, "model_dump") else result.dict()
    out["result"] = json.loads(json.dumps(data, default=str))
print("KBFUSE-RESULT " + json.dumps(out))
"""


def evaluate(checkout: Path, candidate: Path, trials: int, perf: int, timeout: float) -> dict:
    level, task = task_of_file(candidate)
    task_file = find_task_file(checkout, level, task)
    try:
        proc = subprocess.run(
            [
                sys.executable,
                "-c",
                CHILD,
                str(checkout),
                str(task_file),
                str(candidate),
                str(trials),
                str(perf),
            ],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return {"candidate": candidate.name, "task": task, "error": f"timeout {timeout} s"}
    for line in proc.stdout.splitlines():
        if line.startswith("KBFUSE-RESULT "):
            return {"candidate": candidate.name, "task": task, **json.loads(line[14:])}
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    return {"candidate": candidate.name, "task": task, "error": " | ".join(tail)}


def row(entry: dict, verdicts: Path | None) -> dict:
    result = entry.get("result") or {}
    meta = result.get("metadata") or {}
    runtime, ref = result.get("runtime", -1.0), result.get("ref_runtime", -1.0)
    cells = {
        "candidate": entry["candidate"],
        "task": f"2/{entry['task']}",
        "kernelbench_compiled": result.get("compiled"),
        "kernelbench_correct": result.get("correctness"),
        "kernelbench_speedup": round(ref / runtime, 3) if runtime and runtime > 0 < ref else None,
        "kernelbench_flags": " ".join(
            k for k in ("excessive_speedup", "correctness_issue", "runtime_error") if k in meta
        ),
        "static_valid": (entry.get("static") or {}).get("valid"),
        "static_errors": "; ".join((entry.get("static") or {}).get("errors", []))[:120],
        "static_warnings": "; ".join((entry.get("static") or {}).get("warnings", []))[:120],
        "error": entry.get("error", ""),
    }
    verdict_file = verdicts / f"{Path(entry['candidate']).stem}.json" if verdicts else None
    if verdict_file is not None and verdict_file.is_file():
        record = json.loads(verdict_file.read_text())
        cells["kbfuse_verdict"] = record["verdict"]
        cells["kbfuse_failed"] = " ".join(record["failed_checks"])
        cells["kbfuse_findings"] = " ".join(record["findings"])
    return cells


def markdown(rows: list[dict]) -> str:
    columns = list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for r in rows:
        lines.append(
            "| " + " | ".join("" if r.get(c) is None else str(r.get(c)) for c in columns) + " |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("candidates", nargs="+", type=Path)
    parser.add_argument("--kernelbench", type=Path, default=Path("results/kernelbench/checkout"))
    parser.add_argument("--out", type=Path, default=Path("results/check/kernelbench_eval"))
    parser.add_argument("--verdicts", type=Path, help="kbfuse check's verdict folder")
    parser.add_argument("--trials", type=int, default=1)
    parser.add_argument("--perf-trials", type=int, default=100)
    parser.add_argument("--timeout", type=float, default=600)
    parser.add_argument(
        "--jobs", type=int, default=1, help="candidates evaluated at once (%(default)s)"
    )
    parser.add_argument(
        "--static-only", action="store_true", help="only the static checker (text; no GPU)"
    )
    args = parser.parse_args(argv)
    if args.static_only:
        args.trials = 0

    def one(candidate: Path) -> dict:
        entry = evaluate(args.kernelbench, candidate, args.trials, args.perf_trials, args.timeout)
        print(json.dumps({k: v for k, v in entry.items() if k != "result"}), flush=True)
        return entry

    # Several at once share the GPU: their verdicts hold, their timings are not comparable.
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        entries = list(pool.map(one, args.candidates))
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "kernelbench_eval.json").write_text(json.dumps(entries, indent=1, default=str))
    table = markdown([row(e, args.verdicts) for e in entries])
    (args.out / "kernelbench_eval.md").write_text(table)
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
