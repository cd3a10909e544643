"""ddptop: train and profile PyTorch data-parallel jobs from the terminal."""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1


def __getattr__(name: str):
    """`ddptop.join()`, the user's own loop (ddptop/api.py), imported on first use: `import ddptop` stays free of torch
    (replay, report and the screen start without it)."""
    if name == "join":
        from ddptop.api import join

        return join
    raise AttributeError(f"module 'ddptop' has no attribute {name!r}")
