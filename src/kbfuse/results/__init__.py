"""Results: records and their schemas, the summary (study, tables, plots), manifest, bundle
and comparison."""
