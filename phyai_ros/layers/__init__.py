"""Operator layer: the only place model code gets its math from (see ops.py for why)."""
from . import ops

__all__ = ["ops"]
