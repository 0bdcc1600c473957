"""d3ray: D3 data scheduling (dynamic directional graph-constrained ordering) on Ray."""

__version__ = "0.1.0"
__all__ = ["__version__"]
