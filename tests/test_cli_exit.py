"""`kbfuse` exit codes: 0 all checks out, 1 the input has problems, 2 could not run.

Every bad input gives a one-line-per-problem message on stderr and an exit code, never a
traceback; `--version` names the version; `compare` labels bundles by their machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml
from test_bundle import members_of, repack, result_files
from test_summary import make_config, write_study

from kbfuse import __version__
from kbfuse.results.bundle import MANIFEST_MEMBER, RESULTS_PREFIX, make_bundle
from kbfuse.results.compare import COMPARISON_TABLES
from kbfuse.results.manifest import build_manifest
from kbfuse.workflow import cli

REPO = Path(__file__).resolve().parents[1]
KERNELS = str(REPO / "kernels")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """(results dir, config file, bundle of an H200, bundle of an H100) of small studies."""
    base = tmp_path_factory.mktemp("cli")
    config = make_config(variants=("cupy-default", "nvrtc-cubin-noftz"))
    bundles = []
    for name, gpu, driver in (
        ("h200", "NVIDIA H200", "580.95.05"),
        ("h100", "NVIDIA H100 80GB HBM3", "570.86.15"),
    ):
        root = base / name / "results"
        write_study(root, config, gpu=gpu, driver=driver)
        manifest = base / name / "manifest.json"
        build_manifest(root, result_files(root, config), config, manifest)
        bundles.append(make_bundle(root, manifest, base / f"{name}.tar.gz"))
    config_file = base / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    return base / "h200" / "results", config_file, bundles[0], bundles[1]


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli.main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    return rc, out, err


def test_version(capsys):
    with pytest.raises(SystemExit, match=r"^0$") as exit_:  # argparse exits 0 after --version
        cli.main(["--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out == f"kbfuse {__version__}\n"


def test_bad_arguments_exit_2(capsys):
    for argv in (["no-such-command"], ["compare", "a.tar.gz"], []):
        with pytest.raises(SystemExit, match=rf"^{cli.EXIT_CANNOT_RUN}$") as exit_:
            cli.main(argv)
        assert exit_.value.code == cli.EXIT_CANNOT_RUN
    assert "usage: kbfuse" in capsys.readouterr().err


def _bundle_with_manifest(made, tmp_path, manifest: bytes) -> Path:
    members = members_of(made[2])
    return repack({**members, MANIFEST_MEMBER: manifest}, tmp_path / "m.tar.gz")


@pytest.mark.parametrize(
    ("manifest", "words"),
    [
        (b"{not json", "is not valid JSON"),
        (b"[1, 2]", "expected a JSON object"),
        (b'{"kind": "timing"}', "field kind is 'timing'"),
        (b'{"kind": "manifest", "schema_version": 1}', "field files is missing"),
        (b"\xff\xfe", "is not valid JSON"),
    ],
)
def test_malformed_manifest_exits_1_with_a_message(made, tmp_path, capsys, manifest, words):
    bundle = _bundle_with_manifest(made, tmp_path, manifest)
    rc, _, err = run(capsys, "verify-bundle", str(bundle))
    assert rc == cli.EXIT_PROBLEMS and words in err and MANIFEST_MEMBER in err


def test_verify_bundle_exit_codes(made, tmp_path, capsys):
    _, _, good, _ = made
    assert run(capsys, "verify-bundle", str(good))[0] == cli.EXIT_OK
    members = members_of(good)
    name = RESULTS_PREFIX + "timing/53.json"
    tampered = repack({**members, name: members[name] + b" "}, tmp_path / "t.tar.gz")
    assert run(capsys, "verify-bundle", str(tampered))[0] == cli.EXIT_PROBLEMS
    junk = tmp_path / "junk.tar.gz"
    junk.write_bytes(b"junk")
    rc, _, err = run(capsys, "verify-bundle", str(junk))
    assert rc == cli.EXIT_PROBLEMS and "not a readable .tar.gz" in err
    for absent in (tmp_path / "absent.tar.gz", tmp_path):
        rc, _, err = run(capsys, "verify-bundle", str(absent))
        assert rc == cli.EXIT_CANNOT_RUN and "does not exist or is not a file" in err


def test_compare_labels_bundles_by_their_machine(made, tmp_path, capsys):
    _, _, h200, h100 = made
    out = tmp_path / "cmp"
    rc, stdout, _ = run(capsys, "compare", str(h200), str(h100), "--out", str(out))
    assert rc == cli.EXIT_OK and "difference(s) between the bundles" in stdout
    columns = list(pd.read_csv(out / "differences.csv").columns)
    assert columns == [
        "section",
        "key",
        "NVIDIA H200, driver 580.95.05, NVRTC 13.0.88",
        "NVIDIA H100 80GB HBM3, driver 570.86.15, NVRTC 13.0.88",
    ]
    argv = ["compare", str(h200), str(h100), "--out", str(out), "--label", "a", "--label", "b"]
    assert run(capsys, *argv)[0] == cli.EXIT_OK
    ftz = pd.read_csv(out / "ftz.csv")
    assert {"effective_ftz[a]", "effective_ftz[b]"} <= set(ftz.columns)
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{n}.{e}" for n in COMPARISON_TABLES for e in ("csv", "md")
    )


def test_compare_exit_codes(made, tmp_path, capsys):
    _, _, h200, h100 = made
    out = str(tmp_path / "cmp")
    taken = tmp_path / "taken"
    taken.write_text("x")
    cases = [
        (["compare", str(h200), "--out", out], "at least two bundles"),
        (["compare", str(h200), str(h100), "--out", str(taken)], "exists and is not a directory"),
        (["compare", str(h200), str(h100), "--out", out, "--label", "a"], "1 --label given"),
        (
            ["compare", str(h200), str(h100), "--out", out, "--label", "a]", "--label", "b"],
            "label 'a]' is not usable",
        ),
        (["compare", str(h200), str(tmp_path / "nope"), "--out", out], "does not exist"),
    ]
    for argv, words in cases:
        rc, _, err = run(capsys, *argv)
        assert rc == cli.EXIT_CANNOT_RUN and words in err, argv
    assert taken.read_text() == "x" and not Path(out).exists()
    members = members_of(h100)
    name = RESULTS_PREFIX + "timing/81.json"
    tampered = repack({**members, name: b"{}"}, tmp_path / "t.tar.gz")
    rc, _, err = run(capsys, "compare", str(h200), str(tampered), "--out", out)
    assert rc == cli.EXIT_PROBLEMS and "failed verification" in err
    assert [p.name for p in Path(out).iterdir()] == []


def test_summarize_exit_codes(made, tmp_path, capsys):
    results, config_file, _, _ = made
    out = tmp_path / "s"
    base = ["--kernels", KERNELS]
    rc, stdout, _ = run(capsys, "summarize", str(results), "--config", str(config_file),
                        "--out", str(out), *base)  # fmt: skip
    assert rc == cli.EXIT_OK and (out / "correctness.csv").is_file()
    bad_yaml = tmp_path / "bad.yaml"
    bad_yaml.write_text("tasks: [53\n")
    not_mapping = tmp_path / "list.yaml"
    not_mapping.write_text("- 53\n")
    invalid = tmp_path / "invalid.yaml"
    invalid.write_text(yaml.safe_dump({**yaml.safe_load(config_file.read_text()), "tasks": "53"}))
    taken = tmp_path / "taken"
    taken.write_text("x")
    problems = [
        (str(results), str(bad_yaml), str(out), "bad.yaml: while parsing"),
        (str(results), str(not_mapping), str(out), "expected a mapping"),
        (str(results), str(invalid), str(out), "config key tasks"),
        (str(tmp_path), str(config_file), str(out), "is missing"),
    ]
    for res, cfg, dest, words in problems:
        rc, _, err = run(capsys, "summarize", res, "--config", cfg, "--out", dest, *base)
        assert rc == cli.EXIT_PROBLEMS and words in err, words
    cannot = [
        (str(tmp_path / "nope"), str(config_file), str(out), "results directory"),
        (str(results), str(tmp_path / "nope.yaml"), str(out), "config file"),
        (str(results), str(config_file), str(taken), "exists and is not a directory"),
    ]
    for res, cfg, dest, words in cannot:
        rc, _, err = run(capsys, "summarize", res, "--config", cfg, "--out", dest, *base)
        assert rc == cli.EXIT_CANNOT_RUN and words in err, words


def test_the_installed_command_prints_no_traceback(made, tmp_path):
    bundle = _bundle_with_manifest(made, tmp_path, b"{broken")
    env = dict(os.environ, PYTHONPATH=str(REPO / "src"))
    for argv, code in (
        (["verify-bundle", str(bundle)], cli.EXIT_PROBLEMS),
        (["verify-bundle", "--json", str(tmp_path / "absent")], cli.EXIT_CANNOT_RUN),
        (["--version"], cli.EXIT_OK),
    ):
        proc = subprocess.run(
            [sys.executable, "-m", "kbfuse.workflow.cli", *argv],
            capture_output=True,
            text=True,
            env=env,
        )
        assert proc.returncode == code, proc.stderr
        assert "Traceback" not in proc.stderr
    assert proc.stdout == f"kbfuse {__version__}\n"
