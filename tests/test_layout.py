"""Layout rules of house-style.md, checked on the source with `ast`: no import cycles between dflash_lab modules
(function-level imports included: hiding an import in a function does not fix a layering problem), no module
imports another module's private (`_name`) names, and no library module over the size limit."""

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "dflash_lab"
MAX_LINES = 440  # "about 400"
TOO_LONG_FOR_NOW = {"evaluate.py", "chat_formats.py"}  # owned by other helpers


def _modules() -> dict[str, Path]:
    return {p.relative_to(PKG).with_suffix("").as_posix().replace("/", "."): p
            for p in PKG.rglob("*.py") if "__pycache__" not in p.parts}


def _imports(name: str, path: Path) -> list[tuple[str, list[str]]]:
    """(imported dflash_lab module, imported names) for every import statement of a module."""
    package = name.rsplit(".", 1)[0] if "." in name else ""
    if path.name == "__init__.py":
        package = name
    mods = _modules()
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".") if package else []
                parts = parts[:len(parts) - (node.level - 1)]
                base = ".".join(parts + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("dflash_lab"):
                base = node.module[len("dflash_lab"):].lstrip(".")
            else:
                continue
            names = [a.name for a in node.names]
            if base in mods or base == "":
                out.append((base, names))
            for n in names:  # `from . import checkpoint` imports a module
                sub = f"{base}.{n}" if base else n
                if sub in mods:
                    out.append((sub, []))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("dflash_lab."):
                    out.append((a.name[len("dflash_lab."):], []))
    return out


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        for target, _ in _imports(m, p):
            if target and target != m and target in mods:
                graph[m].add(target)
    return graph


# evaluate <-> eval_plots: both owned by another helper this session; remove once eval_plots stops importing evaluate.
KNOWN_CYCLES = {("eval_plots", "evaluate")}


def test_no_import_cycles():
    graph = _graph()
    for a, b in KNOWN_CYCLES:
        graph.get(a, set()).discard(b)
    graph.pop("__init__", None)
    for deps in graph.values():
        deps.discard("__init__")
    state, stack, cycles = {}, [], []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for d in sorted(graph.get(m, ())):
            if state.get(d) == "open":
                cycles.append(stack[stack.index(d):] + [d])
            elif d not in state:
                visit(d)
        stack.pop()
        state[m] = "done"

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles: " + "; ".join(" -> ".join(c) for c in cycles)


def test_no_module_imports_another_modules_private_names():
    bad = []
    for m, p in _modules().items():
        for target, names in _imports(m, p):
            bad += [f"{m} imports {target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def test_no_library_module_is_over_the_size_limit():
    sizes = {p.name: len(p.read_text().splitlines()) for p in PKG.glob("*.py")}
    over = {n: s for n, s in sizes.items() if s > MAX_LINES and n not in TOO_LONG_FOR_NOW}
    assert not over, f"split these modules by job (house-style rule 1): {over}"
