"""docs/contracts.md names only what the code has.

The page fixes the names that modules written side by side agree on; these tests keep it from
drifting: every function the module table names exists in that module, every `def` of the
"Python APIs between modules" block has the parameters the code has (same names, same order),
and the config block lists exactly the top-level keys of the config schema.
"""

import importlib
import inspect
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
CONTRACTS = (ROOT / "docs/contracts.md").read_text()
PACKAGE = ROOT / "src/kbfuse"
# The subpackages of the studies beside the fused-tail study: their modules are named with the
# subpackage (`survey.summary`, `candidates.timing`, `audit.cli`), as several share a stem with
# the core's.
STUDY_PACKAGES = ("survey", "candidates", "audit")


def _doc_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE).with_suffix("").parts
    return ".".join(parts) if parts[0] in STUDY_PACKAGES else path.stem


# Module name as the docs write it (the file's stem) -> its import path in the package.
MODULES = {
    _doc_name(path): "kbfuse." + ".".join(path.relative_to(PACKAGE).with_suffix("").parts)
    for path in PACKAGE.rglob("*.py")
    if path.stem != "__init__"
}


def _section(title: str) -> str:
    """The text of the `## title` section of contracts.md."""
    start = CONTRACTS.index(f"\n## {title}\n")
    end = CONTRACTS.find("\n## ", start + 1)
    return CONTRACTS[start : end if end != -1 else None]


def _module_rows() -> list[tuple[list[str], str]]:
    rows = []
    for line in _section("Modules").splitlines():
        match = re.match(r"^\| `([^|]+)` \| (.*) \|$", line)
        if match:
            names = [name.strip("` ") for name in match.group(1).split(",")]
            rows.append((names, match.group(2)))
    return rows


def _resolve(dotted: str, modules: list[str]):
    """`dotted` (e.g. `load_task`, `bundle.read_bundle`, `LoadedModule.load`) looked up in the
    row's module, or in a module of the package when it starts with one."""
    first, *rest = dotted.split(".")
    if rest and first in modules:
        owner, path = importlib.import_module(MODULES[first]), rest
    else:
        owner, path = importlib.import_module(MODULES[modules[0]]), [first, *rest]
    for part in path:
        owner = getattr(owner, part)
    return owner


def _split_top_level(text: str) -> list[str]:
    """`text` split at the commas outside brackets."""
    parts, depth, current = [], 0, ""
    for char in text:
        depth += char in "([{"
        depth -= char in ")]}"
        if char == "," and depth == 0:
            parts.append(current)
            current = ""
        else:
            current += char
    return [*parts, current]


def _param_names(text: str) -> list[str]:
    names = [re.split(r"[:=]", part)[0].strip(" *\n") for part in _split_top_level(text)]
    return [name for name in names if name and name not in ("self", "cls", "*")]


def _api_defs() -> list[tuple[str, str, str, list[str]]]:
    """(module, class or "", function, parameter names) for every `def` of the API block."""
    block = CONTRACTS.split("### Python APIs between modules")[1]
    block = block.split("```python")[1].split("```")[0]
    found, module, cls = [], None, ""
    pattern = r"^(# kbfuse\.(?:\w+\.)*(\w+)\b|class (\w+)|(\s*)def (\w+)\()"
    for start in re.finditer(pattern, block, re.M):
        if start.group(2):
            module, cls = start.group(2), ""
        elif start.group(3):
            cls = start.group(3)
        else:
            cls = cls if start.group(4) else ""
            depth, end = 1, start.end()
            while depth:
                depth += {"(": 1, ")": -1}.get(block[end], 0)
                end += 1
            params = _param_names(block[start.end() : end - 1])
            found.append((module, cls, start.group(5), params))
    return found


def test_the_module_table_names_every_module_of_the_package():
    listed = {name for names, _ in _module_rows() for name in names}
    assert len(MODULES) == len(list(PACKAGE.rglob("*.py"))) - len(
        list(PACKAGE.rglob("__init__.py"))
    )
    assert sorted(set(MODULES) - listed) == []
    assert sorted(listed - set(MODULES)) == []


def _calls(text: str) -> list[tuple[str, str]]:
    """(dotted name, argument text) of every `name(...)` in backticks, parentheses balanced."""
    found = []
    for start in re.finditer(r"`([A-Za-z_][\w.]*)\(", text):
        depth, end = 1, start.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(text[end], 0)
            end += 1
        found.append((start.group(1), text[start.end() : end - 1]))
    return found


@pytest.mark.parametrize("names,job", _module_rows(), ids=lambda v: str(v)[:20])
def test_every_function_the_module_table_names_exists(names, job):
    for dotted, args in _calls(job):
        function = _resolve(dotted, names)
        assert callable(function), f"{names}: {dotted}"
        if args and (inspect.isfunction(function) or inspect.ismethod(function)):
            actual = [p for p in inspect.signature(function).parameters if p != "self"]
            assert actual[: len(_param_names(args))] == _param_names(args), dotted


@pytest.mark.parametrize("module,cls,name,params", _api_defs(), ids=lambda v: str(v))
def test_every_api_signature_matches_the_code(module, cls, name, params):
    owner = importlib.import_module(MODULES[module])
    if cls:
        owner = getattr(owner, cls)
    signature = inspect.signature(getattr(owner, name))
    actual = [p for p in signature.parameters if p not in ("self", "cls")]
    assert actual == params


def test_the_api_block_covers_the_modules_stages_share():
    modules = {module for module, *_ in _api_defs()}
    assert {"kernelbench", "tails", "launch", "correctness", "verify", "cudadriver"} <= modules


def test_the_config_block_lists_the_schema_keys():
    block = _section("Config (after schema defaults are filled)").split("```yaml")[1]
    block = block.split("```")[0]
    documented = re.findall(r"^([a-z_0-9]+):", block, flags=re.MULTILINE)
    schema = yaml.safe_load((ROOT / "workflow/schemas/config.schema.yaml").read_text())
    assert documented == list(schema["properties"])


@pytest.mark.parametrize(
    "page", ["README.md", *sorted(p.name for p in (ROOT / "docs").glob("*.md"))]
)
def test_every_relative_link_of_the_docs_resolves(page):
    path = ROOT / page if page == "README.md" else ROOT / "docs" / page
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", path.read_text()):
        if "://" not in target:
            assert (path.parent / target).exists(), f"{page}: {target}"


def test_the_readme_names_one_rule_file_and_one_module_per_stage():
    readme = (ROOT / "README.md").read_text()
    table = readme.split("## Stages: one rule file and one module each")[1].split("\n\n")[1]
    rows = [line.split(" | ") for line in table.splitlines()[2:]]
    rule_files = {row[1].strip("` ") for row in rows}
    # *common.smk files hold the settings and input functions of the rule files that include them
    stage_files = {p.name for p in (ROOT / "workflow/rules").glob("*.smk")}
    assert rule_files == stage_files - {
        p.name for p in (ROOT / "workflow/rules").glob("*common.smk")
    }
    for row in rows:
        for module in re.findall(r"`([\w.]+)`", row[2]):
            assert module in MODULES, module
        rules = re.findall(
            r"^rule (\w+):", (ROOT / "workflow/rules" / row[1].strip("` ")).read_text(), re.M
        )
        assert rules, row[1]
