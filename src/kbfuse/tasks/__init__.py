"""The tasks: which KernelBench tasks the study knows (registry), loading them (kernelbench), their
fused tails (tails), inputs, weights and compiled baselines."""
