"""trainscale: measure distributed-training strategies with one experiment matrix."""

__version__ = "0.1.0"
