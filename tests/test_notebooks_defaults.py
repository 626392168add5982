"""Every driver notebook as shipped: its parameters cell is one typed literal per line that papermill parses (so
`--help-notebook` lists every parameter and no "Unable to parse" / "Passed unknown parameter" warning contradicts
the stop on unknown names), the first code cell after it stops on a parameter the notebook does not define, and
the notebooks no other test executes run headless with their defaults."""

import ast
import json
import logging
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from papermill.translators import PythonTranslator

from dflash_lab.config import notebook_params

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.relative_to(REPO / "notebooks").as_posix() for p in (REPO / "notebooks").rglob("*.ipynb")
                   if "results" not in p.parts and ".ipynb_checkpoints" not in p.parts)


def _cells(name: str):
    nb = nbformat.read(str(REPO / "notebooks" / name), as_version=4)
    at = [i for i, c in enumerate(nb.cells) if "parameters" in c.metadata.get("tags", [])]
    assert len(at) == 1, f"{name} must have exactly one cell tagged `parameters`"
    return nb.cells[at[0]], next(c for c in nb.cells[at[0] + 1:] if c.cell_type == "code")


def test_every_driver_notebook_is_covered():
    assert NOTEBOOKS == ["compare.ipynb", "eval.ipynb", "explore.ipynb", "launch.ipynb", "recipes/smollm2.ipynb",
                         "scaling.ipynb", "sweep.ipynb", "train.ipynb"]


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_papermill_parses_every_parameter_with_its_type(name, caplog):
    params, _ = _cells(name)
    names = []
    for node in ast.parse(params.source).body:
        assert isinstance(node, ast.AnnAssign), f"{name} line {node.lineno}: use `name: type = literal  # help`"
        ast.literal_eval(node.value)  # literals only
        names.append(node.target.id)
    with caplog.at_level(logging.WARNING, logger="papermill"):
        parsed = PythonTranslator.inspect(params)
    assert not caplog.records, [r.getMessage() for r in caplog.records]  # e.g. a help text holding "="
    assert [p.name for p in parsed] == names == list(notebook_params.parameter_defaults(name))
    for p in parsed:
        assert p.inferred_type_name != "None", f"{name}: {p.name} has no type papermill can read"
        assert len(p.help) > 10, f"{name}: {p.name} has no help text"


@pytest.mark.parametrize("name", NOTEBOOKS)
def test_the_first_call_after_the_parameters_stops_on_an_unknown_one(name):
    _, first = _cells(name)
    calls = [n for n in ast.walk(ast.parse(first.source)) if isinstance(n, ast.Call)
             and isinstance(n.func, ast.Attribute) and n.func.attr == "check"
             and getattr(n.func.value, "id", None) == "notebook_params"]
    assert len(calls) == 1, f"{name}: its first code cell must call notebook_params.check(globals(), {name!r})"
    assert [a.value for a in calls[0].args[1:]] == [name]


def _outputs(path: Path) -> str:
    nb = json.loads(path.read_text())
    return "\n".join(json.dumps(o) for c in nb["cells"] for o in c.get("outputs", []))


def test_scaling_notebook_runs_as_shipped_and_writes_nothing(tmp_path):
    """Its default is the committed study (a relative path, read from the project root whatever the kernel's folder)
    and it writes no file unless figures_dir is given."""
    from dflash_lab.runs.notebook_exec import execute

    study = REPO / "bench" / "results" / "2026-12-01-h200-scaling4-smollm2"
    before = sorted((p.name, p.stat().st_mtime_ns) for p in study.iterdir())
    out = execute(REPO / "notebooks" / "scaling.ipynb", tmp_path / "out.ipynb", parameters={}, cwd=tmp_path)
    text = _outputs(out)
    points = json.loads((study / "scaling.json").read_text())["points"]
    assert len(points) == 12 and all(p["name"] in text for p in points)
    assert text.count('"image/png"') == 3 and "b16-t0" in text and "b8-t0" in text
    assert sorted((p.name, p.stat().st_mtime_ns) for p in study.iterdir()) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.ipynb"]


@pytest.mark.slow  # a kernel's start for a refusal test_recipe checks in-process (~5 s)
def test_recipe_notebook_as_shipped_on_a_cpu_stops_naming_the_parameter(tmp_path):
    """The defaults are H200-sized and device="cpu": Run All stops in the first call, before anything is written."""
    out = _papermill("recipes/smollm2.ipynb", tmp_path)
    assert out.returncode != 0
    assert "ConfigError" in out.stderr and "allow_cpu_full_size" in out.stderr
    assert "6,374,400 answer tokens" in out.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.ipynb"]  # no work_dir, no model fetched


@pytest.mark.slow  # a kernel's start; every notebook's call of the check is asserted above without one (~5 s)
def test_a_misspelt_parameter_stops_the_eval_notebook(tmp_path):
    """`-p chekpoint best` used to evaluate the newest weights and exit 0."""
    out = _papermill("eval.ipynb", tmp_path, "-p", "chekpoint", "best", "-p", "run", "x")
    assert out.returncode != 0
    assert "UnknownParameterError" in out.stderr and "['chekpoint']" in out.stderr
    assert "Passed unknown parameter: chekpoint" in out.stderr  # papermill's own warning, now agreeing with the stop
    assert "Passed unknown parameter: run" not in out.stderr


def _papermill(name: str, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "papermill", str(REPO / "notebooks" / name), str(cwd / "out.ipynb"),
                           "--cwd", str(cwd), "--no-progress-bar", *args], capture_output=True, text=True, timeout=300)


def test_evaluate_runs_eval_ipynb_without_papermill_warnings(caplog, capsys):
    """`python -m dflash_lab.evaluation.evaluate` passes every setting to eval.ipynb: papermill parses each of its
    parameters, so neither "Unable to parse" nor "Passed unknown parameter" is printed."""
    from dflash_lab.evaluation import evaluate as ev
    from tests.test_speculative import tiny_trained_run

    run = tiny_trained_run()
    with caplog.at_level(logging.WARNING):
        assert ev.main([str(run), "--n-prompts", "1", "--max-new-tokens", "4", "--no-untrained"]) == 0
    said = [r.getMessage() for r in caplog.records if r.name.startswith("papermill")]
    assert not said, said
    assert "eval folder:" in capsys.readouterr().out


@pytest.mark.slow  # every phase of the recipe through a kernel (21 s on the shared 2-core machine)
def test_recipe_notebook_runs_every_phase_at_smoke_size(tmp_path):
    """The first cell's CPU smoke run, on the embedded tiny target (the SmolLM2 wheel is not installed in tests):
    every call of the notebook reaches its phase, and results.json holds each phase. The tiny target has 960 ids,
    fewer than the recipe's 16,384-id draft vocabulary: 0 trains the full one."""
    pytest.importorskip("chitchat_dataset", reason="the recipe's human prompts come from the chitchat-dataset wheel")
    from dflash_lab.tiny import ensure_tiny_target

    ensure_tiny_target()
    smoke = dict(model="tiny", draft_vocab_size=0, work_dir=str(tmp_path / "r"), n_self=8, self_heldout=2, self_heldout_fraction=0.5,
                 n_train=4, heldout=2, regen_batch_size=8, regen_max_new_tokens=16, steps=1, seq_len=96, batch_size=2,
                 num_anchors=2, block_size=8, num_draft_layers=1, real_tau_every=0, real_tau_prompts=2,
                 eval_prompts=1, eval_max_new_tokens=8, eval_block_sizes=[8], eval_temperatures=[0.0],
                 eval_sampled_block_size=0, eval_untrained=False, threads=1)
    args = [a for k, v in smoke.items() for a in ("-y", json.dumps({k: v}))]
    out = _papermill("recipes/smollm2.ipynb", tmp_path, *args)
    assert out.returncode == 0, out.stderr[-3000:]
    phases = json.loads((tmp_path / "r" / "results.json").read_text())["phases"]
    assert list(phases) == ["get_model", "self_prompts", "build_data", "regenerate", "mix_data", "train", "evaluate",
                            "export"]
    assert phases["train"]["steps"] == 1 and phases["evaluate"]["rows"]
