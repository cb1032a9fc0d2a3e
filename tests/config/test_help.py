"""`amago-train --help`: the groups a user picks from (no internal schema/* groups) and every option with the
one-line explanation from its schema docstring, following the command line's choices."""

from __future__ import annotations

import re
import subprocess
import sys

from amago_app.config.help import field_docs
from amago_app.config.schema import EnvConfig, GRUTrajEncoderConfig, LoggerConfig, TrainerConfig


def help_text(*args) -> str:
    r = subprocess.run([sys.executable, "-m", "amago_app.cli.train", *args, "--help"], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout


def section(text: str, key: str) -> dict[str, str]:
    """{option: its line} of one top-level config node in the help."""
    block = text.split(f"\n  {key}:\n", 1)[1]
    out = {}
    for line in block.splitlines():
        if not line.startswith("    "):
            break
        m = re.match(r"^    (\w+):", line)
        if m:
            out[m.group(1)] = line
    return out


def test_help_lists_user_groups_and_explains_every_documented_option():
    text = help_text()
    assert "schema/" not in text and "schema" not in text.split("== Config ==")[0]
    groups = text.split("== Config ==")[0]
    assert re.search(r"\btmaze\* ", groups) and re.search(r"\n  logger +local\* tensorboard wandb\n", groups)
    assert "hydra/" not in groups
    for key, cls in (("trainer", TrainerConfig), ("logger", LoggerConfig), ("env", EnvConfig)):
        lines = section(text, key)
        docs = field_docs(cls)
        documented = [k for k in lines if k in docs]
        assert len(documented) >= 5, key
        for k in documented:
            assert lines[k].rstrip().endswith(f"# {docs[k]}"), lines[k]
    # a docstring that wraps over lines is shown whole, on one line
    assert "never trim) | learn (updates only" in section(text, "trainer")["mode"]
    assert "  epochs: 40" in text and "Evaluate a run with: amago-eval" in text


def test_help_follows_the_chosen_options():
    text = help_text("env=gym", "traj_encoder=gru")
    assert re.search(r"\bgym\*", text) and re.search(r"\bgru\*", text) and not re.search(r"\btmaze\*", text)
    assert section(text, "env")["id"].startswith("    id: CartPole-v1")
    gru = section(text, "traj_encoder")
    docs = field_docs(GRUTrajEncoderConfig)
    assert any(k in docs and line.endswith(f"# {docs[k]}") for k, line in gru.items())
    assert "d_model" not in gru  # the Transformer's options are gone
