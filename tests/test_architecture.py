"""The package's architecture, enforced: the layer contract of .importlinter (import-linter), no import cycle
between modules, no private name imported from another module. Imports under `if TYPE_CHECKING:` are for
annotations only and do not count."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "tensorgen"


def _modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(REPO).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, modules: dict[str, Path]) -> list[tuple[str, str]]:
    """(module, name) of every `from tensorgen... import name` in `path` outside TYPE_CHECKING blocks; name is
    "" when the import names a module."""
    tree = ast.parse(path.read_text())
    hidden = {id(n) for node in ast.walk(tree)
              if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test) for n in ast.walk(node)}
    found = []
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tensorgen"):
            found += [(f"{node.module}.{a.name}", "") if f"{node.module}.{a.name}" in modules else (node.module, a.name)
                      for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.startswith("tensorgen")]
    return found


def test_the_layer_contract_holds():
    proc = subprocess.run([sys.executable, "-c", "from importlinter.cli import lint_imports_command; "
                           "lint_imports_command()"], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-2000:]


def test_no_module_imports_a_cycle_back_to_itself():
    modules = _modules()
    graph = {m: {target for target, _ in _imports(p, modules) if target != m} for m, p in modules.items()}
    cycles, index, low, stack, on_stack = [], {}, {}, [], set()

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v] & graph.keys():
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = set()
            while not component or v not in component:
                component.add(stack.pop())
            on_stack.difference_update(component)
            if len(component) > 1:
                cycles.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(graph)))
    for module in graph:
        if module not in index:
            visit(module)
    assert cycles == []


def test_no_private_name_is_imported_from_another_module():
    modules = _modules()
    private = [(m, f"{target}.{name}") for m, p in modules.items() for target, name in _imports(p, modules)
               if name.startswith("_") and not name.startswith("__")]
    assert private == []
