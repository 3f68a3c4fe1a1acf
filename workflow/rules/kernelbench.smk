# The pinned commit is the checkout's identity (a param: changing it reruns the checkout and
# all that depends on it); the URL is only transport, so the script reads it from the config
# and changing it (another mirror, path or file:// URL) reruns and deletes nothing.
rule kernelbench_checkout:
    output:
        checkout=directory(layout.file("checkout")),
        record=layout.file("checkout_record"),
    log:
        layout.log("kernelbench/checkout"),
    conda:
        ENV
    params:
        commit=config["kernelbench"]["commit"],
        level=config["kernelbench"]["level"],
    script:
        "../scripts/kernelbench_checkout.py"


rule kernelbench_task:
    input:
        checkout=layout.file("checkout"),
        record=layout.file("checkout_record"),
        code=module_files("tasks.kernelbench"),
    output:
        pin=layout.file("task_pin"),
    log:
        layout.log("kernelbench/task-{task}"),
    conda:
        ENV
    script:
        "../scripts/kernelbench_task.py"


# The official check (tolerance, argument order, seeds, trials, timing method) as the pinned
# evaluator's own source makes it: every judge (study, survey, check) reads it from here.
rule kernelbench_contract:
    input:
        checkout=layout.file("checkout"),
        record=layout.file("checkout_record"),
        code=module_files("tasks.evaluator"),
    output:
        contract=layout.record("kernelbench_contract"),
    log:
        layout.log("kernelbench/contract"),
    conda:
        ENV
    script:
        "../scripts/kernelbench_contract.py"


rule kernelbench_pin:
    input:
        record=layout.file("checkout_record"),
        tasks=[task_pin(task) for task in TASKS],
        code=module_files("tasks.kernelbench"),
    output:
        pin=layout.record("kernelbench_pin"),
    log:
        layout.log("kernelbench/pin"),
    conda:
        ENV
    script:
        "../scripts/kernelbench_pin.py"
