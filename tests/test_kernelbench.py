"""kbfuse.tasks.kernelbench: pinning a KernelBench checkout, reading the pin, loading tasks."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch
from kbrepo import (
    BATCH,
    IN_FEATURES,
    OUT_FEATURES,
    TASK_FILES,
    commit_files,
    git,
    make_kernelbench_repo,
    task_relpath,
)

from kbfuse.errors import KbfuseError
from kbfuse.tasks import kernelbench
from kbfuse.tasks.kernelbench import build_model, load_task, pin_kernelbench, read_pin

# A local clone or mirror of the real KernelBench: KBFUSE_KERNELBENCH_MIRROR, else the fixture
# repository stands in (same task names, small shapes).
MIRROR_VARIABLE = "KBFUSE_KERNELBENCH_MIRROR"
REAL_COMMIT = "423217d9fda91e0c2d67e4a43bf62f96f6d104f1"
REAL_NAMES = {
    53: "53_Gemm_Scaling_Hardtanh_GELU",
    81: "81_Gemm_Swish_Divide_Clamp_Tanh_Clamp",
    95: "95_Matmul_Add_Swish_Tanh_GELU_Hardtanh",
}


@pytest.fixture(scope="module")
def kbrepo(tmp_path_factory):
    """(path, pinned commit, tip commit) of the fixture repository."""
    url, commit = make_kernelbench_repo(tmp_path_factory.mktemp("kb") / "KernelBench")
    return url, commit, git(Path(url), "rev-parse", "HEAD")


def pin_into(tmp_path: Path, url: str, commit: str, tasks=(53, 81, 95), **kw) -> dict:
    return pin_kernelbench(
        url, commit, 2, list(tasks), tmp_path / "checkout", tmp_path / "pin.json", **kw
    )


def assert_nothing_left(tmp_path: Path) -> None:
    assert not (tmp_path / "checkout").exists()
    assert not (tmp_path / "pin.json").exists()


def sha256_text(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


# --------------------------------------------------------------------------- fixture repo


def test_fixture_repo_commits_are_deterministic(tmp_path, kbrepo):
    url, commit = make_kernelbench_repo(tmp_path / "again")
    assert commit == kbrepo[1]
    assert git(Path(url), "rev-parse", "HEAD") == kbrepo[2]
    assert kbrepo[1] != kbrepo[2]


# --------------------------------------------------------------------------- pinning


def test_pin_records_commit_paths_and_hashes(tmp_path, kbrepo):
    url, commit, _ = kbrepo
    log = tmp_path / "logs" / "pin.log"
    pin = pin_into(tmp_path, url, commit, log=log)

    assert pin == json.loads((tmp_path / "pin.json").read_text())
    assert pin["kind"] == "kernelbench_pin"
    assert pin["schema_version"] == 1
    assert pin["url"] == "local mirror"  # a path of this machine is never recorded
    assert pin["commit"] == pin["head"] == commit
    assert pin["level"] == 2
    assert sorted(pin["tasks"]) == ["53", "81", "95"]
    for task, (filename, text) in TASK_FILES.items():
        record = pin["tasks"][str(task)]
        assert record["path"] == f"KernelBench/level2/{filename}"
        assert record["name"] == filename.removesuffix(".py")
        assert record["sha256"] == sha256_text(text)
    checkout = tmp_path / "checkout"
    assert git(checkout, "rev-parse", "HEAD") == commit
    # a shallow fetch of exactly the pinned commit
    assert git(checkout, "rev-parse", "--is-shallow-repository") == "true"
    assert git(checkout, "rev-list", "--count", "HEAD") == "1"
    text = log.read_text()
    assert "$ git fetch --no-tags --depth 1" in text
    assert f"pinned {commit} (shallow fetch)" in text
    assert url not in text and "$ git ls-remote -- local mirror HEAD" in text
    assert read_pin(tmp_path / "pin.json") == pin


def test_pin_other_commit_hashes_its_own_files(tmp_path, kbrepo):
    url, commit, tip = kbrepo
    pin = pin_into(tmp_path, url, tip)
    changed = TASK_FILES[53][1].replace("scaling_factor = 0.5", "scaling_factor = 0.25")
    assert pin["commit"] == tip
    assert pin["tasks"]["53"]["sha256"] == sha256_text(changed)
    assert pin["tasks"]["81"]["sha256"] == sha256_text(TASK_FILES[81][1])


def test_pin_subset_of_tasks_and_file_url(tmp_path, kbrepo):
    url, commit, _ = kbrepo
    pin = pin_into(tmp_path, Path(url).as_uri(), commit, tasks=[81])
    assert list(pin["tasks"]) == ["81"]
    assert pin["url"] == "local mirror"


def test_pin_relative_local_path(tmp_path, kbrepo, monkeypatch):
    url, commit, _ = kbrepo
    monkeypatch.chdir(Path(url).parent)
    pin = pin_into(tmp_path, Path(url).name, commit)
    assert pin["head"] == commit


def test_pin_from_bare_mirror(tmp_path, kbrepo):
    url, commit, _ = kbrepo
    mirror = tmp_path / "mirror.git"
    subprocess.run(["git", "clone", "-q", "--mirror", url, str(mirror)], check=True)
    pin = pin_into(tmp_path, str(mirror), commit)
    assert pin["tasks"]["95"]["sha256"] == sha256_text(TASK_FILES[95][1])


def test_pin_falls_back_to_full_fetch_when_sha_fetch_refused(tmp_path, kbrepo, monkeypatch):
    # Protocol v0 without uploadpack.allowReachableSHA1InWant refuses a non-tip commit.
    url, commit, _ = kbrepo
    monkeypatch.setenv("GIT_CONFIG_COUNT", "1")
    monkeypatch.setenv("GIT_CONFIG_KEY_0", "protocol.version")
    monkeypatch.setenv("GIT_CONFIG_VALUE_0", "0")
    log = tmp_path / "pin.log"
    pin = pin_into(tmp_path, url, commit, log=log)
    assert pin["head"] == commit
    assert pin["tasks"]["53"]["sha256"] == sha256_text(TASK_FILES[53][1])
    assert f"pinned {commit} (full fetch)" in log.read_text()


def test_pin_replaces_stale_checkout_and_pin(tmp_path, kbrepo):
    url, commit, tip = kbrepo
    pin_into(tmp_path, url, tip)
    (tmp_path / "checkout" / "leftover.txt").write_text("stale")
    pin = pin_into(tmp_path, url, commit)
    assert not (tmp_path / "checkout" / "leftover.txt").exists()
    assert read_pin(tmp_path / "pin.json")["commit"] == commit == pin["commit"]


def test_pin_refuses_to_remove_foreign_directory(tmp_path, kbrepo):
    url, commit, _ = kbrepo
    (tmp_path / "checkout").mkdir()
    (tmp_path / "checkout" / "precious.txt").write_text("keep me")
    with pytest.raises(KbfuseError, match="refusing to remove"):
        pin_into(tmp_path, url, commit)
    assert (tmp_path / "checkout" / "precious.txt").read_text() == "keep me"


@pytest.mark.parametrize(
    "bad_commit",
    ["423217d", "g" * 40, "A" * 40, "a" * 41, "", None],
)
def test_pin_rejects_malformed_commit(tmp_path, kbrepo, bad_commit):
    with pytest.raises(KbfuseError, match="malformed"):
        pin_into(tmp_path, kbrepo[0], bad_commit)
    assert_nothing_left(tmp_path)


@pytest.mark.parametrize("as_uri", [False, True])
def test_pin_unreachable_url(tmp_path, kbrepo, as_uri):
    missing = tmp_path / "no-such-repo"
    url = missing.as_uri() if as_uri else str(missing)
    with pytest.raises(KbfuseError, match="unreachable or not a git repository") as err:
        pin_into(tmp_path, url, kbrepo[1])
    assert url in str(err.value)
    assert_nothing_left(tmp_path)


def test_pin_git_timeout(tmp_path, kbrepo):
    with pytest.raises(KbfuseError, match="timed out after"):
        pin_into(tmp_path, kbrepo[0], kbrepo[1], timeout_s=1e-4)
    assert_nothing_left(tmp_path)


def test_pin_directory_that_is_not_a_repository(tmp_path, kbrepo):
    plain = tmp_path / "plain"
    plain.mkdir()
    (plain / "file.txt").write_text("not a repository")
    with pytest.raises(KbfuseError, match="unreachable or not a git repository"):
        pin_into(tmp_path, str(plain), kbrepo[1])
    assert_nothing_left(tmp_path)


def test_pin_commit_not_in_repository(tmp_path, kbrepo):
    absent = "0123456789abcdef0123456789abcdef01234567"
    log = tmp_path / "pin.log"
    with pytest.raises(KbfuseError, match=f"{absent} is not in the repository"):
        pin_into(tmp_path, kbrepo[0], absent, log=log)
    assert_nothing_left(tmp_path)
    assert "refs/heads/*:refs/remotes/origin/*" in log.read_text()  # tried the full fetch


def test_pin_object_that_is_not_a_commit(tmp_path, kbrepo):
    url, commit, _ = kbrepo
    tree = git(Path(url), "rev-parse", f"{commit}^{{tree}}")
    with pytest.raises(KbfuseError, match="names a tree"):
        pin_into(tmp_path, url, tree)
    assert_nothing_left(tmp_path)


def test_pin_head_mismatch(tmp_path, kbrepo, monkeypatch):
    url, commit, _ = kbrepo
    real_call = kernelbench._GitRunner.__call__

    def lying_rev_parse(self, *args, cwd=None):
        out = real_call(self, *args, cwd=cwd)
        return "f" * 40 if args == ("rev-parse", "HEAD") else out

    monkeypatch.setattr(kernelbench._GitRunner, "__call__", lying_rev_parse)
    with pytest.raises(KbfuseError, match=f"HEAD is '{'f' * 40}'.*{commit}"):
        pin_into(tmp_path, url, commit)
    assert_nothing_left(tmp_path)


def test_pin_missing_task_file(tmp_path, kbrepo):
    url, commit, _ = kbrepo
    with pytest.raises(KbfuseError, match=r"task 12: no file matches KernelBench/level2/12_\*\.py"):
        pin_into(tmp_path, url, commit, tasks=[53, 12])
    assert_nothing_left(tmp_path)


def test_pin_missing_level(tmp_path, kbrepo):
    url, commit, _ = kbrepo
    with pytest.raises(KbfuseError, match="KernelBench/level3/53_"):
        pin_kernelbench(url, commit, 3, [53], tmp_path / "checkout", tmp_path / "pin.json")
    assert_nothing_left(tmp_path)


def test_pin_ambiguous_task_file(tmp_path):
    url, _ = make_kernelbench_repo(tmp_path / "repo")
    duplicate = commit_files(
        Path(url), {"KernelBench/level2/53_Another_Version.py": "# duplicate\n"}, "dup"
    )
    with pytest.raises(KbfuseError, match="task 53: .* is ambiguous .*53_Another_Version.py"):
        pin_into(tmp_path, url, duplicate)
    assert_nothing_left(tmp_path)


def test_pin_task_prefix_is_not_ambiguous_with_longer_numbers(tmp_path):
    url, _ = make_kernelbench_repo(tmp_path / "repo")
    extra = commit_files(Path(url), {"KernelBench/level2/153_Other.py": "# other\n"}, "153")
    pin = pin_into(tmp_path, url, extra, tasks=[53])
    assert pin["tasks"]["53"]["name"] == "53_Gemm_Scaling_Hardtanh_GELU"


@pytest.mark.parametrize(
    ("level", "tasks", "message"),
    [(0, [53], "level"), (2, [], "empty"), (2, [53, 53], "more than once"), (2, ["53"], "task")],
)
def test_pin_rejects_bad_level_or_tasks(tmp_path, kbrepo, level, tasks, message):
    with pytest.raises(KbfuseError, match=message):
        pin_kernelbench(
            kbrepo[0], kbrepo[1], level, tasks, tmp_path / "checkout", tmp_path / "pin.json"
        )
    assert_nothing_left(tmp_path)


def test_failed_pin_removes_earlier_pin(tmp_path, kbrepo):
    url, commit, _ = kbrepo
    pin_into(tmp_path, url, commit)
    with pytest.raises(KbfuseError, match="task 99: no file matches"):
        pin_into(tmp_path, url, commit, tasks=[99])
    assert_nothing_left(tmp_path)


# --------------------------------------------------------------------------- pin record


def test_read_pin_validates_keys(tmp_path, kbrepo):
    pin = pin_into(tmp_path, kbrepo[0], kbrepo[1])
    broken = tmp_path / "broken.json"
    cases = [
        ({k: v for k, v in pin.items() if k != "head"}, "missing key"),
        ({**pin, "kind": "compile"}, "kind"),
        ({**pin, "head": "f" * 40}, "head .* differs"),
        ({**pin, "commit": "abc"}, "commit 'abc'"),
        ({**pin, "tasks": {"53": {**pin["tasks"]["53"], "sha256": "xyz"}}}, "sha256"),
        ({**pin, "tasks": {"53": {**pin["tasks"]["53"], "path": "/etc/passwd"}}}, "relative"),
        ({**pin, "tasks": {"81": pin["tasks"]["53"]}}, "disagree"),
    ]
    for obj, message in cases:
        broken.write_text(json.dumps(obj))
        with pytest.raises(KbfuseError, match=message) as err:
            read_pin(broken)
        assert str(broken) in str(err.value)
    with pytest.raises(KbfuseError, match="does not exist"):
        read_pin(tmp_path / "absent.json")
    broken.write_text("{not json")
    with pytest.raises(KbfuseError, match="not valid JSON"):
        read_pin(broken)


# --------------------------------------------------------------------------- tasks


@pytest.fixture
def pinned(tmp_path, kbrepo):
    pin = pin_into(tmp_path, kbrepo[0], kbrepo[1])
    return tmp_path / "checkout", pin


def test_load_task_spec(pinned):
    checkout, pin = pinned
    spec = load_task(checkout, pin, 53)
    assert spec.task == 53
    assert spec.name == "53_Gemm_Scaling_Hardtanh_GELU"
    assert spec.path == checkout / task_relpath(53)
    assert spec.sha256 == pin["tasks"]["53"]["sha256"]
    assert spec.pin_commit == pin["commit"]
    assert spec.input_shape() == (BATCH, IN_FEATURES)
    assert spec.init_inputs() == [IN_FEATURES, OUT_FEATURES, 0.5, -2, 2]
    assert load_task(checkout, pin, 95).init_inputs() == [IN_FEATURES, OUT_FEATURES, (64,)]


def test_load_task_imports_under_unique_names(pinned):
    checkout, pin = pinned
    first, second = load_task(checkout, pin, 81), load_task(checkout, pin, 81)
    assert first.module is not second.module
    assert first.module.__name__ != second.module.__name__
    first.module.batch_size = 1
    assert second.input_shape() == (BATCH, IN_FEATURES)


def test_load_task_detects_change_after_pinning(pinned):
    checkout, pin = pinned
    path = checkout / task_relpath(81)
    path.write_text(path.read_text().replace("x / 2.0", "x / 3.0"))
    with pytest.raises(KbfuseError, match="changed after pinning") as err:
        load_task(checkout, pin, 81)
    message = str(err.value)
    assert str(path) in message
    assert pin["tasks"]["81"]["sha256"] in message
    assert hashlib.sha256(path.read_bytes()).hexdigest() in message


def test_load_task_unknown_task_or_missing_file(pinned):
    checkout, pin = pinned
    with pytest.raises(KbfuseError, match="task 12 is not in the pin record"):
        load_task(checkout, pin, 12)
    (checkout / task_relpath(95)).unlink()
    with pytest.raises(KbfuseError, match="does not exist"):
        load_task(checkout, pin, 95)


def test_load_task_requires_model_and_input_functions(tmp_path):
    url, _ = make_kernelbench_repo(tmp_path / "repo", tasks=(81,))
    text = TASK_FILES[81][1].replace("def get_init_inputs", "def init_inputs_renamed")
    commit = commit_files(Path(url), {task_relpath(81): text}, "break 81")
    pin = pin_into(tmp_path, url, commit, tasks=[81])
    with pytest.raises(KbfuseError, match="does not define get_init_inputs"):
        load_task(tmp_path / "checkout", pin, 81)


def test_load_task_import_error_names_file(tmp_path):
    url, _ = make_kernelbench_repo(tmp_path / "repo", tasks=(81,))
    commit = commit_files(Path(url), {task_relpath(81): "raise RuntimeError('boom')\n"}, "boom")
    pin = pin_into(tmp_path, url, commit, tasks=[81])
    with pytest.raises(KbfuseError, match="importing task 81 file .*81_Gemm.*boom"):
        load_task(tmp_path / "checkout", pin, 81)


def test_build_model_cpu_is_seeded_and_runs(pinned):
    checkout, pin = pinned
    for task, linear in ((53, "gemm"), (81, "gemm"), (95, "matmul")):
        spec = load_task(checkout, pin, task)
        model = build_model(spec, seed=3, device="cpu")
        assert not model.training
        assert all(p.dtype == torch.float32 and p.device.type == "cpu" for p in model.parameters())
        assert getattr(model, linear).weight.shape == (OUT_FEATURES, IN_FEATURES)
        again = build_model(spec, seed=3, device="cpu")
        other = build_model(spec, seed=4, device="cpu")
        for (name, a), (_, b), (_, c) in zip(
            model.state_dict().items(),
            again.state_dict().items(),
            other.state_dict().items(),
            strict=True,
        ):
            assert torch.equal(a, b), name
            assert not torch.equal(a, c), name
        torch.manual_seed(0)
        (x,) = spec.module.get_inputs()
        with torch.no_grad():
            y = model(x)
        assert y.shape == (BATCH, OUT_FEATURES)
        assert torch.isfinite(y).all()
        assert y.abs().max() <= 1.0 if task in (81, 95) else y.abs().max() <= 2.0


def test_build_model_matches_kernelbench_ops(pinned):
    """The fixture models compute the task's tail; checked against the ops spelled out."""
    checkout, pin = pinned
    torch.manual_seed(1)
    x = torch.randn(BATCH, IN_FEATURES) * 4
    f = torch.nn.functional
    with torch.no_grad():
        m53 = build_model(load_task(checkout, pin, 53), seed=0, device="cpu")
        y = m53.gemm(x)
        assert torch.equal(m53(x), f.gelu(f.hardtanh(y * 0.5, -2, 2)))
        m81 = build_model(load_task(checkout, pin, 81), seed=0, device="cpu")
        y = m81.gemm(x)
        expected = torch.tanh(torch.clamp((y * torch.sigmoid(y)) / 2.0, -1, 1)).clamp(-1, 1)
        assert torch.equal(m81(x), expected)
        m95 = build_model(load_task(checkout, pin, 95), seed=0, device="cpu")
        y = m95.matmul(x) + m95.add_value
        expected = f.hardtanh(f.gelu(torch.tanh(torch.sigmoid(y) * y)), -1, 1)
        assert torch.equal(m95(x), expected)


# --------------------------------------------------------------------------- real mirror


@pytest.fixture
def mirror(kb_repo) -> tuple[str, str, bool]:
    """(url, commit, real): the mirror in $KBFUSE_KERNELBENCH_MIRROR at the study's pin, or
    the session's fixture repository (kb_repo) at its pinned commit."""
    url = os.environ.get(MIRROR_VARIABLE)
    if url:
        return url, REAL_COMMIT, True
    return *kb_repo, False


def test_pin_real_kernelbench_mirror(tmp_path, mirror):
    url, commit, real = mirror
    pin = pin_into(tmp_path, url, commit)
    assert pin["head"] == commit
    for task, name in REAL_NAMES.items():
        record = pin["tasks"][str(task)]
        assert record["name"] == name
        assert record["path"] == f"KernelBench/level2/{name}.py"
        blob = subprocess.run(
            ["git", "-C", url, "show", f"{commit}:{record['path']}"],
            capture_output=True,
            check=True,
        ).stdout
        assert record["sha256"] == hashlib.sha256(blob).hexdigest()
    checkout = tmp_path / "checkout"
    batch, in_features, out_features = (
        (2048, 8192, 8192) if real else (BATCH, IN_FEATURES, OUT_FEATURES)
    )
    spec53 = load_task(checkout, pin, 53)
    assert spec53.input_shape() == (batch, in_features)
    assert spec53.init_inputs() == [in_features, out_features, 0.5, -2, 2]
    assert load_task(checkout, pin, 81).input_shape() == (
        (1024, 8192) if real else (BATCH, IN_FEATURES)
    )
    assert load_task(checkout, pin, 95).init_inputs() == [
        in_features,
        out_features,
        (out_features,),
    ]
