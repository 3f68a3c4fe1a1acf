"""`kbfuse audit`: a published corpus of candidate kernels, each judged by `kbfuse check`,
its claimed speedups kept beside the measured ones.

A corpus is a folder of KernelBench-format files or a JSON/JSONL file read through a small
declarative mapping (mappings/*.yaml; docs/audit.md). Every entry becomes a candidate file
named after its content, checked by `kbfuse.candidates.check.check_candidate` exactly as
`kbfuse check` checks one file; the audit adds nothing to the judge.

Modules, one job each:
  mapping      the declarative mapping of a JSON/JSONL corpus (which key holds what)
  corpus       the corpus read into entries: level, task, code, reference, claims
  settings     the `audit:` config block, its defaults and checks
  materialise  entries as content-named candidate files (written only when changed) and the
               entries index the summary reads
  references   the entry's reference against the pinned KernelBench task file
  claims       claims beside measured speedups per candidate, and the tallies by kind
  plot         the claimed-vs-measured scatter plot
  summary      the summary files (tables, tallies, plot) of an audit
  cli          `kbfuse audit CORPUS`: the same without Snakemake, one check after another
"""
