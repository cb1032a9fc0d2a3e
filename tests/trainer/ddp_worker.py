"""Run under `torchrun --nproc_per_node 2`: train a tiny run, then save this rank's agent weights."""

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from conftest import compose_config  # noqa: E402

from amago_app.trainer.loop import Trainer  # noqa: E402
from amago_app.trainer.run import end_process_group  # noqa: E402

out = Path(sys.argv[1])
cfg = compose_config(["trainer.epochs=2", "trainer.train_batches_per_epoch=4", f"seed={sys.argv[2]}"])
trainer = Trainer(cfg, out / "run")
trainer.learn()
rank = trainer.rank
torch.save({"agent": trainer.agent.state_dict(), "gradient_steps": trainer.counters.gradient_steps,
            "total_frames": trainer.counters.total_frames, "run_dir": str(trainer.run_dir),
            "model_after_learn": type(trainer.model).__name__}, out / f"rank{rank}.pt")
end_process_group()  # (as amago-train does: gloo can abort at interpreter exit otherwise)
