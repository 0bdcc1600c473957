"""plot stage."""
