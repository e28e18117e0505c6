"""Surviving failures: checkpoints and snapshots, hangs, the driver's link, standbys, live resizing."""
