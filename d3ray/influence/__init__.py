"""influence stage."""
