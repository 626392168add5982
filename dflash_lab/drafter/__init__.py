"""The DFlash drafter and what one training step computes: the model (one file, leaves first), anchors and block
inputs, the block attention mask (dense and flex), fixed-shape block batches, loss weighting (decay or D-PACE), the
chunked LM head and loss, as plain functions the engine captures.

Imports `config`, `runs`, `target` and `data`; the training engine and the evaluator build on it."""
