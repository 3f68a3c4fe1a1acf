"""Issue 12: compiler options and kernel sources from someone else.

Options are an allow-list per route (kbfuse.compilation.routes): nothing that reaches a shell,
reads a file
kbfuse does not hash or writes a file is passed to a compiler, and that is decided when the
config is checked, before any job. Every file a kernel source pulls in is inlined and hashed, or
refused (kbfuse.compilation.kernelsrc). None of these tests needs nvcc or a GPU: the nvcc shell
injection of
the issue is reproduced with a stand-in nvcc that hands its -D values to a shell, as nvcc does.
"""

from __future__ import annotations

import copy
import os
import stat
import subprocess
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from kbfuse.compilation import compile as kcompile
from kbfuse.compilation import kernelsrc, routes
from kbfuse.errors import KbfuseError
from kbfuse.workflow.config import check_config, validate_schema

ROOT = Path(__file__).resolve().parents[1]
KERNELS = ROOT / "kernels"
DEFAULT = yaml.safe_load((ROOT / "config" / "config.yaml").read_text())
BASE = ["--std=c++11", "--fmad=false"]
PER_ELEMENT = "// kbfuse-launch: per-element threads=256\n"
SHELL_CHARACTERS = set("$`'\"\\;&|<>()*?[]{}~!# \t\n,/")

# A stand-in for nvcc: like nvcc (which runs its preprocessing steps through a shell), it hands
# its arguments to `sh -c`; it also records that it ran.
FAKE_NVCC = """#!/bin/sh
echo called >> "$(dirname "$0")/calls"
case "$1" in --version) echo "Cuda compilation tools, release 13.0, V13.0.88"; exit 0;; esac
for arg in "$@"; do
  case "$arg" in -D*) sh -c "echo $arg" > /dev/null;; esac
done
exit 1
"""


def fake_nvcc(bin_dir: Path) -> Path:
    bin_dir.mkdir(parents=True, exist_ok=True)
    nvcc = bin_dir / "nvcc"
    nvcc.write_text(FAKE_NVCC)
    nvcc.chmod(nvcc.stat().st_mode | stat.S_IXUSR)
    return nvcc


def injection(marker: Path) -> str:
    return f"-DX=$(touch${{IFS}}{marker})"


# --- the nvcc shell injection of the issue ---------------------------------------------------


def test_the_stand_in_nvcc_really_runs_the_injected_command(tmp_path):
    """The stand-in is as dangerous as nvcc: given the option directly, the command runs."""
    nvcc = fake_nvcc(tmp_path / "bin")
    marker = tmp_path / "pwned"
    subprocess.run([str(nvcc), "-cubin", injection(marker)], check=False)
    assert marker.exists()


def test_nvcc_shell_injection_is_refused_by_the_config_check(tmp_path):
    marker = tmp_path / "pwned"
    cfg = copy.deepcopy(DEFAULT)
    cfg["variants"]["evil"] = {"route": "nvcc-cubin", "options": [*BASE, injection(marker)]}
    validate_schema(cfg)
    with pytest.raises(
        KbfuseError, match=r"variants\.evil\.options: route nvcc-cubin: option"
    ) as err:
        check_config(cfg, KERNELS)
    assert "is refused: --define-macro values must match" in str(err.value)
    assert str(marker) in str(err.value)  # the option is named as given
    assert not marker.exists()


def test_nvcc_shell_injection_is_refused_by_the_compile_job_before_nvcc_runs(tmp_path, monkeypatch):
    """Even with nvcc on PATH, the compile job refuses the option before calling it."""
    nvcc = fake_nvcc(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{nvcc.parent}{os.pathsep}{os.environ['PATH']}")
    marker = tmp_path / "pwned"
    spec = {"route": "nvcc-cubin", "kernel": "naive", "options": [*BASE, injection(marker)]}
    out = tmp_path / "out"
    with pytest.raises(KbfuseError, match=r"variant 'evil': route nvcc-cubin: option '-DX="):
        kcompile.compile_variant(
            KERNELS / "naive.cu",
            "evil",
            spec,
            "sm_90",
            artifact=out / "tails.bin",
            meta=out / "meta.json",
            log=out / "log.txt",
        )
    assert not marker.exists()
    assert not (nvcc.parent / "calls").exists(), "nvcc was called"
    assert not (out / "tails.bin").exists() and not (out / "meta.json").exists()
    assert "is refused" in (out / "log.txt").read_text()


# --- the allow-list --------------------------------------------------------------------------

REFUSED = [
    ("--create-pch=/tmp/kbfuse-pch", "precompiled header"),
    ("--use-pch=/tmp/kbfuse-pch", "precompiled header"),
    ("--pch-dir=/tmp", "precompiled header"),
    ("--pch", "precompiled header"),
    ("-pch-verbose=true", "precompiled header"),
    ("--fdevice-time-trace=/tmp/trace.json", "writes a trace file"),
    ("--time=/tmp/time.csv", "writes a timing file"),
    ("-I/usr/include", "reads headers from outside kernels/"),
    ("--include-path=/etc", "reads headers from outside kernels/"),
    ("-include=/etc/passwd", "reads headers from outside kernels/"),
    ("--pre-include=x.h", "reads headers from outside kernels/"),
    ("-DX=$(id)", "--define-macro values must match"),
    ("-DX=`id`", "--define-macro values must match"),
    ("-DX=1,Y=2", "--define-macro values must match"),  # nvcc splits -D values at commas
    ("-D'X'", "--define-macro values must match"),
    ("-DX=a/b", "--define-macro values must match"),
    ('--define-macro=X="s"', "--define-macro values must match"),
    ("-UX;rm", "--undefine-macro values must match"),
    ("-U1X", "--undefine-macro values must match"),
    ("-Xptxas=-o/tmp/x", "--ptxas-options values must match"),
    ("--ptxas-options=--output-file=/tmp/x", "--ptxas-options values must match"),
    ("-Xptxas=-v,-o", "--ptxas-options values must match"),
    ("-diag-suppress=1;x", "--diag-suppress values must match"),
    ("-frandom-seed=../x", "--frandom-seed values must match"),
    ("-DX=\u00e9", "non-ASCII or control character"),
    ("-DX=\x01", "non-ASCII or control character"),
    ("--optimization-info=/tmp/x", "expects one of inline"),
    ("--maxrregcount=\u0661\u0662", "expects a non-negative integer"),
    ("-o", "is not an NVRTC option"),
    ("--output-file=/tmp/x", "is not an NVRTC option"),
    ("--keep", "is not an NVRTC option"),
    ("--keep-dir=/tmp", "is not an NVRTC option"),
    ("-odir=/tmp", "is not an NVRTC option"),
    ("--compiler-bindir=/tmp", "is not an NVRTC option"),
    ("-Xcompiler=-fplugin=x.so", "is not an NVRTC option"),
]


@pytest.mark.parametrize("route", ["nvrtc-cubin", "nvrtc-ptx", "nvcc-cubin", "cupy-default"])
@pytest.mark.parametrize(("option", "why"), REFUSED)
def test_options_that_reach_files_or_a_shell_are_refused(route, option, why):
    problems = routes.option_problems(route, [*BASE, option])
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"route {route}: ")
    assert repr(option) in problems[0] and why in problems[0]


@pytest.mark.parametrize(
    "option",
    [
        "-DTILE=4",
        "-DNAME",
        "-DX=1.5f",
        "-DX=-1",
        "-DX=",
        "--define-macro=X=0x10",
        "-UNAME",
        "-Xptxas=-v",
        "--ptxas-options=-O3",
        "-Xptxas=--warn-on-spills",
        "-diag-suppress=177,550",
        "-frandom-seed=abc",
        "--optimization-info=inline",
        "-lineinfo",
        "--maxrregcount=64",
    ],
)
def test_simple_values_are_accepted(option):
    assert routes.option_problems("nvcc-cubin", [*BASE, option]) in (
        [],
        [f"route nvcc-cubin: option {option!r} is an NVRTC-only option with no nvcc equivalent"],
    )
    assert routes.option_problems("nvrtc-cubin", [*BASE, option]) == []


def test_every_value_option_is_refused_or_has_a_value_pattern():
    for spec in routes.OPTIONS.values():
        if spec.kind == "value" and spec.name != "gpu-architecture":
            assert (spec.refused is None) != (spec.value_pattern is None), spec.name
        if spec.value_pattern is not None:
            assert spec.kind == "value", spec.name
    refused = {spec.name for spec in routes.OPTIONS.values() if spec.refused}
    assert {"include-path", "pre-include", "create-pch", "use-pch", "pch-dir", "pch"} <= refused
    assert {"fdevice-time-trace", "time"} <= refused


_VALUE_SPELLINGS = [
    f"-{spec.short}" if spec.short else f"--{spec.name}"
    for spec in routes.OPTIONS.values()
    if spec.kind != "flag"
]


@settings(max_examples=400, deadline=None)
@given(
    spelling=st.sampled_from([*_VALUE_SPELLINGS, "-D", "-U", "-I"]),
    glue=st.sampled_from(["=", ""]),
    value=st.text(max_size=30),
)
def test_no_accepted_option_carries_a_shell_character_or_a_path(spelling, glue, value):
    option = f"{spelling}{glue}{value}"
    problems = routes.option_problems("nvcc-cubin", [option])
    accepted = not problems or all("no nvcc equivalent" in p for p in problems)
    if accepted:
        value_part = option.partition("=")[2] if "=" in option else option[2:]
        assert not SHELL_CHARACTERS & set(value_part), option
        assert value_part.isascii() and value_part.isprintable(), option


# --- compilers run from argv, in a scratch directory ------------------------------------------


def test_nvcc_runs_from_an_argv_list_in_a_scratch_directory(tmp_path, monkeypatch):
    calls = []

    def run(cmd, **kwargs):
        calls.append((cmd, kwargs))
        if "--version" in cmd:
            return subprocess.CompletedProcess(cmd, 0, "V13.0.88", "")
        cwd = Path(kwargs["cwd"])
        assert cwd.is_dir() and cwd.name.startswith("kbfuse-nvcc-")
        (cwd / "module.cubin").write_bytes(b"\x7fELF cubin")
        return subprocess.CompletedProcess(cmd, 0, "", "")

    monkeypatch.setattr(kcompile, "find_nvcc", lambda: "/opt/cuda/bin/nvcc")
    monkeypatch.setattr(kcompile.subprocess, "run", run)
    monkeypatch.setenv("NVCC_APPEND_FLAGS", "--ftz=true")
    monkeypatch.setenv("NVCC_PREPEND_FLAGS", "-DX=$(id)")
    compiled = kcompile.compile_nvcc_cubin("// k\n", [*BASE, "-DTILE=4"], "sm_90", "naive.cu")
    assert compiled.artifact == b"\x7fELF cubin"
    compile_cmd, kwargs = calls[0]
    assert isinstance(compile_cmd, list) and all(isinstance(a, str) for a in compile_cmd)
    assert "shell" not in kwargs
    for _, call in calls:  # nvcc would add these to its command line: not what was recorded
        assert "NVCC_APPEND_FLAGS" not in call["env"] and "NVCC_PREPEND_FLAGS" not in call["env"]
        assert call["env"]["PATH"] == os.environ["PATH"]
    assert compiled.notes == [
        "NVCC_PREPEND_FLAGS was set ('-DX=$(id)') and was not passed to nvcc",
        "NVCC_APPEND_FLAGS was set ('--ftz=true') and was not passed to nvcc",
    ]
    assert compile_cmd[:3] == ["/opt/cuda/bin/nvcc", "-cubin", "-arch=sm_90"]
    assert compile_cmd[3:6] == [*BASE, "-DTILE=4"]
    scratch = Path(kwargs["cwd"])
    assert compile_cmd[-1] == str(scratch / "naive.cu")
    assert compile_cmd[-3:-1] == ["-o", str(scratch / "module.cubin")]
    assert not scratch.exists(), "the scratch directory outlived the compile"


# --- every byte that reaches the compiler is tracked ------------------------------------------


def write_sources(directory: Path, files: dict[str, str]) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in files.items():
        (directory / name).write_text(text)
    return directory / "k.cu"


@pytest.mark.parametrize(
    ("body", "refusal"),
    [
        ("#include <stdio.h>\n", r"'#include <stdio.h>' is refused: only these toolchain"),
        ("#include </etc/passwd>\n", r"'#include </etc/passwd>' is refused"),
        ("  #  include <cuda_runtime.h>\n", r"'#include <cuda_runtime.h>' is refused"),
        (
            '#define H "ops.cuh"\n#include H\n',
            r"'#include H' is refused: an include through a macro",
        ),
        ('#include "ops.cuh" /* starts\n here */\n', r"a quoted include must stand on its own"),
        ('#include \\\n"ops.cuh"\n', r"a quoted include must stand on its own line"),
        ("#inc\\\nlude <stdio.h>\n", r"'#include <stdio.h>' is refused"),
        ("#include_next <cstdint>\n", r"'#include_next <cstdint>' is refused: reads a file"),
        ("#import <x.h>\n", r"'#import <x.h>' is refused: reads a file"),
        ('#embed "/etc/passwd"\n', r"'#embed \"/etc/passwd\"' is refused: reads a file"),
        ("%:include <stdio.h>\n", r"'#include <stdio.h>' is refused"),
        ("??=include <stdio.h>\n", r"'#include <stdio.h>' is refused"),
        ("# /* c */ include <stdio.h>\n", r"'#include <stdio.h>' is refused"),
        ("#if __has_include(<x.h>)\n#endif\n", r"__has_include is refused"),
        # "/*" inside a raw string or after a digit separator opens no comment for the compiler
        (
            'auto s = R"(" /* )";\n#include <stdio.h>\nauto t = R"(*/)";\n',
            r"<stdio\.h>' is refused",
        ),
        ("int n = 1'0; auto s = \"'/*\";\n#include <stdio.h>\n// */\n", r"<stdio\.h>' is refused"),
    ],
)
def test_untracked_includes_are_refused_naming_file_and_line(tmp_path, body, refusal):
    source = write_sources(tmp_path, {"k.cu": PER_ELEMENT + body, "ops.cuh": "int f();\n"})
    with pytest.raises(KbfuseError, match=rf"kernel source {tmp_path}/k\.cu: .*{refusal}"):
        kernelsrc.load(source)


def test_an_untracked_include_in_a_header_names_the_header(tmp_path):
    source = write_sources(
        tmp_path,
        {"k.cu": PER_ELEMENT + '#include "ops.cuh"\n', "ops.cuh": "#include <math.h>\n"},
    )
    with pytest.raises(KbfuseError, match=r"ops\.cuh: '#include <math\.h>' is refused"):
        kernelsrc.load(source)
    with pytest.raises(KbfuseError, match=r"ops\.cuh: '#include <math\.h>' is refused"):
        kernelsrc.included_headers(source)


def test_an_include_hidden_by_the_inlining_is_caught_in_the_final_text(tmp_path):
    """A quoted include inside a comment that a nested comment closes early: kbfuse inlines the
    header there, and what the compiler sees is checked too."""
    source = write_sources(
        tmp_path,
        {
            "k.cu": PER_ELEMENT + '/*\n#include "ops.cuh"\n',
            "ops.cuh": "*/\n#include <stdio.h>\n/*\n",
        },
    )
    with pytest.raises(KbfuseError, match=r"'#include <stdio\.h>' is refused"):
        kernelsrc.load(source)


@pytest.mark.parametrize(
    "body",
    [
        "#include <cuda_fp16.h>\n#include <cstdint>\n",
        "// #include <stdio.h>\n",
        "/* #include <stdio.h>\n   #include </etc/passwd> */\n",
        'const char *s = "#include <stdio.h>";\n',
        'const char *s = "/*";\n#include <cstdint>\nconst char *t = "*/";\n',
        "auto s = R\"x(\n#include <stdio.h>\n)x\";\nint n = 1'000'000;\n",
    ],
)
def test_toolchain_headers_comments_and_strings_are_accepted(tmp_path, body):
    source = write_sources(tmp_path, {"k.cu": PER_ELEMENT + body})
    assert kernelsrc.load(source).files == {
        "k.cu": kernelsrc._sha256(source.read_bytes())  # noqa: SLF001
    }


def test_quoted_include_followed_by_a_comment_is_inlined_and_tracked(tmp_path):
    source = write_sources(
        tmp_path,
        {
            "k.cu": PER_ELEMENT + '#include "ops.cuh" /* the ops */ // and more\nint g;\n',
            "ops.cuh": "int f() { return 1; }\n",
        },
    )
    unit = kernelsrc.load(source)
    assert "int f() { return 1; }" in unit.text and '#include "ops.cuh"' not in unit.text
    assert list(unit.files) == ["k.cu", "ops.cuh"]
    assert kernelsrc.included_headers(source) == [tmp_path / "ops.cuh"]
    before = unit.sha256
    (tmp_path / "ops.cuh").write_text("int f() { return 2; }\n")
    assert kernelsrc.load(source).sha256 != before


def test_a_quoted_include_in_a_crlf_source_is_inlined(tmp_path):
    source = tmp_path / "k.cu"
    source.write_bytes(PER_ELEMENT.encode() + b'#include "ops.cuh"\r\nint g;\r\n')
    (tmp_path / "ops.cuh").write_bytes(b"int f();\r\n")
    unit = kernelsrc.load(source)
    assert list(unit.files) == ["k.cu", "ops.cuh"] and "int f();" in unit.text


def test_two_comments_on_an_include_line_do_not_swallow_code(tmp_path):
    source = write_sources(
        tmp_path,
        {"k.cu": PER_ELEMENT + '#include "ops.cuh" /* a */ int lost; /* b */\n', "ops.cuh": ""},
    )
    with pytest.raises(KbfuseError, match=r"a quoted include must stand on its own line"):
        kernelsrc.load(source)


def test_a_header_linking_out_of_kernels_is_refused(tmp_path):
    outside = tmp_path / "outside.cuh"
    outside.write_text("int secret;\n")
    source = write_sources(tmp_path / "kernels", {"k.cu": PER_ELEMENT + '#include "ops.cuh"\n'})
    (tmp_path / "kernels" / "ops.cuh").symlink_to(outside)
    with pytest.raises(KbfuseError, match=r"ops\.cuh resolves to .*outside\.cuh, outside"):
        kernelsrc.load(source)


def test_a_kernel_source_linking_out_of_kernels_is_refused_by_the_config_check(tmp_path):
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    (kernels / "eager_ops.cuh").write_text((KERNELS / "eager_ops.cuh").read_text())
    (kernels / "naive.cu").write_text((KERNELS / "naive.cu").read_text())
    elsewhere = write_sources(tmp_path / "elsewhere", {"k.cu": PER_ELEMENT})
    (kernels / "linked.cu").symlink_to(elsewhere)
    cfg = copy.deepcopy(DEFAULT)
    cfg["variants"] = {"x": {"route": "nvrtc-cubin", "kernel": "linked", "options": BASE}}
    validate_schema(cfg)
    with pytest.raises(KbfuseError, match=r"variants\.x\.kernel: 'linked': .* is a link out of"):
        check_config(cfg, kernels)


def test_nul_in_a_kernel_source_is_refused(tmp_path):
    source = write_sources(tmp_path, {"k.cu": PER_ELEMENT + "int a;\0\n"})
    with pytest.raises(KbfuseError, match=r"k\.cu contains a NUL character"):
        kernelsrc.load(source)


# --- odd characters in launch lines -----------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "refusal"),
    [
        ("// kbfuse-launch: per-element threads=\u00b2", r"'threads=\u00b2' is not name=positive"),
        ("// kbfuse-launch: per-element threads=\u0661\u0662\u0668", r"is not name=positive"),
        ("// kbfuse-launch: per-element threads=" + "9" * 5000, r"at most 9"),
        ("// kbfuse-launch: per-element threads=1 threads=2", r"'threads' is given twice"),
        ("// kbfuse-launch: per\u2011element threads=1", r"mode 'per\u2011element' is not one"),
        ("// kbfuse-launch: per-element threads=\x00", r"is not name=positive"),
        ("// kbfuse-launch: per-element thr\u00e9ads=4 threads=4", r"unknown \['thr\u00e9ads'\]"),
        ("// kbfuse-launch: per-element =4 threads=4", r"unknown \[''\]"),
        ("// kbfuse-launch: \u200b", r"mode '\\u200b' is not one of"),  # repr escapes it
    ],
)
def test_odd_launch_lines_give_a_message_not_a_traceback(line, refusal):
    with pytest.raises(KbfuseError, match=refusal):
        kernelsrc.parse_launch(line + "\n", "k.cu")
