"""The survey: every KernelBench level-2 task against eager, TorchScript and Inductor.

One job per task (`kbfuse.survey.job.run_survey_task`) writes one `survey_task` record per
numerics mode (schema `kbfuse/schemas/survey_task.schema.json`, docs/contracts.md).
Each step is its own small module with one job:

- `settings`: the `survey:` config block (defaults, checks, numerics modes);
- `tasks`: which task files exist at the pin, loading one task seeded, its inputs;
- `determinism`, `flops`, `baselines`, `correctness`, `timing`, `profile`: the measurements,
  each returning plain JSON-ready data (blind spots and the official predicate:
  `kbfuse.checks.official`, shared with the study and `kbfuse check`);
- `job`: runs them in order, records every baseline failure with its stage, writes the record;
- `classify`, `peaks`, `anchor`, `summary`, `plots`, `wall`: the summary over every record
  (kernel categories, the GPU's peak, KernelBench's own H100 timings, tables, plots, where the
  survey's wall time went).

A baseline that fails (trace error, compile error, out of memory) is recorded with its stage
and first message line; the task goes on. Only a task that cannot even be loaded fails the job.
Nothing here imports torch at module import time except the measurement modules, so the
workflow's config checks stay cheap.
"""
