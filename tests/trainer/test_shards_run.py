"""`buffer=shards` through the real commands: `amago-train` trains and resumes on it, `amago-eval` never opens it,
and what it cannot do yet is refused in one line. (Exact resumption: test_reproducible.py runs its killed-and-
resumed comparison with both buffers.)"""

from __future__ import annotations

import numpy as np

from amago_app.logging.metrics import read_jsonl
from conftest import Payload, amago_cli, one_line_error


def test_smoke_run_trains_resumes_and_evaluates_on_shards(tmp_path):
    run = tmp_path / "run"
    common = ("+experiment=smoke", "buffer=shards", "trainer.threads=1", "trainer.ckpt_interval=1")
    r = amago_cli("train", *common, f"hydra.run.dir={run}", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    shards = sorted(p for p in (run / "buffer" / "shards").iterdir() if not p.name.startswith("."))
    assert [s.name[-6:] for s in shards] == ["000000"]
    rows = read_jsonl(run / "metrics" / "buffer.jsonl")
    assert rows[-1]["buffer/Trajectories"] > 0 and rows[-1]["buffer/Shards"] == 1

    r = amago_cli("train", f"resume={run}", "trainer.epochs=3", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    later = read_jsonl(run / "metrics" / "buffer.jsonl")
    assert later[-1]["epoch"] == 2 and later[-1]["buffer/Trajectories"] > rows[-1]["buffer/Trajectories"]

    # amago-eval rebuilds the agent from the saved config and never reads the buffer: a shard made hostile
    # (a pickle payload) is not opened
    marker = tmp_path / "pwned"
    np.save(shards[0] / "rews.npy", np.array([Payload(marker)], dtype=object), allow_pickle=True)
    r = amago_cli("eval", str(run), "episodes=2", cwd=tmp_path, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert not marker.exists()
    # ... while training on it refuses that shard in one line naming it
    r = amago_cli("train", f"resume={run}", "trainer.epochs=4", cwd=tmp_path, timeout=300)
    line = one_line_error(r, "train")
    assert str(shards[0]) in line and "rews.npy" in line and not marker.exists()


def test_what_shards_cannot_do_yet_is_refused_in_one_line(tmp_path):
    r = amago_cli("train", "+experiment=smoke", "buffer=shards", "buffer.on_env_change=set_aside",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert "buffer=shards does not support buffer.on_env_change=set_aside" in one_line_error(r, "train")
