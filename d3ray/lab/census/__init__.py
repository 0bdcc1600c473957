"""The census: counterfactual chunks. From a finished run's checkpoints, train each of the next chunks
again in many orders from the same full state, and measure how much the order moves the held-out loss
and where D3's order falls among them (issue 28; README.md)."""
