"""`kbfuse check`: judge a KernelBench candidate kernel under the study's contract.

A candidate is a Python file in KernelBench's submission format (a `ModelNew` with the task's
`Model` constructor and forward signature). It is untrusted code: `check.check_candidate`
runs it in a child process of its own (`sandbox`), computes the reference in another child
process (`reference`), lets only tensors cross between them, and writes one verdict record
(`verdict`). docs/check.md states the threat model and every check.

Modules, one job each:
  spec       task reference ("2/53"), the `# kbfuse-task:` line, the `check:` settings
  sandbox    a child process with a wall-time limit, an RSS limit and a scratch directory
  child      entry point of the child processes (reference, candidate, witness roles)
  reference  the task's own Model on every case: inputs and reference outputs
  runner     the candidate's side: build, run every case, guards, profile, timing
  guards     runtime detection: timer patching, lazy results, side-stream work
  flags      the compiler flags a candidate's extension was built with and what they imply
  witness    effective FTZ of those flags, measured on the device
  compare    bit counts, ULP errors, the official predicate per case, trivial candidates
  timing     interleaved timing with device-wide synchronisation (events, graph, cold L2)
  verdict    the record: named checks, contract, speedups; its JSON Schema
  summary    table (CSV, Markdown) and plot over a folder of verdicts
"""
