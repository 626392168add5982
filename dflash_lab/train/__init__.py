"""Training: prepare a run (tokenizer, data, sampler, placement, resume) -> place targets and drafter workers on
devices (memory model) -> the fixed-shape engine (one worker thread per GPU, static buffers, CUDA-graph capture) ->
optimizers and the lr schedule -> `Trainer`, the facade a notebook drives, with controls and periodic validation;
the same step under torchrun (`python -m dflash_lab.train`).

May import every stage below it; only the workflows (recipe, sweep, preflight, bench, demo) import it."""
