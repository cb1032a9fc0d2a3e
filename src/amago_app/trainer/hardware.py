"""Precision and compilation chosen for the machine (`trainer.mixed_precision=auto`, `trainer.compile=auto`,
`trainer.compile_rollout=auto`).

The choices are pure functions of what the machine can do (CPU flags, whether the GPU has bf16), so they are
tested without the hardware; `detect_*` reads the capabilities of the machine the run is on.

* **Precision.** bf16 autocast where the device multiplies bf16 natively: CPUs with AVX512-BF16 or AMX-BF16
  (x86) or the BF16 extension (Arm), GPUs for which `torch.cuda.is_bf16_supported()` (Ampere and newer); fp32
  everywhere else. Measured on the reference workload (AMD EPYC Zen 4 with AVX512-BF16, 1 torch thread): one
  update costs 74 ms of CPU in bf16 against 137 ms in fp32; without native bf16 instructions torch converts
  every product in software and bf16 is slower than fp32, hence fp32 there. fp16 is never chosen
  automatically: it needs loss scaling and overflows where bf16 does not.
* **Compilation.** `torch.compile` of the update on CUDA only. On CPUs inductor made the same update slower
  (Zen 4, torch 2.13: 84 ms of CPU per update against 69 ms eager in bf16, 8.2 against 9.5 updates/s in fp32)
  after 50-90 s of compilation; on GPUs it fuses the many small kernels of a ~1 M parameter model.
* **Compiling the rollout step** (`trainer.compile_rollout`) is the opposite case: one step of 8 actors is a few
  hundred tiny ops whose dispatch costs more than their arithmetic, and inductor's C++ wrapper runs them without
  Python. Reference model on Zen 4: 0.87 against 1.17 ms per collection step of 8 actors (policy, envs, buffer
  writes), after ~12 s of compilation (~2 s with inductor's on-disk cache warm), hence auto = on for CPU runs
  long enough to win the compilation back.
"""

from __future__ import annotations

import os
import shutil
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch

from amago_app.config.values import parse_switch

PRECISIONS = ("no", "bf16", "fp16")
#: CPU feature flags (/proc/cpuinfo) of native bf16 arithmetic: x86 AVX512-BF16, AMX-BF16; Arm BF16
NATIVE_BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "bf16")


@dataclass(frozen=True)
class Choice:
    """A setting as it applies to this run, and why (one phrase for the start-up lines)."""

    value: object
    reason: str


def cpu_flags(cpuinfo: str | None = None) -> frozenset[str]:
    """The CPU's feature flags: `flags` (x86) or `Features` (Arm) of /proc/cpuinfo; empty where there is none."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return frozenset()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return frozenset(value.split())
    return frozenset()


def detect_cuda_bf16() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def choose_precision(setting: str, device_type: str, flags: frozenset[str] | set[str], cuda_bf16: bool) -> Choice:
    """`trainer.mixed_precision` as it applies on `device_type` ("cpu" / "cuda") with these capabilities."""
    if setting in PRECISIONS:
        return Choice(setting, "trainer.mixed_precision")
    if setting != "auto":
        raise ValueError(f"trainer.mixed_precision={setting!r} is not one of {('auto',) + PRECISIONS}")
    if device_type == "cuda":
        return (Choice("bf16", "auto: the GPU computes bf16 natively") if cuda_bf16
                else Choice("no", "auto: the GPU has no native bf16"))
    native = sorted(set(flags) & set(NATIVE_BF16_CPU_FLAGS))
    if native and device_type == "cpu":
        return Choice("bf16", f"auto: the CPU has {'/'.join(native)}")
    return Choice("no", f"auto: no native bf16 on this {device_type.upper()}")


def parse_compile(setting) -> bool | None:
    """`trainer.compile`: true / false, or None for auto; anything else is an error."""
    return parse_switch(setting, "trainer.compile")


def choose_compile(setting, device_type: str) -> Choice:
    """`trainer.compile` as it applies on `device_type`: auto compiles on CUDA only (see the module doc)."""
    fixed = parse_compile(setting)
    if fixed is not None:
        return Choice(fixed, "trainer.compile")
    if device_type == "cuda":
        return Choice(True, "auto: on for CUDA")
    return Choice(False, f"auto: off on {device_type.upper()}, where compiling measured slower")


#: planned collection steps per actor (trainer.epochs x train_timesteps_per_epoch) from which
#: `trainer.compile_rollout=auto` compiles the rollout step on CPU: at the measured saving (~0.28 ms per step of
#: 8 actors, reference model, Zen 4) this many steps win back a cold compilation (~12 s; ~2 s from inductor's
#: on-disk cache)
COMPILE_ROLLOUT_FROM_STEPS = 50_000


def missing_cpp_toolchain() -> str | None:
    """What inductor's CPU code (C++ kernels and wrapper) needs and this machine lacks; None if nothing."""
    compilers = [os.environ.get("CXX"), "g++", "c++", "clang++"]
    if not any(c and shutil.which(c) for c in compilers):
        return "no C++ compiler (g++ / clang++ or $CXX)"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "no Python headers (Python.h)"
    return None


def choose_compile_rollout(setting, device_type: str, planned_steps: int, missing: str | None) -> Choice:
    """`trainer.compile_rollout`: true / false, or auto = on for CPU runs that plan at least
    `COMPILE_ROLLOUT_FROM_STEPS` collection steps per actor, where a C++ toolchain is there (`missing` is what
    `missing_cpp_toolchain` found lacking). GPUs: off under auto (the compiled step is measured on CPUs only)."""
    fixed = parse_switch(setting, "trainer.compile_rollout")
    if fixed is not None:
        if fixed and device_type == "cpu" and missing:
            raise ValueError(f"trainer.compile_rollout=true needs a C++ toolchain for torch.compile on CPU: {missing}; "
                             "install one or set trainer.compile_rollout=false")
        return Choice(fixed, "trainer.compile_rollout")
    if device_type != "cpu":
        return Choice(False, f"auto: off on {device_type.upper()} (measured on CPUs)")
    if missing:
        return Choice(False, f"auto: off, {missing}")
    if planned_steps < COMPILE_ROLLOUT_FROM_STEPS:
        return Choice(False, f"auto: off for {planned_steps:,} collection steps (on from {COMPILE_ROLLOUT_FROM_STEPS:,})")
    return Choice(True, f"auto: on for {planned_steps:,} collection steps")


def device_type(cpu_only: bool) -> str:
    """The device type the Accelerator will pick (`trainer.cpu`, or no GPU: cpu)."""
    return "cpu" if cpu_only or not torch.cuda.is_available() else "cuda"


#: cores per process from which `trainer.overlap_collection=auto` collects in a thread beside the update
OVERLAP_FROM_CORES = 4


def choose_overlap(setting, cores: int, processes: int, mode: str) -> Choice:
    """`trainer.overlap_collection`: true / false, or auto = on in mode=both for a single process that may use
    at least `OVERLAP_FROM_CORES` cores. On 2 cores the collector thread takes a core the update needs (measured
    slower, docs/results.md#speed); with spare cores it hides the collection time."""
    fixed = parse_switch(setting, "trainer.overlap_collection")
    if fixed is True and mode != "both":
        raise ValueError(f"trainer.overlap_collection=true needs trainer.mode=both (got trainer.mode={mode}); "
                         "trainer.mode=async runs collectors in processes of their own")
    if fixed is not None:
        return Choice(fixed, "trainer.overlap_collection")
    if mode != "both" or processes > 1:
        return Choice(False, "auto: off with several processes or trainer.mode other than both")
    per_process = cores // max(1, processes)
    if per_process >= OVERLAP_FROM_CORES:
        return Choice(True, f"auto: {per_process} cores, one collects beside the update")
    return Choice(False, f"auto: off on {per_process} core(s) (on from {OVERLAP_FROM_CORES})")
