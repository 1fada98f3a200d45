"""Search: tasks, targets, sketch rules, evolutionary search, task scheduling."""
