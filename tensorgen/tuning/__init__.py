"""Tuning: one task (`tune`), many tasks of models (`scheduler`), and what the scheduler optimizes (`objectives`)."""
