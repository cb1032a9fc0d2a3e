"""trainer.mixed_precision=auto / trainer.compile=auto / trainer.compile_rollout=auto: the choices as functions of
the machine's capabilities (and the run's length), and runs with the auto defaults (what this machine chooses)
and with the compiled rollout step that build and train."""

from __future__ import annotations

import copy
import json

import pytest
import torch

from amago_app.nets.traj.transformer import TransformerTrajEncoder
from amago_app.trainer import build as build_module
from amago_app.trainer.hardware import (COMPILE_ROLLOUT_FROM_STEPS, choose_compile, choose_compile_rollout,
                                        choose_precision, cpu_flags, detect_cuda_bf16, device_type,
                                        missing_cpp_toolchain, parse_compile)
from amago_app.trainer.loop import Trainer
from conftest import TINY, compose_config

ZEN4 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
ICELAKE = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_vnni\n"
SAPPHIRE = "processor\t: 0\nflags\t\t: avx512f amx_bf16 amx_tile\n"
GRAVITON3 = "processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_cpu_flags_read_x86_and_arm_cpuinfo():
    assert "avx512_bf16" in cpu_flags(ZEN4)
    assert "bf16" in cpu_flags(GRAVITON3)
    assert cpu_flags("no such lines") == frozenset()


@pytest.mark.parametrize("cpuinfo, chosen", [(ZEN4, "bf16"), (SAPPHIRE, "bf16"), (GRAVITON3, "bf16"),
                                             (ICELAKE, "no"), ("", "no")])
def test_auto_precision_on_cpu_is_bf16_only_with_native_bf16(cpuinfo, chosen):
    choice = choose_precision("auto", "cpu", cpu_flags(cpuinfo), cuda_bf16=False)
    assert choice.value == chosen
    assert choice.reason.startswith("auto")


def test_auto_precision_on_cuda_follows_the_gpus_bf16_support():
    assert choose_precision("auto", "cuda", frozenset(), cuda_bf16=True).value == "bf16"
    assert choose_precision("auto", "cuda", cpu_flags(ZEN4), cuda_bf16=False).value == "no"  # a V100 / T4


@pytest.mark.parametrize("setting", ["no", "bf16", "fp16"])
def test_an_explicit_precision_is_kept(setting):
    assert choose_precision(setting, "cpu", cpu_flags(ICELAKE), cuda_bf16=False).value == setting


def test_a_bad_precision_names_the_choices():
    with pytest.raises(ValueError, match=r"'fp8' is not one of \('auto', 'no', 'bf16', 'fp16'\)"):
        choose_precision("fp8", "cpu", frozenset(), cuda_bf16=False)


def test_auto_compile_is_on_for_cuda_only():
    assert choose_compile("auto", "cuda").value is True
    assert choose_compile("auto", "cpu").value is False
    assert choose_compile(True, "cpu").value is True and choose_compile("false", "cuda").value is False
    assert parse_compile(None) is None  # an empty value means auto
    with pytest.raises(ValueError, match=r"trainer.compile=3 is not one of \(auto, true, false\)"):
        parse_compile(3)


def _train_one_epoch(tmp_path, overrides=()):
    trainer = Trainer(compose_config(["trainer.epochs=1", *overrides]), tmp_path / "run")
    trainer.autocast_used = trainer.accelerator.mixed_precision  # what accelerate runs the update in
    trainer.learn()
    rows = [json.loads(line) for line in (tmp_path / "run/metrics/train-update.jsonl").read_text().splitlines()]
    return trainer, rows


def test_the_auto_defaults_build_and_train_with_this_machines_choice(tmp_path, capsys):
    """The defaults are auto; a tiny run composes, builds, trains an epoch and says what auto chose."""
    cfg = compose_config([])
    assert cfg.trainer.mixed_precision == "auto" and cfg.trainer.compile == "auto"
    expected = choose_precision("auto", device_type(False), cpu_flags(), detect_cuda_bf16())
    trainer, rows = _train_one_epoch(tmp_path, ["logger.verbose=true", "logger.console=plain"])
    assert trainer.precision == expected and trainer.compiled.value is (device_type(False) == "cuda")
    assert trainer.autocast_used == expected.value
    assert trainer.counters.gradient_steps == 3 and all(r["train-update/Loss"] == r["train-update/Loss"] for r in rows)
    assert rows[0]["train-update/bf16 Autocast"] == float(expected.value == "bf16")
    assert rows[0]["train-update/Compiled"] == float(trainer.compiled.value)
    out = capsys.readouterr().out
    assert f"({expected.reason})" in out and "compile off (auto: off on CPU" in out


@pytest.mark.parametrize("flags, autocast", [(frozenset(), 0.0), (frozenset({"avx512_bf16"}), 1.0)])
def test_auto_precision_trains_in_what_the_cpu_flags_allow(tmp_path, monkeypatch, flags, autocast):
    """The same run on a CPU without native bf16 trains in fp32, with it in bf16 (the flags are what differs)."""
    monkeypatch.setattr(build_module, "cpu_flags", lambda: flags)
    trainer, rows = _train_one_epoch(tmp_path, ["trainer.cpu=true"])
    assert trainer.autocast_used == ("bf16" if autocast else "no")
    assert rows[0]["train-update/bf16 Autocast"] == autocast


# --- trainer.compile_rollout ----------------------------------------------------------------------------------
def test_auto_compiles_the_rollout_step_on_cpu_for_long_runs_only():
    long, short = COMPILE_ROLLOUT_FROM_STEPS, COMPILE_ROLLOUT_FROM_STEPS - 1
    assert choose_compile_rollout("auto", "cpu", long, None).value is True
    off = choose_compile_rollout("auto", "cpu", short, None)
    assert off.value is False and f"{short:,} collection steps" in off.reason
    assert choose_compile_rollout("auto", "cpu", long, "no C++ compiler").value is False
    assert choose_compile_rollout("auto", "cuda", long, None).value is False
    assert choose_compile_rollout(True, "cpu", 10, None).value is True  # true: whatever the run's length
    assert choose_compile_rollout("false", "cpu", long, None).value is False
    with pytest.raises(ValueError, match=r"trainer.compile_rollout=true needs a C\+\+ toolchain .*: no C\+\+ compiler"):
        choose_compile_rollout("true", "cpu", long, "no C++ compiler (g++ / clang++ or $CXX)")
    with pytest.raises(ValueError, match=r"trainer.compile_rollout='yes' is not one of \(auto, true, false\)"):
        choose_compile_rollout("yes", "cpu", long, None)


def test_the_toolchain_check_names_a_missing_compiler(monkeypatch):
    monkeypatch.setattr("shutil.which", lambda name: None)
    monkeypatch.delenv("CXX", raising=False)
    assert missing_cpp_toolchain() == "no C++ compiler (g++ / clang++ or $CXX)"


needs_toolchain = pytest.mark.skipif(missing_cpp_toolchain() is not None,
                                     reason=f"torch.compile on CPU needs {missing_cpp_toolchain()}")


@needs_toolchain
@pytest.mark.parametrize("options", [
    pytest.param({}, id="causal"),
    pytest.param({"attn_mask": "sliding_window", "window_size": 5, "pos_emb": "rope"}, id="sliding-window-rope",
                 marks=pytest.mark.slow),  # one more compilation (10-25 s)
])
def test_the_compiled_rollout_step_matches_the_eager_one(options):
    """Through the ring's wrap-around and a reset of one row: the compiled step (every slot read, unfilled ones
    masked) gives the eager step's outputs."""
    torch.manual_seed(0)
    enc = TransformerTrajEncoder(tstep_dim=16, max_seq_len=12, d_model=32, n_heads=4, n_layers=2, **options).eval()
    eager = copy.deepcopy(enc)
    assert enc.compile_rollout_step(3, torch.device("cpu"))
    hidden_c, hidden_e = enc.init_hidden_state(3, "cpu"), eager.init_hidden_state(3, "cpu")
    seq = torch.randn(3, 30, 16)
    time_idx = torch.arange(30)[None, :, None].expand(3, 30, 1)
    with torch.no_grad():
        for t in range(30):
            if t == 17:
                done = torch.tensor([True, False, False])
                hidden_c, hidden_e = enc.reset_hidden_state(hidden_c, done), eager.reset_hidden_state(hidden_e, done)
            out_c, hidden_c = enc(seq[:, t : t + 1], time_idx[:, t : t + 1], hidden_c)
            out_e, hidden_e = eager(seq[:, t : t + 1], time_idx[:, t : t + 1], hidden_e)
            torch.testing.assert_close(out_c, out_e, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(hidden_c.k[1], hidden_e.k[1], rtol=1e-5, atol=1e-5)


@needs_toolchain
def test_a_run_with_the_compiled_rollout_step_collects_and_says_so(tmp_path, capsys):
    trainer, _ = _train_one_epoch(tmp_path, ["trainer.compile_rollout=true", "logger.verbose=true",
                                             "logger.console=plain"])
    assert trainer.rollout_compiled.value is True and trainer.rollout_compile_seconds > 0
    assert trainer.agent.traj_encoder._compiled_step is not None
    train = [json.loads(line) for line in (tmp_path / "run/metrics/train.jsonl").read_text().splitlines()]
    assert train[-1]["train/Rollout Step Compiled"] == 1.0
    assert "rollout step compiled in" in capsys.readouterr().out


def test_a_memory_without_a_compiled_step_acts_eagerly_and_says_why(tmp_path):
    cfg = compose_config([o for o in TINY if not o.startswith("traj_encoder.")] + ["traj_encoder=gru",
                         "traj_encoder.d_hidden=16", "trainer.compile_rollout=true"], tiny=False)
    trainer = Trainer(cfg, tmp_path / "run")
    assert trainer.rollout_compiled.value is False
    assert "GRUTrajEncoder has no compiled step" in trainer.rollout_compiled.reason


def test_a_copy_of_the_memory_does_not_share_its_compiled_step():
    enc = TransformerTrajEncoder(tstep_dim=4, max_seq_len=5, d_model=8, n_heads=2, n_layers=1)
    enc._compiled_step = object()  # stands for the compiled function, bound to enc's parameters
    assert copy.deepcopy(enc)._compiled_step is None and enc._compiled_step is not None


@needs_toolchain
def test_the_overlaps_acting_copy_runs_a_compiled_step_of_its_own(tmp_path):
    """With collection beside the update, the acting copy compiles its own step: it acts with its weights (the
    epoch's starting ones), not with the learner's, which change during the update."""
    trainer = Trainer(compose_config(["trainer.compile_rollout=true", "trainer.overlap_collection=true"]),
                      tmp_path / "run")
    learner, acting = trainer.agent.traj_encoder.eval(), trainer._background.acting.traj_encoder  # as rollouts act
    assert trainer.rollout_compiled.value and acting._compiled_step is not None

    def step(encoder):
        with torch.no_grad():
            hidden = encoder.init_hidden_state(2, torch.device("cpu"))
            out, _ = encoder(torch.ones(2, 1, encoder.tstep_dim), torch.zeros(2, 1, 1, dtype=torch.long), hidden)
        return out

    torch.testing.assert_close(step(acting), step(learner))
    with torch.no_grad():
        acting.final_norm.bias += 1.0
    torch.testing.assert_close(step(acting), step(learner) + 1.0)
