"""Regeneration with the tiny target: batched HF generation, recorded settings, resume after an interruption without
redoing finished samples, and the OpenAI-server path against a local HTTP server with the tiny target behind it."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from dflash_lab.config.errors import ConfigError
from dflash_lab.data.chat_formats import DataError, read_chat_data
from dflash_lab.data.regenerate import load_finished, meta_path, regenerate
from dflash_lab.target.sampling import GenerationSettings

N = 10
MAX_NEW = 160  # tiny answers are 40-150 tokens


pytestmark = pytest.mark.usefixtures("one_torch_thread")  # conftest.py: batch-1 decoding of tiny models


@pytest.fixture(scope="module")
def tiny():
    from dflash_lab.target.load import load_target, load_tokenizer

    return load_target("tiny"), load_tokenizer("tiny")


@pytest.fixture(scope="module")
def prompts(tmp_path_factory):
    """The first N held-out conversations (some multi-turn) as a regeneration input file."""
    from dflash_lab.tiny import tiny_heldout_path

    lines = tiny_heldout_path().read_text().splitlines()
    multi = [ln for ln in lines if json.loads(ln)["messages"].__len__() > 2][:2]
    single = [ln for ln in lines if json.loads(ln)["messages"].__len__() == 2][:N - len(multi)]
    path = tmp_path_factory.mktemp("regen") / "prompts.jsonl"
    path.write_text("\n".join(multi + single) + "\n")
    return path


SAMPLING = GenerationSettings(max_new_tokens=MAX_NEW, enable_thinking=False)


@pytest.fixture(scope="module")
def full_run(tiny, prompts, tmp_path_factory):
    out = tmp_path_factory.mktemp("full") / "regen.jsonl"
    lines = []
    stats = regenerate(prompts, out, target="tiny", batch_size=4, sampling=SAMPLING, models={"cpu": tiny[0]},
                       log=lines.append)
    return out, stats, lines


def _records(path):
    return {r["id"]: r for r in map(json.loads, path.read_text().splitlines())}


def test_hf_regeneration_writes_the_targets_answers_with_settings(full_run, prompts, tiny):
    out, stats, lines = full_run
    recs = _records(out)
    src = read_chat_data(prompts)
    assert list(recs) != [] and sorted(recs) == sorted(src.ids) and stats.samples == N and stats.already_done == 0
    n_turns = sum(sum(m["role"] == "assistant" for m in c) for c in src)
    assert stats.turns == n_turns > N and stats.new_tokens == sum(sum(r["generation"]["new_tokens"])
                                                                  for r in recs.values())
    total = 0
    for conv in src.conversations:
        rec = recs[conv.id]
        assert [m["role"] for m in rec["messages"]] == [m["role"] for m in conv.messages]
        assert [m["content"] for m in rec["messages"] if m["role"] != "assistant"] == \
               [m["content"] for m in conv.messages if m["role"] != "assistant"]
        g = rec["generation"]
        assert {k: g[k] for k in SAMPLING.to_dict()} == SAMPLING.to_dict() and g["model"] == "tiny"
        assert len(g["finish_reasons"]) == len(g["new_tokens"]) == sum(m["role"] == "assistant" for m in conv.messages)
        total += len(g["finish_reasons"])
    assert stats.finish_reasons["stop"] >= 0.8 * total  # the target ends its turns itself
    # batched, left-padded, turn-by-turn output == a plain one-conversation greedy decode (thinking off)
    model, tok = tiny
    multi = next(c for c in src.conversations if len(c.messages) > 2)
    history = []
    for m in recs[multi.id]["messages"]:
        if m["role"] == "assistant":
            prompt = tok.apply_chat_template(history, tokenize=False, add_generation_prompt=True, enable_thinking=False)
            ids = tok(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
            with torch.no_grad():
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, max_new_tokens=MAX_NEW,
                                     eos_token_id=[tok.convert_tokens_to_ids("<|im_end|>"), tok.pad_token_id],
                                     pad_token_id=tok.pad_token_id)[0, ids.shape[1]:].tolist()
            end = next((i for i, t in enumerate(gen) if t in (tok.convert_tokens_to_ids("<|im_end|>"),
                                                              tok.pad_token_id)), len(gen))
            assert m["content"] == tok.decode(gen[:end], skip_special_tokens=False)
        history.append(m)
    meta = json.loads(meta_path(out).read_text())
    assert meta["settings"]["sampling"] == SAMPLING.to_dict() and meta["last_run"]["samples"] == N
    assert any(line.startswith(f"regenerate: {N}/{N} conversations") for line in lines)  # progress line
    assert stats.samples_per_s > 0 and stats.tokens_per_s > 0
    # the output is training data: it reads back as OpenAI messages
    assert len(read_chat_data(out)) == N


def test_interrupted_run_resumes_without_redoing_finished_samples(tiny, prompts, full_run, tmp_path):
    out = tmp_path / "regen.jsonl"

    class Interrupt(Exception):
        pass

    def stop_after_4(stats):
        if stats.samples == 4:
            raise Interrupt

    with pytest.raises(Interrupt):
        regenerate(prompts, out, target="tiny", batch_size=4, sampling=SAMPLING, models={"cpu": tiny[0]},
                   on_progress=stop_after_4, log=lambda s: None)
    first = _records(out)
    assert len(first) == 4
    with open(out, "a") as f:  # an interrupted write leaves half a line behind
        f.write('{"id": "half-writ')
    logs = []
    stats = regenerate(prompts, out, target="tiny", batch_size=4, sampling=SAMPLING, models={"cpu": tiny[0]},
                       log=logs.append)
    assert stats.already_done == 4 and stats.samples == N - 4
    assert any("cut off a half-written last line" in s for s in logs)
    final = _records(out)
    assert len(out.read_text().splitlines()) == N and len(final) == N
    assert all(final[k] == v for k, v in first.items())  # finished samples untouched
    reference = _records(full_run[0])
    assert {k: r["messages"] for k, r in final.items()} == {k: r["messages"] for k, r in reference.items()}
    again = regenerate(prompts, out, target="tiny", sampling=SAMPLING, models={"cpu": tiny[0]}, log=lambda s: None)
    assert again.samples == 0 and again.already_done == N
    with pytest.raises(DataError, match="was written with other settings"):
        regenerate(prompts, out, target="tiny", sampling=GenerationSettings(max_new_tokens=8), models={"cpu": tiny[0]},
                   log=lambda s: None)
    (out.parent / "bad.jsonl").write_text('{"id": "a"}\nnot json\n{"id": "b"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2: not a complete output record"):
        load_finished(out.parent / "bad.jsonl")


def _reply(handler, code: int, body: bytes) -> None:
    handler.send_response(code)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _tiny_server(model, tokenizer):
    """A minimal OpenAI-compatible /v1/chat/completions server with the tiny target behind it (greedy)."""
    lock = threading.Lock()
    stop_ids = [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.pad_token_id]
    seen = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, obj):
            _reply(self, code, json.dumps(obj).encode())

        def do_GET(self):
            if self.path == "/v1/models":
                return self._send(200, {"object": "list", "data": [{"id": "tiny-qwen3", "object": "model"}]})
            self._send(404, {"error": "not found"})

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(req)
            if self.path != "/v1/chat/completions" or req.get("model") != "tiny-qwen3":
                return self._send(400, {"error": {"message": f"unknown model {req.get('model')!r}"}})
            kw = req.get("chat_template_kwargs") or {}
            prompt = tokenizer.apply_chat_template(req["messages"], tokenize=False, add_generation_prompt=True, **kw)
            ids = tokenizer(prompt, return_tensors="pt", add_special_tokens=False)["input_ids"]
            with lock, torch.no_grad():
                out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=req["max_tokens"], eos_token_id=stop_ids,
                                     pad_token_id=tokenizer.pad_token_id)
            new = out[0, ids.shape[1]:].tolist()
            end = next((i for i, t in enumerate(new) if t in stop_ids), None)
            text = tokenizer.decode(new if end is None else new[:end], skip_special_tokens=False)
            self._send(200, {"id": "x", "object": "chat.completion", "model": "tiny-qwen3",
                             "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                                          "finish_reason": "length" if end is None else "stop"}],
                             "usage": {"completion_tokens": len(new)}})

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, seen


def test_server_path_matches_local_generation(tiny, prompts, full_run, tmp_path):
    server, seen = _tiny_server(*tiny)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        out = tmp_path / "server.jsonl"
        stats = regenerate(prompts, out, target="tiny", sampling=SAMPLING, server_url=url, concurrency=3,
                           log=lambda s: None)
        assert stats.samples == N and stats.backend == f"server {url}"
        got, ref = _records(out), _records(full_run[0])
        assert {k: r["messages"] for k, r in got.items()} == {k: r["messages"] for k, r in ref.items()}
        g = next(iter(got.values()))["generation"]
        assert g["model"] == "tiny-qwen3" and g["server_url"] == url and g["max_new_tokens"] == MAX_NEW
        assert all(r["chat_template_kwargs"] == {"enable_thinking": False} and r["temperature"] == 0.0
                   and r["max_tokens"] == MAX_NEW for r in seen)
        with pytest.raises(DataError, match="answered HTTP 400: .*unknown model 'nope'"):
            regenerate(prompts, tmp_path / "x.jsonl", sampling=SAMPLING, server_url=url, server_model="nope",
                       log=lambda s: None)
    finally:
        server.shutdown()
        server.server_close()


def test_sampling_settings_validate():
    with pytest.raises(ConfigError, match=r"GenerationSettings.top_p=0 is invalid: must be in \(0, 1\]. Fix"):
        GenerationSettings(top_p=0)
    with pytest.raises(ConfigError, match="GenerationSettings.temperature=-1"):
        GenerationSettings(temperature=-1)
    with pytest.raises(ConfigError, match="GenerationSettings.enable_thinking='off' is invalid"):
        GenerationSettings(enable_thinking="off")


def test_tokenizer_without_pad_token_gets_one_and_batches(tiny):
    """Llama-family tokenizers (SmolLM2, Llama 3) ship no pad token: batched generation used to stop at once with
    "Asking to pad but the tokenizer does not have a padding token"."""
    import copy

    from dflash_lab.data.regen_local import HFGenerator

    model, tok = tiny
    tok = copy.deepcopy(tok)
    tok.pad_token = None
    gen = HFGenerator(model, tok, GenerationSettings(max_new_tokens=8, enable_thinking=False))
    assert tok.pad_token_id == gen.pad_id == gen.stop_ids[0]
    outs = gen([[{"role": "user", "content": "hi"}],
                [{"role": "user", "content": "tell me a much longer story about a cat and a dog"}]], seed=0)
    assert len(outs) == 2 and all(n >= 1 for _, _, n in outs)


def test_greedy_match_check_is_recorded_in_meta(tiny, prompts, tmp_path):
    """fp32 on the CPU: batched left-padded greedy equals single-sequence greedy on every checked prompt, and the
    rate lands in the stats and <out>.meta.json."""
    out = tmp_path / "regen.jsonl"
    stats = regenerate(prompts, out, target="tiny", batch_size=4, limit=4, match_check=4,
                       sampling=GenerationSettings(max_new_tokens=48, enable_thinking=False), models={"cpu": tiny[0]},
                       log=lambda *a: None)
    gm = stats.greedy_match
    assert gm["checked"] == 4 and gm["identical"] == 4 and gm["match_rate"] == 1.0 and gm["dtype"] == "float32"
    meta = json.loads(meta_path(out).read_text())
    assert meta["last_run"]["greedy_match"]["identical"] == 4


# --- the server path counts every failure by id, retries with backoff, refuses mixed settings ------------------------
def _scripted_server(*, slow_s=0.0):
    """A real HTTP server whose reply depends on the user's text: good, malformed (3 kinds), empty, slow once, 503
    once. Each reply is 'echo: <text>' so the output is checkable."""
    calls: dict[str, int] = {}
    lock = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _send(self, code, body: bytes):
            _reply(self, code, body)

        def do_GET(self):
            self._send(200, json.dumps({"data": [{"id": "scripted"}]}).encode())

        def do_POST(self):
            req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            text = req["messages"][-1]["content"]
            with lock:
                n = calls[text] = calls.get(text, 0) + 1
            good = {"choices": [{"message": {"content": f"echo: {text}"}, "finish_reason": "stop"}],
                    "usage": {"completion_tokens": 3}}
            if text == "not json":
                return self._send(200, b"<html>502 Bad Gateway</html>")
            if text == "no choices":
                return self._send(200, json.dumps({"choices": []}).encode())
            if text == "content is a list":
                return self._send(200, json.dumps({"choices": [{"message": {"content": ["x"]}}]}).encode())
            if text == "empty":
                return self._send(200, json.dumps({"choices": [{"message": {"content": "  "}}]}).encode())
            if text == "slow once" and n == 1:
                import time

                time.sleep(slow_s)
            if text == "503 once" and n == 1:
                return self._send(503, b'{"error": "overloaded"}')
            self._send(200, json.dumps(good).encode())

    class Quiet(ThreadingHTTPServer):
        def handle_error(self, request, client_address):  # the timed-out client hung up before the slow reply
            pass

    server = Quiet(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, calls


def _prompts_file(path, texts):
    path.write_text("".join(json.dumps({"id": f"c{i}", "messages": [{"role": "user", "content": t}]}) + "\n"
                            for i, t in enumerate(texts)))
    return path


def test_server_failures_are_counted_by_id_retried_with_backoff_and_settings_checked_per_record(tmp_path):
    texts = ["hello", "not json", "no choices", "content is a list", "empty", "slow once", "503 once", "bye"]
    server, calls = _scripted_server(slow_s=1.5)
    url = f"http://127.0.0.1:{server.server_address[1]}"
    lines = []
    try:
        out = tmp_path / "out.jsonl"
        data = _prompts_file(tmp_path / "in.jsonl", texts)
        kw = dict(server_url=url, concurrency=2, server_timeout_s=0.5, server_retries=2, server_backoff_s=0.01)
        stats = regenerate(data, out, sampling=SAMPLING, log=lines.append, **kw)
        assert {k: sorted(v) for k, v in stats.failed.items()} == {"malformed_reply": ["c1", "c2", "c3"],
                                                                  "empty_answer": ["c4"]}
        recs = _records(out)
        assert sorted(recs) == ["c0", "c5", "c6", "c7"]  # the failed ones are not written: a rerun retries them
        assert recs["c5"]["messages"][-1]["content"] == "echo: slow once" and calls["slow once"] == 2
        assert calls["503 once"] == 2 and calls["not json"] == 1  # a malformed reply is not retried
        retries = [ln for ln in lines if "retry 1/2" in ln]
        assert len(retries) == 2 and any("conversation 'c5' turn 0 failed (TimeoutError" in ln for ln in retries)
        assert any("conversation 'c6' turn 0 failed (HTTP 503" in ln for ln in retries)
        assert any(ln.startswith("regenerate: conversation 'c1' not written: malformed_reply: reply is not JSON")
                   for ln in lines)
        assert "NOT written {'malformed_reply': 3, 'empty_answer': 1}" in str(stats)
        assert all(r["generation"]["temperature"] == 0.0 and r["generation"]["max_new_tokens"] == MAX_NEW
                   for r in recs.values())  # sampling settings in every record

        meta_path(out).unlink()  # even without the .meta.json file, other settings are refused
        hot = GenerationSettings(max_new_tokens=MAX_NEW, enable_thinking=False, temperature=0.7)
        with pytest.raises(DataError, match=r"was generated with other settings \{'temperature': \(0.0, 0.7\)\}"):
            regenerate(data, out, sampling=hot, log=lines.append, **kw)
        again = regenerate(data, out, sampling=SAMPLING, log=lines.append, **kw)  # same settings: retries the 4
        assert again.already_done == 4 and again.samples == 0 and sum(map(len, again.failed.values())) == 4
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("url", ["ftp://host/x", "localhost:8000", "file:///etc/passwd", "http://", "http://h:1/?q=1"])
def test_server_url_must_be_http(tmp_path, url):
    with pytest.raises(DataError, match=r"server_url=.* Fix: pass"):
        regenerate(tmp_path / "missing.jsonl", tmp_path / "o.jsonl", server_url=url, log=lambda s: None)


def test_a_dead_server_stops_the_run_after_bounded_retries(tmp_path):
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    data = _prompts_file(tmp_path / "in.jsonl", ["a", "b"])
    with pytest.raises(DataError, match="is the server up"):
        regenerate(data, tmp_path / "o.jsonl", server_url=f"http://127.0.0.1:{port}", server_retries=1,
                   server_backoff_s=0.01, log=lambda s: None)


# --- nothing lost, nothing mixed: the output is never the input, has one writer, and holds one producer -------------
def _small_prompts(path, texts, ids=None):
    path.write_text("".join(json.dumps({"id": (ids or [f"p{i}" for i in range(len(texts))])[i],
                                        "messages": [{"role": "user", "content": t}]}) + "\n"
                            for i, t in enumerate(texts)))
    return path


SHORT = GenerationSettings(max_new_tokens=12, enable_thinking=False)


def test_out_that_is_the_input_or_inside_its_folder_is_refused_before_anything_is_touched(tmp_path, capsys):
    from dflash_lab.data.regenerate import main

    data = _small_prompts(tmp_path / "d.jsonl", ["hi", "bye"])
    before = data.read_bytes()
    for overwrite in (True, False):
        with pytest.raises(DataError, match=r"is the input file .* Fix: pass another --out"):
            regenerate(data, data, overwrite=overwrite, sampling=SHORT, log=lambda s: None)
    assert data.read_bytes() == before and not meta_path(data).exists()
    folder = tmp_path / "in"
    folder.mkdir()
    _small_prompts(folder / "a.jsonl", ["hi"])
    with pytest.raises(DataError, match="lies inside the input folder"):
        regenerate(folder, folder / "sub" / "out.jsonl", sampling=SHORT, log=lambda s: None)
    assert sorted(p.name for p in folder.rglob("*")) == ["a.jsonl"]  # nothing created there
    assert main(["--data", str(data), "--out", str(data), "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --out") and err.count("\n") == 1 and data.read_bytes() == before


def test_a_second_writer_of_one_output_is_refused_naming_the_first(tiny, tmp_path):
    import os

    data = _small_prompts(tmp_path / "in.jsonl", ["one", "two", "three"])
    out = tmp_path / "out.jsonl"
    inside, go_on, errors = threading.Event(), threading.Event(), []

    def hold(stats):
        inside.set()
        go_on.wait(timeout=300)

    def first():
        try:
            regenerate(data, out, sampling=SHORT, batch_size=1, models={"cpu": tiny[0]}, on_progress=hold,
                       log=lambda s: None)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    t = threading.Thread(target=first)
    t.start()
    try:
        assert inside.wait(timeout=300)
        with pytest.raises(DataError, match=rf"regeneration output .*out.jsonl is in use by pid {os.getpid()}"):
            regenerate(data, out, sampling=SHORT, batch_size=1, models={"cpu": tiny[0]}, log=lambda s: None)
    finally:
        go_on.set()
        t.join(timeout=120)
    assert not errors
    ids = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(ids) == ["p0", "p1", "p2"]  # each once
    again = regenerate(data, out, sampling=SHORT, models={"cpu": tiny[0]}, log=lambda s: None)  # released
    assert again.already_done == 3 and again.samples == 0


def test_every_record_carries_what_produced_it_and_a_resume_refuses_any_difference(tiny, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    from dflash_lab.target.load import resolve_target_path

    data = _small_prompts(tmp_path / "in.jsonl", ["one", "two", "three"])
    out = tmp_path / "out.jsonl"
    regenerate(data, out, sampling=SHORT, limit=2, models={"cpu": tiny[0]}, log=lambda s: None)
    recs = _records(out)
    g = recs["p0"]["generation"]
    assert g["dtype"] == "float32" and g["target"] == "tiny" and g["backend"] == "hf"
    assert len(g["target_sha256"]) == 64 and len(g["prompt_sha256"]) == 64
    assert recs["p0"]["generation"]["prompt_sha256"] != recs["p1"]["generation"]["prompt_sha256"]
    meta_path(out).unlink()  # the records alone must be enough
    with pytest.raises(DataError, match=r"out.jsonl:1 \(id 'p0'\) was generated with other settings "
                                        r"\{'dtype': \('float32', 'bfloat16'\)\}"):
        regenerate(data, out, sampling=SHORT, dtype="bfloat16", log=lambda s: None)
    target = Path(shutil.copytree(resolve_target_path("tiny"), tmp_path / "copy"))
    with pytest.raises(DataError, match=r"other settings \{'target': \('tiny', '.*copy'\)"):
        regenerate(data, out, sampling=SHORT, target=str(target), log=lambda s: None)
    # same name, other weights: the checksum tells them apart
    out2 = tmp_path / "out2.jsonl"
    regenerate(data, out2, sampling=SHORT, target=str(target), limit=1, log=lambda s: None)
    weights = load_file(str(target / "model.safetensors"))
    name = next(iter(weights))
    weights[name] = weights[name] + 1e-3
    save_file(weights, str(target / "model.safetensors"), metadata={"format": "pt"})
    with pytest.raises(DataError, match=r"other settings \{'target_sha256': "):
        regenerate(data, out2, sampling=SHORT, target=str(target), log=lambda s: None)
    # a conversation edited in the input keeps its id: its old answer must not pass for the new prompt
    _small_prompts(data, ["one, edited", "two", "three"])
    with pytest.raises(DataError, match=r"1 conversation\(s\) changed in the input since .* \(ids \['p0'\]\)"):
        regenerate(data, out, sampling=SHORT, models={"cpu": tiny[0]}, log=lambda s: None)
    assert len(out.read_text().splitlines()) == 2  # nothing appended by any refused run


def test_a_prompt_longer_than_the_targets_context_is_skipped_and_counted(tiny, tmp_path):
    long = "the cat sat on the mat " * 260  # > 1,024 tokens: past the tiny target's positions
    data = _small_prompts(tmp_path / "in.jsonl", ["hi", long])
    out = tmp_path / "out.jsonl"
    said = []
    stats = regenerate(data, out, sampling=SHORT, models={"cpu": tiny[0]}, log=said.append)
    assert list(_records(out)) == ["p0"] and stats.samples == 1
    assert stats.skipped["too_long_for_context"] == 1
    assert any("'p1' skipped: its prompt has" in s and "exceeds the target's 1,024 positions" in s for s in said)


@pytest.mark.parametrize("backend", ["hf", "engine"])
def test_a_conversation_opening_with_an_answer_is_reported_and_the_rest_are_written(tiny, tmp_path, backend):
    """An assistant turn before any user turn has no prompt: that record is skipped at the input check, named in
    the log and counted, and the other conversations are written (both back ends crashed on it, writing none)."""
    data = tmp_path / "in.jsonl"
    data.write_text(json.dumps({"id": "opens-with-answer", "messages": [
        {"role": "system", "content": "Be brief."}, {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "hi"}]}) + "\n" + json.dumps({"id": "ok", "messages": [
            {"role": "user", "content": "hi"}]}) + "\n")
    said = []
    stats = regenerate(data, tmp_path / "out.jsonl", sampling=SHORT, models={"cpu": tiny[0]}, backend=backend,
                       log=said.append)
    assert list(_records(tmp_path / "out.jsonl")) == ["ok"] and stats.samples == 1 and stats.total == 1
    assert stats.skipped == {"no_user_turn_before_answer": 1}
    assert any("'opens-with-answer'" in s and "first assistant turn comes before any user turn" in s for s in said)


@pytest.mark.parametrize("args, words", [
    (["--batch-size", "-4"], "batch_size=-4 is invalid: must be an integer >= 1"),
    (["--batch-size", "0"], "batch_size=0 is invalid"),
    (["--limit", "-1"], "limit=-1 is invalid: must be an integer >= 0"),
    (["--concurrency", "0", "--server-url", "http://127.0.0.1:9"], "concurrency=0 is invalid"),
    (["--max-new-tokens", "0"], "GenerationSettings.max_new_tokens=0 is invalid"),
    (["--devices", "cuda:7"], "device 'cuda:7': this machine sees"),
    (["--devices", "gpu0"], "device 'gpu0' is not a device name"),
])
def test_bad_cli_values_exit_2_with_one_line_naming_the_value(tmp_path, capsys, args, words):
    from dflash_lab.data.regenerate import main

    data = _small_prompts(tmp_path / "in.jsonl", ["hi", "bye"])
    out = tmp_path / "out.jsonl"
    assert main(["--data", str(data), "--out", str(out), *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1 and "Traceback" not in err
    assert not out.exists()


def test_a_settings_mismatch_on_the_command_line_is_one_line(tmp_path, capsys):
    from dflash_lab.data.regenerate import main

    data = _small_prompts(tmp_path / "in.jsonl", ["hi", "bye"])
    out = tmp_path / "out.jsonl"
    base = ["--data", str(data), "--out", str(out), "--thinking", "off", "--threads", "1"]
    assert main(base + ["--max-new-tokens", "8", "--limit", "1"]) == 0
    capsys.readouterr()
    assert main(base + ["--max-new-tokens", "9"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "max_new_tokens" in err and err.count("\n") == 1


def test_engine_back_end_writes_the_same_greedy_answers_as_hf_generate(full_run, prompts, tiny, tmp_path):
    """The generation engine (every turn through one queue, rows refilled as they finish) answers exactly as the
    Hugging Face back end at T=0 in fp32, records say which back end wrote them, and a resume checks it."""
    out = tmp_path / "engine.jsonl"
    lines = []
    stats = regenerate(prompts, out, target="tiny", batch_size=3, sampling=SAMPLING, models={"cpu": tiny[0]},
                       backend="engine", log=lines.append)
    hf, mine = _records(full_run[0]), _records(out)
    assert stats.samples == N and sorted(mine) == sorted(hf)
    for cid, rec in mine.items():
        assert rec["messages"] == hf[cid]["messages"], cid
        assert rec["generation"]["backend"] == "engine" and rec["generation"]["prompt_sha256"]
    assert any("answers re-tokenized as generated" in line for line in lines)
    with pytest.raises(DataError, match="backend"):  # hf records cannot be resumed by the engine
        regenerate(prompts, full_run[0], target="tiny", sampling=SAMPLING, models={"cpu": tiny[0]},
                   backend="engine", log=lambda s: None)
    with pytest.raises(DataError, match="backend='vllm' is unknown"):
        regenerate(prompts, tmp_path / "x.jsonl", target="tiny", sampling=SAMPLING, backend="vllm")


def test_keep_token_ids_goes_from_the_command_line_to_the_records_and_into_tokenization(tmp_path, capsys):
    """--keep-token-ids (engine back end): every sampled answer's ids as generated are in its record and
    tokenization trains on exactly them; the HF back end, which returns text only, refuses the flag."""
    from dflash_lab.data.regenerate import main
    from dflash_lab.data.tokenize import read_conversations, tokenize_dataset
    from dflash_lab.target.load import load_tokenizer

    data = _small_prompts(tmp_path / "in.jsonl", ["hi", "Count from 1 to 5.", "Tell me a story."])
    out = tmp_path / "out.jsonl"
    base = ["--data", str(data), "--out", str(out), "--thinking", "off", "--max-new-tokens", "12", "--temperature",
            "1.0", "--seed", "5", "--threads", "1", "--keep-token-ids"]
    assert main(base + ["--backend", "hf"]) == 2
    assert "keep_token_ids needs the engine back end (backend='hf' returns text only)" in capsys.readouterr().err
    assert main(base + ["--backend", "engine"]) == 0
    recs = list(_records(out).values())
    assert len(recs) == 3 and all(len(r["generation"]["token_ids"]) == 1 for r in recs)
    assert [len(r["generation"]["token_ids"][0]) for r in recs] == [r["generation"]["new_tokens"][0] for r in recs]
    tok = load_tokenizer("tiny")
    tokenized = tokenize_dataset(tok, read_conversations(out), seq_len=128, block_size=2, enable_thinking=False)
    chat = read_conversations(out)  # an answer that stopped at once is empty: not training data
    assert tokenized.report["answer_ids"] == {"used": len(chat), "text_differs": 0} and len(tokenized) >= 2
    by_id = {r["id"]: r for r in recs}
    for row, sid in enumerate(tokenized.sample_ids):
        gen = by_id[sid]["generation"]
        ids = gen["token_ids"][0]
        content = ids[:-1] if gen["finish_reasons"][0] == "stop" else ids
        sup = [t for t, m in zip(tokenized.input_ids[row].tolist(), tokenized.loss_mask[row].tolist()) if m]
        assert sup[:len(content)] == content  # thinking off: the answer's own ids open the supervised span


class _FullDisk:
    """A real output file on a disk with `room` bytes left: the write past it fails with ENOSPC, as does every
    flush of the data still buffered, as on a full disk."""

    def __init__(self, path, mode, room, **kw):
        import io

        self.f, self.room, self.pending = io.open(path, mode, **kw), room, ""

    def write(self, text):
        self.pending += text
        return len(text)

    def flush(self):
        import errno

        if len(self.pending.encode()) > self.room:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.room -= len(self.pending.encode())
        self.f.write(self.pending)
        self.f.flush()
        self.pending = ""

    def fileno(self):
        return self.f.fileno()

    def close(self):
        try:
            self.flush()
        finally:
            self.f.close()


@pytest.mark.parametrize("backend", ["hf", "engine"])
def test_a_full_disk_is_one_line_naming_the_file_and_what_is_kept_and_a_rerun_resumes(tmp_path, capsys,
                                                                                       monkeypatch, backend):
    from dflash_lab.data import regen_output
    from dflash_lab.data.regenerate import main

    data = _small_prompts(tmp_path / "in.jsonl", ["hi", "bye", "hello", "thanks"])
    out = tmp_path / "out.jsonl"
    args = ["--data", str(data), "--out", str(out), "--thinking", "off", "--max-new-tokens", "12", "--threads", "1",
            "--backend", backend, "--batch-size", "1"]
    line = 900  # bytes per record here (~700): two fit, the third does not
    monkeypatch.setattr(regen_output, "open", lambda p, m, **kw: _FullDisk(p, m, 2 * line, **kw), raising=False)
    assert main(args) == 2
    err = capsys.readouterr().err
    kept = len(out.read_text().splitlines())
    assert err == (f"error: regenerate: could not write {out} (No space left on device); {kept} complete "
                   f"conversations are kept in {out} (a half-written last line is cut off on resume). Fix: free disk "
                   "space, then rerun the same command: it resumes.\n") and kept == 2
    monkeypatch.undo()
    assert main(args) == 0  # space again: the kept conversations are not redone
    assert sorted(_records(out)) == ["p0", "p1", "p2", "p3"]
    assert f"{4 - kept} of 4 conversations to do ({kept} already in" in capsys.readouterr().out


def test_a_vanishing_temperature_answers_greedily_on_either_back_end_and_nonsense_is_one_line(tmp_path, capsys):
    """--temperature 1e-40 is T -> 0: the HF back end (which divides the logits by T) died on NaN probabilities with
    a raw traceback; now both back ends write the greedy answers. nan and inf are refused in one line."""
    from dflash_lab.data.regenerate import main

    data = _small_prompts(tmp_path / "in.jsonl", ["Count from 1 to 5.", "Tell me a story."])
    answers = {}
    for backend, t in (("hf", "0"), ("hf", "1e-40"), ("engine", "1e-40")):
        out = tmp_path / f"{backend}-{t}.jsonl"
        assert main(["--data", str(data), "--out", str(out), "--thinking", "off", "--max-new-tokens", "12",
                     "--temperature", t, "--threads", "1", "--backend", backend]) == 0
        answers[backend, t] = {i: r["messages"][-1]["content"] for i, r in _records(out).items()}
    assert answers["hf", "1e-40"] == answers["hf", "0"] == answers["engine", "1e-40"]
    capsys.readouterr()
    for t in ("nan", "inf", "-inf"):
        assert main(["--data", str(data), "--out", str(tmp_path / "x.jsonl"), f"--temperature={t}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and "temperature" in err and err.count("\n") == 1, err
