"""Loop-nest IR: what schedules lower to and code generators render."""
