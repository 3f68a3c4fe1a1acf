# The survey's summary (tables, plots) and the `survey` target; survey.smk writes the records
# (SURVEY: the survey block with defaults; survey_record_files: every record of every task and
# numerics mode; survey_floor_files: every task's memory floor, a record each;
# SURVEY_CHECKOUT: the pinned KernelBench checkout, whose H100 timings are the anchor;
# survey_path: a survey file of the configured level). kbfuse.survey.summary holds the logic,
# docs/survey.md what the tables say.
from kbfuse import layout
from kbfuse.survey.summary import caption_name as survey_caption
from kbfuse.survey.summary import summary_outputs as survey_summary_outputs

SURVEY_SUMMARY = survey_path("survey_summary")
SURVEY_SUMMARY_CODE = module_files("survey.summary", "survey.plots")


# On a GPU the summary also reads the env fingerprint: the copy bandwidth the floor is
# divided by.
SURVEY_SUMMARY_BANDWIDTH = (
    {"fingerprint": layout.record("env")} if SURVEY.get("device") == "cuda" else {}
)


rule survey_summary:
    input:
        **SURVEY_SUMMARY_BANDWIDTH,
        records=survey_record_files,
        floors=survey_floor_files,
        checkout=SURVEY_CHECKOUT,
        code=SURVEY_SUMMARY_CODE,
    output:
        [
            report(
                f"{SURVEY_SUMMARY}/{name}",
                caption=f"../report/{survey_caption(name)}",
                category="Survey",
            )
            for name in survey_summary_outputs(SURVEY["numerics"])
        ],
    log:
        survey_path("survey_summary_log"),
    conda:
        ENV
    params:
        modes=SURVEY["numerics"],
    script:
        "../scripts/survey_summary.py"


rule survey:
    input:
        survey_record_files,
        [
            f"{SURVEY_SUMMARY}/{name}"
            for name in survey_summary_outputs(SURVEY["numerics"])
        ],
