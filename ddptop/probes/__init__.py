"""Probes: where each step's time and bytes go, measured cheaply enough to leave on."""
