"""Imported first by the server that local CPU ranks fork from (front/supervisor.py, PRELOAD): it dies
with the front that started it, and its ranks, which die with their parent, with it."""

from ddptop.train.lifetime import die_with_parent

die_with_parent()
