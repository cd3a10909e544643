"""Recordings: one SQLite file per run (writer thread, reader, replay source, export); never imports torch."""
