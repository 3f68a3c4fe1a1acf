"""The survey of KernelBench level-2 tasks: per-task records and their summary."""
