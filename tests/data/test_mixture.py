"""MixtureBuffer: weights, annealing, renormalization over ready children, the single save dir rule."""

from __future__ import annotations

import numpy as np
import pytest

from amago_app.data.buffer import Buffer, DiskBuffer, NoBuffer
from amago_app.data.files import save_trajectory
from amago_app.data.mixture import MixtureBuffer
from amago_app.trainer.build import build_buffer
from conftest import compose_config, random_trajectory


class Fixed(Buffer):
    """Always returns trajectories of one length (identifies the child); readiness can be switched."""

    def __init__(self, length: int, ready: bool = True, save_to=None):
        self.length = length
        self.ready = ready
        self.save_new_trajs_to = save_to
        self.traj = random_trajectory(length)
        self.calls: list[str] = []

    @property
    def ready_for_training(self) -> bool:
        return self.ready

    def sample_random_trajectory(self, rng):
        return self.traj

    def on_end_of_collection(self, epoch, is_main_process=True):
        self.calls.append(f"collect{epoch}")
        return {"Files Deleted": 7}

    def refresh(self):
        self.calls.append("refresh")

    def stats(self):
        return {"Total Files": self.length}


def _epoch(mix: MixtureBuffer, epoch: int) -> None:
    """What the trainer does after each collection phase."""
    mix.on_end_of_collection(epoch)
    mix.refresh()


def _fractions(mix, n=4000, seed=0):
    rng = np.random.default_rng(seed)
    lengths = [len(mix.sample_random_trajectory(rng)) for _ in range(n)]
    return {k: lengths.count(k) / n for k in set(lengths)}


def test_weights_are_validated():
    a, b = Fixed(2), Fixed(3)
    with pytest.raises(ValueError, match="sum to 1"):
        MixtureBuffer([a, b], [0.5, 0.6])
    with pytest.raises(ValueError, match="2 entries for 1"):
        MixtureBuffer([a], [0.5, 0.5])
    with pytest.raises(ValueError, match=">= 0"):
        MixtureBuffer([a, b], [1.5, -0.5])
    with pytest.raises(ValueError, match="smooth_sudden_starts"):
        MixtureBuffer([a, b], [0.5, 0.5], smooth_sudden_starts=0)


def test_empirical_fractions_follow_the_weights_and_stats_report_them():
    mix = MixtureBuffer({"demos": Fixed(2), "online": Fixed(3)}, [0.8, 0.2])
    mix.configure()
    _epoch(mix, 0)
    frac = _fractions(mix)
    assert abs(frac[2] - 0.8) < 0.03 and abs(frac[3] - 0.2) < 0.03
    stats = mix.stats()
    assert stats["demos/Current Sample Weight"] == pytest.approx(0.8)
    assert stats["online/Normalized Sample Weight"] == pytest.approx(0.2)
    assert abs(stats["demos/Empirical Sample Fraction"] - frac[2]) < 1e-9
    assert stats["demos/Total Files"] == 2 and stats["online/Total Files"] == 3  # child metrics, prefixed
    assert "demos/Empirical Sample Fraction" not in mix.stats()  # counts restart after each report


def test_children_that_are_not_ready_are_skipped_and_weights_renormalized():
    demos, online = Fixed(2), Fixed(3, ready=False)
    mix = MixtureBuffer({"demos": demos, "online": online}, [0.3, 0.7])
    mix.configure()
    _epoch(mix, 0)
    assert mix.ready_for_training
    assert list(mix.normalized_weights()) == [1.0, 0.0]
    assert _fractions(mix, 500) == {2: 1.0}
    online.ready = True
    _epoch(mix, 1)
    assert mix.normalized_weights() == pytest.approx([0.3, 0.7])  # no smoothing: the final weight at once
    demos.ready = False
    _epoch(mix, 2)
    assert list(mix.normalized_weights()) == [0.0, 1.0] and _fractions(mix, 500) == {3: 1.0}


def test_not_ready_until_a_child_with_weight_is():
    online = Fixed(3, ready=False)
    mix = MixtureBuffer([NoBuffer(), online], [0.5, 0.5])
    assert not mix.ready_for_training  # not configured yet
    mix.configure()
    assert not mix.ready_for_training
    with pytest.raises(RuntimeError, match="no dataset of the mixture is ready"):
        mix.sample_random_trajectory(np.random.default_rng(0))
    online.ready = True
    _epoch(mix, 0)
    assert mix.ready_for_training


def test_annealing_schedule_of_a_late_child():
    """Ready at start: final weight throughout. Ready at epoch e0: 0 -> w over n epochs, from e0 on."""
    demos, online = Fixed(2), Fixed(3, ready=False)
    mix = MixtureBuffer({"demos": demos, "online": online}, [0.8, 0.2], smooth_sudden_starts=4)
    mix.configure()
    for e in range(3):
        _epoch(mix, e)
        assert list(mix.current_weights()) == [0.8, 0.0]
    online.ready = True
    seen = []
    for e in range(3, 10):
        _epoch(mix, e)
        seen.append(mix.current_weights().round(6).tolist())
    assert mix.ready_epoch == [0, 3]
    assert seen == [[0.8, 0.05], [0.8, 0.1], [0.8, 0.15], [0.8, 0.2], [0.8, 0.2], [0.8, 0.2], [0.8, 0.2]]
    # normalized over the ready children at epoch 3: 0.05 / 0.85
    mix.epoch = 3
    assert mix.normalized_weights()[1] == pytest.approx(0.05 / 0.85)


def test_annealing_from_explicit_initial_weights_moves_both_ways():
    a, b = Fixed(2), Fixed(3)
    mix = MixtureBuffer([a, b], [0.2, 0.8], initial_sampling_weights=[1.0, 0.0], smooth_sudden_starts=5)
    mix.configure()
    history = []
    for e in range(7):
        _epoch(mix, e)
        history.append(mix.current_weights().round(6).tolist())
    assert history[0] == [0.84, 0.16]  # w0 + (w - w0) * (0 - 0 + 1) / 5
    assert history[3] == [0.36, 0.64]
    assert history[4] == history[5] == history[6] == [0.2, 0.8]  # clipped at the final weights
    # None entries use the default rule (the final weight for a child ready at start)
    mix = MixtureBuffer([Fixed(2), Fixed(3)], [0.5, 0.5], initial_sampling_weights=[None, 0.0],
                            smooth_sudden_starts=2)
    mix.configure()
    _epoch(mix, 0)
    assert mix.current_weights().tolist() == [0.5, 0.25]


def test_state_dict_keeps_the_schedule_across_a_resume():
    demos, online = Fixed(2), Fixed(3, ready=False)
    mix = MixtureBuffer({"demos": demos, "online": online}, [0.8, 0.2], smooth_sudden_starts=4)
    mix.configure()
    _epoch(mix, 0)
    online.ready = True
    _epoch(mix, 1)
    state = mix.state_dict()
    again = MixtureBuffer({"demos": demos, "online": online}, [0.8, 0.2], smooth_sudden_starts=4)
    again.configure()  # both children are ready now: without the state, "online" would count as ready at start
    again.load_state_dict(state)
    _epoch(again, 2)
    assert again.current_weights().tolist() == pytest.approx([0.8, 0.1])


def test_at_most_one_child_saves_and_it_becomes_the_mixtures_save_dir(tmp_path):
    with pytest.raises(ValueError, match="at most one dataset"):
        MixtureBuffer([Fixed(2, save_to=tmp_path / "a"), Fixed(3, save_to=tmp_path / "b")], [0.5, 0.5])
    own = DiskBuffer(tmp_path, "run")
    save_trajectory(random_trajectory(4), own.protected_dir, "x")
    save_trajectory(random_trajectory(4, seed=1), own.protected_dir, "x")
    offline = DiskBuffer(tmp_path, "run", read_only=True)
    assert offline.save_new_trajs_to is None
    mix = MixtureBuffer({"offline": offline, "online": own}, [0.5, 0.5])
    assert mix.save_new_trajs_to == own.fifo_dir
    assert MixtureBuffer([Fixed(2), Fixed(3)], [0.5, 0.5]).save_new_trajs_to is None


def test_children_get_edit_rights_housekeeping_and_refresh():
    a, b = Fixed(2), Fixed(3)
    mix = MixtureBuffer({"a": a, "b": b}, [0.5, 0.5])
    mix.configure(has_edit_rights=False)
    assert a.has_edit_rights is False and b.has_edit_rights is False
    out = mix.on_end_of_collection(4)
    mix.refresh()
    assert out == {"a/Files Deleted": 7, "b/Files Deleted": 7}
    assert a.calls == ["collect4", "refresh"]


def test_read_only_buffer_never_trims_or_deletes(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        DiskBuffer(tmp_path, "missing", read_only=True)
    own = DiskBuffer(tmp_path, "data", max_size=1)
    for i in range(3):
        save_trajectory(random_trajectory(3, seed=i), own.fifo_dir, "x")
    ro = DiskBuffer(tmp_path, "data", max_size=1, read_only=True)
    assert ro.on_end_of_collection(0)["Files Deleted"] == 0
    ro.delete()
    ro.refresh()
    assert len(ro) == 3 and ro.ready_for_training
    assert "read-only" in ro.get_description()


def test_buffer_options_build_the_right_dataset(tmp_path):
    run = tmp_path / "runs" / "r1"
    assert isinstance(build_buffer(compose_config(["buffer=none"]), run), NoBuffer)
    data = DiskBuffer(tmp_path / "data", "demos")
    save_trajectory(random_trajectory(4), data.protected_dir, "demo")
    cfg = compose_config(["buffer=mixture", f"buffer.datasets.offline.dataset.root={tmp_path / 'data'}",
                          "buffer.datasets.offline.dataset.name=demos", "buffer.smooth_sudden_starts=10",
                          "buffer.datasets.online.initial_weight=0.1"])
    mix = build_buffer(cfg, run)
    assert isinstance(mix, MixtureBuffer) and mix.names == ["offline", "online"]
    assert mix.final_weights == [0.8, 0.2] and mix.smooth_sudden_starts == 10
    assert mix.initial_weights == [None, 0.1]
    assert mix.save_new_trajs_to == run.parent / "r1" / "buffer" / "fifo"  # the run's own buffer
    assert mix.datasets[0].read_only and len(mix.datasets[0]) == 1
    with pytest.raises(Exception, match="buffer.datasets.offline.dataset.root"):  # the data must be named
        build_buffer(compose_config(["buffer=mixture"]), run)
    with pytest.raises(ValueError, match="must be `own` or a config"):
        build_buffer(compose_config(["buffer=mixture", "buffer.datasets.online.dataset=mine",
                                     f"buffer.datasets.offline.dataset.root={tmp_path / 'data'}",
                                     "buffer.datasets.offline.dataset.name=demos"]), run)
    with pytest.raises(ValueError, match="buffer.kind='tape'"):
        build_buffer(compose_config(["buffer.kind=tape"]), run)


def test_file_weights_apply_inside_each_dataset_not_across_them(tmp_path):
    """`sample_by=transition` weighs the files of the dataset the mixture chose; the mixture's own weights still
    decide how often each dataset is drawn."""
    a = DiskBuffer(tmp_path, "a")
    for i, n in enumerate((2, 18)):
        save_trajectory(random_trajectory(n, seed=i), a.fifo_dir, "env")
    a.refresh()
    DiskBuffer(tmp_path, "b")  # makes the directories of the offline dataset
    save_trajectory(random_trajectory(50, seed=3), tmp_path / "b" / "buffer" / "protected", "env")
    b = DiskBuffer(tmp_path, "b", read_only=True, min_size=0)
    mix = MixtureBuffer([a, b], [0.5, 0.5])
    mix.configure()
    rng = np.random.default_rng(0)
    lengths = [len(mix.sample_random_trajectory(rng, weight=lambda t: t)) for _ in range(4000)]
    assert abs(lengths.count(50) / 4000 - 0.5) < 0.03  # not 50 / 70 of the draws
    assert abs(lengths.count(18) / 4000 - 0.5 * 18 / 20) < 0.03
