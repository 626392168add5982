"""tests/engines_fetch.py: the wheels it fetches are serving_engines.VERSIONS' releases, and a folder unzipped from
another release (its `.complete` marker names the pin) is fetched again, its old files removed."""

from __future__ import annotations

import zipfile
from pathlib import Path

from dflash_lab.evaluation.serving_engines import VERSIONS
from tests import engines_fetch


def test_wheels_are_the_releases_serving_engines_names():
    assert engines_fetch.WHEELS == {"vllm": f"vllm=={VERSIONS['vllm']}", "sglang": f"sglang=={VERSIONS['sglang']}"}


def test_a_folder_of_another_pin_is_fetched_again(tmp_path, monkeypatch):
    downloads = []

    def fake_pip(cmd, check):  # `pip download ... -d TMP PIN`: a wheel holding one source file
        tmp, pin = Path(cmd[cmd.index("-d") + 1]), cmd[-1]
        name, version = pin.split("==")
        downloads.append(pin)
        with zipfile.ZipFile(tmp / f"{name}-{version}-py3-none-any.whl", "w") as z:
            z.writestr(f"{name}/__init__.py", f"__version__ = {version!r}\n")

    monkeypatch.setattr(engines_fetch.subprocess, "run", fake_pip)
    monkeypatch.setattr(engines_fetch, "WHEELS", {"vllm": "vllm==1.0"})
    engines_fetch.fetch(tmp_path, log=lambda *a: None)
    assert engines_fetch.fetched_pin(tmp_path / "vllm") == "vllm==1.0"
    (tmp_path / "vllm" / "vllm" / "gone_in_2.py").write_text("")  # a file the next release no longer ships

    engines_fetch.fetch(tmp_path, log=lambda *a: None)  # same pin: nothing fetched
    assert downloads == ["vllm==1.0"]

    monkeypatch.setattr(engines_fetch, "WHEELS", {"vllm": "vllm==2.0"})
    engines_fetch.fetch(tmp_path, log=lambda *a: None)
    assert downloads == ["vllm==1.0", "vllm==2.0"]
    assert engines_fetch.fetched_pin(tmp_path / "vllm") == "vllm==2.0"
    assert not (tmp_path / "vllm" / "vllm" / "gone_in_2.py").exists()
    assert "2.0" in (tmp_path / "vllm" / "vllm" / "__init__.py").read_text()
