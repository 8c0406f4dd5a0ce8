"""tinygpt: train, sweep and sample small decoder-only GPTs."""

__version__ = "0.1.0"
