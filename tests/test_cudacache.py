"""kbfuse.compilation.cudacache: isolating the CUDA compute cache and CuPy's kernel cache."""

from __future__ import annotations

import os
import sys
import types
from pathlib import Path

import pytest

from kbfuse.compilation import cudacache
from kbfuse.errors import KbfuseError

ISOLATED_RECORD = {
    "CUDA_CACHE_DISABLE": "1",
    "CUDA_CACHE_PATH": "private-empty",
    "CUPY_CACHE_DIR": "private-empty",
    "CUPY_CACHE_IN_MEMORY": "1",
    "isolated": True,
}
MARKS = ("KBFUSE_PRIVATE_CUDA_CACHE_PATH", "KBFUSE_PRIVATE_CUPY_CACHE_DIR")


@pytest.fixture
def clean_env(monkeypatch):
    """os.environ without any cache variable, in a process whose CUDA driver counts as not yet
    initialised (these tests check the bookkeeping); everything restored after the test."""
    monkeypatch.setattr(cudacache, "driver_initialised", lambda: False)
    saved = dict(os.environ)
    for var in (*cudacache.ISOLATION_VARIABLES, *MARKS):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.delitem(sys.modules, "cupy", raising=False)
    yield
    os.environ.clear()
    os.environ.update(saved)


def test_default_setting_when_nothing_is_set(clean_env):
    assert cudacache.current_setting() == {
        "CUDA_CACHE_DISABLE": None,
        "CUDA_CACHE_PATH": "default",
        "CUPY_CACHE_DIR": "default",
        "CUPY_CACHE_IN_MEMORY": None,
        "isolated": False,
    }


def test_isolate_sets_private_empty_dirs_and_a_stable_record(clean_env, tmp_path):
    record = cudacache.isolate(tmp_path / "scratch")
    assert record == ISOLATED_RECORD
    assert cudacache.current_setting() == ISOLATED_RECORD
    cuda_dir = Path(os.environ["CUDA_CACHE_PATH"])
    cupy_dir = Path(os.environ["CUPY_CACHE_DIR"])
    assert os.environ["CUDA_CACHE_DISABLE"] == "1"
    assert os.environ["CUPY_CACHE_IN_MEMORY"] == "1"
    for directory in (cuda_dir, cupy_dir):
        assert directory.is_dir()
        assert directory.parent == tmp_path / "scratch"
        assert list(directory.iterdir()) == []
    assert cuda_dir != cupy_dir
    # a second isolation gives new directories and the very same record (no paths, no times)
    again = cudacache.isolate(tmp_path / "scratch")
    assert again == record
    assert Path(os.environ["CUDA_CACHE_PATH"]) != cuda_dir
    assert "/" not in repr(record)


def test_a_path_set_by_someone_else_is_custom_not_isolated(clean_env, tmp_path, monkeypatch):
    cudacache.isolate(tmp_path)
    monkeypatch.setenv("CUDA_CACHE_PATH", str(tmp_path / "elsewhere"))
    setting = cudacache.current_setting()
    assert setting["CUDA_CACHE_PATH"] == "custom"
    assert setting["CUPY_CACHE_DIR"] == "private-empty"
    assert setting["isolated"] is False
    monkeypatch.setenv("CUDA_CACHE_DISABLE", "0")
    assert cudacache.current_setting()["CUDA_CACHE_DISABLE"] == "0"


def test_isolate_refuses_after_cupy_was_imported(clean_env, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "cupy", types.ModuleType("cupy"))
    with pytest.raises(KbfuseError, match="too late: cupy is already imported"):
        cudacache.isolate(tmp_path)
    assert "CUDA_CACHE_PATH" not in os.environ
    assert list(tmp_path.iterdir()) == []


def test_isolate_refuses_once_torch_cuda_is_initialised(clean_env, tmp_path, monkeypatch):
    fake_torch = types.ModuleType("torch")
    fake_torch.cuda = types.SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "torch", fake_torch)
    with pytest.raises(KbfuseError, match="torch.cuda is already initialised"):
        cudacache.isolate(tmp_path)
    fake_torch.cuda = types.SimpleNamespace(is_initialized=lambda: False)
    assert cudacache.isolate(tmp_path) == ISOLATED_RECORD


def test_default_cache_env_undoes_isolation(clean_env, tmp_path):
    cudacache.isolate(tmp_path)
    env = cudacache.default_cache_env()
    for var in (*cudacache.ISOLATION_VARIABLES, *MARKS):
        assert var not in env
    assert env["PATH"] == os.environ["PATH"]
    shared = cudacache.default_cache_env(cache_path=tmp_path / "shared")
    assert shared["CUDA_CACHE_PATH"] == str(tmp_path / "shared")
    assert "CUDA_CACHE_DISABLE" not in shared
    # os.environ itself is untouched
    assert cudacache.current_setting() == ISOLATED_RECORD


def test_isolated_env_for_a_child_process(clean_env, tmp_path):
    env = cudacache.isolated_env(tmp_path / "child", base_env={"PATH": "/bin"})
    assert env["CUDA_CACHE_DISABLE"] == "1"
    assert env["CUPY_CACHE_IN_MEMORY"] == "1"
    assert Path(env["CUDA_CACHE_PATH"]).parent == tmp_path / "child"
    assert Path(env["CUPY_CACHE_DIR"]).is_dir()
    assert env["PATH"] == "/bin"
    assert cudacache.current_setting()["isolated"] is False  # this process is unchanged
    os.environ.update(env)
    assert cudacache.current_setting() == ISOLATED_RECORD


def test_isolate_refuses_once_the_driver_is_initialised(clean_env, tmp_path, monkeypatch):
    monkeypatch.setattr(cudacache, "driver_initialised", lambda: True)
    with pytest.raises(KbfuseError, match="CUDA driver is already initialised"):
        cudacache.isolate(tmp_path)


_DRIVER_CHILD = """
import sys
from kbfuse.compilation import cudacache
from kbfuse.errors import KbfuseError
before = cudacache.driver_initialised()
import ctypes
ctypes.CDLL("libcuda.so.1").cuInit(0)
after = cudacache.driver_initialised()
try:
    cudacache.isolate(sys.argv[1])
    refused = False
except KbfuseError:
    refused = True
print(before, after, refused)
"""


@pytest.mark.gpu
def test_driver_initialisation_is_detected(tmp_path):
    import subprocess

    env = cudacache.default_cache_env()
    src = str(Path(__file__).resolve().parents[1] / "src")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [src, env.get("PYTHONPATH")]))
    proc = subprocess.run(
        [sys.executable, "-c", _DRIVER_CHILD, str(tmp_path)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["False", "True", "True"]
