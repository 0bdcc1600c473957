"""Tests of the lab (``d3ray/lab/``): compare, census and bench, unit, property and end-to-end (Ray) tests alike."""
