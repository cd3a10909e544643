"""Provides the widgets, one per module: thin shells (reactives, CSS, messages) over the pure renderables."""
