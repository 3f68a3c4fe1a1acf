"""Comparing bundles: shared keys side by side, everything else listed as a difference."""

from __future__ import annotations

import copy

import pandas as pd
import pytest
from test_bundle import members_of, repack, result_files
from test_summary import make_config, write_study

from kbfuse.errors import KbfuseError
from kbfuse.io import read_json, write_json
from kbfuse.results.bundle import RESULTS_PREFIX, make_bundle
from kbfuse.results.compare import ABSENT, COMPARISON_TABLES, compare_bundles
from kbfuse.results.manifest import build_manifest
from kbfuse.workflow import cli

OTHER_COMMIT = "0123456789abcdef0123456789abcdef01234567"


def bundle_for(base, name, config, edit=None, **machine):
    root = base / name / "results"
    write_study(root, config, **machine)
    if edit is not None:
        edit(root)
    manifest = base / name / "manifest.json"
    build_manifest(root, result_files(root, config), config, manifest)
    return make_bundle(root, manifest, base / f"{name}.tar.gz")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory):
    """h200: the reference study; h100: another GPU and driver, one variant fewer, more
    timing rounds and another KernelBench commit."""
    base = tmp_path_factory.mktemp("compare")
    config_a = make_config(variants=("cupy-default", "nvrtc-cubin-noftz", "nvrtc-cubin-ftz"))
    config_b = copy.deepcopy(config_a)
    del config_b["variants"]["nvrtc-cubin-ftz"]
    config_b["timing"]["rounds"] = 7
    config_b["kernelbench"]["commit"] = OTHER_COMMIT
    a = bundle_for(base, "h200", config_a)
    b = bundle_for(base, "h100", config_b, gpu="NVIDIA H100 80GB HBM3", driver="570.86.15")
    return a, b, config_a, config_b


def test_side_by_side_tables_hold_only_shared_keys(bundles):
    a, b, config_a, config_b = bundles
    tables = compare_bundles([a, b], ["h200", "h100"])
    assert list(tables) == COMPARISON_TABLES

    ftz = tables["ftz"]
    assert list(ftz["variant"]) == ["cupy-default", "nvrtc-cubin-noftz"]
    assert list(ftz["effective_ftz[h200]"]) == [True, False]
    assert list(ftz["effective_ftz[h100]"]) == [True, False]

    bits = tables["bit_identity"]
    shared_impls = ["cupy-default", "nvrtc-cubin-noftz", "torchscript", "inductor"]
    assert list(zip(bits["task"], bits["implementation"], strict=True)) == [
        (t, i) for t in config_a["tasks"] for i in shared_impls
    ]
    assert (bits["bit_identical_cases[h200]"] <= bits["cases[h200]"]).all()
    assert str(bits["elements_bit_equal[h100]"].dtype) == "Int64"

    tail = tables["tail_time"]
    assert not tail["median_ms[h200]"].isna().any() and not tail["median_ms[h100]"].isna().any()
    assert "nvrtc-cubin-ftz" not in set(tail["impl"])
    assert {"pct_of_floor[h200]", "pct_of_floor[h100]"} <= set(tail.columns)
    # task 53's cupy-default is gated out of timing in both runs
    assert not ((tail["task"] == 53) & (tail["impl"] == "cupy-default")).any()
    assert set(tables["full_time"]["method"]) == {"events", "graph"}


def test_differences_name_config_pin_fingerprint_and_unshared_rows(bundles):
    a, b, _, _ = bundles
    diff = compare_bundles([a, b], ["h200", "h100"])["differences"]
    assert list(diff.columns) == ["section", "key", "h200", "h100"]
    rows = {(r.section, r.key): (r.h200, r.h100) for r in diff.itertuples()}
    assert rows[("config", "timing.rounds")] == ("5", "7")
    assert rows[("config", "kernelbench.commit")][1] == f'"{OTHER_COMMIT}"'
    assert rows[("config", "variants.nvrtc-cubin-ftz.route")] == ('"nvrtc-cubin"', ABSENT)
    assert rows[("kernelbench_pin", "commit")][1] == f'"{OTHER_COMMIT}"'
    assert rows[("fingerprint", "gpu.name")] == ('"NVIDIA H200"', '"NVIDIA H100 80GB HBM3"')
    assert rows[("fingerprint", "driver.nvidia_smi.driver_version")] == (
        '"580.95.05"',
        '"570.86.15"',
    )
    assert rows[("rows:ftz", "variant=nvrtc-cubin-ftz, route=nvrtc-cubin")] == (
        "present",
        ABSENT,
    )
    assert ("rows:bit_identity", "task=81, implementation=nvrtc-cubin-ftz") in rows
    # identical values are not differences
    assert ("config", "tolerance.atol") not in rows
    assert ("fingerprint", "torch") not in rows
    assert all(h200 != h100 for h200, h100 in rows.values())


def test_same_bundle_twice_has_no_differences(bundles, tmp_path):
    a, _, _, _ = bundles
    tables = compare_bundles([a, a], workdir=tmp_path)
    label = "NVIDIA H200, driver 580.95.05, NVRTC 13.0.88"  # the machine, from the fingerprint
    assert list(tables["differences"].columns) == ["section", "key", label, f"{label} #2"]
    assert tables["differences"].empty
    assert list(tmp_path.iterdir()) == []  # extracted results are removed
    ftz = tables["ftz"]
    assert (ftz[f"effective_ftz[{label}]"] == ftz[f"effective_ftz[{label} #2]"]).all()
    tail = tables["tail_time"]
    pd.testing.assert_series_equal(
        tail[f"median_ms[{label}]"], tail[f"median_ms[{label} #2]"], check_names=False
    )


def test_compare_refuses_a_bundle_that_fails_verification(bundles, tmp_path):
    a, b, _, _ = bundles
    members = members_of(b)
    name = RESULTS_PREFIX + "timing/81.json"
    tampered = repack({**members, name: members[name] + b" "}, tmp_path / "h100.tar.gz")
    with pytest.raises(KbfuseError, match="failed verification: .*timing/81.json"):
        compare_bundles([a, tampered])
    with pytest.raises(KbfuseError, match="at least two bundles"):
        compare_bundles([a])


def test_cli_compare_writes_every_table(bundles, tmp_path, capsys):
    a, b, _, _ = bundles
    out = tmp_path / "cmp"
    assert cli.main(["compare", str(a), str(b), "--out", str(out)]) == cli.EXIT_OK
    for name in COMPARISON_TABLES:
        assert (out / f"{name}.csv").is_file() and (out / f"{name}.md").is_file()
    written = pd.read_csv(out / "differences.csv")
    assert "timing.rounds" in set(written["key"])
    assert "difference(s) between the bundles" in capsys.readouterr().out
    absent = str(tmp_path / "absent.tar.gz")
    assert cli.main(["compare", str(a), absent, "--out", str(out)]) == cli.EXIT_CANNOT_RUN


def as_cuda12(root):
    """The same study as if the NVRTC variants had been compiled by NVRTC 12.9: another
    compiler in the metadata, and (made up) one flushing difference fewer on task 81."""
    for meta_path in root.glob("compile/nvrtc-*/meta.json"):
        meta = read_json(meta_path)
        meta["compiler"].update(version="12.9", full_version="12.9.86")
        write_json(meta_path, meta)
    controls = read_json(root / "controls/81.json")
    controls["exhaustive"]["nvrtc-cubin-ftz"]["differ"] = 999
    write_json(root / "controls/81.json", controls)


def test_a_cuda12_bundle_beside_a_cuda13_one_says_variant_by_variant_what_changed(tmp_path):
    config = make_config(variants=("cupy-default", "nvrtc-cubin-noftz", "nvrtc-cubin-ftz"))
    a = bundle_for(tmp_path, "cuda13", config)
    b = bundle_for(tmp_path, "cuda12", config, edit=as_cuda12)
    tables = compare_bundles([a, b], ["cuda13", "cuda12"])
    toolchain = tables["toolchain"].set_index("variant")
    assert toolchain.loc["nvrtc-cubin-noftz", "toolchain[cuda13]"] == "nvrtc 13.0.88"
    assert toolchain.loc["nvrtc-cubin-noftz", "toolchain[cuda12]"] == "nvrtc 12.9.86"
    assert toolchain.loc["nvrtc-cubin-noftz", "changed"] == "toolchain"
    assert toolchain.loc["cupy-default", "changed"] == ""  # CuPy's route: not rebuilt
    exhaustive = tables["exhaustive"]
    changed = exhaustive[exhaustive["changed"] != ""]
    assert list(zip(changed["task"], changed["variant"], changed["changed"], strict=True)) == [
        (81, "nvrtc-cubin-ftz", "differ")
    ]
    assert list(changed["differ[cuda13]"]) == [1000] and list(changed["differ[cuda12]"]) == [999]
