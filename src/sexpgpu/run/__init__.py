"""The run loop: parameters from their stream keys, microbatches in a fixed order, the
update, passes, the run directory and checkpoints."""
