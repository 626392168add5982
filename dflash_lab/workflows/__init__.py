"""Workflows: the jobs a researcher runs, each composing the pipeline's stages end to end.

The demo (tiny target -> trained and evaluated drafter), the recipe (a real target writes its own data, trains and
evaluates a drafter), sweeps of knobs ranked by held-out real tau, the scaling study (tau against data and steps),
and the pre-flight memory estimate. They may import every stage below them; no stage imports them.
"""
