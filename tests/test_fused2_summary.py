"""The second study's summary on the CPU: which tables it writes, the survey's prediction beside
what a timing record measured, and the contract table (kbfuse.results.prediction, tables).

The survey rows are the committed H200 reference's (results/reference/h200/survey); the timing
and correctness records are built here, small and by hand, to pin the arithmetic down: they
stand for no run.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kbfuse import layout
from kbfuse.checks import contract
from kbfuse.errors import KbfuseError
from kbfuse.results import prediction
from kbfuse.results.study import StudyResults, survey_rows_of
from kbfuse.results.tables import contract_table, prediction_table
from kbfuse.tasks.tails import tail_for
from kbfuse.workflow.config import load_config
from kbfuse.workflow.studies import fused2_config

ROOT = Path(__file__).resolve().parents[1]
SURVEY = ROOT / "results/reference/h200/survey/survey/summary"
AUTOTUNE = "inductor-max-autotune-no-cudagraphs"
GBPS = 4244.575470431294  # the H200 reference's measured copy bandwidth (env/fingerprint.json)


@pytest.fixture(scope="module")
def configs():
    config = load_config(ROOT / "config/config.yaml", ROOT / "kernels")
    second = fused2_config(config)
    second["survey_summary"] = str(SURVEY)
    return config, second


def test_only_the_second_study_writes_the_contract_and_prediction_tables(configs):
    first, second = configs
    assert layout.study_tables(first) == [
        name for name, table in layout.TABLES.items() if not table.second_study
    ]
    assert layout.study_tables(second) == list(layout.TABLES)
    assert {"contract", "prediction"} == set(layout.TABLES) - set(layout.study_tables(first))
    names = layout.summary_outputs(second)
    assert {"contract.csv", "contract.md", "prediction.csv", "prediction.md"} <= set(names)
    assert {"tail_time_4.png", "tail_time_65.png"} <= set(names)
    assert len(names) == 2 * len(layout.TABLES) + 2 + 1


def test_the_survey_rows_of_the_second_study(configs):
    _, second = configs
    rows = prediction.survey_rows(second)
    assert list(rows) == [4, 65]
    # each task in its mode (config fused2.numerics): 4 in KernelBench's defaults, 65 strict
    assert rows[4] == {
        "best_compiled": "inductor-max-autotune-no-cudagraphs",
        "best_ms": pytest.approx(4.425152063369751),
        "library_ms": pytest.approx(1.6701716666666664),
        "outside_ms": pytest.approx(2.7549803967030844),
        "numerics": "kernelbench-defaults",
    }
    assert rows[65]["numerics"] == "strict" and rows[65]["best_compiled"] == "torchscript"
    assert rows[65]["library_ms"] == pytest.approx(5.979702999999999)
    strict = prediction.read_survey_rows(SURVEY, "strict")
    assert strict[4]["best_compiled"] == "torchscript"


def test_a_missing_survey_is_named(tmp_path, configs):
    _, second = configs
    with pytest.raises(KbfuseError, match=r"survey summary .*survey_strict.csv is missing"):
        prediction.read_survey_rows(tmp_path, "strict")
    (tmp_path / "survey_strict.csv").write_text("task,best_ms\n4,1.0\n")
    with pytest.raises(KbfuseError, match=r"lacks column\(s\) \['best_compiled', 'library_ms'"):
        prediction.read_survey_rows(tmp_path, "strict")
    (tmp_path / "survey_strict.csv").write_text(
        "task,best_compiled,best_ms,library_ms,outside_ms\n1,inductor,2.0,1.0,1.0\n"
    )
    with pytest.raises(KbfuseError, match=r"has no row for 4"):
        prediction.survey_rows({**second, "survey_summary": str(tmp_path), "numerics": "strict"})


def measurement(median_ms: float) -> dict:
    return {
        "median_ms": median_ms,
        "q1_ms": median_ms,
        "q3_ms": median_ms,
        "samples_ms": [median_ms],
    }


def timing_record(tail_bytes: int) -> dict:
    """A timing record's fields the prediction reads: eager 7.0, TorchScript 18.0, Inductor
    4.0, the fused program 2.5 ms; its tail 1.25 ms."""
    full = {"eager": 7.0, "torchscript": 18.0, "inductor": 4.0, "fast": 2.5}
    return {
        "timed": ["eager", "torchscript", "inductor", "fast"],
        "tail_bytes": tail_bytes,
        "measurements": {
            "full/graph": {name: measurement(ms) for name, ms in full.items()},
            "tail/graph": {"eager": measurement(2.0), "fast": measurement(1.25)},
        },
        "ratios": {"full/graph": {"fast": {"vs_inductor": {"median": 1.58, "q1": 1.5, "q3": 1.6}}}},
    }


def test_prediction_rows_put_the_measured_time_beside_the_surveys(configs):
    _, second = configs
    survey = prediction.survey_rows(second)[4]
    y = torch.empty(64, 128, 254, 254, device="meta")  # task 4's library output at the pin
    tail_bytes = tail_for(4).bytes_moved(y)
    assert tail_bytes == 2 * 4 * 64 * 128 * 254 * 254 + 4 * 128
    (row,) = prediction.prediction_rows(
        4, "kernelbench-defaults", survey, timing_record(tail_bytes), ["fast"], GBPS
    )
    floor_ms = tail_bytes / (GBPS * 1e9) * 1e3
    assert row["floor_ms"] == pytest.approx(floor_ms) and 0.99 < floor_ms < 1.0
    assert row["predicted_ms"] == pytest.approx(survey["library_ms"] + floor_ms)
    assert row["predicted_speedup"] == pytest.approx(survey["best_ms"] / row["predicted_ms"])
    assert (row["best_compiled"], row["best_compiled_ms"]) == ("inductor", 4.0)
    assert row["speedup_vs_best_compiled"] == pytest.approx(4.0 / 2.5)
    assert row["paired_speedup_vs_best_compiled"] == 1.58
    assert row["tail_pct_of_floor"] == pytest.approx(100 * floor_ms / 1.25)
    assert row["meets_speedup_target"] is True  # 1.6 >= 1.3
    assert row["meets_floor_target"] is False  # about 80 % < 85 %
    assert row["fused_over_predicted"] == pytest.approx(2.5 / row["predicted_ms"])


def test_the_strongest_compiled_baseline_is_whichever_ran_fastest():
    full = {name: measurement(ms) for name, ms in {"eager": 1.0, "a": 3.0, "b": 2.0}.items()}
    assert prediction.strongest_compiled(full, ["eager", "a", "b"]) == "b"
    assert prediction.strongest_compiled(full, ["eager", "a"]) == "a"
    assert prediction.strongest_compiled(full, ["eager"]) is None


def reduction_case(name, stage_equal, deciding, tail, task):
    def comparison(ratio):
        return {
            "reference": "x",
            "eager_max_abs_error": 1.0,
            "candidate_max_abs_error": ratio,
            "nonfinite_match": True,
            "no_worse": ratio <= 1.0,
        }

    stage = {"name": name, "elements": 10, "bit_equal": 10 if stage_equal else 9}
    stage["bit_identical"] = stage_equal
    return contract.reduction_case(
        name,
        "full_program",
        {**stage, "max_abs_diff": 0.0, "nonfinite_match": True},
        comparison(deciding),
        comparison(tail),
        None if task is None else comparison(task),
    )


def test_the_contract_table_joins_correctness_and_the_exhaustive_control(configs):
    _, second = configs
    cases = [
        reduction_case("seed0/uniform", True, 0.5, 0.9, 1.2),
        reduction_case("tail/bounds", True, 1.0, 1.0, None),
    ]
    point_cases = [
        {"name": "seed0/uniform", "group": "full_program", "bit_equal": 4, "elements": 4}
    ]
    res = StudyResults(
        config=second,
        root=Path("."),
        pin={},
        fingerprint={},
        contract={},
        compile_meta={"v": {"kernel": "fused2_fast"}},
        correctness={
            (4, "v"): {"contract": contract.verdict("bit-identical", point_cases, [])},
            (65, "v"): {"contract": contract.verdict("reduction-float64", [], cases)},
        },
        controls={4: {"exhaustive": {"v": {"differ": 0, "bit_identical": True}}}},
    )
    rows = contract_table(res).to_dict("records")
    four, sixty_five = rows
    assert (four["task"], four["contract"], four["holds"], four["exhaustive_differ"]) == (
        4,
        "bit-identical",
        True,
        0,
    )
    assert sixty_five["holds"] and sixty_five["cases_checked"] == 2
    assert sixty_five["stage_elements"] == 20 and sixty_five["stage_bit_equal"] == 20
    assert sixty_five["reduction_worst_ratio"] == 1.0
    assert (sixty_five["tail_no_worse_cases"], sixty_five["tail_cases"]) == (2, 2)
    assert (sixty_five["task_no_worse_cases"], sixty_five["task_cases"]) == (0, 1)
    # a pointwise tail whose exhaustive control differs does not hold its contract
    res.controls[4]["exhaustive"]["v"] = {"differ": 3, "bit_identical": False}
    assert not contract_table(res).to_dict("records")[0]["holds"]


def test_the_prediction_table_reads_every_timed_variant(configs):
    _, second = configs
    y65 = torch.empty(128, 64, 382, 382, device="meta")
    res = StudyResults(
        config={**second, "variants": {"fast": {}}},
        root=Path("."),
        pin={},
        fingerprint={"copy_bandwidth": {"gbps": GBPS}},
        contract={},
        timing={65: timing_record(tail_for(65).bytes_moved(y65))},
        paths={("env",): Path("env/fingerprint.json")},
        survey=prediction.survey_rows(second),
    )
    (row,) = prediction_table(res).to_dict("records")
    assert row["task"] == 65 and row["numerics"] == "strict"
    assert 1.12 < row["floor_ms"] < 1.13  # 4.78 GB read once at 4245 GB/s
    # the survey's strict TorchScript, 11.29 ms, over its library time plus that floor
    assert row["predicted_speedup"] == pytest.approx(
        11.286880016326904 / (5.979702999999999 + row["floor_ms"])
    )


def test_the_survey_rows_record_holds_what_the_prediction_reads(configs, tmp_path):
    from kbfuse.io import read_json, sha256_file
    from kbfuse.results.records import validate_record

    _, second = configs
    out = tmp_path / "prediction" / "survey_rows.json"
    record = prediction.write_survey_rows(second, out)
    assert read_json(out) == record
    validate_record(read_json(out), "survey_rows", str(out))
    assert record["tables"] == {
        mode: {"file": f"survey_{mode}.csv", "sha256": sha256_file(SURVEY / f"survey_{mode}.csv")}
        for mode in ("kernelbench-defaults", "strict")
    }
    res = StudyResults(
        config=second,
        root=tmp_path,
        pin={},
        fingerprint={},
        contract={},
        paths={("survey_rows",): out},
    )
    rows = survey_rows_of(res, read_json(out))
    assert rows[65]["numerics"] == "strict" and rows[4]["best_compiled"] == AUTOTUNE
    # a record made for other modes is stale
    res.config = {**second, "numerics": "strict"}
    with pytest.raises(KbfuseError, match=r"field rows\.4\.numerics is 'kernelbench-defaults'"):
        survey_rows_of(res, read_json(out))
    assert layout.record("survey_rows", "results/fused2") == (
        "results/fused2/prediction/survey_rows.json"
    )
    assert ("survey_rows",) in layout.result_paths(second)
    first, _ = configs
    assert ("survey_rows",) not in layout.result_paths(first)
