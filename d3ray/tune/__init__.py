"""Ray Tune sweeps over whole training runs (``d3ray sweep``); see README.md in this package."""
