"""The house rules of docs/internals.md, checked on the source itself.

* no import cycle among tfrun's modules, function-level imports included;
* the task side (``tfrun.in_task``) never imports the launcher or the CLI;
* every ``TFRUN_*`` variable is spelled in ``tfrun/contract.py`` only;
* each engine's own vocabulary (Slurm's commands and variables, ``import ray``, ssh's
  options, JobSet/TFJob kinds) lives in its engine's module or folder only.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[2] / "src"
PACKAGE = SRC / "tfrun"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    return {_module_name(p): p for p in PACKAGE.rglob("*.py")}


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Every tfrun module ``name`` imports, anywhere in its code (function bodies too).

    ``from . import x`` counts as importing the submodule ``x`` when there is one, else the
    package itself; importing a submodule does not count as importing its parents (Python
    runs their ``__init__`` first, but that is no edge back to the importer)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            targets = []
            for alias in node.names:
                sub = f"{module}.{alias.name}"
                targets.append(sub if sub in known else module)
        else:
            continue
        found.update(t for t in targets if t in known and t != name)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    known = set(modules)
    return {name: _imports(name, path, known) for name, path in modules.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in graph[node]:
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_cycle_finder_finds_a_cycle():
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles():
    assert _cycles(_graph()) == []


def test_the_task_side_never_imports_the_launcher():
    graph = _graph()
    reach: dict[str, set[str]] = {}

    def reachable(name: str) -> set[str]:
        if name not in reach:
            reach[name] = set()
            for nxt in graph[name]:
                reach[name] |= {nxt} | reachable(nxt)
        return reach[name]

    offenders = {name: sorted(m for m in reachable(name)
                              if m.startswith(("tfrun.launch", "tfrun.cli")))
                 for name in graph if name.startswith("tfrun.in_task")}
    assert {k: v for k, v in offenders.items() if v} == {}


def _spelled_in(pattern: str) -> list[str]:
    regex = re.compile(pattern)
    return sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*")
                  if p.suffix in (".py", ".cc") and regex.search(p.read_text()))


def test_tfrun_variables_are_spelled_in_the_contract_only():
    assert _spelled_in(r"TFRUN_") == ["contract.py"]


ENGINE_WORDS = {
    # engine folder or module -> what only it may say
    "launch/engines/slurm": r"\bSLURM_[A-Z]|\bsrun\b|\bsbatch\b|\bscontrol\b|\bscancel\b",
    "launch/engines/ray.py": r"^\s*import ray\b|^\s*from ray\b",
    "launch/engines/ssh": r"BatchMode|StrictHostKeyChecking|ServerAliveInterval",
    "launch/engines/kubernetes.py": r"kind\W+(JobSet|TFJob)|jobset\.x-k8s\.io|kubeflow\.org/v1",
}


@pytest.mark.parametrize("home", sorted(ENGINE_WORDS))
def test_each_engine_is_named_in_its_own_module_only(home):
    pattern = re.compile(ENGINE_WORDS[home], re.M)
    strangers = []
    for path in PACKAGE.rglob("*.py"):
        relative = str(path.relative_to(PACKAGE))
        if relative == home or relative.startswith(home + "/"):
            continue
        # prose may mention an engine; code may not use its vocabulary
        code = _code_only(path.read_text())
        if pattern.search(code):
            strangers.append(relative)
    assert strangers == []


def _code_only(source: str) -> str:
    """The source without comments and docstrings: string constants that are statements."""
    tree = ast.parse(source)
    lines = source.splitlines()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            for i in range(node.lineno - 1, node.end_lineno):
                lines[i] = ""
    return "\n".join(re.sub(r"#.*$", "", line) for line in lines)


def test_the_product_names_things_by_what_they_are():
    """No wording from the documents tfrun grew from ("seed 000", "seed-001"): users never
    saw them. Checked over the package, the README, the docs and the examples."""
    root = PACKAGE.parents[1]
    places = [*PACKAGE.rglob("*.py"), root / "README.md", *(root / "docs").rglob("*.md"),
              *(root / "examples").rglob("*.py")]
    pattern = re.compile(r"seed[ _-]?0\d\d|\bthe seed\b", re.I)
    found = [f"{p.relative_to(root)}:{n}" for p in places if p.exists()
             for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert found == []


def test_no_test_is_defined_twice_in_a_module():
    """A second ``def test_x`` silently replaces the first: one of them never runs."""
    tests = Path(__file__).resolve().parents[1]
    twice = {}
    for path in sorted(tests.rglob("test_*.py")):
        names = [node.name for node in ast.parse(path.read_text()).body
                 if isinstance(node, (ast.FunctionDef, ast.ClassDef))
                 and node.name.startswith(("test_", "Test"))]
        repeated = sorted({n for n in names if names.count(n) > 1})
        if repeated:
            twice[str(path.relative_to(tests))] = repeated
    assert twice == {}


def test_no_function_is_over_100_lines_and_no_class_over_300():
    """Rooms a reader can hold in mind: a longer function is several steps to name, a
    longer class several concerns to part (docs/internals.md)."""
    too_long = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            limit = 100 if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else \
                300 if isinstance(node, ast.ClassDef) else None
            if limit is not None and node.end_lineno - node.lineno + 1 > limit:
                too_long.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name} "
                                f"({node.end_lineno - node.lineno + 1} lines)")
    assert not too_long, too_long


def test_nothing_the_supervisor_builds_on_imports_it():
    """The engines, the output layer, the remote protocol and the plan's modules sit below
    the supervisor (``tfrun.launch.supervise``): they never import it. What both sides
    read (exit codes, a task's spec) lives below both (``tfrun.launch.exit_codes``)."""
    modules = _modules()
    known = set(modules)
    above = {"tfrun.launch", "tfrun.launch.run"}  # the package's face, and the orchestrator
    upward = sorted(f"{name} -> {target}" for name, path in modules.items()
                    if name.startswith("tfrun.launch.") and name not in above
                    and not name.startswith("tfrun.launch.supervise")
                    for target in _imports(name, path, known)
                    if target.startswith("tfrun.launch.supervise"))
    assert not upward, upward


def test_no_engine_and_nothing_below_the_orchestrator_imports_it():
    """``tfrun.launch.run`` (supervise, summarise, report) sits above the engines: the
    orchestrator hands its ``supervise`` to the engine it chose. No engine, and nothing the
    engines or the dry run build on, imports it."""
    modules = _modules()
    known = set(modules)
    upward = sorted(f"{name} -> tfrun.launch.run" for name, path in modules.items()
                    if name.startswith("tfrun.launch.") and name != "tfrun.launch.run"
                    and "tfrun.launch.run" in _imports(name, path, known))
    assert not upward, upward
