"""Validation of TrainConfig's packing knob (issue 17: pack_sequences); packing itself is packing.py."""

from __future__ import annotations

from .errors import fail


def check_pack_fields(cfg) -> None:
    """pack_sequences needs features computed online: a feature cache holds one conversation per row, unpacked."""
    if cfg.pack_sequences and cfg.feature_cache is not None:
        fail("TrainConfig", "pack_sequences", cfg.pack_sequences,
             f"feature_cache={cfg.feature_cache!r} holds features of unpacked rows (one conversation each, looked up "
             "by input ids), which packed windows do not match",
             "set pack_sequences=False to train from the cache, or feature_cache=None to pack with online features")
