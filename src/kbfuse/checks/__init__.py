"""The checks: correctness against PyTorch eager, effective flush-to-zero (verify), the controls,
the exhaustive control, numerics and the tolerance protocol."""
