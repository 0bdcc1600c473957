"""Weight schedulers: per-sample loss weights inside the step (loss-based reweighting)."""
