"""Write docs/mutation.md from mutmut's results (called by tools/mutation.sh).

    python tools/mutation_report.py --names MODULE...   # the mutant globs mutation.sh runs
    python tools/mutation_report.py MODULE...           # rewrite docs/mutation.md

Modules are named as in the package, below kbfuse: "results.bundle" is kbfuse.results.bundle.
The score of a module is killed / scored mutants. Scored: every mutant of the module's
functions, except the few that only run on a GPU (GPU_ONLY): those are counted apart, never
silently dropped. The timing gate is its own module, timing.gate; timing.timing (run_timing)
is scored too, driven on the CPU through stand-ins. Every survivor must be listed
in tools/mutation_equivalent.toml with the reason it is equivalent (the program behaves the
same), or it is printed as unexplained and the command exits 1. Scored modules this run did
not cover in full are shown apart with earlier runs' figures (tools/mutation_previous.toml),
named as such and never added to this run's score.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import re
import subprocess
import sys
import tomllib
from collections import Counter
from fnmatch import fnmatchcase
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "mutation.md"
EQUIVALENT = ROOT / "tools" / "mutation_equivalent.toml"
PREVIOUS = ROOT / "tools" / "mutation_previous.toml"
# The modules mutated, below kbfuse (the files are [tool.mutmut] only_mutate in pyproject.toml).
MODULES = (
    "checks.numerics",
    "timing.measure",
    "timing.gate",
    "checks.verify",
    "compilation.routes",
    "results.manifest",
    "results.bundle",
    "results.records",
    "workflow.config",
    "workflow.deps",
    "compilation.cudacache",
    "workflow.gpulock",
    "survey.correctness",
    "checks.official",
    "tasks.evaluator",
    "survey.determinism",
    "survey.classify",
    "survey.timing",
    "candidates.flags",
    "candidates.verdict",
    "errors",
    "checks.cases",
    "candidates.check",
    "candidates.evidence",
    "candidates.readback",
    "candidates.compare",
    "untrusted",
    "survey.summary",
    "timing.timing",
)
# Functions that launch kernels or build the model on the GPU: no CPU test can run them.
GPU_ONLY = (
    "timing.measure.time_interleaved",
    "timing.measure.capture_graphs",
    "checks.verify.witness_output",
    "checks.verify._float32_value",
    "checks.verify.Task81Witness.*",
    "survey.timing._cold_l2",
    "survey.timing._events",
    "survey.timing.capture_problem",
)
GOAL = 0.90
NOT_KILLED = ("survived", "no tests", "timeout", "suspicious")
# kbfuse.<module, dotted>.<x_function | xǁClassǁmethod>__mutmut_<n>
_NAME = re.compile(r"^kbfuse\.([\w.]+?)\.(x_.+|xǁ.+)__mutmut_(\d+)$")


def mutant_globs(modules) -> list[str]:
    """The mutant names (fnmatch globs) `mutmut run` is given for `modules`."""
    return [f"kbfuse.{module}.*" for module in modules]


def function_of(name: str) -> tuple[str, str]:
    """(module, function) of a mutant name: 'kbfuse.checks.verify.xǁTask81Witnessǁmeasure__mutmut_3'
    is ('checks.verify', 'Task81Witness.measure')."""
    match = _NAME.match(name)
    if match is None:
        raise ValueError(f"not a mutmut mutant name: {name!r}")
    module, mangled = match.group(1), match.group(2)
    if mangled.startswith("xǁ"):
        return module, ".".join(mangled[2:].split("ǁ"))
    return module, mangled.removeprefix("x_")


def gpu_only(module: str, function: str) -> bool:
    return any(fnmatchcase(f"{module}.{function}", pattern) for pattern in GPU_ONLY)


# mutmut leaves a function with a decorator alone (but for staticmethod and classmethod): the
# decorator runs when the function is defined, so mutmut does not wrap it with its trampoline.
UNDECORATED = ("staticmethod", "classmethod")


def not_mutated(modules, src: Path = ROOT / "src" / "kbfuse") -> list[str]:
    """'module.function' (or 'module.Class.method') of each decorated function of `modules`
    that mutmut does not mutate (`@cache`, `@contextlib.contextmanager`, `@property`, ...)."""
    found = []
    for module in modules:
        tree = ast.parse((src / f"{module.replace('.', '/')}.py").read_text())
        found += [f"{module}.{name}" for name in _decorated(tree.body)]
    return found


def _decorated(body, prefix: str = "") -> list[str]:
    names = []
    for node in body:
        if isinstance(node, ast.ClassDef):
            names += _decorated(node.body, f"{prefix}{node.name}.")
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.decorator_list:
            decorators = [ast.unparse(d) for d in node.decorator_list]
            if not (len(decorators) == 1 and decorators[0] in UNDECORATED):
                names.append(f"{prefix}{node.name}")
    return names


def mutmut_results() -> dict[str, str]:
    """Mutant name -> mutmut's status ('killed', 'survived', 'no tests', ...)."""
    out = subprocess.run(
        ["mutmut", "results", "--all", "true"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    results = {}
    for line in out.splitlines():
        name, sep, status = line.strip().rpartition(": ")
        if sep and _NAME.match(name):
            results[name] = status
    return results


def mutant_diff(name: str) -> list[str]:
    """The changed lines of a mutant, from `mutmut show`."""
    out = subprocess.run(
        ["mutmut", "show", name], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return [
        line
        for line in out.splitlines()
        if line[:1] in "+-" and not line.startswith(("+++", "---"))
    ]


def equivalent_reasons() -> dict[str, str]:
    """Mutant name -> why it is equivalent, from tools/mutation_equivalent.toml."""
    data = tomllib.loads(EQUIVALENT.read_text())
    reasons = {}
    for entry in data.get("equivalent", []):
        for name in entry["mutants"]:
            reasons[name] = entry["why"]
    return reasons


def tally(results: dict[str, str], modules) -> dict[str, Counter]:
    counts: dict[str, Counter] = {module: Counter() for module in modules}
    for name, status in results.items():
        module, function = function_of(name)
        if module not in counts:
            continue
        if gpu_only(module, function):
            counts[module]["gpu-only"] += 1
        elif status == "not checked":
            counts[module]["not run"] += 1
        else:
            counts[module]["scored"] += 1
            counts[module][status] += 1
    return counts


_TOML_KEYS = {"gpu_only": "gpu-only", "no_tests": "no tests", "not_run": "not run"}


def previous_runs(repeated) -> list[tuple[dict, dict[str, Counter]]]:
    """Earlier runs (tools/mutation_previous.toml), each as (run, module -> counts) for its
    modules not in `repeated` (the modules this run mutated in full); runs left empty drop."""
    if not PREVIOUS.is_file():
        return []
    runs = []
    for run in tomllib.loads(PREVIOUS.read_text()).get("runs", []):
        counts = {
            module: Counter({_TOML_KEYS.get(k, k): v for k, v in figures.items()})
            for module, figures in run.get("modules", {}).items()
            if module not in repeated
        }
        if counts:
            runs.append((run, counts))
    return runs


def repeated_in_full(counts: dict[str, Counter]) -> set[str]:
    """The modules of this run whose every scored mutant ran (none left 'not run')."""
    return {module for module, c in counts.items() if c["scored"] and not c["not run"]}


def previous_section(repeated) -> list[str]:
    runs = previous_runs(repeated)
    if not runs:
        return []
    lines = [
        "## Earlier runs' figures",
        "",
        "For the modules this run did not mutate in full, the figures of earlier runs, kept in",
        "`tools/mutation_previous.toml`. They are not part of the score above. Runs before the",
        "package moved into subpackages measured the modules under their flat names",
        "(`kbfuse.bundle` for today's `kbfuse.results.bundle`, `kbfuse.timing` for the gate now in",
        "`kbfuse.timing.gate`); their figures and survivors are listed under the new names, and",
        "each run says what changed in the code since.",
        "",
    ]
    for run, counts in runs:
        about = " ".join(run.get("about", "").split())
        lines += [
            f"Run of {run.get('date')} (mutmut {run.get('mutmut')}) on the code of commit "
            f"{run.get('commit')}. {about}".rstrip(),
            "",
            *score_table(counts),
            "",
        ]
    return lines


def score_table(counts: dict[str, Counter]) -> list[str]:
    head = (
        "| module | scored | killed | survived | no CPU test | timeout | score | GPU-only "
        "| not run |"
    )
    lines = [head, "|:--|--:|--:|--:|--:|--:|--:|--:|--:|"]
    total = Counter()
    for module, c in counts.items():
        total.update(c)
        lines.append(_row(module, c))
    lines.append(_row("**all**", total))
    return lines


def _row(label: str, c: Counter) -> str:
    score = f"{c['killed'] / c['scored']:.1%}" if c["scored"] else "—"
    return (
        f"| {label} | {c['scored']} | {c['killed']} | {c['survived']} | {c['no tests']} | "
        f"{c['timeout']} | {score} | {c['gpu-only']} | {c['not run']} |"
    )


def survivors(results: dict[str, str], modules) -> list[str]:
    names = []
    for name, status in sorted(results.items(), key=lambda kv: _sort_key(kv[0])):
        module, function = function_of(name)
        if module in modules and not gpu_only(module, function) and status in NOT_KILLED:
            names.append(name)
    return names


def _sort_key(name: str) -> tuple[str, str, int]:
    module, function = function_of(name)
    return module, function, int(name.rsplit("_", 1)[1])


def _listed(names) -> str:
    return ", ".join(f"`{name}`" for name in names) if names else "none"


def render(modules, counts, results, reasons, note: str = "") -> tuple[str, list[str]]:
    total = Counter()
    for c in counts.values():
        total.update(c)
    score = total["killed"] / total["scored"] if total["scored"] else 0.0
    version = subprocess.run(
        ["mutmut", "--version"], capture_output=True, text=True, check=True
    ).stdout.strip()
    lines = [
        "# Mutation testing",
        "",
        "Small bugs are planted in the modules that decide the study's results, one at a time,",
        "and the fast CPU tests of those modules must notice each one (a test fails: the mutant",
        "is *killed*). A mutant that survives is either a missing test or *equivalent*: the",
        "program behaves the same, and the reason is written down below.",
        "",
        "```bash",
        "bash tools/mutation.sh                 # every scored module",
        "bash tools/mutation.sh workflow.deps compilation.cudacache  # some of them",
        "```",
        "",
        "The tool is [mutmut](https://github.com/boxed/mutmut), configured under `[tool.mutmut]`",
        "in pyproject.toml: the modules it mutates and the test files it runs (the fast CPU",
        "tests of those modules; tests that start Snakemake, a candidate's own process or a",
        "survey job on a KernelBench checkout take seconds each and are left out: the",
        "`test_mutation_*.py` files test those modules' functions directly). `tools/mutation.sh`",
        "runs it in `./mutants` (git-ignored) and rewrites this page with",
        "`tools/mutation_report.py`, which exits 1 while a survivor is unexplained. Equivalent",
        "mutants and their reasons are listed in `tools/mutation_equivalent.toml`. mutmut is not",
        "in the `test` extra: `.venv-cpu/bin/pip install mutmut==3.8.1` first.",
        "",
        "Modules are named below `kbfuse` (`results.bundle` is `kbfuse.results.bundle`).",
        "Scored: every function of the modules below. The timing gate is its own module",
        "(`timing.gate`); `timing.timing` (`run_timing`) is driven on the CPU through",
        "stand-ins (tests/test_fakes_gate.py), and the timing statistics are in `timing.measure`.",
        "*GPU-only* mutants are in functions that launch kernels on the device "
        f"({', '.join(f'`{g}`' for g in GPU_ONLY)}); no CPU test can reach them, the GPU tests",
        "do, and they are counted apart. *No CPU test*: no selected test runs the function.",
        "*Not run*: mutants of a scored function that this run did not reach (0 after a full run).",
        "*Not mutated*: mutmut leaves every function with a decorator alone (but for",
        "`staticmethod` and `classmethod`); in the scored modules these are "
        f"{_listed(not_mutated(MODULES))}. Their own tests run in the suite, but no",
        "mutant checks them.",
        "mutmut keeps its verdicts in `./mutants`: after tests are added, `mutmut run NAME...`",
        "with the survivors' names rechecks just those, and `python tools/mutation_report.py`",
        "rewrites this page.",
        "",
        f"## Score: {score:.1%} killed (goal {GOAL:.0%})",
        "",
        f"Run {datetime.date.today().isoformat()} with {version}, modules: {' '.join(modules)}.",
        *([note, ""] if note else [""]),
        *score_table(counts),
        "",
        *previous_section(repeated_in_full(counts)),
        "## Survivors",
        "",
    ]
    unexplained = []
    names = survivors(results, modules)
    if not names:
        lines.append("None.")
    for name in names:
        reason = reasons.get(name)
        if reason is None:
            unexplained.append(name)
            reason = "**unexplained**"
        reason = " ".join(reason.split())  # one markdown list item
        diff = "; ".join(f"`{d.strip()}`" for d in mutant_diff(name))
        lines.append(f"- `{name}` ({results[name]}): {diff}. {reason}")
    lines.append("")
    return "\n".join(lines), unexplained


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("modules", nargs="*", default=list(MODULES))
    parser.add_argument("--names", action="store_true", help="print the mutant globs and stop")
    parser.add_argument("--note", default="", help="a paragraph on this run's scope, shown")
    args = parser.parse_args(argv)
    unknown = [m for m in args.modules if m not in MODULES]
    if unknown:
        print(f"unknown module(s) {unknown}; scored modules: {list(MODULES)}", file=sys.stderr)
        return 2
    if args.names:
        print("\n".join(mutant_globs(args.modules)))
        return 0
    results = mutmut_results()
    counts = tally(results, args.modules)
    text, unexplained = render(args.modules, counts, results, equivalent_reasons(), args.note)
    DOC.write_text(text)
    print(f"wrote {DOC.relative_to(ROOT)}")
    for name in unexplained:
        print(f"unexplained survivor: {name}", file=sys.stderr)
    return 1 if unexplained else 0


if __name__ == "__main__":
    sys.exit(main())
