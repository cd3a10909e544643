"""Provides the session state: events reduced to frozen snapshots for the screens (no textual, no torch)."""
