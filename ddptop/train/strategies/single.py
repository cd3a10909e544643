"""`single`: no communication. Sends 0 bytes; with several ranks each trains alone on its shard (CS744 part 1)."""

from ddptop.train.strategies.base import Strategy


class Single(Strategy):
    name = "single"
