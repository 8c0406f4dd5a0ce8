"""Persistence: the checkpoint format (checkpoint), a run directory's checkpoints (runs), where a
training run continues from (resume), and a model from whatever a user names (loading)."""
