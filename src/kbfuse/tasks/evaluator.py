"""KernelBench's official check, read from the pinned checkout's own evaluator source.

Everything kbfuse calls "KernelBench's" (the tolerance, the argument order of the predicate,
the seeds, the trial count, the order of seeding, model construction and input draws, the
timing method) is read here from the evaluator at the pin, never from memory or a literal
elsewhere. The files are parsed with `ast`, not imported (the evaluator imports packages
kbfuse does not need, and a checkout is code kbfuse does not run). Each fact keeps the file
and line it was read from. At commit 423217d (the default pin):

- `src/kernelbench/eval.py`, `run_and_check_correctness`: `torch.allclose(output, output_new,
  atol=tolerance, rtol=tolerance)`, `output` being the reference model's and `output_new` the
  candidate's, and `tolerance = get_tolerance_for_precision(precision)`, whose table gives
  float32 1e-4;
- trial seeds: `torch.manual_seed(seed)`, then `torch.randint(0, 2**32 - 1, (1,)).item()` per
  trial; each trial seeds with its trial seed, then calls `get_inputs()`, then the reference,
  then the candidate;
- `eval_kernel_against_ref(seed_num=42, timing_method="cuda_event")`: `set_seed(seed_num)`,
  `get_init_inputs()`, `set_seed(seed_num)`, `Model(*init_inputs)`; the evaluator never calls
  `.eval()` and sets no TF32 switch (PyTorch's defaults stay in force);
- `scripts/eval_from_generations.py`: 5 correctness trials, 100 timing trials;
- `src/kernelbench/timing.py`, `time_execution_with_cuda_event`: the L2 cache is cleared
  before every timed trial.

A structure kbfuse does not recognise is an error naming the file and what is missing, so a
pin whose evaluator changed shape stops the workflow instead of being judged by old rules.
"""

from __future__ import annotations

import ast
import hashlib
import operator
import os
from pathlib import Path
from typing import Any

from kbfuse.errors import KbfuseError

KIND = "kernelbench_contract"
SCHEMA_VERSION = 1
PRECISION = "float32"
EVAL_FILES = ("src/kernelbench/eval.py", "src/eval.py")
TIMING_FILES = ("src/kernelbench/timing.py", "src/timing.py")
SCRIPT_FILE = "scripts/eval_from_generations.py"
EVALUATOR = "eval_kernel_against_ref"
TRIALS = "run_and_check_correctness"
TOLERANCE = "get_tolerance_for_precision"
TIMING_PREFIX = "time_execution_with_"
# The evaluator's steps kbfuse reproduces, in source order (other calls may come between).
CONSTRUCTION_STEPS = ("set_seed", "get_init_inputs", "set_seed", "Model")
TRIAL_STEPS = ("set_seed", "get_inputs_fn", "set_seed", "model", "model_new")
TF32_NAMES = ("allow_tf32", "set_float32_matmul_precision", "fp32_precision")

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Pow: operator.pow,
}


def _exists(checkout: Path, candidates: tuple[str, ...]) -> bool:
    return any((checkout / name).is_file() for name in candidates)


class _Source:
    """One parsed file of the checkout, with its path relative to the checkout."""

    def __init__(self, checkout: Path, candidates: tuple[str, ...]):
        found = [name for name in candidates if (checkout / name).is_file()]
        if not found:
            raise KbfuseError(
                f"KernelBench checkout {checkout} has none of {list(candidates)}: kbfuse reads "
                "the official check from the pinned evaluator's source"
            )
        self.name = found[0]
        data = (checkout / self.name).read_bytes()
        self.sha256 = hashlib.sha256(data).hexdigest()
        try:
            self.tree = ast.parse(data, filename=self.name)
        except SyntaxError as exc:
            raise KbfuseError(f"KernelBench's {self.name} does not parse: {exc}") from None

    def where(self, node: ast.AST, what: str) -> str:
        return f"{self.name}:{node.lineno} {what}"

    def function(self, name: str) -> ast.FunctionDef:
        for node in ast.walk(self.tree):
            if isinstance(node, ast.FunctionDef) and node.name == name:
                return node
        raise self.missing(f"no function {name}")

    def missing(self, what: str) -> KbfuseError:
        return KbfuseError(
            f"KernelBench's {self.name}: {what}; kbfuse cannot read the official check from "
            "this evaluator (a KernelBench whose evaluator changed shape needs kbfuse updated)"
        )


def _constant(node: ast.AST) -> Any:
    """The value of a literal or of arithmetic on literals (`2**32 - 1`); ValueError else."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.Tuple):
        return tuple(_constant(e) for e in node.elts)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        return _BINARY[type(node.op)](_constant(node.left), _constant(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_constant(node.operand)
    raise ValueError(ast.dump(node))


def _dotted(node: ast.AST) -> str:
    """`torch.float32` -> "torch.float32"; a plain name -> itself; "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else ""
    return ""


def _calls(function: ast.FunctionDef) -> list[ast.Call]:
    """The calls of a function body in source order."""
    calls = [n for n in ast.walk(function) if isinstance(n, ast.Call)]
    return sorted(calls, key=lambda n: (n.lineno, n.col_offset))


def _default(function: ast.FunctionDef, parameter: str) -> ast.AST | None:
    args = function.args
    positional = args.posonlyargs + args.args
    with_defaults = positional[len(positional) - len(args.defaults) :]
    pairs = list(zip(with_defaults, args.defaults, strict=True))
    pairs += [
        (a, d) for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d is not None
    ]
    return next((d for a, d in pairs if a.arg == parameter), None)


def _in_order(calls: list[ast.Call], steps: tuple[str, ...]) -> bool:
    """Do calls to `steps` (by the called name) appear in this order, gaps allowed?"""
    names = iter(_dotted(c.func).split(".")[-1] for c in calls)
    return all(any(name == step for name in names) for step in steps)


def _assigned(function: ast.FunctionDef) -> dict[str, ast.AST]:
    """name -> the value last assigned to it by a plain `name = value` in the function."""
    values = {}
    for node in ast.walk(function):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Name):
                values[target.id] = node.value
    return values


def _origin(name: str, values: dict[str, ast.AST]) -> str:
    """Follow `x = y(...)` and `x = y.to(...)` back to the name they start from."""
    seen = set()
    while name in values and name not in seen:
        seen.add(name)
        value = values[name]
        if not isinstance(value, ast.Call):
            break
        func = value.func
        if isinstance(func, ast.Attribute):
            func = func.value
        if not isinstance(func, ast.Name):
            break
        name = func.id
    return name


def _allclose(source: _Source, trials: ast.FunctionDef) -> ast.Call:
    calls = [c for c in _calls(trials) if _dotted(c.func) == "torch.allclose"]
    if len(calls) != 1:
        raise source.missing(f"{TRIALS} makes {len(calls)} torch.allclose calls (need one)")
    return calls[0]


def _argument_order(source: _Source, trials: ast.FunctionDef, call: ast.Call) -> dict:
    """Which model's output is allclose's first argument (the one whose |value| does NOT scale
    the relative term)."""
    params = [a.arg for a in trials.args.posonlyargs + trials.args.args]
    values = _assigned(trials)
    if len(call.args) < 2 or len(params) < 2:
        raise source.missing(f"{TRIALS}: torch.allclose needs two positional arguments")
    roles = {params[0]: "reference", params[1]: "candidate"}
    order = [roles.get(_origin(a.id, values)) if isinstance(a, ast.Name) else None
             for a in call.args[:2]]  # fmt: skip
    if sorted(map(str, order)) != ["candidate", "reference"]:
        raise source.missing(f"{TRIALS}: cannot tell which allclose argument is the reference")
    return {"argument_order": order, "argument_order_source": source.where(call, "torch.allclose")}


def _tolerance_table(source: _Source) -> dict[str, tuple[float, ast.AST]]:
    """dtype name -> (tolerance, node) from get_tolerance_for_precision's dict literal."""
    function = source.function(TOLERANCE)
    for node in ast.walk(function):
        if isinstance(node, ast.Dict) and node.keys:
            table = {}
            for key, value in zip(node.keys, node.values, strict=True):
                try:
                    table[_dotted(key).removeprefix("torch.")] = (float(_constant(value)), value)
                except (ValueError, TypeError):
                    continue
            if PRECISION in table:
                return table
    raise source.missing(f"{TOLERANCE} holds no table with a {PRECISION} tolerance")


def _tolerance_value(source: _Source, trials: ast.FunctionDef, call: ast.Call, key: str):
    """(value, where) of allclose's `key` keyword: a literal, or a name assigned from
    get_tolerance_for_precision (read for float32)."""
    keyword = next((k.value for k in call.keywords if k.arg == key), None)
    if keyword is None:
        raise source.missing(f"{TRIALS}: torch.allclose has no {key}=")
    try:
        return float(_constant(keyword)), source.where(keyword, f"torch.allclose {key}=")
    except (ValueError, TypeError):
        pass
    assigned = _assigned(trials).get(keyword.id) if isinstance(keyword, ast.Name) else None
    if not (isinstance(assigned, ast.Call) and _dotted(assigned.func).endswith(TOLERANCE)):
        raise source.missing(f"{TRIALS}: torch.allclose's {key} is no number nor {TOLERANCE}")
    value, node = _tolerance_table(source)[PRECISION]
    return value, source.where(node, f"{TOLERANCE}, torch.{PRECISION}")


def _trial_seeds(source: _Source, trials: ast.FunctionDef) -> dict:
    """How trial seeds are drawn: torch.manual_seed(seed), then randint(low, high, (1,))."""
    calls = _calls(trials)
    randint = next((c for c in calls if _dotted(c.func) == "torch.randint"), None)
    seeded = any(_dotted(c.func) == "torch.manual_seed" for c in calls)
    if randint is None or not seeded or len(randint.args) < 3:
        raise source.missing(f"{TRIALS}: no torch.manual_seed + torch.randint trial seeds")
    try:
        low, high = int(_constant(randint.args[0])), int(_constant(randint.args[1]))
        size = _constant(randint.args[2])
    except (ValueError, TypeError):
        raise source.missing(f"{TRIALS}: torch.randint's bounds are not literals") from None
    if size != (1,):
        raise source.missing(f"{TRIALS}: torch.randint draws {size!r}, not one value per trial")
    if not _in_order(calls, TRIAL_STEPS):
        raise source.missing(f"{TRIALS}: the calls {' -> '.join(TRIAL_STEPS)} are not in order")
    return {
        "trial_seed_low": low,
        "trial_seed_high": high,
        "trial_seeds_source": source.where(randint, "torch.randint"),
        "trial_steps": list(TRIAL_STEPS),
    }


def _timing_method(source: _Source, function: ast.FunctionDef) -> tuple[str, str]:
    """The evaluator's timing method: its `timing_method` default, or (older evaluators) the
    `time_execution_with_<method>` function it calls."""
    default = _default(function, "timing_method")
    if default is not None:
        return str(_constant(default)), source.where(default, f"{EVALUATOR}(timing_method=...)")
    for call in _calls(function):
        name = _dotted(call.func).split(".")[-1]
        if name.startswith(TIMING_PREFIX):
            return name.removeprefix(TIMING_PREFIX), source.where(call, name)
    raise source.missing(f"{EVALUATOR} names no timing method")


def _evaluator(source: _Source) -> dict:
    function = source.function(EVALUATOR)
    seed = _default(function, "seed_num")
    if seed is None:
        raise source.missing(f"{EVALUATOR} has no default seed_num")
    if not _in_order(_calls(function), CONSTRUCTION_STEPS):
        steps = " -> ".join(CONSTRUCTION_STEPS)
        raise source.missing(f"{EVALUATOR}: the calls {steps} are not in order")
    calls_eval = any(
        isinstance(c.func, ast.Attribute) and c.func.attr == "eval" and not c.args
        for c in _calls(function)
    )
    method, method_source = _timing_method(source, function)
    return {
        "seed": int(_constant(seed)),
        "seed_source": source.where(seed, f"{EVALUATOR}(seed_num=...)"),
        "construction_steps": list(CONSTRUCTION_STEPS),
        "timing_method": method,
        "timing_method_source": method_source,
        "calls_eval": calls_eval,
    }


def _sets_tf32(source: _Source) -> bool:
    """Does the evaluator touch a TF32 switch anywhere?"""
    return any(
        (isinstance(n, ast.Attribute) and n.attr in TF32_NAMES)
        or (isinstance(n, ast.Name) and n.id in TF32_NAMES)
        for n in ast.walk(source.tree)
    )


def _script_count(source: _Source, attribute: str) -> tuple[int, str]:
    for node in ast.walk(source.tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            if isinstance(target, ast.Attribute) and target.attr == attribute:
                try:
                    return int(_constant(node.value)), source.where(node, attribute)
                except (ValueError, TypeError):
                    break
    raise source.missing(f"no literal `self.{attribute} = N`")


def _cold_l2(sources: list[_Source], method: str) -> dict:
    """Does the default timing function clear the L2 cache before each timed trial? It lives
    in the timing module, or (older evaluators) in the evaluator itself."""
    name = TIMING_PREFIX + method
    for source in sources:
        function = next(
            (n for n in ast.walk(source.tree) if isinstance(n, ast.FunctionDef) and n.name == name),
            None,
        )
        if function is None:
            continue
        flush = next((c for c in _calls(function) if "clear_l2_cache" in _dotted(c.func)), None)
        return {
            "timing_cold_l2": flush is not None,
            "timing_cold_l2_source": source.where(flush or function, "clear_l2_cache"),
        }
    raise sources[0].missing(f"no function {name}")


def read_contract(checkout: str | os.PathLike, commit: str | None = None) -> dict:
    """The `kernelbench_contract` record of a KernelBench checkout (see the module docstring):
    what the pinned evaluator does, each fact with the file and line it was read from."""
    checkout = Path(checkout)
    evaluator = _Source(checkout, EVAL_FILES)
    trials = evaluator.function(TRIALS)
    call = _allclose(evaluator, trials)
    atol, atol_source = _tolerance_value(evaluator, trials, call, "atol")
    rtol, rtol_source = _tolerance_value(evaluator, trials, call, "rtol")
    construction = _evaluator(evaluator)
    script = _Source(checkout, (SCRIPT_FILE,))
    correct_trials, trials_source = _script_count(script, "num_correct_trials")
    perf_trials, perf_source = _script_count(script, "num_perf_trials")
    timing = [_Source(checkout, TIMING_FILES)] if _exists(checkout, TIMING_FILES) else []
    return {
        "kind": KIND,
        "schema_version": SCHEMA_VERSION,
        "commit": commit,
        "files": {s.name: s.sha256 for s in (evaluator, script, *timing)},
        "precision": PRECISION,
        "atol": atol,
        "rtol": rtol,
        "tolerance_source": {"atol": atol_source, "rtol": rtol_source},
        **_argument_order(evaluator, trials, call),
        **{k: v for k, v in construction.items() if k != "calls_eval"},
        **_trial_seeds(evaluator, trials),
        "trials": correct_trials,
        "trials_source": trials_source,
        "semantics": "eval" if construction["calls_eval"] else "training",
        "numerics": "sets TF32" if _sets_tf32(evaluator) else "pytorch-defaults",
        "timing_trials": perf_trials,
        "timing_trials_source": perf_source,
        **_cold_l2([*timing, evaluator], construction["timing_method"]),
    }


def read_contract_record(path: str | os.PathLike) -> dict:
    """A written kernelbench_contract record, checked against its schema and for the keys
    the judges use (kbfuse.checks.official.check_contract)."""
    from kbfuse.checks.official import check_contract
    from kbfuse.results import records

    data = records.parse_json(records.read_limited(path), str(path))
    records.validate_record(data, KIND, str(path))
    return check_contract(data, str(path))


def write_contract(checkout, checkout_record, out) -> dict:
    """Read the contract of the pinned checkout (its commit from the checkout's record),
    validate it and write it atomically."""
    from kbfuse.io import read_json, write_json
    from kbfuse.results import records

    contract = read_contract(checkout, read_json(checkout_record).get("commit"))
    records.validate_record(contract, KIND, str(out))
    write_json(out, contract)
    return contract


STUDY_ORDER = ["reference", "candidate"]


def tolerance_of(path: str | os.PathLike) -> dict[str, float]:
    """{"atol", "rtol"} of the kernelbench_contract record at `path` (what the study's
    correctness, controls and protocol stages judge with). The study's case records call
    `torch.allclose(reference, candidate)` official and the swapped reading historical
    (kbfuse.checks.numerics): a pin whose evaluator puts the candidate first is refused here,
    by name, rather than judged in the wrong order (the survey and the check follow either
    order: kbfuse.checks.official.passes)."""
    contract = read_contract_record(path)
    if list(contract["argument_order"]) != STUDY_ORDER:
        raise KbfuseError(
            f"{path}: the pinned evaluator calls torch.allclose with the arguments "
            f"{contract['argument_order']} ({contract['argument_order_source']}); the study's "
            f"records take {STUDY_ORDER} as the official order"
        )
    return {"atol": float(contract["atol"]), "rtol": float(contract["rtol"])}
