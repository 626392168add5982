"""The layout every A/B results notebook shares (intro, settings, final evaluation, arms, curves, reading), so a
results folder's make_notebook.py only writes what it measured. The notebook reads its folder through
dflash_lab.workflows.ab_report and nothing else; execute the source this writes with
    papermill /tmp/nbgen/<name>-src.ipynb notebooks/results/<notebook>.ipynb --cwd . -k python3
"""
from pathlib import Path

import nbformat as nbf

CURVES = """## Training curves, against steps and against GPU time

Top row against optimizer steps, bottom row against GPU minutes. Loss, training accuracy (faint, with a rolling
mean), held-out accuracy at each validation check, and real tau: the training-time checks (filled) and the final
evaluation (hollow, one marker per set)."""
LOAD = """from IPython.display import Markdown, display

from dflash_lab.workflows.ab_report import arms_markdown, final_markdown, load_ab, settings_markdown, training_png

ab = load_ab(results)
display(Markdown(settings_markdown(ab)))"""


def head_cells(folder: str, *, intro: str, evaluation: str) -> list:
    """The cells every A/B notebook opens with: the intro, the papermill parameter `results` (`folder`, relative to
    the project root), the loading cell, and the final evaluation's table under `evaluation`'s prose."""
    md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
    return [md(intro), code(f'results: str = "{folder}"  # the folder; relative: from the project root'), code(LOAD),
            md("## Final evaluation\n\n" + evaluation), code("display(Markdown(final_markdown(ab)))")]


def write(name: str, folder: str, *, intro: str, evaluation: str, arms: str, reading: str,
          tau_figure: str | None = None, arms_heading: str = "The arms and their training-time checks") -> Path:
    """Writes /tmp/nbgen/<name>-src.ipynb: `folder` (relative to the project root) is its papermill parameter;
    `evaluation` and `arms` are the prose above the final-evaluation and arms tables, without their headings;
    `tau_figure` (markdown with its heading), where given, introduces the held-out chain tau against GPU-minutes."""
    md, code = nbf.v4.new_markdown_cell, nbf.v4.new_code_cell
    figure = [] if tau_figure is None else [
        md(tau_figure), code("from dflash_lab.workflows.ab_report import chain_tau_png\n\nchain_tau_png(ab)")]
    cells = [
        *head_cells(folder, intro=intro, evaluation=evaluation),
        md(f"## {arms_heading}\n\n" + arms),
        code("display(Markdown(arms_markdown(ab)))"),
        *figure,
        md(CURVES),
        code("training_png(ab)"),
        md("## Reading\n\n" + reading),
    ]
    return save(cells, name)


def save(cells: list, name: str) -> Path:
    """Writes /tmp/nbgen/<name>-src.ipynb: the notebook's header cell (result_headers.py), then `cells`, the second of
    which is papermill's parameters cell."""
    from result_headers import header_for  # bench/results/result_headers.py: what it is, ran on, how to read

    nb = nbf.v4.new_notebook(cells=[nbf.v4.new_markdown_cell(header_for(name), metadata={"tags": ["result-header"]}),
                                    *cells])
    nb.cells[2].metadata["tags"] = ["parameters"]
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python", "name": "python3"}
    out = Path("/tmp/nbgen") / f"{name}-src.ipynb"
    out.parent.mkdir(exist_ok=True)
    nbf.write(nb, out)
    return out
