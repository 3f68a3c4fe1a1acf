"""The candidate's side of a check, run in its own process (kbfuse.candidates.child).

Order matters: the timer snapshot and the clock (guards) and the build capture (capture) are
taken *before* the candidate file is imported. Then, stage by stage, each failure recorded
with its stage name and the run stopped there:

  build        import the task and the candidate file; construct `ModelNew` as KernelBench
               does (kbfuse.candidates.reference.build_instance); torch's switches
               (kbfuse.candidates.switches) read before the import and after the build;
  correctness  every case of cases.json in order, one instance per case instance; each
               case's inputs drawn here with the reference's code (reference.case_inputs,
               torch's default dtype and device as they were before the import) and their
               digest recorded (`inputs_sha256`); outputs written to outputs/{case}.pt as
               plain CPU tensors; the `weights` case changes the candidate's parameters in
               place as the reference did (same names needed);
  guards       the timing's instances made (the task's Model with torch's defaults from
               before the import, as the reference builds it) and its baselines built
               (Inductor compiles here); with a GPU lock, then the GPU alone (ask_alone);
               the task's Model and a fresh ModelNew profiled on official_0's inputs (side
               streams), the caller-stream race check;
  timing       torch's switches read again; candidate, eager, TorchScript and Inductor
               interleaved (candidates.timing), all under the switches the candidate left;
               the candidate's output after the timed region written to
               outputs/after_timing.pt.

runner.json holds the captured builds, the build.ninja flags, the guards' findings, the
timing and each stage's wall seconds (`stage_s`; the guards stage split into its baselines'
builds, the wait for the GPU alone and the guards themselves). It is written by the
candidate's process, so a hostile candidate could forge it (docs/check.md); the outputs are
compared with the reference in the parent.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from kbfuse.candidates import capture, guards, switches
from kbfuse.candidates.childio import (
    error_record,
    fresh_defaults,
    import_file,
    inputs_digest,
    save_tensors,
    to_device,
    torch_defaults,
    write_json,
)
from kbfuse.candidates.reference import (
    AFTER_TIMING,
    TIMING_CASE,
    build_instance,
    case_inputs,
    instance_seed,
    perturb_weights,
)


class Runner:
    def __init__(self, request: dict, out: Path) -> None:
        self.request, self.out = request, out
        self.device = request["device"]
        self.before = guards.snapshot()
        self.clock = guards.Clock()
        self.defaults = torch_defaults()
        capture.install()
        self.record: dict = {
            "failure": None,
            "switches": {"before_import": switches.read()},
            "patched": {"after_import": [], "after_calls": []},
            "lazy": [],
            "cases_run": [],
            "skipped_cases": {},
            "inputs_sha256": {},
            "stage_s": {},
        }

    def log(self, line: str) -> None:
        print(line, flush=True)

    def save(self) -> None:
        from kbfuse.candidates.flags import ninja_builds

        self.record["builds"] = capture.BUILDS
        self.record["capture_notes"] = capture.NOTES
        self.record["ninja"] = ninja_builds(os.environ.get("TORCH_EXTENSIONS_DIR", ""))
        write_json(self.out / "runner.json", self.record)

    def note_patches(self, when: str) -> None:
        found = guards.patched(self.before)
        known = self.record["patched"][when]
        known.extend(name for name in found if name not in known)

    def call(self, model, inputs: list):
        import torch

        with torch.no_grad():
            return model(*inputs)

    # ---------------------------------------------------------------- stages

    def build(self) -> None:
        import torch

        if self.device == "cuda":
            torch.cuda.set_per_process_memory_fraction(self.request["gpu_memory_fraction"])
        self.task = import_file(self.request["task_file"], "kbfuse_check_task")
        self.module = import_file(self.request["candidate"], "kbfuse_candidate")
        self.note_patches("after_import")
        if not hasattr(self.module, "ModelNew"):
            raise AttributeError("the candidate file defines no ModelNew")
        self.record["triton"] = capture.triton_used(self.module)
        # constructing may compile: still the build stage
        self.make(self.request["contract"]["seed"])
        self.record["switches"]["after_build"] = switches.read()

    def make(self, seed: int):
        return self.settled(build_instance(self.task, self.module.ModelNew, seed, self.device))

    def settled(self, value):
        """`value` once every copy to the device has landed: a host-to-device copy from
        pageable memory may still be in flight when it returns, and a candidate that reads
        on another stream must not see a half-copied input or weight."""
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
        return value

    def draw(self, name: str, recorded_as: str | None = None) -> list:
        """Case `name`'s CPU inputs, drawn as the reference drew them, their digest recorded
        under `recorded_as` (default: `name`). A case that reuses another's (`inputs_of`)
        draws that one again: nothing is kept between calls, so no call sees what an earlier
        one did to its inputs."""
        cases = {case["name"]: case for case in self.request["cases"]}
        source = cases[cases[name].get("inputs_of", name)]
        with fresh_defaults(self.defaults):
            inputs = case_inputs(self.task, source, {})
        self.record["inputs_sha256"][recorded_as or name] = inputs_digest(inputs)
        return inputs

    def correctness(self) -> None:
        cases = self.request["cases"]
        instances: dict[str, object] = {}
        for case in cases:
            name = case["name"]
            if case["instance"] not in instances:
                seed = instance_seed(case["instance"], self.request)
                instances[case["instance"]] = self.make(seed)
            model = instances[case["instance"]]
            if case.get("perturb"):
                names = self.settled(perturb_weights(model))
                if names != case.get("perturbed"):
                    self.record["skipped_cases"][name] = (
                        f"ModelNew's parameters {names} are not the task Model's "
                        f"{case.get('perturbed')}: its weights cannot be changed the same way"
                    )
                    continue
            inputs = self.settled(to_device(self.draw(name), self.device))
            output = self.call(model, inputs)
            self.note_patches("after_calls")
            self.keep_output(name, output)
            self.record["cases_run"].append(name)

    def keep_output(self, name: str, output) -> None:
        """Record a case's output after a device-wide synchronisation (as KernelBench's
        evaluator synchronises after each call): side-stream work is judged by the guards,
        not by a race here."""
        import torch

        if self.device == "cuda":
            torch.cuda.synchronize()
        lazy = guards.lazy_result(output)
        if lazy is not None:
            self.record["lazy"].append({"case": name, "why": lazy})
        if not isinstance(output, torch.Tensor):
            raise TypeError(f"case {name}: {lazy}")
        plain = output.detach().as_subclass(torch.Tensor).clone().cpu()
        save_tensors(self.out / "outputs" / f"{name}.pt", plain)

    def lap(self, name: str, since: float) -> float:
        """Record the wall seconds since `since` as stage_s[name]; the clock's now."""
        now = self.clock.perf_counter()
        self.record["stage_s"][name] = round(now - since, 3)
        return now

    def ask_alone(self) -> None:
        """Have the GPU alone from here on (the guards' race check and the timing): ask the
        parent (sandbox.Handoff) and wait until it has the GPU lock alone for this process."""
        handoff = self.request.get("handoff")
        if not handoff:
            return
        if self.device == "cuda":
            import torch

            torch.cuda.synchronize()  # nothing of this process still running meanwhile
        Path(handoff["request"]).touch()
        granted = Path(handoff["granted"])
        while not granted.exists():
            time.sleep(0.01)
        self.log("kbfuse check: the GPU alone")

    def timing_setup(self) -> None:
        self.x = self.settled(to_device(self.draw(TIMING_CASE, AFTER_TIMING), self.device))
        seed = self.request["contract"]["seed"]
        with fresh_defaults(self.defaults):  # the baselines' Model, as the reference's
            self.model = build_instance(self.task, self.task.Model, seed, self.device)
        self.candidate = self.make(seed)

    def guard_stage(self) -> None:
        """Set up the timing's instances, build the baselines, then, with the GPU alone, the
        guards' profiles and race check."""
        started = self.clock.perf_counter()
        self.timing_setup()
        self.prepare_baselines()
        started = self.lap("baselines", started)
        self.ask_alone()
        started = self.lap("alone_wait", started)
        self.guard_checks()
        self.lap("guards", started)

    def guard_checks(self) -> None:
        if self.device != "cuda":
            self.record["side_stream"] = None
            self.record["unfinished_on_caller_stream"] = None
            return
        caller = guards.profile_streams(
            lambda: self.call(self.model, self.x), self.out / "trace_reference.json"
        )
        first = guards.profile_streams(
            lambda: self.call(self.candidate, self.x), self.out / "trace_candidate_first.json"
        )
        mine = guards.profile_streams(
            lambda: self.call(self.candidate, self.x), self.out / "trace_candidate.json"
        )
        self.record["side_stream"] = guards.side_stream_work(caller, mine, first_call=first)
        self.record["unfinished_on_caller_stream"] = guards.unfinished_on_caller_stream(
            lambda: self.call(self.candidate, self.x)
        )
        self.note_patches("after_calls")

    def baselines(self) -> dict:
        import torch

        impls = {"candidate": lambda: self.call(self.candidate, self.x)}
        status: dict = {}
        for name in self.request["baselines"]:
            started = time.monotonic()
            try:
                impls[name] = self.baseline(name)
                impls[name]()  # Inductor compiles here
                if self.device == "cuda":
                    torch.cuda.synchronize()
                status[name] = {"status": "ok", "build_s": round(time.monotonic() - started, 3)}
            except Exception as exc:  # noqa: BLE001 - a baseline that fails is named, not fatal
                impls.pop(name, None)
                status[name] = {"status": "failed", "failure": error_record(exc, "build")}
        self.record["baselines"] = status
        return impls

    def baseline(self, name: str):
        import copy

        import torch

        model = self.model
        if name == "eager":
            return lambda: self.call(model, self.x)
        if name == "torchscript":
            frozen_source = copy.deepcopy(model).eval()
            with torch.no_grad():
                frozen = torch.jit.freeze(torch.jit.trace(frozen_source, tuple(self.x)))
            return lambda: self.call(frozen, self.x)
        compiled = torch.compile(model, dynamic=False)
        return lambda: self.call(compiled, self.x)

    def prepare_baselines(self) -> None:
        """The baselines built (TorchScript traced and frozen, Inductor compiled) while the
        device is still shared: compiling needs no GPU to itself."""
        self.note_patches("after_calls")
        self.impls = self.baselines()
        # Building the baselines (torch.jit, torch.compile) runs only kbfuse's code: the
        # snapshot is renewed, so the checks after it see what the candidate's calls did.
        self.before = guards.snapshot()

    def timing(self) -> None:
        from kbfuse.candidates.timing import time_all

        self.record["switches"]["at_timing"] = switches.read()
        self.record["timing"] = time_all(
            self.impls, self.request["timing"], self.clock, self.device, self.log
        )
        self.note_patches("after_calls")
        self.keep_output(AFTER_TIMING, self.call(self.candidate, self.x))

    def run(self) -> None:
        stages = [
            ("build", self.build),
            ("correctness", self.correctness),
            ("guards", self.guard_stage),
            ("timing", self.timing),
        ]
        self.record["stages_done"] = []
        for stage, step in stages:
            self.log(f"kbfuse check: stage {stage}")
            started = self.clock.perf_counter()
            try:
                step()
                if stage != "guards":  # split into its parts there
                    self.lap(stage, started)
            except Exception as exc:  # noqa: BLE001 - recorded with its stage
                self.record["failure"] = error_record(exc, stage)
                self.log(self.record["failure"]["traceback"])
                break
            finally:
                self.save()
            self.record["stages_done"].append(stage)
        self.save()


def run_candidate(request: dict, out: Path) -> None:
    Runner(request, out).run()
