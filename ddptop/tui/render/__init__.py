"""Provides pure Rich renderables (graphs, charts, bars, tables) that the widgets draw and the tests read as text."""
