"""Layout rules of house-style.md, checked on the source with `ast`: the subpackages follow the pipeline and import
one way (down it, plus the `config` / `runs` floors), no import cycles between modules (function-level imports
included: hiding an import in a function does not fix a layering problem), no module imports another module's
private (`_name`) names, no library module over the size limit, every subpackage says its job, and no code comment
cites the tracker instead of saying why."""

import ast
import re
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = ROOT / "dflash_lab"
MAX_LINES = 440  # "about 400"

# Import order, lowest first: a module may import its own subpackage and any subpackage of a LOWER rank. `tiny` (the
# embedded default) and `config` are floors; `runs` (run folders) stands on config; the pipeline follows. Data sits
# above target because tokenizing and regenerating use the target's tokenizer and weights; evaluation sits below
# train because the trainer measures real tau with the evaluator. The workflows (demo, recipe, sweeps, scaling,
# preflight) and the benchmarks stand on top: they may import every stage, and no stage imports them or the facade.
RANKS = {"export_template": -2, "tiny": -1, "config": 0, "runs": 1, "target": 2, "data": 3, "drafter": 4,
         "evaluation": 5, "train": 6, "workflows": 7, "benchmarks": 7}
WORKFLOWS = 7
FACADE = 8  # dflash_lab/__init__.py: the public names for notebooks and widgets


def _modules(pkg: Path = PKG) -> dict[str, Path]:
    out = {}
    for p in pkg.rglob("*.py"):
        if "__pycache__" in p.parts:
            continue
        name = p.relative_to(pkg).with_suffix("").as_posix().replace("/", ".")
        out[name] = p
    return out


def _resolve(base: str, mods: dict[str, Path]) -> str | None:
    """The module a dotted name means: a module, or a package's __init__ ('' = the package facade)."""
    if base in mods:
        return base
    init = f"{base}.__init__" if base else "__init__"
    return init if init in mods else None


def _imports(name: str, path: Path, mods: dict[str, Path]) -> list[tuple[str, list[str]]]:
    """(imported dflash_lab module, imported names) for every import statement of a module."""
    parts = name.split(".")[:-1]  # the module's package (for __init__, the package itself)
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                up = parts[:len(parts) - (node.level - 1)]
                base = ".".join(up + ([node.module] if node.module else []))
            elif node.module and (node.module == "dflash_lab" or node.module.startswith("dflash_lab.")):
                base = node.module[len("dflash_lab"):].lstrip(".")
            else:
                continue
            names = [a.name for a in node.names]
            subs = [f"{base}.{n}" if base else n for n in names]
            sub_mods = [s for s in subs if _resolve(s, mods)]
            for s in sub_mods:  # `from dflash_lab.runs import checkpoint` imports a module
                out.append((_resolve(s, mods), []))
            if len(sub_mods) < len(names) and _resolve(base, mods):
                out.append((_resolve(base, mods), [n for n, s in zip(names, subs) if s not in sub_mods]))
        elif isinstance(node, ast.Import):
            for a in node.names:
                if a.name.startswith("dflash_lab."):
                    target = _resolve(a.name[len("dflash_lab."):], mods)
                    if target:
                        out.append((target, []))
    return out


def _graph(pkg: Path = PKG) -> dict[str, set[str]]:
    mods = _modules(pkg)
    graph = {m: set() for m in mods}
    for m, p in mods.items():
        for target, _ in _imports(m, p, mods):
            if target != m:
                graph[m].add(target)
    return graph


def _stage(module: str) -> tuple[str, int]:
    """(subpackage, rank) of a module name."""
    if module == "__init__":
        return "", FACADE
    head = module.split(".")[0]
    if "." not in module:
        return "", WORKFLOWS
    return head, RANKS[head]


def direction_violations(pkg: Path = PKG) -> list[str]:
    """Every import that runs against the pipeline: 'importer -> imported (why)'."""
    bad = []
    for m, deps in sorted(_graph(pkg).items()):
        here, rank = _stage(m)
        for d in sorted(deps):
            there, d_rank = _stage(d)
            if m == "__init__" or (here and here == there):
                continue  # the facade may import anything; a subpackage its own modules
            if d_rank >= rank:
                bad.append(f"{m} -> {d} ({here or 'workflow'} may not import {there or 'the package facade'})")
    return bad


def test_every_subpackage_has_a_known_rank_and_says_its_job():
    subpackages = sorted(p.parent.name for p in PKG.glob("*/__init__.py"))
    assert set(subpackages) <= set(RANKS), f"give these a rank in RANKS: {set(subpackages) - set(RANKS)}"
    for name in subpackages:
        doc = ast.get_docstring(ast.parse((PKG / name / "__init__.py").read_text()))
        assert doc and len(doc) > 80, f"dflash_lab/{name}/__init__.py needs a docstring saying the subpackage's job"


def test_the_package_top_is_its_stages():
    """Only the facade stands loose at the top of the package: every other module lives in the stage it belongs to."""
    loose = sorted(p.name for p in PKG.glob("*.py") if p.name != "__init__.py")
    assert not loose, f"move these into a subpackage (workflows/, benchmarks/ or a stage): {loose}"


def test_imports_run_down_the_pipeline():
    bad = direction_violations()
    assert not bad, "imports against the pipeline:\n" + "\n".join(bad)


def test_a_planted_backward_import_is_caught(tmp_path):
    """The direction check fails on a backward import, a function-level one included."""
    copy = tmp_path / "dflash_lab"
    shutil.copytree(PKG, copy, ignore=shutil.ignore_patterns("__pycache__", "assets"))
    victim = copy / "data" / "files.py"
    victim.write_text(victim.read_text() + "\n\ndef _planted():\n    from dflash_lab.train.trainer import Trainer\n")
    cfg = copy / "config" / "errors.py"
    cfg.write_text(cfg.read_text() + "\nfrom ..runs import rundir  # planted\n")
    bad = direction_violations(copy)
    assert bad == ["config.errors -> runs.rundir (config may not import runs)",
                   "data.files -> train.trainer (data may not import train)"], bad


def test_no_import_cycles():
    graph = _graph()
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
    mods = _modules()
    for m, p in mods.items():
        for target, names in _imports(m, p, mods):
            bad += [f"{m} imports {target}.{n}" for n in names if n.startswith("_") and not n.startswith("__")]
    assert not bad, bad


def test_no_library_module_is_over_the_size_limit():
    sizes = {m: len(p.read_text().splitlines()) for m, p in _modules().items()}
    over = {m: s for m, s in sizes.items() if s > MAX_LINES}
    assert not over, f"split these modules by job (house-style rule 1): {over}"


def test_code_says_why_instead_of_citing_the_tracker():
    cite = re.compile(r"\b[Ii]ssues? ?#?\d+|\bissue-\d+")
    hits = [f"{p.relative_to(ROOT)}:{i}: {line.strip()}"
            for folder in ("dflash_lab", "widgets") for p in sorted((ROOT / folder).rglob("*"))
            if p.suffix in (".py", ".json") and "__pycache__" not in p.parts
            for i, line in enumerate(p.read_text().splitlines(), 1) if cite.search(line)]
    assert not hits, "say why in the domain's words, not by tracker number:\n" + "\n".join(hits)
