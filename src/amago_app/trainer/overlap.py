"""`trainer.overlap_collection`: an epoch's collection runs in a thread beside its update (mode=both).

The epoch becomes  validate -> [collect in a thread | update] -> store -> checkpoint.  The thread acts with a
copy of the agent whose weights are those of the epoch's start, the weights mode=both collects with, so the
data is exactly as on-policy as in mode=both; what changes is that the update runs on the buffer as it was
before this epoch's collection (the new rollouts join the buffer at the end of the epoch and are trained on
from the next one). The first epochs, before the buffer is ready for training, collect in the foreground.

The thread draws its actions from its own torch generator, seeded from (seed, actor rank, epoch), through
`sampling_generator` (torch's default generator stays the learner's alone), and the learner owns everything
else: the recorder's files are written, frames counted and metrics logged after the thread has finished. So a
run with overlap is as reproducible as one without, and resumes the same way.
"""

from __future__ import annotations

import copy
import threading
import time

import numpy as np
import torch

from amago_app.nets.heads.distributions import sampling_generator


class BackgroundCollection:
    """One epoch's collection in a thread; `start()` at the epoch's start, `finish()` after its update."""

    def __init__(self, trainer):
        self.trainer = trainer
        # the acting copy: never trained, its weights loaded from the learner at every start()
        self.acting = copy.deepcopy(trainer.agent).requires_grad_(False).eval()
        self.generator = torch.Generator(device=trainer.device)
        self._thread: threading.Thread | None = None
        self._result = None
        self._error: BaseException | None = None

    @property
    def running(self) -> bool:
        return self._thread is not None

    def start(self, epoch: int) -> None:
        t = self.trainer
        with torch.no_grad():
            self.acting.load_state_dict(t.agent.state_dict())
        seed = np.random.SeedSequence([t.cfg.seed, t.actor_rank, epoch, 0xC011EC7]).generate_state(1)[0]
        self.generator.manual_seed(int(seed))
        self._result, self._error = None, None
        self._thread = threading.Thread(target=self._run, name="amago-collection", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            start = time.perf_counter()
            with sampling_generator(self.generator):
                stats = self.trainer.run_collection(self.acting, on_step=None)
            self._result = (stats, time.perf_counter() - start)
        except BaseException as e:  # raised again in the learner's thread by finish()
            self._error = e

    def finish(self) -> float:
        """Wait for the thread, then record its rollouts (files, frame counts, metrics); returns env steps/s."""
        self._thread.join()
        self._thread = None
        if self._error is not None:
            raise self._error
        stats, seconds = self._result
        return self.trainer.record_collection(stats, seconds, beside_update=True)
