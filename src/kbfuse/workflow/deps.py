"""Which kbfuse source files a module depends on, so rules can list them as inputs.

Snakemake reruns a job when its script changes but knows nothing of the modules the
script imports; rules name `module_files("<module>")` as an input instead, and an edit
to any module in the closure reruns the job. Modules are named relative to the package, with
their subpackage: "checks.verify", "layout". A module's closure includes the `__init__.py`
of its subpackage, which Python runs when it imports the module.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from functools import cache
from pathlib import Path

PACKAGE = "kbfuse"
SRC = Path(__file__).resolve().parents[1]


def _source(name: str, src: Path) -> tuple[str, Path] | None:
    """(module name, file) of `name`: a module file, or a subpackage's __init__.py (named
    "<package>.__init__"); None when `name` is neither (a name imported from a module)."""
    base = os.path.join(src, *name.split("."))
    if os.path.isfile(base + ".py"):
        return name, Path(base + ".py")
    if os.path.isfile(os.path.join(base, "__init__.py")):
        return f"{name}.__init__", Path(base, "__init__.py")
    return None


# Looked up once per process: the closures of one Snakefile ask for the same names hundreds
# of times. (Not a decorator: mutmut leaves decorated functions unmutated.)
_cached_source = cache(_source)


# An import statement at the start of a line (ruff's E701 and E702 keep imports off the line
# of another statement), with its continuation: a parenthesised name list or backslash-joined
# lines.
_IMPORT_STATEMENT = re.compile(
    r"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+import[ \t]*\((?s:[^)]*)\)"
    r"|(?:from|import)[ \t](?:[^\n\\]|\\\n)*)",
    re.MULTILINE,
)


def _statements(body: list) -> Iterator[ast.stmt]:
    """Every statement of `body` and of the statements nested in it."""
    for node in body:
        yield node
        for field in ("body", "orelse", "finalbody", "handlers", "cases"):
            nested = getattr(node, field, None)
            if isinstance(nested, list):
                yield from _statements(nested)


def _import_nodes(text: str, filename: str) -> list[ast.stmt]:
    """The import statements of `text`. Parsing only the lines that start one is about ten
    times cheaper than parsing the module, and every Snakemake start walks about 80 modules.
    When one of those lines does not parse on its own (a string's or a comment's "from the
    ..."), the whole module is parsed instead. A string line that does parse ("import x")
    can only add a module to a closure, never drop one."""
    nodes: list[ast.stmt] = []
    for match in _IMPORT_STATEMENT.finditer(text):
        try:
            nodes += ast.parse(match.group(0).strip(), filename=filename).body
        except SyntaxError:
            return list(_statements(ast.parse(text, filename=filename).body))
    return nodes


def _imported_modules(path: Path) -> set[str]:
    found: set[str] = set()
    for node in _import_nodes(path.read_text(), str(path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative import inside the package
                base = node.module or ""
                names = [base] if base else [alias.name for alias in node.names]
                names = [f"{PACKAGE}.{n}" for n in names]
            else:
                base = node.module or ""
                names = [base] + [f"{base}.{alias.name}" for alias in node.names]
        else:
            continue
        for name in names:
            parts = name.split(".")
            if parts[0] == PACKAGE and len(parts) >= 2:
                found.add(".".join(parts[1:]))
    return found


@cache
def _imports_of(path: Path, stamp: tuple[int, int]) -> frozenset[str]:
    """_imported_modules(path), parsed once per version of the file (its mtime and size): the
    Snakefile's closures share most modules, and parsing them again for each closure took a
    quarter of every Snakemake start (0.5 of 1.8 s on the CPU)."""
    return frozenset(_imported_modules(path))


@cache
def module_closure(module: str, src: Path = SRC) -> tuple[str, ...]:
    """Sorted module names reachable from `module` through kbfuse imports (itself included)."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        name = todo.pop()
        found = _cached_source(name, src)
        if found is None:
            if name == module:
                path = (src / Path(*name.split("."))).with_suffix(".py")
                raise FileNotFoundError(f"no kbfuse module {name!r} at {path}")
            continue  # a name imported from a module, not a module itself
        name, path = found
        if name in seen:
            continue
        seen.add(name)
        stat = path.stat()
        todo.extend(_imports_of(path, (stat.st_mtime_ns, stat.st_size)) - seen)
        if "." in name:  # importing a module of a subpackage runs the subpackage's __init__
            todo.append(name.rsplit(".", 1)[0].removesuffix(".__init__"))
    return tuple(sorted(seen))


# Data files a module reads at run time: editing one reruns the jobs that use the module.
DATA_FILES = {"results.records": "schemas/*.json"}


def module_files(*modules: str, root: str = "src/kbfuse") -> list[str]:
    """Paths (relative to the workflow root) of every module in the closures of `modules`,
    then the data files those modules read (DATA_FILES)."""
    names: set[str] = set()
    for module in modules:
        names.update(module_closure(module))
    data = sorted(
        path.relative_to(SRC).as_posix()
        for name in sorted(names)
        if name in DATA_FILES
        for path in SRC.glob(DATA_FILES[name])
    )
    files = [f"{root}/{name.replace('.', '/')}.py" for name in sorted(names)]
    return files + [f"{root}/{rel}" for rel in data]
