"""Run a serving engine's own functions on the CPU: one source file of vLLM or SGLang (their PyPI wheels, unzipped)
executed as a module whose imports are stand-ins, so its classes' __init__ and load_weights run unmodified.

The engines need CUDA (and hundreds of modules) to import, so the file's own `import` lines resolve to stand-in
modules: a name a test provides (the layers whose parameters the engine declares, its weight loader's plumbing) is
that object; any other name is an inert placeholder (falsy, callable, every attribute another placeholder), enough
for module-level flags and type hints. Only the code paths a test calls run, and they run as the engine ships them.

Where the engines' sources live: $DFLASH_ENGINES (default .venv/engines, which `make test` fills once with
tests/engines_fetch.py: the two wheels' .py files) holding vllm/ and sglang/. Tests that need them skip, naming that
command, where they are absent (a plain `pytest` in an environment `make test` did not make).
"""

from __future__ import annotations

import ast
import os
import sys
import types
from pathlib import Path

from dflash_lab.evaluation.serving_engines import VERSIONS

ENGINES = Path(os.environ.get("DFLASH_ENGINES", Path(__file__).resolve().parents[1] / ".venv" / "engines"))
HOW = ("the serving engines' sources are not here: python tests/engines_fetch.py .venv/engines (make test does it), "
       f"or set DFLASH_ENGINES to a folder holding the unzipped vllm {VERSIONS['vllm']} and sglang "
       f"{VERSIONS['sglang']} wheels")


def engine_file(engine: str, rel: str) -> Path:
    """A source file inside an unzipped engine wheel ($DFLASH_ENGINES/<engine>/<engine>/<rel>)."""
    return ENGINES / engine / engine / rel


class Inert:
    """A placeholder for anything the file imports that the test does not provide: falsy, callable, iterable (empty),
    and every attribute is another placeholder."""

    def __init__(self, *args, **kwargs):
        pass

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Inert()

    def __call__(self, *args, **kwargs):
        return Inert()

    def __bool__(self):
        return False

    def __iter__(self):
        return iter(())

    def __getitem__(self, key):
        return Inert()

    def __or__(self, other):  # `A | B` in module-level type aliases
        return Inert()

    __ror__ = __or__


class _StandIn(types.ModuleType):
    def __init__(self, name: str, provided: dict):
        super().__init__(name)
        self.__dict__.update(provided)
        self.__path__ = []  # a package, so `from a.b import c` finds a.b under it

    def __getattr__(self, name):
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return Inert()


def _imported_modules(tree: ast.Module, package: str) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative to the file's package
                parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names.add(base)
            names |= {f"{base}.{a.name}" for a in node.names}  # `from pkg import submodule`
    return names


def load_engine_module(path: Path, module_name: str, provide: dict[str, dict], keep_real: tuple[str, ...] = ()):
    """Execute the source file at `path` as module `module_name`. provide: {imported module name: {attribute:
    object}} for the stand-ins the test supplies; every other module the file imports that is not importable here
    among keep_real (torch, typing, ...) becomes a stand-in of inert placeholders. Returns the module; sys.modules
    is restored afterwards."""
    source = path.read_text()
    tree = ast.parse(source)
    package = module_name.rpartition(".")[0]
    saved = dict(sys.modules)
    try:
        for name in sorted(_imported_modules(tree, package)):
            top = name.split(".")[0]
            if top in keep_real or top in ("__future__",):
                continue
            for i in range(1, name.count(".") + 2):  # every parent package too
                sub = ".".join(name.split(".")[:i])
                if sub not in sys.modules or not isinstance(sys.modules[sub], _StandIn):
                    sys.modules[sub] = _StandIn(sub, provide.get(sub, {}))
        module = types.ModuleType(module_name)
        module.__file__ = str(path)
        module.__package__ = package
        sys.modules[module_name] = module
        exec(compile(source, str(path), "exec"), module.__dict__)
        return module
    finally:
        sys.modules.clear()
        sys.modules.update(saved)
