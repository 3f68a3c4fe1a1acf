"""Timing: the protocol (measure), the correctness gate (gate), the timing stage and the tail
roofline report."""
