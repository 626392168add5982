"""Regenerate the README's headless screenshots: run notebooks/train.ipynb with its DEFAULT parameters under papermill
(tiny target, CPU), render the run folder's copy of the executed notebook to HTML (nbconvert, lab template) and
screenshot it in chromium at 1,024 and 1,600 px. Prints the run's summary (steps, loss, simulated tau), which is also
the check that the notebook's defaults learn visibly. The live-dashboard screenshots come from tests/test_browser.py
(tests/artifacts/browser/dashboard-{1600,1024}.png); copy them here with --copy-browser.

    .venv/bin/python docs/screenshots.py [--copy-browser]       # ~2-4 min on a 2-core CPU
"""

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
CHROMIUM = "/usr/bin/chromium"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copy-browser", action="store_true", help="also copy the browser test's dashboard screenshots")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "train.ipynb"
        t0 = time.monotonic()
        subprocess.run([sys.executable, "-m", "papermill", str(ROOT / "notebooks" / "train.ipynb"), str(out),
                        "--cwd", str(ROOT), "--no-progress-bar", "-p", "runs_dir", str(Path(tmp) / "runs"),
                        "-p", "run_name", "screenshot"], check=True)
        run = next((Path(tmp) / "runs").iterdir())
        summary = json.loads((run / "summary.json").read_text())
        shared = run / "train.ipynb"  # the run folder's copy (what is shared: relative paths, no widget state)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not json.loads(shared.read_text())["metadata"]["papermill"].get(
                "end_time"):
            time.sleep(0.5)  # the detached copier replaces the partial copy once papermill wrote the final one
        out = shared
        print(f"train.ipynb defaults: {summary['steps']} steps in {time.monotonic() - t0:.0f} s, loss "
              f"{summary['loss_first']:.2f} -> {summary['loss_last']:.2f}, sim tau {summary['sim_tau_last']:.2f}")
        html = Path(tmp) / "train.html"
        subprocess.run([sys.executable, "-m", "jupyter", "nbconvert", "--to", "html", "--template", "lab",
                        str(out), "--output", str(html)], check=True, capture_output=True)
        from playwright.sync_api import sync_playwright

        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=["--no-sandbox"])
            for width in (1024, 1600):
                page = browser.new_page(viewport={"width": width, "height": 900})
                page.goto(html.as_uri())
                path = DOCS / f"headless-train-{width}.png"
                page.screenshot(path=str(path), full_page=True)
                print(f"wrote {path}")
            browser.close()
    if args.copy_browser:
        for width in (1600, 1024):
            src = ROOT / "tests" / "artifacts" / "browser" / f"dashboard-{width}.png"
            shutil.copyfile(src, DOCS / f"dashboard-{width}.png")
            print(f"copied {src} -> docs/")


if __name__ == "__main__":
    main()
