"""Placement of GPU jobs on the devices of one machine (kbfuse.workflow.devices), on the CPU.

The devices are fakes (index, UUID, name): the choice reads only the lock files in a test
folder, so N devices need no GPU. Each job that must hold its lock or its slot while another
one is placed is a child process (flock treats two processes as two holders; `placed` also
sets the process's environment, which threads would share).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from kbfuse.compilation import cudadriver
from kbfuse.errors import KbfuseError
from kbfuse.workflow import devices, gpulock, jobs
from kbfuse.workflow.devices import Device

ROOT = Path(__file__).resolve().parents[1]


def fake_devices(n: int) -> list[Device]:
    return [
        Device(i, f"GPU-{i:08x}-0000-0000-0000-00000000000{i % 10}", "Fake H200") for i in range(n)
    ]


@pytest.fixture
def no_placement_env(monkeypatch):
    for key in (devices.VISIBLE, devices.PLACED):
        monkeypatch.delenv(key, raising=False)


# -- whether there is anything to choose ---------------------------------------------------------


@pytest.mark.parametrize(
    ("visible", "several"),
    [("0", False), ("GPU-abc", False), ("0,1", True), ("2,3,5", True), ("0,", False),
     ("", False), (",1", False)],
)  # fmt: skip
def test_cuda_visible_devices_says_whether_there_is_a_choice(tmp_path, visible, several):
    assert devices.maybe_several({devices.VISIBLE: visible}, dev=tmp_path) is several


def test_without_cuda_visible_devices_the_device_nodes_say_it(tmp_path):
    for name in ("nvidia0", "nvidiactl", "nvidia-uvm", "nvidia-modeset"):
        (tmp_path / name).touch()
    assert devices.device_nodes(tmp_path) == 1
    assert devices.maybe_several({}, dev=tmp_path) is False  # one GPU: nothing asked
    (tmp_path / "nvidia1").touch()
    assert devices.maybe_several({}, dev=tmp_path) is True
    assert devices.device_nodes(tmp_path / "missing") == 0


def test_one_gpu_is_never_listed_in_a_child(monkeypatch):
    monkeypatch.setattr(devices, "maybe_several", lambda: False)
    monkeypatch.setattr(devices, "list_in_child", lambda: pytest.fail("listed"))
    assert devices.several_visible() == []


def test_a_single_device_listed_leaves_cudas_view_alone(monkeypatch):
    monkeypatch.setattr(devices, "maybe_several", lambda: True)
    monkeypatch.setattr(devices, "list_in_child", lambda: fake_devices(1))
    assert devices.several_visible() == []
    monkeypatch.setattr(devices, "list_in_child", lambda: fake_devices(3))
    assert devices.several_visible() == fake_devices(3)


def test_a_child_that_cannot_list_the_devices_gives_none(monkeypatch):
    monkeypatch.setattr(sys, "executable", "/nonexistent/python")
    assert devices.list_in_child() == []


# -- one visible device: exactly as before ----------------------------------------------------


def test_one_device_places_nothing_and_sets_nothing(tmp_path, no_placement_env):
    for listed in ([], fake_devices(1)):
        with devices.placed("alone", devices=listed, folder=tmp_path) as device:
            assert device is None
            assert devices.VISIBLE not in os.environ and devices.PLACED not in os.environ
    assert list(tmp_path.iterdir()) == []  # no slot, no placement lock


def test_one_device_job_takes_the_same_lock_as_before(tmp_path, monkeypatch, no_placement_env):
    """On one GPU the job's lock is still device 0's (gpulock.device_key), and the job is not
    placed: no variable set, nothing listed."""
    monkeypatch.setattr(devices, "maybe_several", lambda: False)
    monkeypatch.setattr(jobs, "require_gpu", lambda stage, torch=True: None)
    monkeypatch.setattr(cudadriver, "device_uuid", lambda ordinal=0: "GPU-only-one")
    monkeypatch.setenv(gpulock.LOCK_DIR_VARIABLE, str(tmp_path))
    held = {}
    real = jobs._hold_the_gpu

    def spy(how):
        context = real(how)
        held["how"] = how
        return context

    monkeypatch.setattr(jobs, "_hold_the_gpu", spy)
    with jobs.job(tmp_path / "log.txt", "timing", gpu=True, gpu_lock="alone"):
        assert devices.VISIBLE not in os.environ
        assert sorted(p.name for p in tmp_path.glob("kbfuse-gpu-*")) == [
            "kbfuse-gpu-GPU-only-one.lock",
            "kbfuse-gpu-GPU-only-one.queue",
            "kbfuse-gpu-GPU-only-one.turnstile",
        ]
    assert held == {"how": "alone"}


def test_current_on_one_device_asks_the_driver(monkeypatch, no_placement_env):
    monkeypatch.setattr(cudadriver, "device_uuid", lambda ordinal=0: "GPU-1234")
    monkeypatch.setattr(cudadriver, "device_name", lambda ordinal=0: "NVIDIA H200")
    assert devices.current("cuda") == {"index": 0, "uuid": "GPU-1234", "name": "NVIDIA H200"}
    assert devices.current("cpu") is None

    def no_driver(ordinal=0):
        raise cudadriver.NoCudaDriver("no libcuda")

    monkeypatch.setattr(cudadriver, "device_uuid", no_driver)
    assert devices.current("cuda") is None


# -- the choice --------------------------------------------------------------------------------


def test_pick_takes_the_least_loaded_device_then_the_lowest_index():
    four = fake_devices(4)
    load = {four[0].uuid: 2, four[1].uuid: 1, four[2].uuid: 1, four[3].uuid: 3}
    assert devices.pick(four, "shared", load, {}) == four[1]
    assert devices.pick(four, "shared", {}, {}) == four[0]


def test_pick_puts_a_timing_job_where_nothing_runs():
    three = fake_devices(3)
    load = {d.uuid: 1 for d in three}
    busy = {three[0].uuid: True, three[1].uuid: False, three[2].uuid: True}
    assert devices.pick(three, "alone", load, busy) == three[1]
    # a sharing job does not care
    assert devices.pick(three, "shared", load, busy) == three[0]
    # every device in use: the least loaded, where it will wait for its turn
    busy = dict.fromkeys(busy, True)
    assert devices.pick(three, "alone", {three[0].uuid: 2, three[1].uuid: 1, three[2].uuid: 1},
                        busy) == three[1]  # fmt: skip


def test_pick_refuses_a_bad_mode_or_no_device():
    with pytest.raises(KbfuseError, match="placement mode 'both'"):
        devices.pick(fake_devices(2), "both", {}, {})
    with pytest.raises(KbfuseError, match="no device"):
        devices.pick([], "shared", {}, {})


def test_jobs_spread_over_n_devices_round_robin(tmp_path):
    four = fake_devices(4)
    slots = []
    order = []
    for _ in range(10):
        device, slot = devices.choose(four, "shared", tmp_path)
        slots.append(slot)
        order.append(device.index)
    assert order == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1]
    assert [devices.load_of(tmp_path, d) for d in four] == [3, 3, 2, 2]
    # a job on device 0 ends: devices 0, 2 and 3 hold two, the next job goes to the first
    slots[0].close()
    assert devices.load_of(tmp_path, four[0]) == 2
    device, slot = devices.choose(four, "shared", tmp_path)
    assert device == four[0]
    slots.append(slot)
    device, slot = devices.choose(four, "shared", tmp_path)
    assert device == four[2]
    slots.append(slot)
    for s in slots:
        s.close()
    assert [devices.load_of(tmp_path, d) for d in four] == [0, 0, 0, 0]


def test_one_lock_per_device(tmp_path):
    a, b = fake_devices(2)
    lock_a, lock_b = gpulock.GpuLock(a.uuid, tmp_path), gpulock.GpuLock(b.uuid, tmp_path)
    assert lock_a.path != lock_b.path
    with lock_a.alone():
        assert devices.in_use(tmp_path, a) and not devices.in_use(tmp_path, b)
        with lock_b.alone():  # another device: no wait
            assert lock_b.waited_s < 0.5
    assert not devices.in_use(tmp_path, a)


def test_a_timing_job_is_never_placed_beside_another_timing_job(tmp_path):
    """A device timed on (its lock held alone) is busy: the next timing job goes to another
    device, even a more loaded one."""
    two = fake_devices(2)
    _, first_slot = devices.choose(two, "shared", tmp_path)  # device 0 ...
    _, second_slot = devices.choose(two, "shared", tmp_path)  # ... and 1 each hold one job
    _, third_slot = devices.choose(two, "shared", tmp_path)  # device 0 holds two
    timer = gpulock.GpuLock(two[1].uuid, tmp_path)
    with timer.alone():  # device 1's job times
        device, slot = devices.choose(two, "alone", tmp_path)
    assert device == two[0]  # not device 1, though it holds fewer jobs
    for s in (first_slot, second_slot, third_slot, slot):
        s.close()


def test_a_second_timing_job_on_one_device_waits_for_the_first(tmp_path):
    """Every device free but one: two timing jobs placed there cannot time at once."""
    (only,) = fake_devices(1)
    events = []
    guard = threading.Lock()

    def timer(who):
        with gpulock.GpuLock(only.uuid, tmp_path).alone():
            with guard:
                events.append((who, "in"))
            time.sleep(0.2)
            with guard:
                events.append((who, "out"))

    threads = [threading.Thread(target=timer, args=(n,)) for n in "ab"]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    assert [e[1] for e in events] == ["in", "out", "in", "out"]


@pytest.mark.parametrize(("what", "how"), [("turnstile", "EX"), ("path", "EX"), ("queue", "SH")])
def test_a_job_holding_or_waiting_for_the_lock_makes_the_device_busy(tmp_path, what, how):
    """A job waiting to be alone holds the device's queue (shared) and turnstile; a job on it
    holds its lock."""
    (only,) = fake_devices(1)
    assert not devices.in_use(tmp_path, only)
    child = _hold_in_child(tmp_path, only, what, how)
    try:
        assert devices.in_use(tmp_path, only)
    finally:
        child.kill()
        child.wait()
    assert not devices.in_use(tmp_path, only)


def _hold_in_child(folder: Path, device: Device, what: str, how: str) -> subprocess.Popen:
    """A child process holding `device`'s queue or turnstile (as a job waiting to be alone
    does) or its lock (`path`), flock'ed `how` (EX or SH)."""
    code = textwrap.dedent(f"""
        import fcntl, sys, time
        from kbfuse.workflow.gpulock import GpuLock
        lock = GpuLock({device.uuid!r}, {str(folder)!r})
        fh = open(lock.{what}, "a")
        fcntl.flock(fh, fcntl.LOCK_{how})
        print("held", flush=True)
        time.sleep(60)
    """)
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PYTHONPATH": str(ROOT / "src")})  # fmt: skip
    assert child.stdout.readline().strip() == "held"
    return child


# -- placing a job: the environment it runs in ------------------------------------------------


def test_placed_sets_the_device_for_the_job_and_its_children(tmp_path, no_placement_env):
    three = fake_devices(3)
    with devices.placed("shared", devices=three, folder=tmp_path) as device:
        assert device == three[0]
        assert os.environ[devices.VISIBLE] == three[0].uuid
        assert json.loads(os.environ[devices.PLACED]) == three[0].record()
        assert devices.current("cuda") == three[0].record()
        assert devices.placed_here() == three[0]
        # a nested placement (a process of a placed job) keeps the job's device
        with devices.placed("alone", devices=three, folder=tmp_path) as again:
            assert again == three[0]
        assert devices.load_of(tmp_path, three[0]) == 1
        child = subprocess.run(
            [sys.executable, "-c", "import os; print(os.environ['CUDA_VISIBLE_DEVICES'])"],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert child.stdout.strip() == three[0].uuid
    assert devices.VISIBLE not in os.environ and devices.PLACED not in os.environ
    assert devices.load_of(tmp_path, three[0]) == 0


def test_placed_restores_a_cuda_visible_devices_it_replaced(tmp_path, monkeypatch):
    monkeypatch.setenv(devices.VISIBLE, "0,1")
    monkeypatch.delenv(devices.PLACED, raising=False)
    with devices.placed("shared", devices=fake_devices(2), folder=tmp_path):
        assert os.environ[devices.VISIBLE] == fake_devices(2)[0].uuid
    assert os.environ[devices.VISIBLE] == "0,1"


def test_a_stale_placement_variable_is_not_trusted(tmp_path, monkeypatch):
    two = fake_devices(2)
    monkeypatch.setenv(devices.PLACED, json.dumps(two[1].record()))
    monkeypatch.setenv(devices.VISIBLE, "0,1")  # not the device it names
    assert devices.placed_here() is None
    monkeypatch.setenv(devices.PLACED, "{not json")
    assert devices.placed_here() is None


def test_avoided_devices_are_left_out(tmp_path, no_placement_env):
    three = fake_devices(3)
    avoid = [three[0].uuid]
    with devices.placed("shared", avoid, devices=three, folder=tmp_path) as device:
        assert device == three[1]
    every = [d.uuid for d in three]
    with (
        pytest.raises(KbfuseError, match="every visible device is left out"),
        devices.placed("shared", every, devices=three, folder=tmp_path),
    ):
        pass


def test_placed_refuses_a_bad_mode(tmp_path):
    with (
        pytest.raises(KbfuseError, match="placement mode"),
        devices.placed("timing", devices=fake_devices(2), folder=tmp_path),
    ):
        pass


PLACE_AND_HOLD = textwrap.dedent("""
    import json, os, sys, time
    from kbfuse.compilation import cudadriver
    from kbfuse.workflow import devices, jobs
    listed = [devices.from_record(r) for r in json.loads(sys.argv[1])]
    devices.several_visible = lambda: listed
    jobs.require_gpu = lambda stage, torch=True: None
    # the fake driver sees the one device CUDA_VISIBLE_DEVICES leaves: its UUID
    cudadriver.device_uuid = lambda ordinal=0: os.environ["CUDA_VISIBLE_DEVICES"]
    with jobs.job(sys.argv[2], "timing", gpu=True, gpu_lock=sys.argv[3]):
        print(json.dumps({"visible": os.environ["CUDA_VISIBLE_DEVICES"],
                          "placed": json.loads(os.environ["KBFUSE_DEVICE"])}),
              file=sys.__stdout__, flush=True)
        time.sleep(float(sys.argv[4]))
""")


def _job(tmp_path, listed, name, how="shared", hold_s=30.0) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), gpulock.LOCK_DIR_VARIABLE: str(tmp_path)}
    env.pop(devices.VISIBLE, None)
    env.pop(devices.PLACED, None)
    return subprocess.Popen(
        [sys.executable, "-c", PLACE_AND_HOLD, json.dumps([d.record() for d in listed]),
         str(tmp_path / f"{name}.log"), how, str(hold_s)],
        stdout=subprocess.PIPE, text=True, env=env,
    )  # fmt: skip


def test_workflow_jobs_in_processes_spread_over_the_devices(tmp_path):
    """Six jobs started one after another on three fake devices: two on each, each job's
    CUDA_VISIBLE_DEVICES its device's UUID and its GPU lock the device's."""
    three = fake_devices(3)
    children, seen = [], []
    try:
        for n in range(6):
            child = _job(tmp_path, three, f"job{n}")
            children.append(child)
            line = json.loads(child.stdout.readline())
            assert line["visible"] == line["placed"]["uuid"]
            seen.append(line["placed"]["index"])
        assert seen == [0, 1, 2, 0, 1, 2]
        # each holds its device's lock, shared: the device is in use; its slot is counted
        assert [devices.load_of(tmp_path, d) for d in three] == [2, 2, 2]
        assert all(devices.in_use(tmp_path, d) for d in three)
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert [devices.load_of(tmp_path, d) for d in three] == [0, 0, 0]  # a killed job is forgotten


def test_two_timing_jobs_go_to_two_devices(tmp_path):
    """Timing jobs (the GPU lock alone for their whole life) on two devices: the second goes to
    the free device; a third finds both timed on and waits on one until its job ends."""
    two = fake_devices(2)
    first = _job(tmp_path, two, "t1", "alone")
    second = third = None
    try:
        a = json.loads(first.stdout.readline())["placed"]["index"]
        second = _job(tmp_path, two, "t2", "alone")
        b = json.loads(second.stdout.readline())["placed"]["index"]
        assert {a, b} == {0, 1}
        third = _job(tmp_path, two, "t3", "alone", hold_s=0.1)
        time.sleep(1.0)
        assert third.poll() is None  # waiting: no device to time on alone
        first.kill()
        first.wait()
        line = json.loads(third.stdout.readline())
        assert line["placed"]["index"] in (0, 1)
        assert third.wait(timeout=30) == 0
    finally:
        for child in (first, second, third):
            if child is not None:
                child.kill()
                child.wait()
