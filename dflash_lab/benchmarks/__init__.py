"""Benchmarks: one JSON line per configuration, comparable across commits and beside the peer on the same GPU.

`step` times the training step (target forward + drafter forward/backward + optimizer) exactly as the engine runs it,
`step_variants` adds its FP8 and compile variants, `generation` times the generation engine, `vocab_head` the
LM head + cross-entropy with a pruned draft vocabulary. They stand beside the workflows above every stage.
"""
