"""One command for a machine with a GPU: run every CUDA path of amago_app against its CPU/float32 result, then
measure the reference and long-context workloads (side by side with the original AMAGO when given), and write one
JSON file of figures. docs/guide-gpu.md explains the file; `bash scripts/gpu_check.sh` is the entry point.

Checks (each in its own process, with its own time limit; a crash or a hang fails that row only):
  update_fp32            the full AMAGO update (Transformer, SDPA attention) on CUDA in fp32
  bf16_autocast          the same under bf16 autocast (what trainer.mixed_precision=auto picks on bf16 GPUs)
  sdpa_kernel[K]         the update with torch's SDPA forced to one kernel K: flash, efficient, cudnn (bf16 for
                         flash / cudnn, which take half precision only), math
  attention[B]           amago_app's attention backends B: vanilla, flex (compiled on CUDA), flash (flash-attn
                         package: its training kernel and the KV-cache kernel of rollout steps)
  mamba[B]               the Mamba memory: pure PyTorch scan on CUDA (torch), mamba-ssm's fused kernels (mamba_ssm)
  compile_update         trainer.compile=true in fp32, and compile_update[bf16] with bf16 autocast (the GPU
                         default: trainer.compile=auto + mixed_precision=auto)
  compile_rollout        trainer.compile_rollout=true: the compiled one-step update of the memory in rollouts
  ddp_nccl               two or more GPUs: torchrun, DDP over NCCL
Every check builds a real Trainer from the Hydra config, fills its disk buffer by collecting, draws one batch, and
compares on it, from the same weights: the loss and every parameter's gradient of one update, the memory's output
over the whole window and, where the check has a rollout path, the memory's output step by step through its
rollout state (KV cache / SSM state), all against a CPU float32 reference (attention: the `vanilla` backend, Mamba:
the pure-PyTorch block). A tensor passes when max|device - cpu| <= atol + rtol * max|cpu|, or, in bf16, when it is
within a few times what bf16 autocast on the CPU makes of the same update (TOLERANCES below). The update is made
deterministic for this (no dropout, one critic: REDQ's random critic subset would draw different numbers on CUDA
and on the CPU).

Then `bench_update.py` measures (trainer.compile=false on both sides, as the original does not compile; the
compiled update is measured by a separate amago_app-only run): `update` and `rollout` on both workloads.

Without a CUDA device (or with --dry) it checks that everything it would run is there: every check's configs
compose through the real Hydra composition, every model builds on the CPU at a tiny size, the bench scripts'
command lines parse, torchrun is there; then it prints one line ("no CUDA device: ...") and exits 0. A piece that
does not compose or build exits 2 with one line naming it.

    bash scripts/gpu_check.sh                                    # -> ./gpu_check.json
    bash scripts/gpu_check.sh --out /tmp/h100.json --original ../amago --original-python ../amago/.venv/bin/python
    bash scripts/gpu_check.sh --only update_fp32 attention[flash] --no-bench
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import importlib.util
import json
import logging
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAM = "gpu_check"
ROW_PREFIX = "GPU_CHECK_ROW "  # how a check process hands its row to the orchestrator (one JSON per line)

#: fp32: CUDA and CPU sum in different orders (TF32 is switched off for these checks). bf16 keeps 8 bits of
#: mantissa: gradients part from fp32 by several percent of their scale, and by more than their own value where
#: a gradient is one sum whose terms cancel (sigma-reparam's scalar gains: bf16 rounds the terms, the sum is
#: small), so a bf16 tensor may also be as far off as `cpu_bf16_factor` times what bf16 autocast on the CPU
#: makes of the same update (same weights, same batch)
TOLERANCES = {"fp32": {"atol": 1e-5, "rtol": 1e-3}, "bf16": {"atol": 1e-3, "rtol": 0.1, "cpu_bf16_factor": 4}}
TOL_RULE = ("per tensor: max|device - cpu_fp32| <= atol + rtol * max|cpu_fp32|; bf16 rows also pass a tensor "
            "within cpu_bf16_factor * max|cpu_bf16 - cpu_fp32|")
INSTALL_CUDA_EXTRA = "pip install amago_app[cuda] (from a clone: EXTRAS=cuda bash scripts/setup.sh)"


# --- the checks ---------------------------------------------------------------------------------------------
# The reference workload of bench_update.py (T-maze, FF timestep encoder 128 wide, 8 actors, batch 24), with the
# update made deterministic: dropout off, one critic (REDQ draws its critic subset on the device's generator)
BASE = {"tstep_encoder.d_hidden": 128, "tstep_encoder.d_output": 128, "env.parallel_actors": 8,
        "trainer.batch_size": 24, "agent.num_critics": 1, "agent.num_critics_td": 1, "logger.verbose": "false",
        "trainer.log_interval": 1000000, "trainer.epochs": 1, "trainer.val_interval": "null",
        "trainer.ckpt_interval": "null", "trainer.always_save_latest": "false"}
TRANSFORMER = {"traj_encoder": "transformer", "traj_encoder.d_model": 128, "traj_encoder.n_layers": 2,
               "traj_encoder.n_heads": 8, "traj_encoder.dropout_ff": 0, "traj_encoder.dropout_emb": 0}
MAMBA = {"traj_encoder": "mamba", "traj_encoder.d_model": 128, "traj_encoder.n_layers": 2}
#: the same at toy sizes: the dry check's models and the CPU self-test (--device cpu --tiny)
TINY = {"tstep_encoder.d_hidden": 16, "tstep_encoder.d_output": 16, "env.parallel_actors": 2,
        "trainer.batch_size": 4, "agent.actor.d_hidden": 16, "agent.critic.d_hidden": 16}
TINY_NET = {"transformer": {"traj_encoder.d_model": 16, "traj_encoder.n_heads": 2, "traj_encoder.n_layers": 1},
            "mamba": {"traj_encoder.d_model": 16, "traj_encoder.n_layers": 1}}
FP32 = {"trainer.mixed_precision": "no"}
BF16 = {"trainer.mixed_precision": "bf16"}
EAGER = {"trainer.compile": "false", "trainer.compile_rollout": "false"}


@dataclass(frozen=True)
class Check:
    name: str
    overrides: dict  # the config under test (on top of BASE)
    reference: dict  # changed for the CPU float32 reference agent
    window: int = 50  # max_seq_len: the training window, and the rollout steps compared
    needs: str | None = None  # an optional package (import name), else the row is skipped with the pip command
    sdpa: str | None = None  # force torch's SDPA to this kernel around the device's calls
    rollout: bool = True  # compare the memory's step-by-step rollout output too
    limit_s: int = 90  # this check's own time limit
    builds_on_cpu: bool = True  # the dry check builds the device config's model on the CPU

    @property
    def precision(self) -> str:
        return "bf16" if self.overrides.get("trainer.mixed_precision") == "bf16" else "fp32"

    @property
    def net(self) -> str:
        return self.overrides["traj_encoder"]


VANILLA_REF = {"traj_encoder.attention": "vanilla"}
SDPA_KERNELS = {"flash": BF16, "efficient": FP32, "cudnn": BF16, "math": FP32}  # flash / cudnn: half precision only
CHECKS = [
    # the longest first: they overlap with the short ones (--jobs)
    Check("compile_update", {**TRANSFORMER, **FP32, **EAGER, "trainer.compile": "true"}, VANILLA_REF,
          rollout=False, limit_s=240),
    Check("compile_update[bf16]", {**TRANSFORMER, **BF16, **EAGER, "trainer.compile": "true"}, VANILLA_REF,
          rollout=False, limit_s=240),
    Check("attention[flex]", {**TRANSFORMER, **FP32, **EAGER, "traj_encoder.attention": "flex"}, VANILLA_REF,
          window=256, limit_s=180),
    Check("compile_rollout", {**TRANSFORMER, **FP32, **EAGER, "trainer.compile_rollout": "true"}, VANILLA_REF,
          limit_s=180),
    Check("ddp_nccl", {**TRANSFORMER, **FP32, **EAGER}, VANILLA_REF, rollout=False, limit_s=180),
    Check("update_fp32", {**TRANSFORMER, **FP32, **EAGER}, VANILLA_REF),
    Check("bf16_autocast", {**TRANSFORMER, **BF16, **EAGER}, VANILLA_REF),
    *(Check(f"sdpa_kernel[{k}]", {**TRANSFORMER, **p, **EAGER}, VANILLA_REF, window=256, sdpa=k, rollout=False)
      for k, p in SDPA_KERNELS.items()),
    Check("attention[vanilla]", {**TRANSFORMER, **FP32, **EAGER, "traj_encoder.attention": "vanilla"}, {}, window=256),
    Check("attention[flash]", {**TRANSFORMER, **BF16, **EAGER, "traj_encoder.attention": "flash"}, VANILLA_REF,
          window=256, needs="flash_attn"),
    Check("mamba[torch]", {**MAMBA, **FP32, **EAGER, "traj_encoder.backend": "torch"}, {}),
    # bf16, as runs use it: mamba-ssm's step kernel then meets bf16 inputs and the fp32 rollout state
    Check("mamba[mamba_ssm]", {**MAMBA, **BF16, **EAGER, "traj_encoder.backend": "mamba_ssm"},
          {"traj_encoder.backend": "torch"}, needs="mamba_ssm", builds_on_cpu=False),
]
CHECK_NAMES = [c.name for c in CHECKS]
PACKAGES = {"flash_attn": "flash-attn", "mamba_ssm": "mamba-ssm"}


@dataclass(frozen=True)
class Bench:
    """One bench_update.py run: a workload, a measurement, amago_app's overrides, beside the original or not."""

    workload: str
    measure: str
    overrides: tuple[str, ...] = ("trainer.compile=false",)  # the original does not compile either
    side_by_side: bool = True

    @property
    def run_name(self) -> str:
        """What --bench-only takes, e.g. `update[reference, compiled]`."""
        compiled = "" if "trainer.compile=false" in self.overrides else ", compiled"
        return f"{self.measure}[{self.workload}{compiled}]"

    @property
    def name(self) -> str:  # the report's row name
        return f"bench:{self.run_name}"


BENCHES = [Bench("reference", "update"), Bench("long", "update"), Bench("reference", "rollout"),
           Bench("long", "rollout"), Bench("reference", "update", ("trainer.compile=true",), side_by_side=False)]
BENCH_NAMES = [b.run_name for b in BENCHES]


def check_overrides(check: Check, tiny: bool, reference: bool = False, device: str = "cuda",
                    extra: list[str] | tuple[str, ...] = ()) -> list[str]:
    """The Hydra overrides of `check`'s device config, or of its CPU reference agent's."""
    values = {**BASE, **check.overrides, **window_keys(check.window)}
    if tiny:
        values.update(tiny_keys(check))
    if reference:
        values.update(check.reference, **FP32, **EAGER, **{"trainer.cpu": "true"})
    elif device == "cpu":
        values["trainer.cpu"] = "true"
    return [f"{k}={v}" for k, v in values.items()] + list(extra)


def window_keys(window: int) -> dict:
    # T-maze episodes as long as the window; a few of them per actor leave enough finished trajectories on disk
    return {"max_seq_len": window, "env.horizon": window - 1, "trainer.train_timesteps_per_epoch": 2 * window + 10}


def tiny_keys(check: Check) -> dict:
    return {**window_keys(8), **TINY, **TINY_NET[check.net]}


def compose(overrides: list[str]):
    from amago_app.api import compose as api_compose

    return api_compose(overrides)


# --- comparing ------------------------------------------------------------------------------------------------
def max_abs(a, b) -> float:
    a, b = a.detach().float().cpu(), b.detach().float().cpu()
    return float((a - b).abs().max()) if a.numel() else 0.0


def compare(pairs: dict, precision: str, cpu_bf16: dict | None = None) -> dict:
    """max|got - ref| per tensor against its tolerance (TOL_RULE; `cpu_bf16`: name -> max|cpu_bf16 - cpu_fp32|):
    the row's error figures and whether all pass."""
    import torch

    tol = TOLERANCES[precision]
    max_err, problems, ratios = 0.0, [], {}
    for name, (got, ref) in pairs.items():
        got, ref = got.detach().float().cpu(), ref.detach().float().cpu()
        if got.shape != ref.shape:
            problems.append(f"{name}: shape {tuple(got.shape)} on the device, {tuple(ref.shape)} on the CPU")
            continue
        if not torch.isfinite(got).all():
            problems.append(f"{name}: non-finite values on the device")
            continue
        err = max_abs(got, ref)
        bound = tol["atol"] + tol["rtol"] * (float(ref.abs().max()) if ref.numel() else 0.0)
        if cpu_bf16 is not None and name in cpu_bf16:
            bound = max(bound, tol["cpu_bf16_factor"] * cpu_bf16[name])
        max_err = max(max_err, err)
        ratios[name] = err / bound
    # the worst tensor (the last of equals, in the pairs' order)
    worst = max(reversed(list(ratios)), key=ratios.__getitem__) if ratios else None
    worst_ratio = ratios[worst] if ratios else 0.0
    worst_five = sorted(ratios.items(), key=lambda kv: -kv[1])[:5]  # where a failure lives: one tensor or many
    return {"max_abs_err": max_err, "ok": not problems and worst_ratio <= 1.0, "problems": problems,
            "worst": worst, "worst_err_over_tol": round(worst_ratio, 4), "tensors": len(pairs),
            "worst_five": {name: round(r, 4) for name, r in worst_five}}


def forward_backward(model, agent, batch, backward):
    """One update's loss and gradients (no optimizer step): {name: grad} of every parameter that got one."""
    agent.zero_grad(set_to_none=True)
    loss, _ = model(batch, False)
    backward(loss)
    grads = {n: p.grad.detach().float().cpu() for n, p in agent.named_parameters() if p.grad is not None}
    return loss.detach().float().cpu(), grads


def compiled_vs_eager(trainer, eager, before: dict, batch, loss_c, grads_c, precision: str) -> dict:
    """The compiled update against the same update run eagerly on the same device, from the same weights and
    statistics (`before`): the compiler's own share of a difference from the CPU, by the same rule."""
    trainer.agent.load_state_dict(before)
    loss_e, grads_e = forward_backward(eager, trainer.agent, batch, trainer.accelerator.backward)
    pairs = {"loss": (loss_c, loss_e), **{f"grad:{n}": (grads_c[n], g) for n, g in grads_e.items() if n in grads_c}}
    result = compare(pairs, precision)
    return {"ok": result["ok"], "max_abs_err": result["max_abs_err"], "worst_tensor": result["worst"],
            "worst_err_over_tol": result["worst_err_over_tol"], "worst_five": result["worst_five"],
            "loss_compiled": float(loss_c), "loss_eager": float(loss_e)}


def full_states(agent, batch, autocast):
    """The memory's output over the whole window (eval mode: no statistics move)."""
    import torch

    was = agent.training
    agent.eval()
    try:
        with torch.no_grad(), autocast():
            s, _ = agent.get_state(batch.obs, batch.rl2s, batch.time_idxs)
    finally:
        agent.train(was)
    return s.float().cpu()


def step_states(agent, batch, rows: int, steps: int, device, autocast):
    """The memory's output one timestep at a time through its rollout state, as rollouts call it; and the
    seconds per step after the first."""
    import torch

    def step(t: int):  # contiguous, as a rollout's tensors are (a compiled step guards on strides)
        obs = {k: v[:rows, t : t + 1].contiguous() for k, v in batch.obs.items()}
        return obs, batch.rl2s[:rows, t : t + 1].contiguous(), batch.time_idxs[:rows, t : t + 1].contiguous()

    was = agent.training
    agent.eval()
    out = []
    try:
        with torch.no_grad():
            hidden = agent.init_hidden_state(rows, device)
            for t in range(steps):
                if t == 1:
                    sync(device)
                    start = time.perf_counter()
                with autocast():
                    s, hidden = agent.get_state(*step(t), hidden)
                out.append(s)
            sync(device)
            seconds = (time.perf_counter() - start) / (steps - 1)
    finally:
        agent.train(was)
    return torch.cat(out, dim=1).float().cpu(), seconds


def full_fp32() -> None:
    """fp32 means fp32 here: no TF32 in matmuls or convolutions on Ampere and newer, eager or compiled. Both
    switches: torch >= 2.9 has a per-backend precision setting beside the older flags, and the compiler's
    kernels read the newer one."""
    import torch

    torch.set_float32_matmul_precision("highest")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    for backend in (torch.backends.cuda.matmul, torch.backends.cudnn, getattr(torch.backends.cudnn, "conv", None)):
        if backend is not None and hasattr(backend, "fp32_precision"):
            backend.fp32_precision = "ieee"


def sync(device) -> None:
    import torch

    if getattr(device, "type", device) == "cuda":
        torch.cuda.synchronize()


def sdpa_kernel(name: str | None):
    """A context that lets torch's scaled_dot_product_attention use only kernel `name` (None: no constraint)."""
    import torch

    if name is None:
        return contextlib.nullcontext()
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel as only
    except ImportError:  # torch < 2.3: the older switch (no cuDNN kernel there)
        if name == "cudnn":
            raise RuntimeError(f"the cuDNN attention kernel needs torch >= 2.3 (this is {torch.__version__})")
        return torch.backends.cuda.sdp_kernel(enable_flash=name == "flash", enable_mem_efficient=name == "efficient",
                                              enable_math=name == "math")
    kernels = {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
               "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}
    return only([kernels[name]])


class Fallbacks(logging.Handler):
    """Records what amago_app's attention module logs while a check runs: a flash check that logs a fallback
    did not run flash-attn."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.messages: list[str] = []

    def emit(self, record):
        self.messages.append(record.getMessage())


def missing_package(module: str | None) -> str | None:
    if module is None or importlib.util.find_spec(module) is not None:
        return None
    return f"{PACKAGES[module]} is not installed: {INSTALL_CUDA_EXTRA}"


def first_batch(trainer):
    """Collect until the buffer has finished trajectories, then one batch from the trainer's own loader."""
    trainer._open_outputs()
    trainer.collect()
    trainer.store()
    for _ in range(20):  # episodes longer than a collection epoch reach the disk on a later one
        if trainer.buffer.ready_for_training:
            break
        trainer.collect()
        trainer.store()
    batches = trainer.loader.epoch(0, 1)
    try:
        return next(batches)
    finally:
        batches.close()


def row(name: str, status: str, **fields) -> dict:
    base = {"name": name, "status": status, "reason": None, "max_abs_err": None, "tol": None, "seconds": None,
            "figures": {}}
    base.update(fields)
    return base


def run_check(check: Check, device: str, tiny: bool, workdir: Path, extra: list[str]) -> dict:
    """One check in this process: the device side through a real Trainer, the CPU float32 reference beside it."""
    import torch

    from amago_app.interaction.build import build_agent
    from amago_app.trainer.loop import Trainer

    start = time.perf_counter()
    skip = missing_package(check.needs)
    if skip is None and device == "cuda" and check.precision == "bf16" and not torch.cuda.is_bf16_supported():
        skip = f"{torch.cuda.get_device_name()} has no native bf16"
    if skip is None and device == "cpu" and check.sdpa in ("efficient", "cudnn"):
        skip = f"SDPA's {check.sdpa} kernel is CUDA-only (the CPU self-test)"
    if skip:
        return row(check.name, "skipped", reason=skip)
    if check.needs:
        importlib.import_module(check.needs)  # installed but broken (e.g. built for another torch): a failure
    if check.precision == "fp32":
        full_fp32()
    cfg = compose(check_overrides(check, tiny, device=device, extra=extra))
    ref_cfg = compose(check_overrides(check, tiny, reference=True, extra=extra))
    fallbacks = Fallbacks()
    logging.getLogger("amago_app.nets.traj.attention").addHandler(fallbacks)
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    trainer = Trainer(cfg, workdir / "device")
    try:
        dev = trainer.device
        if dev.type != device:
            raise RuntimeError(f"the trainer runs on {dev}, not {device}")
        batch = first_batch(trainer)
        ref = build_agent(ref_cfg, trainer.train_envs)
        ref.load_state_dict({k: v.detach().cpu() for k, v in trainer.agent.state_dict().items()})
        ref.train()
        ref_bf16 = copy.deepcopy(ref) if check.precision == "bf16" else None  # before the update moves statistics
        on_dev = batch.to(dev)
        figures: dict = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu",
                         "precision": trainer.precision_name, "compiled_update": bool(trainer.compiled.value),
                         "window": cfg.max_seq_len, "batch": cfg.trainer.batch_size}
        memory = trainer.agent.traj_encoder
        if hasattr(memory, "attention_backend"):
            figures["attention_backend"] = memory.attention_backend
        if hasattr(memory, "uses_kernels"):
            figures["mamba_kernels"] = bool(memory.uses_kernels)
        eager = getattr(trainer.model, "_orig_mod", None)  # the model under torch.compile, if compiled
        if eager is not None:  # its state before the update (σReparam's u, v move), for the eager update below
            before = {k: v.detach().clone() for k, v in trainer.agent.state_dict().items()}
        with sdpa_kernel(check.sdpa):
            t0 = time.perf_counter()
            loss_d, grads_d = forward_backward(trainer.model, trainer.agent, on_dev, trainer.accelerator.backward)
            sync(dev)
            figures["first_update_s"] = round(time.perf_counter() - t0, 3)  # includes compilation
            states_d = full_states(trainer.agent, on_dev, trainer.accelerator.autocast)
        loss_r, grads_r = forward_backward(ref, ref, batch, lambda loss: loss.backward())
        states_r = full_states(ref, batch, contextlib.nullcontext)
        pairs = {"loss": (loss_d, loss_r), "memory_output": (states_d, states_r)}
        missing = sorted(set(grads_r) - set(grads_d))
        if missing:
            raise RuntimeError(f"no gradient on the device for {len(missing)} parameter(s), e.g. {missing[0]}")
        pairs.update({f"grad:{n}": (grads_d[n], g) for n, g in grads_r.items()})
        cpu_bf16 = None
        if ref_bf16 is not None:  # how far bf16 itself takes the same update from fp32 (TOLERANCES)
            def bf16():
                return torch.autocast("cpu", dtype=torch.bfloat16)

            with bf16():
                loss_h, grads_h = forward_backward(ref_bf16, ref_bf16, batch, lambda loss: loss.backward())
            states_h = full_states(ref_bf16, batch, bf16)
            cpu_bf16 = {"loss": max_abs(loss_h, loss_r), "memory_output": max_abs(states_h, states_r),
                        **{f"grad:{n}": max_abs(grads_h[n], g) for n, g in grads_r.items() if n in grads_h}}
        if check.rollout:
            steps = min(batch.rl2s.shape[1], cfg.max_seq_len)  # the rollout state holds max_seq_len steps
            rows = min(trainer.train_envs.num_envs, batch.rl2s.shape[0])  # the compiled step's batch size
            stepped, per_step = step_states(trainer.agent, on_dev, rows, steps, dev, trainer.rollout_autocast)
            pairs["rollout_steps"] = (stepped, states_r[:rows, :steps])
            if cpu_bf16 is not None:
                cpu_bf16["rollout_steps"] = max_abs(states_h[:rows, :steps], states_r[:rows, :steps])
            figures["rollout_ms_per_step"] = round(1000 * per_step, 3)
            figures["rollout_rows"] = rows
        if check.name == "compile_rollout":
            figures["rollout_compiled"] = bool(trainer.rollout_compiled.value)
            figures["rollout_compile_s"] = trainer.rollout_compile_seconds
            if not trainer.rollout_compiled.value:
                raise RuntimeError(f"the rollout step was not compiled ({trainer.rollout_compiled.reason})")
        with sdpa_kernel(check.sdpa):  # the speed of this path, after the compared (and compiling) update
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                forward_backward(trainer.model, trainer.agent, on_dev, trainer.accelerator.backward)
                sync(dev)
                times.append(time.perf_counter() - t0)
            figures["ms_per_forward_backward"] = round(1000 * statistics.median(times), 3)
        if dev.type == "cuda":
            figures["peak_gpu_mb"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
        if eager is not None:  # compiled: is a difference the compiler's, or the device's?
            figures["compiled_vs_eager_on_device"] = compiled_vs_eager(trainer, eager, before, on_dev, loss_d,
                                                                       grads_d, check.precision)
    finally:
        trainer.close()
        logging.getLogger("amago_app.nets.traj.attention").removeHandler(fallbacks)
    result = compare(pairs, check.precision, cpu_bf16)
    figures.update(worst_tensor=result["worst"], worst_err_over_tol=result["worst_err_over_tol"],
                   worst_five=result["worst_five"],
                   tensors_compared=result["tensors"], loss_device=float(loss_d), loss_cpu_fp32=float(loss_r))
    if cpu_bf16 is not None:
        figures["cpu_bf16_err_of_worst"] = cpu_bf16.get(result["worst"])
    reason = None
    if check.name == "attention[flash]" and (figures.get("attention_backend") != "flash" or fallbacks.messages):
        reason = "flash-attn did not run: " + "; ".join(fallbacks.messages or ["the backend fell back at build time"])
    elif check.name == "mamba[mamba_ssm]" and not figures.get("mamba_kernels"):
        reason = "mamba-ssm's kernels did not run"
    elif not result["ok"]:
        reason = "; ".join(result["problems"]) or (
            f"{result['worst']}: error {result['worst_err_over_tol']}x the tolerance")
    return row(check.name, "fail" if reason else "pass", reason=reason, max_abs_err=result["max_abs_err"],
               tol={**TOLERANCES[check.precision], "dtype": check.precision, "rule": TOL_RULE},
               seconds=round(time.perf_counter() - start, 1), figures=figures)


def run_ddp(check: Check, device: str, tiny: bool, workdir: Path, extra: list[str]) -> dict | None:
    """Under torchrun: one update through DDP (NCCL on CUDA) on every rank's own batch against the same update
    computed on the CPU in fp32 with gloo (the statistics of InputNorm / PopArt are all-reduced on both sides, the
    CPU gradients averaged over the ranks by hand). The row comes from rank 0 (None elsewhere)."""
    import torch
    import torch.distributed as dist

    from amago_app.interaction.build import build_agent
    from amago_app.trainer.loop import Trainer
    from amago_app.trainer.run import end_process_group

    start = time.perf_counter()
    world, local = int(os.environ["WORLD_SIZE"]), int(os.environ["LOCAL_RANK"])
    if device == "cuda":
        torch.cuda.set_device(local)
        full_fp32()
    # one group, two transports: CUDA tensors (the DDP update) over NCCL, CPU tensors (the reference) over gloo;
    # accelerate uses a group that is already there
    dist.init_process_group(backend="cpu:gloo,cuda:nccl" if device == "cuda" else "gloo")
    try:
        cfg = compose(check_overrides(check, tiny, device=device, extra=extra))
        ref_cfg = compose(check_overrides(check, tiny, reference=True, extra=extra))
        trainer = Trainer(cfg, workdir / "device")
        try:
            batch = first_batch(trainer)
            ref = build_agent(ref_cfg, trainer.train_envs)
            ref.load_state_dict({k: v.detach().cpu() for k, v in trainer.agent.state_dict().items()})
            ref.train()
            t0 = time.perf_counter()
            loss_d, grads_d = forward_backward(trainer.model, trainer.agent, batch.to(trainer.device),
                                               trainer.accelerator.backward)
            sync(trainer.device)
            seconds = time.perf_counter() - t0
            loss_r, grads_r = forward_backward(ref, ref, batch, lambda loss: loss.backward())
            for g in grads_r.values():  # what DDP does to the device's gradients: the mean over the ranks
                dist.all_reduce(g)
                g /= world
            pairs = {"loss": (loss_d, loss_r), **{f"grad:{n}": (grads_d[n], g) for n, g in grads_r.items()}}
            result = compare(pairs, check.precision)
            backend = dist.get_backend()
        finally:
            trainer.close()
        # the worst rank decides
        worst = torch.tensor([result["max_abs_err"], result["worst_err_over_tol"], float(not result["ok"])])
        dist.all_reduce(worst, op=dist.ReduceOp.MAX)
        if dist.get_rank() != 0:
            return None
        failed = bool(worst[2])
        return row(check.name, "fail" if failed else "pass",
                   reason=(f"a rank's DDP gradients differ from the CPU fp32 mean ({worst[1]:.3g}x the tolerance); "
                           f"rank 0: {'; '.join(result['problems']) or result['worst']}") if failed else None,
                   max_abs_err=float(worst[0]), tol={**TOLERANCES[check.precision], "dtype": "fp32", "rule": TOL_RULE},
                   seconds=round(time.perf_counter() - start, 1),
                   figures={"world_size": world, "process_group": backend, "worst_err_over_tol": float(worst[1]),
                            "rank0_first_update_s": round(seconds, 3), "rank0_loss_device": float(loss_d),
                            "rank0_loss_cpu_fp32": float(loss_r), "tensors_compared": result["tensors"]})
    finally:
        end_process_group()


def part_main(args) -> None:
    """`--part NAME`: one check in this process; its row on stdout after ROW_PREFIX."""
    check = next(c for c in CHECKS if c.name == args.part)
    workdir = Path(args.workdir)
    try:
        if check.name == "ddp_nccl":
            result = run_ddp(check, args.device, args.tiny, workdir, args.override)
        else:
            result = run_check(check, args.device, args.tiny, workdir, args.override)
    except Exception as e:  # noqa: BLE001 - every failure is this row's result; the traceback goes to stderr
        import traceback

        traceback.print_exc()
        first = (str(e).strip().splitlines() or [""])[0][:300]
        result = row(check.name, "fail", reason=f"{type(e).__name__}: {first}")
        if os.environ.get("RANK", "0") != "0":
            result = None
    if result is not None:
        print(ROW_PREFIX + json.dumps(result), flush=True)


# --- running processes with a limit ------------------------------------------------------------------------
def run_limited(cmd: list[str], timeout: float, env: dict | None = None) -> tuple[int | None, str, str]:
    """(exit code or None on timeout, stdout, stderr); on timeout the whole process group is killed (bench_update
    and torchrun start processes of their own)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=max(1.0, timeout))
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return None, out, err


def json_lines(text: str) -> list[dict]:
    """The JSON objects among a process's output lines (anything else it printed is skipped)."""
    found = []
    for line in text.splitlines():
        if line.startswith("{"):
            with contextlib.suppress(json.JSONDecodeError):
                found.append(json.loads(line))
    return found


def tail(text: str, lines: int = 25) -> list[str]:
    return [line[:400] for line in text.strip().splitlines()[-lines:]]


def torchrun_path() -> str | None:
    beside = Path(sys.executable).parent / "torchrun"
    return str(beside) if beside.exists() else shutil.which("torchrun")


def launch_check(check: Check, args, deadline: float, gpus: int) -> dict:
    """Run one check in its own process (torchrun for DDP) within its limit and what is left of the budget."""
    left = min(check.limit_s, deadline - time.monotonic())
    if missing_package(check.needs):
        return row(check.name, "skipped", reason=missing_package(check.needs), seconds=0.0)
    if left < 15:
        return row(check.name, "skipped", reason=f"the time budget (--budget {args.budget:g} s) was spent first")
    flags = ["--part", check.name, "--device", args.device, *(["--tiny"] if args.tiny else [])]
    for o in args.override:
        flags += ["--override", o]
    if check.name == "ddp_nccl":
        procs = gpus if args.device == "cuda" else 2  # the CPU self-test runs two gloo processes
        if procs < 2:
            return row(check.name, "skipped", reason=f"{gpus} GPU visible: DDP over NCCL needs 2 or more")
        torchrun = torchrun_path()
        if torchrun is None:
            return row(check.name, "fail", reason="torchrun not found (it comes with torch)")
        launcher = [torchrun, "--standalone", "--nproc_per_node", str(procs)]
    else:
        launcher = [sys.executable]
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("HYDRA_FULL_ERROR", None)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="gpu_check_") as tmp:
        code, out, err = run_limited([*launcher, str(HERE / "gpu_check.py"), *flags, "--workdir", tmp], left, env)
    seconds = round(time.perf_counter() - start, 1)
    rows = [json.loads(line[len(ROW_PREFIX):]) for line in out.splitlines() if line.startswith(ROW_PREFIX)]
    if rows:
        result = rows[0]
        result["seconds"] = seconds  # the process's wall time: start-up, Trainer, collection, both sides
    elif code is None:
        limit = "its own limit" if left >= check.limit_s else f"what was left of --budget {args.budget:g}"
        result = row(check.name, "fail", reason=f"timed out after {left:.0f} s ({limit})", seconds=seconds)
    else:
        last = next((line for line in reversed(tail(err)) if line.strip()), "no output")
        result = row(check.name, "fail", reason=f"exit code {code}: {last}", seconds=seconds)
    if result["status"] == "fail":
        result["log_tail"] = tail(err)
    return result


def launch_bench(bench: Bench, args, deadline: float) -> dict:
    left = deadline - time.monotonic()
    label = bench.name
    if left < 30:
        return row(label, "skipped", reason=f"the time budget (--budget {args.budget:g} s) was spent first")
    cmd = [sys.executable, str(HERE / "bench_update.py"), "--workload", bench.workload, "--only", bench.measure]
    if bench.side_by_side and args.original:
        cmd += ["--original", args.original, "--original-python", args.original_python]
    cmd += ["--", *bench.overrides, *args.override]
    start = time.perf_counter()
    code, out, err = run_limited(cmd, left, {**os.environ, "PYTHONUNBUFFERED": "1"})
    rows = json_lines(out)
    figures = {"command": " ".join(cmd[1:]), "rows": rows,
               "summary": [line for line in out.splitlines() if line.startswith("|")]}
    if bench.side_by_side and not args.original:
        figures["original"] = "not measured: give --original PATH --original-python PY"
    status, reason = "pass", None
    if code is None:
        status, reason = "fail", f"timed out after {left:.0f} s (the rows measured until then are kept)"
    elif code != 0:
        status, reason = "fail", f"exit code {code}: " + next((ln for ln in reversed(tail(err)) if ln.strip()), "")
    result = row(label, status, reason=reason, seconds=round(time.perf_counter() - start, 1), figures=figures)
    if status == "fail":
        result["log_tail"] = tail(err)
    return result


# --- the machine and the dry check ----------------------------------------------------------------------------
def machine(device: str) -> dict:
    import platform

    import torch

    info = {"python": sys.version.split()[0], "torch": torch.__version__, "cuda_runtime": torch.version.cuda,
            "cpu": platform.processor() or platform.machine(), "cores": len(os.sched_getaffinity(0)),
            "packages": {pip: version_of(mod) for mod, pip in PACKAGES.items()}}
    if device == "cuda":
        info["gpus"] = [{"name": torch.cuda.get_device_name(i),
                         "capability": ".".join(map(str, torch.cuda.get_device_capability(i))),
                         "memory_gb": round(torch.cuda.get_device_properties(i).total_memory / 2**30, 1)}
                        for i in range(torch.cuda.device_count())]
        info["bf16"] = torch.cuda.is_bf16_supported()
        info["cudnn"] = torch.backends.cudnn.version()
    try:
        info["amago_app_commit"] = subprocess.run(["git", "-C", str(HERE), "rev-parse", "--short", "HEAD"],
                                                  capture_output=True, text=True, timeout=10).stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        info["amago_app_commit"] = None
    return info


def version_of(module: str) -> str | None:
    if importlib.util.find_spec(module) is None:
        return None
    from importlib import metadata

    try:
        return metadata.version(PACKAGES[module])
    except metadata.PackageNotFoundError:
        return "installed"


def dry_check(args) -> str:
    """Compose every config, build every model on the CPU at a tiny size, parse the bench command lines, find
    torchrun: what the run needs before it spends GPU time. A broken piece raises UserError naming it."""
    from hydra import compose as hydra_compose, initialize_config_dir
    from omegaconf import OmegaConf

    from amago_app.cli.errors import UserError, user_message
    from amago_app.config import config_dir, setup
    from amago_app.config.overrides import apply_overrides
    from amago_app.interaction.build import build_agent, build_envs

    def refuse(what: str, e: BaseException):
        raise UserError(f"{what}: {user_message(e) or f'{type(e).__name__}: {e}'}") from e

    composed: dict[tuple, object] = {}

    def compose_once(what: str, overrides: list[str]):
        if tuple(overrides) not in composed:
            try:
                composed[tuple(overrides)] = hydra_compose("config", overrides=overrides)
            except Exception as e:  # noqa: BLE001 - reported as one line naming the piece
                refuse(f"{what} does not compose", e)
        return composed[tuple(overrides)]

    models: set[str] = set()
    setup()
    logging.getLogger("amago_app").setLevel(logging.ERROR)  # the fallbacks a CPU reports are expected here
    with warnings.catch_warnings(), initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        warnings.simplefilter("ignore")
        for check in CHECKS:
            for reference in (False, True):
                side = "its CPU reference" if reference else "the device config"
                what = f"check {check.name!r}: {side}"
                cfg = compose_once(what, check_overrides(check, False, reference=reference, extra=args.override))
                if not (reference or check.builds_on_cpu):
                    continue
                # the same config at toy sizes (plain keys, applied as to any composed config)
                tiny = apply_overrides(copy.deepcopy(cfg), [f"{k}={v}" for k, v in tiny_keys(check).items()])
                model = OmegaConf.to_yaml({k: tiny[k] for k in ("agent", "tstep_encoder", "traj_encoder", "env",
                                                                 "max_seq_len")})
                if model in models:
                    continue
                try:
                    envs = build_envs(tiny, "train", num_actors=1)
                    try:
                        build_agent(tiny, envs)
                    finally:
                        envs.close()
                except Exception as e:  # noqa: BLE001
                    refuse(f"{what}: the model does not build on the CPU", e)
                models.add(model)
    sys.path.insert(0, str(HERE))
    import bench_update

    for bench in BENCHES:  # (bench_update composes its own configs, in its own processes)
        if bench.workload not in bench_update.WORKLOADS or bench.measure not in bench_update.MEASUREMENTS:
            raise UserError(f"{bench.name}: bench_update.py has no workload {bench.workload!r} / measurement "
                            f"{bench.measure!r} (it has {', '.join(bench_update.WORKLOADS)} / "
                            f"{', '.join(bench_update.MEASUREMENTS)})")
    scripts = [(sys.executable, "bench_update.py"), (sys.executable, "bench_original.py")]
    if args.original_python:
        scripts.append((args.original_python, "bench_original.py"))
    for python, script in scripts:
        try:
            done = subprocess.run([python, str(HERE / script), "--help"], capture_output=True, text=True, timeout=60)
        except (OSError, subprocess.SubprocessError) as e:
            raise UserError(f"{python} {script} --help cannot run: {e}") from e
        if done.returncode != 0:
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise UserError(f"{python} {script} --help exits {done.returncode}: {last}")
    if torchrun_path() is None:
        raise UserError("torchrun not found beside this Python or on PATH (it comes with torch): "
                        "the DDP check needs it")
    missing = [PACKAGES[m] for m in PACKAGES if importlib.util.find_spec(m) is None]
    note = f"; {', '.join(missing)} not installed (their checks would be skipped)" if missing else ""
    return (f"dry check passed: {len(CHECKS)} checks compose ({len(composed)} configs), {len(models)} models build "
            f"on the CPU, bench_update.py / bench_original.py parse ({len(BENCHES)} bench runs), torchrun found{note}")


# --- the whole run ------------------------------------------------------------------------------------------
def summary_line(r: dict) -> str:
    if r["status"] == "pass" and r["max_abs_err"] is not None:
        detail = f"max |err| {r['max_abs_err']:.3g}, {r['figures'].get('worst_err_over_tol', 0):.3g}x tol"
    else:
        detail = r["reason"] or ""
    return f"{PROGRAM}: {r['name']:<22} {r['status']:<7} {detail} ({r['seconds'] or 0:.0f} s)"


def orchestrate(args) -> int:
    import torch

    started, t0 = time.strftime("%Y-%m-%dT%H:%M:%S%z"), time.monotonic()
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    checks = [c for c in CHECKS if not args.only or c.name in args.only]
    if args.bench_only:
        benches = [b for b in BENCHES if b.run_name in args.bench_only]
    elif args.no_bench:
        benches = []
    else:
        benches = [b for b in BENCHES if b.measure in args.bench]
    # the checks may use `--check-share` of the budget; the benches get the rest (and whatever the checks left)
    check_deadline = t0 + (args.budget * args.check_share if benches else args.budget)
    print(f"{PROGRAM}: {len(checks)} checks on {args.device} ({gpus} GPU), then {len(benches)} bench runs; "
          f"budget {args.budget:g} s", flush=True)
    rows: list[dict] = []
    machine_info = machine(args.device)
    out = Path(args.out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)

    def write_report(done: bool) -> dict:
        """The whole file, rewritten after every row: a run killed from outside (a lease that ends, a job
        limit) keeps every row it finished; `complete` says whether the run got to its end."""
        counts = {s: sum(r["status"] == s for r in rows) for s in ("pass", "fail", "skipped")}
        report = {"tool": "scripts/gpu_check.py", "started": started, "seconds": round(time.monotonic() - t0, 1),
                  "complete": done, "machine": machine_info,
                  "settings": {"device": args.device, "budget_s": args.budget, "jobs": args.jobs,
                               "tiny": args.tiny, "overrides": args.override, "original": args.original,
                               "original_python": args.original_python},
                  "tolerances": {**TOLERANCES, "rule": TOL_RULE}, "counts": counts, "rows": rows}
        tmp = out.with_name(out.name + ".tmp")
        tmp.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(tmp, out)
        return report

    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        running = [pool.submit(launch_check, c, args, check_deadline, gpus) for c in checks]
        for done in as_completed(running):  # reported as they finish, recorded in the checks' order
            rows.append(done.result())
            print(summary_line(rows[-1]), flush=True)
            write_report(False)
        rows.sort(key=lambda r: CHECK_NAMES.index(r["name"]))
    for bench in benches:
        result = launch_bench(bench, args, t0 + args.budget)
        rows.append(result)
        print(summary_line(result), flush=True)
        for line in result["figures"].get("summary", []):
            print(f"    {line}", flush=True)
        write_report(False)
    report = write_report(True)
    counts = report["counts"]
    print(f"{PROGRAM}: {counts['pass']} pass, {counts['fail']} fail, {counts['skipped']} skipped in "
          f"{report['seconds']:.0f} s; figures in {out}", flush=True)
    return 1 if counts["fail"] else 0


def parse_args(argv=None):
    p = argparse.ArgumentParser(prog=PROGRAM, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="gpu_check.json", help="the JSON file of figures (default: ./gpu_check.json)")
    p.add_argument("--original", default=None, help="a checkout of the original AMAGO: benchmark it side by side")
    p.add_argument("--original-python", default=None, help="the Python of the original's own environment")
    p.add_argument("--budget", type=float, default=450.0, help="seconds for everything (default 450: under 8 min)")
    p.add_argument("--check-share", type=float, default=0.5, help="the part of the budget the checks may use")
    p.add_argument("--jobs", type=int, default=4, help="checks run at once (each its own process; default 4)")
    p.add_argument("--only", nargs="+", default=None, metavar="CHECK", help=f"run these checks only: {CHECK_NAMES}")
    p.add_argument("--bench", nargs="+", default=["update", "rollout"], choices=("update", "rollout"),
                   help="bench_update.py measurements to run (default: both, on the reference and long workloads)")
    p.add_argument("--no-bench", action="store_true", help="the checks only")
    p.add_argument("--bench-only", nargs="+", default=None, metavar="RUN",
                   help=f"these bench runs only, in this script's order: {BENCH_NAMES}")
    p.add_argument("--override", action="append", default=[], metavar="KEY=VALUE",
                   help="a Hydra override added to every config (repeatable), e.g. trainer.threads=4")
    p.add_argument("--dry", action="store_true", help="only the dry check, even with a GPU")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="the device under test; cpu is this script's self-test (figures meaningless)")
    p.add_argument("--tiny", action="store_true", help="toy model sizes (with --device cpu: a quick self-test)")
    p.add_argument("--part", default=None, help=argparse.SUPPRESS)  # one check, in a process of its own
    p.add_argument("--workdir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.only:
        unknown = [n for n in args.only if n not in CHECK_NAMES]
        if unknown:
            p.error(f"--only {unknown[0]!r} is not a check; choose from {', '.join(CHECK_NAMES)}")
    if args.bench_only:
        unknown = [n for n in args.bench_only if n not in BENCH_NAMES]
        if unknown:
            p.error(f"--bench-only {unknown[0]!r} is not a bench run; choose from {', '.join(BENCH_NAMES)}")
    if args.original and not args.original_python:
        p.error("--original needs --original-python (the original runs under its own environment)")
    if args.original and not Path(args.original).is_dir():
        p.error(f"--original {args.original!r} is not a directory")
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.part:
        part_main(args)
        return 0
    from amago_app.cli.errors import report_user_errors

    import torch

    with report_user_errors(PROGRAM):
        dry = dry_check(args)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"no CUDA device: torch {torch.__version__} sees no GPU (CUDA build: {torch.version.cuda}); {dry}; "
              "nothing measured", flush=True)
        return 0
    if args.dry:
        print(f"{PROGRAM}: {dry}; nothing measured (--dry)", flush=True)
        return 0
    print(f"{PROGRAM}: {dry}", flush=True)
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
