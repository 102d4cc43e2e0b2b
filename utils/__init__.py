"""Small helpers every layer may use (no torch, no Lightning): atomic file and directory writes."""
