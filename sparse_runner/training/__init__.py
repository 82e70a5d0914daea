"""Training: the loop, checkpoints, learning-rate schedules and the run log."""
