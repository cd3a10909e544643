"""Provides the Textual screen: `run_live` beside a job's front process and `run_replay` over a recording."""
