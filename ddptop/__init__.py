"""ddptop: train and profile PyTorch data-parallel jobs from the terminal."""

__version__ = "0.1.0"
PROTOCOL_VERSION = 1
