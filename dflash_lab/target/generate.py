"""Fast batched generation with the target's own Hugging Face modules: static KV caches, continuous batching and one
CUDA graph per (batch, length bucket) on CUDA; the same code runs eagerly on the CPU.

    prompts -> PromptQueue -> free rows take prompts -> batched prefill (eager, right-padded, causal) -> first token
            -> decode chunks: `steps_per_sync` graph replays, each one token for every row at its own position
            -> one device->host copy per chunk, read while the NEXT chunk already runs (gen_rows.py keeps the
               books): stop tokens / length limits finish rows, their rows are refilled

Rows are refilled in waves (when a fraction `refill_fraction` of the rows is free, or none is live): a prefill is a
few hundred kernel launches whatever its size, while an idle row in a decode step costs almost nothing, since
a 135M-parameter target's step is bound by launches and weight reads, not rows. A row that finished inside a chunk
keeps decoding garbage until the chunk ends (its tokens are dropped; positions are clamped inside the cache).

Nothing of the target is reimplemented: its decoder layers, rotary embedding, final norm and head run as in
evaluation/static_decode.py, with RowKVCache (static_cache.py) as their cache and a boolean mask by absolute
position (a row at position p sees keys at positions <= p within the live length bucket). Greedy and sampled
decoding (sampling.py: counter-hashed, independent of batching); bf16 and fp32 follow the model's dtype. Several
devices: gen_devices.py. `cuda_graphs=False` runs exactly the same step eagerly (GPU tests check graph == eager).
"""

from __future__ import annotations

import time

import psutil
import torch
import torch.nn.functional as F

from .device_time import elapsed_ms, mark, to_device_async
from .features import decoder_of, embedding_of, lm_head_weight
from .gen_kernels import decode_attention_choice, engine_kernels, grouped_decode_applies
from .gen_queue import Generated, PromptItem, PromptQueue, by_length
from .gen_rows import RowBook
from .sampling import MIN_SAMPLING_TEMPERATURE, GenerationSettings, counter_uniform, next_tokens
from .static_cache import BATCH_FLOOR, RowKVCache, additive, bucket, doubling_ladder, length_ladder, \
    static_cache_problem

# Generator.work, per run: where a run's device time goes. Prefill forwards and tokens (the prompts' own and the
# right-padded total), their device time (CUDA events; wall time on the CPU), and decode chunks, steps and row-steps
# (steps x padded batch): with the run's wall time they split prefill from decode.
CACHE_SHARE = 0.9  # of the device's free memory a KV cache may take: prefill activations and logits need the rest

WORK_KEYS = ("prefill_forwards", "prefill_prompt_tokens", "prefill_padded_tokens", "prefill_s", "decode_chunks",
             "decode_steps", "decode_row_steps")


class CacheMemoryError(ValueError):
    """The KV cache asked for does not fit the device's free memory; says how much it needs, how much is free, and
    how many rows of that length would fit (`rows_that_fit`)."""

    def __init__(self, device: str, rows: int, length: int, need: int, free: int, per_row: int):
        self.device, self.rows, self.length, self.need, self.free = device, rows, length, need, free
        self.rows_that_fit = int(CACHE_SHARE * free // per_row)
        super().__init__(f"the generation engine's KV cache for {rows:,} rows x {length:,} positions needs "
                         f"{need / 2 ** 30:.2f} GiB; {free / 2 ** 30:.2f} GiB is free on {device} (at most "
                         f"{self.rows_that_fit:,} rows of {length:,} positions fit). Fix: fewer rows (the batch size), "
                         "or shorter rows (fewer new tokens per answer).")


def free_bytes(device: torch.device) -> int:
    """Memory a new cache may take on `device`: the GPU's free memory, or the host's available memory on the CPU."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    return psutil.virtual_memory().available


class Generator:
    """Batched generation on one device with one target replica; `generate(prompts, settings)` -> list[Generated].

    stop_ids: token ids that end an answer (included in it). max_batch: rows decoded together. max_len: positions
    per row (prompt + answer), capped by the target's context (None: the context itself); the cache holds only
    what allocate() asks for, refused with CacheMemoryError when it does not fit the device's free memory.
    cuda_graphs: None = on CUDA, off on the CPU.
    steps_per_sync: decode steps between device->host copies (None: 8 on CUDA, 1 on the CPU).
    refill_fraction: refill when this fraction of the rows is free. prefill_tokens: most (rows x padded length)
    of one prefill forward. fused_norms: run the RMSNorms as one kernel (None: on CUDA; changes rounding only).
    grouped_decode: decode attention without repeated K/V for grouped-query sdpa targets (gen_kernels.py). Both
    hold only while the engine runs: the model is left as it was given. decode_attention: "auto" (the per-row
    Triton kernel on CUDA when triton imports, else "sdpa"), "sdpa" (every row over the longest row's length
    bucket), "triton" (each row reads only its own keys: decode_attention.py), "reference" (the same in plain
    torch, for checks); `self.decode_attention` says which runs, graph_status names a per-row kernel. `self.work`:
    the last run's prefill and decode work (WORK_KEYS)."""

    def __init__(self, model, *, stop_ids, max_batch: int = 256, max_len: int | None = None,
                 cuda_graphs: bool | None = None,
                 log=None, steps_per_sync: int | None = None, refill_fraction: float = 0.125,
                 prefill_tokens: int = 32768, fused_norms: bool | None = None, grouped_decode: bool = True,
                 decode_attention: str = "auto", name: str | None = None):
        problem = static_cache_problem(model)
        if problem:
            raise ValueError(f"the generation engine cannot run this target: {problem}. Fix: regenerate with the "
                             "Hugging Face back end (data/regen_local.py) for it.")
        stop = sorted({int(s) for s in ([stop_ids] if isinstance(stop_ids, int) else stop_ids or [])})
        if not stop:
            raise ValueError("stop_ids is empty: answers would only ever end at the length limit. Fix: pass the "
                             "tokenizer's eos and end-of-turn token ids.")
        cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        ctx = int(getattr(cfg, "max_position_embeddings", None) or max_len or 2048)
        max_len = ctx if max_len is None else max_len
        for name_, value, fix in (("max_batch", max_batch, "use e.g. 256"), ("max_len", max_len, "use e.g. 2048")):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Generator {name_}={value!r} must be an integer >= 1. Fix: {fix}.")
        if not 0 < refill_fraction <= 1:
            raise ValueError(f"Generator refill_fraction={refill_fraction!r} must be in (0, 1]. Fix: use e.g. 0.125.")
        self.model, self.stop_ids, self.log = model, stop, log
        self.decoder, self.embed, self.head = decoder_of(model), embedding_of(model), lm_head_weight(model)
        self.device, self.dtype = self.embed.weight.device, self.embed.weight.dtype
        self.name = name or str(self.device)
        self.max_batch, self.max_len = max_batch, min(max_len, ctx)
        on_cuda = self.device.type == "cuda"
        self.graphs = on_cuda if cuda_graphs is None else bool(cuda_graphs and on_cuda)
        self.steps_per_sync = steps_per_sync or (8 if on_cuda else 1)
        self.refill_fraction, self.prefill_tokens = refill_fraction, prefill_tokens
        self.fused_norms = on_cuda if fused_norms is None else bool(fused_norms)
        self.decode_attention = decode_attention_choice(decode_attention, self.decoder, self.device, grouped_decode)
        self.per_row = self.decode_attention != "sdpa"
        self.grouped_decode = grouped_decode and (grouped_decode_applies(self.decoder) or self.per_row)
        self.n_layers = len(self.decoder.layers)
        self.kv_heads = cfg.num_key_value_heads
        self.head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.additive_mask = getattr(model.config, "_attn_implementation", "sdpa") == "eager"
        self.rows = self.length = 0
        self.cache: RowKVCache | None = None
        self._graphs: dict[tuple, torch.cuda.CUDAGraph] = {}
        self._pool = None
        self.capture_s = 0.0
        self.work = dict.fromkeys(WORK_KEYS, 0)
        self._status("graphs: none captured yet" if self.graphs else "eager: graphs off")
        if log and self.per_row:
            log(f"generate on {self.name}: decode attention {self.decode_attention} (per-row lengths)")

    # ---------------------------------------------------------------------------------------------------------
    def cache_bytes(self, rows: int, length: int) -> int:
        """Bytes of the KV cache for rows x length positions: K and V of every layer, (rows, kv heads, length, d)."""
        return 2 * self.n_layers * rows * self.kv_heads * length * self.head_dim * self.embed.weight.element_size()

    def allocate(self, rows: int, length: int) -> None:
        """Caches and step buffers for at least `rows` x `length` (capped by max_batch, max_len). They only grow
        (a later, smaller call reuses them: the buckets follow the live rows); growing drops captured graphs.
        A cache the device cannot hold is refused before any of it is made (CacheMemoryError)."""
        rows = min(max(rows, self.rows), self.max_batch)
        length = bucket(length_ladder(self.max_len), max(length, self.length))
        if rows <= self.rows and length <= self.length:
            return
        dev = self.device
        old = self.cache.nbytes if self.cache is not None else 0
        need, free = self.cache_bytes(rows, length), free_bytes(dev) + old  # the old cache is freed first
        if need > CACHE_SHARE * free:
            raise CacheMemoryError(self.name, rows, length, need, free, self.cache_bytes(1, length))
        self.cache = None  # free the old cache before the new one is made
        self._graphs, self._pool = {}, None
        self.rows, self.length = rows, length
        self.cache = RowKVCache(self.n_layers, self.kv_heads, rows, length, self.head_dim, self.dtype, dev)
        self.kv_pos = torch.arange(length, device=dev)  # (L,)
        self.row_ids = torch.arange(rows, device=dev)  # (R,)
        self.tokens = torch.zeros(rows, dtype=torch.long, device=dev)  # each row's last token (the next input)
        self.pos = torch.zeros(rows, dtype=torch.long, device=dev)  # ... and its position
        self.keys = torch.zeros(rows, dtype=torch.long, device=dev)  # sampling key of the row's prompt
        self.out_steps = torch.zeros(self.steps_per_sync, rows, dtype=torch.long, device=dev)  # tokens of a chunk
        self._host_out = torch.zeros(2, self.steps_per_sync, rows, dtype=torch.long, pin_memory=dev.type == "cuda")
        self.step_idx = torch.zeros(1, dtype=torch.long, device=dev)
        self.seed = torch.zeros((), dtype=torch.long, device=dev)
        self.temperature = torch.ones((), dtype=torch.float32, device=dev)
        self.top_p = torch.ones((), dtype=torch.float32, device=dev)
        self.len_ladder, self.batch_ladder = length_ladder(length), doubling_ladder(rows, BATCH_FLOOR)

    def _status(self, how: str) -> None:
        """graph_status; it also names a per-row decode kernel (no suffix: the masked sdpa path, as before)."""
        self.graph_status = f"{how}; decode attention {self.decode_attention}" if self.per_row else how

    def _set_settings(self, s: GenerationSettings) -> None:
        self.seed.fill_(s.seed)
        self.temperature.fill_(max(s.temperature, MIN_SAMPLING_TEMPERATURE))
        self.top_p.fill_(s.top_p)

    # ---------------------------------------------------------------------------------------------------------
    def _layers(self, h: torch.Tensor, mask, position_ids: torch.Tensor, rope, **attn_kw) -> torch.Tensor:
        for layer in self.decoder.layers:  # attn_kw: the layers hand extra keywords down to the attention function
            h = layer(h, attention_mask=mask, position_ids=position_ids, past_key_values=self.cache, use_cache=True,
                      position_embeddings=rope, **attn_kw)
            h = h[0] if isinstance(h, tuple) else h
        return h

    def _logits(self, h: torch.Tensor) -> torch.Tensor:
        return F.linear(self.decoder.norm(h), self.head).float()  # (n, V) fp32, as the evaluator computes them

    def _decode_step(self, B: int, span: int, mode: tuple) -> None:
        """One token for rows 0..B-1, attention over positions < span. Fixed shapes, no host sync (graph-safe)."""
        tok, pos = self.tokens[:B], self.pos[:B]
        h = self.embed(tok[:, None])  # (B, 1, H)
        pos2 = pos[:, None]  # (B, 1)
        rope = self.decoder.rotary_emb(h, pos2)
        mask = (self.kv_pos[:span][None, :] <= pos2)[:, None, None, :]  # (B, 1, 1, span): keys at positions <= p
        if self.additive_mask:
            mask = additive(mask, h.dtype)
        self.cache.decode(self.row_ids[:B], pos, span)
        # per-row kernels: row r reads its min(p + 1, span) keys (what the mask keeps), not the whole span; the
        # mask stays for a model whose attention another engine set (engine_kernels: the first one in decides)
        kw = {"decode_lengths": torch.clamp(pos + 1, max=span), "decode_kernel": self.decode_attention} \
            if self.per_row else {}
        logits = self._logits(self._layers(h, mask, pos2, rope, **kw)[:, 0])  # (B, V)
        u = counter_uniform(self.seed, self.keys[:B], pos + 1) if mode[0] != "greedy" else None
        nxt = next_tokens(logits, mode, temperature=self.temperature, top_p=self.top_p, uniforms=u)  # (B,)
        self.out_steps[:, :B].index_copy_(0, self.step_idx, nxt[None])
        self.step_idx.add_(1)
        tok.copy_(nxt)
        pos.copy_(torch.clamp(pos + 1, max=self.length - 1))  # a finished row decodes on in place until the sync

    def _capture(self, B: int, span: int, mode: tuple) -> torch.cuda.CUDAGraph | None:
        """Warm the step up on a side stream, then capture it; the warm-up's writes to live rows are the ones the real
        steps make (same inputs), and tokens / positions are put back."""
        t0 = time.perf_counter()
        saved = (self.tokens.clone(), self.pos.clone(), self.step_idx.clone())
        stream = torch.cuda.Stream(device=self.device)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for _ in range(2):
                self.step_idx.zero_()
                self._decode_step(B, span, mode)
        torch.cuda.current_stream(self.device).wait_stream(stream)
        for buf, old in zip((self.tokens, self.pos, self.step_idx), saved):
            buf.copy_(old)
        if self._pool is None:
            self._pool = torch.cuda.graph_pool_handle()
        graph = torch.cuda.CUDAGraph()
        try:
            # thread_local: engines on other GPUs (other threads) keep launching while this one captures
            with torch.cuda.graph(graph, pool=self._pool, capture_error_mode="thread_local"):
                self._decode_step(B, span, mode)
        except RuntimeError as e:  # an op that cannot be captured: stay correct, say why it is slow
            self.graphs = False
            self._status(f"eager: CUDA graph capture failed ({str(e).splitlines()[0]})")
            if self.log:
                self.log(f"generate on {self.name}: {self.graph_status}")
            return None
        torch.cuda.synchronize(self.device)
        self.capture_s += time.perf_counter() - t0
        self._status(f"graphs: {len(self._graphs) + 1} captured ({self.capture_s:.1f} s)")
        return graph

    def _run_steps(self, n: int, B: int, span: int, mode: tuple) -> None:
        self.step_idx.zero_()
        key = (B, span, mode)
        if self.graphs and key not in self._graphs:
            graph = self._capture(B, span, mode)
            if graph is not None:
                self._graphs[key] = graph
        graph = self._graphs.get(key) if self.graphs else None
        for _ in range(n):
            if graph is not None:
                graph.replay()
            else:
                self._decode_step(B, span, mode)

    # ---------------------------------------------------------------------------------------------------------
    def _prefill(self, rows: list[int], items: list[PromptItem], mode: tuple) -> list[int]:
        """Prompts into `rows` (one right-padded causal forward); returns each one's first new token (syncs)."""
        n, T, dev = len(items), max(len(it.ids) for it in items), self.device
        t0 = mark(dev)
        ids = self._upload([it.ids + [0] * (T - len(it.ids)) for it in items])  # (n, T)
        lens = self._upload([len(it.ids) for it in items])
        keys = self._upload([it.seed_key for it in items])
        rows_t = self._upload(rows)
        h = self.embed(ids)  # (n, T, H)
        positions = torch.arange(T, device=dev)[None].expand(n, -1)
        rope = self.decoder.rotary_emb(h, positions)
        mask = None  # sdpa: is_causal over the prompt itself (every row starts at position 0)
        if self.additive_mask:
            causal = torch.ones(T, T, dtype=torch.bool, device=dev).tril()
            mask = additive(causal[None, None], h.dtype)
        self.cache.prefill(rows_t)
        h = self._layers(h, mask, positions, rope)
        logits = self._logits(h[torch.arange(n, device=dev), lens - 1])  # (n, V) at each prompt's last token
        u = counter_uniform(self.seed, keys, lens) if mode[0] != "greedy" else None
        first = next_tokens(logits, mode, temperature=self.temperature, top_p=self.top_p, uniforms=u)
        self.tokens[rows_t] = first
        self.pos[rows_t] = torch.clamp(lens, max=self.length - 1)
        self.keys[rows_t] = keys
        t1 = mark(dev)
        out = first.tolist()  # syncs: both marks have completed
        w = self.work
        w["prefill_forwards"] += 1
        w["prefill_prompt_tokens"] += sum(len(it.ids) for it in items)
        w["prefill_padded_tokens"] += n * T
        w["prefill_s"] += elapsed_ms(t0, t1) / 1e3
        return out

    def _upload(self, values: list) -> torch.Tensor:
        """A long tensor on the device without a host sync (pinned + non_blocking on CUDA): the prefill's kernels
        are queued behind the decode chunk in flight instead of waiting for it."""
        return to_device_async(torch.tensor(values, dtype=torch.long), self.device)

    def _prefill_waves(self, rows: list[int], items: list[PromptItem], mode: tuple) -> list[int]:
        """Prefill in forwards of at most prefill_tokens (rows x padded length), similar lengths together."""
        order = sorted(range(len(items)), key=lambda i: len(items[i].ids))
        first = [0] * len(items)
        i = 0
        while i < len(order):
            j = i + 1
            while j < len(order) and (j + 1 - i) * len(items[order[j]].ids) <= self.prefill_tokens:
                j += 1
            part = order[i:j]
            for k, t in zip(part, self._prefill([rows[k] for k in part], [items[k] for k in part], mode)):
                first[k] = t
            i = j
        return first

    # ---------------------------------------------------------------------------------------------------------
    def limit_for(self, prompt_len: int, max_new_tokens: int) -> int:
        """New tokens a prompt may get: max_new_tokens, or fewer where the row's positions run out (0 = no room)."""
        return max(0, min(max_new_tokens, self.length - prompt_len + 1)) if prompt_len < self.length else 0

    @torch.no_grad()
    def run(self, queue: PromptQueue, settings: GenerationSettings) -> None:
        """Decode everything the queue holds (follow-ups included) until it is empty everywhere; results go to
        queue.finish. Needs allocate() first. A prompt that does not fit a row finishes at once: ([], "length")."""
        if self.cache is None:
            raise RuntimeError("Generator.run needs allocate(rows, length) first (generate() does it for you).")
        try:
            with engine_kernels(self.decoder, grouped_decode=self.grouped_decode, fused_norms=self.fused_norms,
                                per_row=self.per_row):
                self._run(queue, settings)
        except BaseException as e:
            queue.abort(e)
            raise

    def _run(self, queue: PromptQueue, s: GenerationSettings) -> None:
        self.work = dict.fromkeys(WORK_KEYS, 0)
        self._set_settings(s)
        mode = s.mode
        book = RowBook(self.rows, self.stop_ids, lambda item, gen: queue.finish(item.key, gen))
        refill_at = max(1, int(self.refill_fraction * self.rows))
        pending = None  # the chunk in flight: (chunk id, host buffer view, event)
        chunk_id = 0
        while not queue.aborted:
            if book.free and (not book.live or len(book.free) >= refill_at) and queue.has_waiting():
                self._refill(book, queue, s, since=chunk_id)  # enqueued after the chunk in flight; syncs
            launch = None
            if book.live and not queue.has_waiting() and \
                    bucket(self.batch_ladder, len(book.live)) < bucket(self.batch_ladder, book.width()):
                pending = self._absorb(book, pending)  # the tail: pack live rows to the front, nothing in flight
                self._pack(book)
            if book.live and book.steps_left() > 0:
                B = bucket(self.batch_ladder, book.width())
                steps = min(self.steps_per_sync, book.steps_left())
                span = bucket(self.len_ladder, min(book.top_position() + steps, self.length))
                self._run_steps(steps, B, span, mode)
                self.work["decode_chunks"] += 1
                self.work["decode_steps"] += steps
                self.work["decode_row_steps"] += steps * B  # the padded batch: what the step computed
                launch = (chunk_id, *self._copy_out(chunk_id, steps, B))
                book.launched(steps, self.length - 1)
                chunk_id += 1
            pending = self._absorb(book, pending)  # the previous chunk, read while this one runs
            queue.report(self.name, len(book.live), book.live_tokens())
            pending = launch
            if pending is None and not book.live:
                if queue.wait_for_work():
                    continue
                break

    def _refill(self, book: RowBook, queue: PromptQueue, s: GenerationSettings, since: int) -> None:
        """Free rows take waiting prompts: one batched prefill, first tokens (which may end an answer at once)."""
        placed = []
        for it in queue.take(len(book.free)):
            limit = self.limit_for(len(it.ids), s.max_new_tokens)
            if limit == 0 or not it.ids:
                queue.finish(it.key, Generated(token_ids=[], finish_reason="length"))
            else:
                placed.append((book.place(it, limit, since), it))
        if placed:
            firsts = self._prefill_waves([r for r, _ in placed], [it for _, it in placed], s.mode)
            for (row, _), t in zip(placed, firsts):
                book.first_token(row, t)

    def _copy_out(self, chunk_id: int, steps: int, B: int):
        """Start the device->host copy of a chunk's tokens (pinned, double-buffered on CUDA); (view, event)."""
        # whole rows of out_steps: both sides contiguous, so the copy is one DMA into pinned memory (a strided copy
        # would go through an unpinned temporary and block the host until the chunk is done)
        buf = self._host_out[chunk_id % 2, :steps]
        buf.copy_(self.out_steps[:steps], non_blocking=self._host_out.is_pinned())
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record(torch.cuda.current_stream(self.device))
        return buf[:, :B], event

    @staticmethod
    def _absorb(book: RowBook, pending):
        """Wait for a launched chunk's tokens and hand them to the rows; returns None (nothing in flight)."""
        if pending is not None:
            chunk_id, buf, event = pending
            if event is not None:
                event.synchronize()  # syncs: waits for this chunk only, the next one keeps the GPU busy
            book.absorb(buf.numpy(), chunk_id)
        return None

    def _pack(self, book: RowBook) -> None:
        """Move live rows to the lowest row numbers (the tail of a run then decodes at a smaller batch bucket)."""
        movers, holes = book.pack()
        if not movers:
            return
        src = torch.tensor(movers, device=self.device)
        dst = torch.tensor(holes, device=self.device)
        self.cache.move_rows(src, dst)
        for buf in (self.tokens, self.pos, self.keys):
            buf[dst] = buf[src]

    # ---------------------------------------------------------------------------------------------------------
    def check_prompts(self, prompts: list[list[int]], max_new_tokens: int) -> None:
        """Raise naming every prompt that is empty or leaves no room for an answer."""
        bad = [i for i, p in enumerate(prompts) if not p or len(p) >= self.max_len]
        if bad:
            lens = [len(prompts[i]) for i in bad[:5]]
            raise ValueError(f"{len(bad)} prompt(s) cannot be generated (e.g. indices {bad[:5]}, {lens} tokens): "
                             f"empty, or not shorter than max_len={self.max_len} positions. Fix: drop them, or build "
                             f"the Generator with max_len >= longest prompt + {max_new_tokens}.")

    def generate(self, prompts: list[list[int]], settings: GenerationSettings, *, progress=None,
                 keys: list[int] | None = None) -> list[Generated]:
        """Answers to `prompts` (token id lists), in order. keys: sampling key per prompt (default: its index)."""
        prompts = [list(map(int, p)) for p in prompts]
        if not prompts:
            return []
        self.check_prompts(prompts, settings.max_new_tokens)
        keys = list(range(len(prompts))) if keys is None else list(keys)
        if len(set(keys)) != len(keys) or len(keys) != len(prompts):
            raise ValueError(f"keys must be {len(prompts)} distinct integers, one per prompt. Fix: pass unique keys.")
        self.allocate(bucket(doubling_ladder(self.max_batch, BATCH_FLOOR), len(prompts)),
                      max(len(p) for p in prompts) + settings.max_new_tokens)
        queue = PromptQueue(by_length([PromptItem(k, p) for k, p in zip(keys, prompts)]), progress=progress,
                            log=self.log)
        self.run(queue, settings)
        queue.flush()
        return [queue.results[k] for k in keys]
