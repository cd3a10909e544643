"""The trainer: models, data, sync strategies, rendezvous, the per-rank loop and the local launcher."""
