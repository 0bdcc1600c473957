"""Evaluation through lm-evaluation-harness on local files (see README.md)."""
