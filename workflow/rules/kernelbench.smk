# The pinned commit is the checkout's identity (a param: changing it reruns the checkout and
# all that depends on it); the URL is only transport, so the script reads it from the config
# and changing it (another mirror, path or file:// URL) reruns and deletes nothing.
rule kernelbench_checkout:
    output:
        checkout=directory("results/kernelbench/checkout"),
        record="results/kernelbench/checkout.json",
    log:
        "results/logs/kernelbench/checkout.log",
    conda:
        ENV
    params:
        commit=config["kernelbench"]["commit"],
        level=config["kernelbench"]["level"],
    script:
        "../scripts/kernelbench_checkout.py"


rule kernelbench_task:
    input:
        checkout="results/kernelbench/checkout",
        record="results/kernelbench/checkout.json",
        code=module_files("kernelbench"),
    output:
        pin="results/kernelbench/tasks/{task}.json",
    log:
        "results/logs/kernelbench/task-{task}.log",
    conda:
        ENV
    script:
        "../scripts/kernelbench_task.py"


rule kernelbench_pin:
    input:
        record="results/kernelbench/checkout.json",
        tasks=expand("results/kernelbench/tasks/{task}.json", task=TASKS),
        code=module_files("kernelbench"),
    output:
        pin="results/kernelbench/pin.json",
    log:
        "results/logs/kernelbench/pin.log",
    conda:
        ENV
    script:
        "../scripts/kernelbench_pin.py"
