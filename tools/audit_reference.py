"""Copy a finished audit's results into a reference folder, with where its time went and a
manifest of them.

    python tools/audit_reference.py --results RUN/results --name cuda_l1_h100 \
        --out results/reference/h200/audit [--snakemake-log RUN/.snakemake/log/X.log ...]

Copies, keeping their paths under `results/`: the audit's entries index (the claims and the
corpus's digests; the candidates' code stays out), every verdict and the summary
(results/audit/<name>/), the environment fingerprint, the KernelBench checkout record and the
official contract every verdict was judged by. The children's logs stay out (their lines
quote the run machine's paths; each verdict keeps its processes' log tails). Then writes
`audit/<name>/wall.json` and `wall.md` (benchmarks/audit_wall.py's report, the run's wall time
from the Snakemake logs given) and `manifest.json` over all of it, with the study config that
was in force (`--config`). Check it with `kbfuse verify-bundle FOLDER`.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from kbfuse import layout  # noqa: E402
from kbfuse.audit.summary import OUTPUTS  # noqa: E402
from kbfuse.audit.wall import audit_wall, report_markdown  # noqa: E402
from kbfuse.errors import KbfuseError  # noqa: E402
from kbfuse.io import copy_files, write_json, write_text  # noqa: E402
from kbfuse.layout import RECORDS  # noqa: E402
from kbfuse.results.manifest import CHECKOUT_PIN, FINGERPRINT, build_manifest  # noqa: E402
from kbfuse.workflow.config import load_config  # noqa: E402

CONTRACT = RECORDS["kernelbench_contract"].path


def reference_files(results: Path, name: str) -> list[str]:
    """The files an audit reference keeps (relative POSIX paths, sorted); KbfuseError naming
    what is missing when the audit has not run to its end."""
    root = Path(layout.file("audit_root", results, audit=name))
    index = Path(layout.audit_file("index", root))
    summary = [Path(layout.audit_file("summary", root, name=out)) for out in OUTPUTS]
    verdicts = sorted(root.glob(layout.audit_file("verdict", ".", numerics="*", entry="*")))
    for required in (index, *summary, results / FINGERPRINT, results / CHECKOUT_PIN,
                     results / CONTRACT):  # fmt: skip
        if not required.is_file():
            raise KbfuseError(
                f"{required} is missing: run `snakemake audit results/env/fingerprint.json` "
                "to its end first"
            )
    if not verdicts:
        raise KbfuseError(f"{root} holds no verdicts")
    files = [index, *summary, *verdicts]
    kept = {p.relative_to(results).as_posix() for p in files}
    return sorted(kept | {FINGERPRINT, CHECKOUT_PIN, CONTRACT})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", type=Path, required=True, help="a finished run's results")
    parser.add_argument("--name", required=True, help="the audit's name (audit.name)")
    parser.add_argument("--out", type=Path, required=True, help="the reference folder")
    parser.add_argument("--snakemake-log", action="append", help="the run's Snakemake log(s)")
    parser.add_argument("--config", type=Path, default=ROOT / "config" / "config.yaml")
    args = parser.parse_args(argv)
    try:
        files = reference_files(args.results, args.name)
        config = load_config(args.config)
        copy_files(args.results, files, args.out)
        audit = Path(layout.file("audit_root", args.out, audit=args.name))
        report = audit_wall(audit, args.snakemake_log)
        write_json(audit / "wall.json", report)
        write_text(audit / "wall.md", report_markdown(report))
        files += [
            (audit / f"wall.{ext}").relative_to(args.out).as_posix() for ext in ("json", "md")
        ]
        build_manifest(args.out, files, config, args.out / "manifest.json", pin=CHECKOUT_PIN)
    except (KbfuseError, OSError) as exc:
        print(f"audit_reference: {exc}", file=sys.stderr)
        return 1
    print(f"{len(files)} files and manifest.json in {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
