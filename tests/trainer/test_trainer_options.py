"""Trainer options that are checked before anything is built or written."""

from __future__ import annotations

import pytest

from amago_app.trainer.loop import Trainer
from conftest import compose_config


@pytest.mark.parametrize("override, message", [
    ("trainer.mixed_precision=fp8", r"trainer.mixed_precision='fp8' is not one of \('no', 'bf16', 'fp16'\)"),
    ("trainer.compile_mode=fastest", r"trainer.compile_mode='fastest' is not one of \('default', 'reduce-overhead'"),
])
def test_bad_precision_or_compile_mode_fails_before_the_run_exists(tmp_path, override, message):
    with pytest.raises(ValueError, match=message):
        Trainer(compose_config([override]), tmp_path / "run")
    assert not (tmp_path / "run").exists()


def test_compile_forces_static_batch_shapes(tmp_path):
    """trainer.compile pads every window to max_seq_len, so one compiled graph serves every update."""
    trainer = Trainer(compose_config(["trainer.compile=true"]), tmp_path / "run")
    try:
        assert trainer.loader.fixed_length
    finally:
        trainer.close()
    trainer = Trainer(compose_config([]), tmp_path / "run2")
    try:
        assert not trainer.loader.fixed_length
    finally:
        trainer.close()
