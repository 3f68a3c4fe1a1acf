"""Workflow glue: the config check, what jobs do around their work, rule inputs (deps), the command
line, the environment fingerprint and the start-up benchmark."""
