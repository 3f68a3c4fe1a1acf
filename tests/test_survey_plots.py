"""The survey's figures: drawn from the tables of hand-built records, one pair per mode, and
drawn (saying so) when there is nothing to show."""

from __future__ import annotations

import pytest
from survey_records import record

from kbfuse.survey import plots
from kbfuse.survey import summary as s


def tables(recs, mode="strict"):
    built = s.build_survey_tables({mode: recs}, None)
    return built[s.main_table(mode)], built["categories"]


def is_png(path) -> bool:
    return path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_both_figures_of_a_mode_are_written(tmp_path):
    main, cats = tables([record(), record(task=66, blind_spot=True)])
    written = plots.write_plots(main, cats, "strict", tmp_path)
    assert [p.name for p in written] == [
        "where_to_fuse_strict.png",
        "time_split_strict.png",
        "speedup_vs_outside_strict.png",
    ]
    assert all(is_png(p) for p in written)


def test_same_tables_give_the_same_bytes(tmp_path):
    main, cats = tables([record()])
    a = plots.write_plots(main, cats, "strict", tmp_path / "a")
    b = plots.write_plots(main, cats, "strict", tmp_path / "b")
    assert [p.read_bytes() for p in a] == [p.read_bytes() for p in b]


def test_segments_sum_categories_into_four_bars():
    row = {
        f"{c}_ms": v
        for c, v in zip(
            [
                "library",
                "generated",
                "framework_pointwise",
                "framework_reduction",
                "copy_other",
                "unclassified",
            ],
            [4.0, 1.0, 0.5, 0.25, 0.125, 0.0625],
            strict=True,
        )
    }
    assert plots._segments(row) == {
        "library": 4.0,
        "generated": 1.0,
        "framework": 0.75,
        "other": 0.1875,
    }


@pytest.mark.parametrize("drop", ["kernels", "all"])
def test_figures_without_data_are_drawn_not_refused(tmp_path, drop):
    rec = record()
    for b in rec["baselines"].values():
        b["kernels"] = None
    recs = [rec] if drop == "kernels" else []
    main, cats = tables(recs)
    written = plots.write_plots(main, cats, "strict", tmp_path)
    assert all(is_png(p) for p in written)
