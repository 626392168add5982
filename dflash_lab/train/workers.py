"""The engine's per-device parts: a frozen target replica and a drafter worker (flat gradients, static inputs, the
captured forward+backward of step.py, its optimiser). engine.py runs them; engine_build.py makes them."""

from __future__ import annotations

import torch

from dflash_lab.drafter.blocks import BlockBatch, attention_masks, flex_mask_mods
from dflash_lab.target.segments import document_positions
from dflash_lab.config.windows import window_masks
from .cuda_graphs import GraphedStep, copy_into, input_mismatch
from .feature_store import FeatureStore, window_key
from dflash_lab.drafter.loss_weights import DECAY, LossWeighting
from dflash_lab.drafter.step import DraftInputs, SoftTargets, forward_backward
from dflash_lab.target.device_time import mark
from .streams import DeviceThread, StaticBuffers, Timeline

def _why_eager(cuda_graphs: bool, device: torch.device) -> str:
    return "no CUDA graphs on CPU" if device.type != "cuda" else "cuda_graphs=False"


# ---------------------------------------------------------------------------------------------------------------
# Target replica and drafter worker
# ---------------------------------------------------------------------------------------------------------------

class TargetReplica:
    """A frozen target on one device; its forward (up to the last needed layer) is captured like the drafter step."""

    def __init__(self, index: int, device: torch.device, extractor, *, cuda_graphs: bool, log=None,
                 store: FeatureStore | None = None):
        self.index, self.device, self.extractor = index, torch.device(device), extractor
        self.store = store  # features of windows seen before (feature_store.py); None = the target runs every step
        self.graphed = GraphedStep(lambda **inputs: extractor(**inputs), name=f"target[{index}]@{self.device}",
                                   enabled=cuda_graphs and self.device.type == "cuda", warmup=1, log=log,
                                   disabled_reason=_why_eager(cuda_graphs, self.device))
        self.buffers = StaticBuffers(self.device)
        self.timeline = Timeline()
        self.thread: DeviceThread | None = None  # set by the Engine (own thread if split, the worker's if colocated)

    @property
    def dtype(self) -> torch.dtype:
        dtype = getattr(self.extractor, "dtype", None)  # CachedFeatureExtractor: the cache's compute dtype
        return dtype if dtype is not None else self.extractor.decoder.embed_tokens.weight.dtype

    def features(self, input_ids: torch.Tensor, doc_ids: torch.Tensor | None = None):
        """(b, S) host ids -> (b, S, n*H) on this device; in graph mode the static output (valid until next call).
        `doc_ids` (b, S): packed windows, one more static input (None = unpacked, today's graph). A distilling
        extractor gives (features, top-k ids, top-k log-probs), and the store keeps all three."""
        def stage(name, t):
            return self.buffers.stage(name, t) if self.device.type == "cuda" else t.to(self.device)

        keys = None
        if self.store is not None:  # host digests of the batch's windows: a batch seen whole before is a gather
            keys = [window_key(input_ids[i], None if doc_ids is None else doc_ids[i])
                    for i in range(input_ids.shape[0])]
            slots = self.store.lookup(keys)
            if slots is not None:
                return self.store.gather(slots)
        if doc_ids is None:
            out = self.graphed(input_ids=stage("input_ids", input_ids))
        else:
            out = self.graphed(input_ids=stage("input_ids", input_ids), doc_ids=stage("doc_ids", doc_ids))
        if keys is not None:  # float8 storage: the step reads the rounded features, stored or not
            out = self.store.put(keys, out)
        return out


class Worker:
    """One drafter replica on one device: flat gradient buffer, static inputs, captured forward+backward, optimiser."""

    def __init__(self, *, index: int, device, drafter: torch.nn.Module, optimizer, embed: torch.nn.Embedding,
                 head_weight: torch.Tensor, attention: str, seq_len: int, layer_types: tuple[str, ...],
                 sliding_window: int | None, chunk_size: int, cuda_graphs: bool, forward_module=None, log=None,
                 layer_windows: tuple = (), loss_weighting: LossWeighting = DECAY,
                 label_map: torch.Tensor | None = None, distill_weight: float = 0.0):
        self.index, self.device = index, torch.device(device)
        self.distill_weight = distill_weight  # > 0: the target hands (features, top-k ids, log-probs)
        self.loss_weighting = loss_weighting  # a constant of the captured step (its buffers hold only values)
        self.drafter, self.optimizer, self.embed, self.head_weight = drafter, optimizer, embed, head_weight
        self.label_map = label_map  # target -> draft ids with a pruned head (draft_vocab.draft_head)
        self.forward_module = forward_module if forward_module is not None else drafter  # compiled or not
        self.attention, self.seq_len, self.chunk_size = attention, seq_len, chunk_size
        self.layer_types, self.sliding_window = tuple(layer_types), sliding_window
        self.layer_windows = tuple(layer_windows)
        self.mask_windows = window_masks(layer_types, sliding_window, layer_windows)  # {mask key: window}
        self.block_size = drafter.config.block_size
        self.thread = DeviceThread(self.device, "drafter")
        self.target: TargetReplica | None = None  # colocated only
        self.timeline = Timeline()
        self.buffers = StaticBuffers(self.device)
        self.inbox: list[torch.Tensor | None] = [None, None]  # split: feature slots the target side writes
        self.inbox_free = [torch.cuda.Event() if self.device.type == "cuda" else None for _ in range(2)]
        self._features: torch.Tensor | None = None
        self._mask_mods: dict | None = None
        self._static_masks: dict = {}
        self.graphed = GraphedStep(self._forward_backward, name=f"drafter[{index}]@{self.device}",
                                   enabled=cuda_graphs and self.device.type == "cuda", warmup=2, log=log,
                                   disabled_reason=_why_eager(cuda_graphs, self.device))
        params = [p for p in drafter.parameters() if p.requires_grad]
        if len({(p.dtype, p.device) for p in params}) != 1:
            raise ValueError("all trainable drafter parameters must share one dtype and device")
        self.params = params
        self.flat_grad = torch.zeros(sum(p.numel() for p in params), dtype=params[0].dtype, device=self.device)
        views, offset = [], 0
        for p in params:
            views.append(self.flat_grad[offset:offset + p.numel()].view_as(p))
            offset += p.numel()
        self._grad_views = views
        self.attach_grads()

    def attach_grads(self) -> None:
        """Point every p.grad at its view of the flat buffer (backward accumulates into it in place)."""
        for p, v in zip(self.params, self._grad_views):
            if p.grad is not v:
                p.grad = v

    # -- inputs ---------------------------------------------------------------------------------------------------
    def take_features(self, slot: int) -> torch.Tensor:
        """Split placements: the features the target side pushed into inbox[slot] (ordered by an event wait)."""
        src = self.inbox[slot]
        if self.device.type != "cuda":
            return src
        if self._features is None or self._features.shape != src.shape:
            self._features = torch.empty_like(src)
        self._features.copy_(src, non_blocking=True)
        self.inbox_free[slot].record()  # the target side may overwrite this slot now
        return self._features

    def _stage(self, part: BlockBatch) -> dict:
        names = ("draft_ids", "position_ids", "labels", "loss_weights", "anchors", "anchor_valid", "prev_ids")
        if self.device.type != "cuda":
            t = {k: getattr(part, k).to(self.device) for k in names}
        else:
            t = {k: self.buffers.stage(k, getattr(part, k)) for k in names}
        b = part.anchors.shape[0]
        if part.doc_ids is not None:  # packed: context positions restart per conversation (static (b, S) buffers)
            cuda = self.device.type == "cuda"
            t["doc_ids"] = self.buffers.stage("doc_ids", part.doc_ids) if cuda else part.doc_ids.to(self.device)
            pos = document_positions(t["doc_ids"])
            t["ctx_pos"] = self.buffers.stage("ctx_pos_packed", pos) if cuda else pos
            return t
        t["doc_ids"] = None
        ctx = self.buffers.bufs.get("ctx_pos")
        if ctx is None or ctx.shape != (b, self.seq_len):
            ctx = torch.arange(self.seq_len, device=self.device)[None].expand(b, -1).contiguous()
            self.buffers.bufs["ctx_pos"] = ctx
        t["ctx_pos"] = ctx
        return t

    def _masks(self, anchors: torch.Tensor, anchor_valid: torch.Tensor, doc_ids: torch.Tensor | None = None) -> dict:
        """Attention masks per distinct window (blocks.attention_masks), built from the (static) anchors outside any
        graph. Flex in graph mode: the mask_mods close over the STATIC anchors, and the kept BlockMask tensors are
        refreshed in place, so the captured flex kernels read this step's masks."""
        kw = dict(seq_len=self.seq_len, block_size=self.block_size, layer_types=self.layer_types,
                  sliding_window=self.sliding_window, layer_windows=self.layer_windows, doc_ids=doc_ids)
        static = (self.attention == "flex" and anchors is self.buffers.bufs.get("anchors")
                  and anchor_valid is self.buffers.bufs.get("anchor_valid")
                  and (doc_ids is None or doc_ids is self.buffers.bufs.get("doc_ids")))
        if static and self._mask_mods is None:
            self._mask_mods = flex_mask_mods(anchors, anchor_valid, **kw)
        masks = attention_masks(anchors, anchor_valid, backend=self.attention,
                                mask_mods=self._mask_mods if static else None, **kw)
        if not static:
            return masks
        out = {}
        for t, m in masks.items():  # refresh the kept BlockMask in place (same tensors every step)
            kept = self._static_masks.get(t)
            if kept is None:
                self._static_masks[t] = kept = m
            elif input_mismatch(t, m, kept) is None:
                copy_into(kept, m)
            else:
                kept = m
            out[t] = kept
        return out

    # -- the captured step ------------------------------------------------------------------------------------
    def _forward_backward(self, features, draft_ids, position_ids, labels, loss_weights, ctx_pos, prev_ids,
                          soft_ids=None, soft_logp=None, anchors=None, **masks):
        """step.forward_backward on this worker's static inputs (flat tensors: what GraphedStep captures);
        masks: {mask key: mask}, one per distinct window; soft_*: the target's top-k when distilling."""
        self.flat_grad.zero_()
        soft = None if soft_ids is None else SoftTargets(soft_ids, soft_logp, anchors, self.distill_weight)
        # input_ids / loss_mask / anchors are not needed past this point (features and masks carry them).
        bb = BlockBatch(input_ids=None, loss_mask=None, anchors=None, anchor_valid=None, draft_ids=draft_ids,
                        position_ids=position_ids, labels=labels, loss_weights=loss_weights,
                        block_size=self.block_size, prev_ids=prev_ids)
        return forward_backward(self.forward_module, self.embed, self.head_weight, features,
                                DraftInputs(bb, masks, ctx_pos), self.chunk_size, self.loss_weighting,
                                self.label_map, soft)

    def forward_backward(self, part: BlockBatch, target_out, step: int) -> dict:
        """`target_out`: the target replica's features, or (features, top-k ids, top-k log-probs) when distilling."""
        m0 = mark(self.device)
        self.attach_grads()
        t = self._stage(part)
        masks = self._masks(t["anchors"], t["anchor_valid"], t["doc_ids"])
        soft = {}
        if isinstance(target_out, tuple):
            if not self.distill_weight:
                raise ValueError("the target handed distillation targets to a worker built with distill_weight=0")
            target_out, ids, logp = target_out
            soft = {"soft_ids": ids, "soft_logp": logp, "anchors": t["anchors"]}
        elif self.distill_weight:
            raise ValueError(f"distill_weight={self.distill_weight} but the target handed features only: its "
                             "extractor was built without soft_top_k (prepare.make_feature_extractor)")
        loss, correct, has_loss, terms = self.graphed(
            features=target_out, draft_ids=t["draft_ids"], position_ids=t["position_ids"], labels=t["labels"],
            loss_weights=t["loss_weights"], ctx_pos=t["ctx_pos"], prev_ids=t["prev_ids"], **soft, **masks)
        out = {"loss": loss.clone(), "correct": correct.clone(), "has_loss": has_loss.clone(), "terms": terms.clone()}
        self.timeline.add(step, "drafter", m0, mark(self.device))
        return out

    def optimizer_step(self, lr: float, grad_clip: float, step: int = -1) -> torch.Tensor:
        m0 = mark(self.device)
        self.attach_grads()
        norm = self.optimizer.step(lr, grad_clip)
        for p, m in zip(self.optimizer.params, self.optimizer.masters):
            if m is not p:
                m.grad = None  # fp32 master grads are rebuilt each step: do not hold 4 bytes/param between steps
        self.timeline.add(step, "optimizer", m0, mark(self.device))
        return norm

    def shutdown(self) -> None:
        self.thread.shutdown()
