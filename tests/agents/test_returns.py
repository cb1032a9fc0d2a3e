import pytest
import torch

from amago_app.agents.returns import nstep_targets, tree_backup_targets


def real_targets(mask, gammas, n):
    """Every (b, t, gamma index, gamma, k) of a real transition, k = min(n, real transitions left)."""
    for b in range(mask.shape[0]):
        real = int(mask[b].sum())
        for t in range(real):
            for gi, g in enumerate(gammas.tolist()):
                yield b, t, gi, g, min(n, real - t)


def brute_force(r, d, q, gammas, mask, n):
    """Direct loop over the definition (docs/design.md, "Losses")."""
    y = torch.zeros(*r.shape[:2], len(gammas))
    for b, t, gi, g, k in real_targets(mask, gammas, n):
        total, alive = 0.0, 1.0
        for i in range(k):
            total += g**i * alive * float(r[b, t + i, 0])
            alive *= 1.0 - float(d[b, t + i, 0])
        total += g**k * alive * float(q[b, t + k - 1, gi])
        y[b, t, gi] = total
    return y


@pytest.mark.parametrize("n", [1, 2, 3, 5, 20])
def test_matches_brute_force(n):
    torch.manual_seed(n)
    B, T = 5, 11
    gammas = torch.tensor([0.0, 0.5, 0.9, 0.999])
    r = torch.randn(B, T, 1)
    d = torch.rand(B, T, 1) < 0.2
    q = torch.randn(B, T, 4)
    mask = torch.ones(B, T, 1)
    mask[1, 7:] = 0
    mask[3, 1:] = 0
    r[mask == 0] = 4.0  # padding value: must not leak into targets
    d[mask == 0] = True
    y = nstep_targets(r, d, q, gammas, mask, n)
    torch.testing.assert_close(y * mask, brute_force(r, d, q, gammas, mask, n), atol=1e-5, rtol=1e-5)


def test_one_step_formula():
    r = torch.tensor([[[1.0], [2.0]]])
    d = torch.tensor([[[False], [True]]])
    q = torch.tensor([[[10.0], [20.0]]])
    y = nstep_targets(r, d, q, torch.tensor([0.9]), torch.ones(1, 2, 1), 1)
    torch.testing.assert_close(y[0, :, 0], torch.tensor([1 + 0.9 * 10, 2.0]))


def test_n_step_below_one_is_rejected():
    with pytest.raises(ValueError, match="n_step must be >= 1, got 0"):
        nstep_targets(torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), torch.zeros(1, 1, 1), torch.ones(1), torch.ones(1, 1, 1), 0)


def tree_backup_brute_force(r, d, v, q, pi, gammas, mask, n):
    """The expanded tree-backup return: for k = min(n, real transitions left),
        y_t = sum_{i<k} w_i [r_{t+i} + g (1 - d_{t+i}) (V_{t+i+1} - 1[i < k-1] pi_{t+i+1} Q_{t+i+1})],
        w_0 = 1, w_{i+1} = w_i g (1 - d_{t+i}) pi_{t+i+1}."""
    y = torch.zeros(*r.shape[:2], len(gammas))
    for b, t, gi, g, k in real_targets(mask, gammas, n):
        total, w = 0.0, 1.0
        for i in range(k):
            alive = 1.0 - float(d[b, t + i, 0])
            cut = float(pi[b, t + i, gi] * q[b, t + i, gi]) if i < k - 1 else 0.0
            total += w * (float(r[b, t + i, 0]) + g * alive * (float(v[b, t + i, gi]) - cut))
            w *= g * alive * float(pi[b, t + i, gi])
        y[b, t, gi] = total
    return y


@pytest.mark.parametrize("n", [1, 2, 3, 5, 20])
def test_tree_backup_matches_brute_force(n):
    torch.manual_seed(100 + n)
    B, T, G = 5, 11, 4
    gammas = torch.tensor([0.0, 0.5, 0.9, 0.999])
    r, v, q = torch.randn(B, T, 1), torch.randn(B, T, G), torch.randn(B, T, G)
    pi = torch.rand(B, T, G)
    d = torch.rand(B, T, 1) < 0.2
    mask = torch.ones(B, T, 1)
    mask[1, 7:] = 0
    mask[3, 1:] = 0
    r[mask == 0] = 4.0
    y = tree_backup_targets(r, d, v, q, pi, gammas, mask, n)
    torch.testing.assert_close(y, tree_backup_brute_force(r, d, v, q, pi, gammas, mask, n), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("n", [1, 3, 6])
def test_tree_backup_is_the_n_step_sum_when_the_policy_takes_the_data_actions(n):
    """pi(a_data) = 1 and Q(s, a_data) = V(s): nothing is cut, the target is the plain n-step return; with n = 1
    it is the 1-step target whatever the policy."""
    torch.manual_seed(n)
    r, v = torch.randn(3, 9, 1), torch.randn(3, 9, 2)
    d = torch.rand(3, 9, 1) < 0.15
    mask = torch.ones(3, 9, 1)
    mask[2, 4:] = 0
    gammas = torch.tensor([0.9, 0.99])
    plain = nstep_targets(r, d, v, gammas, mask, n) * mask
    torch.testing.assert_close(tree_backup_targets(r, d, v, v, torch.ones_like(v), gammas, mask, n), plain)
    one = tree_backup_targets(r, d, v, torch.randn_like(v), torch.rand_like(v), gammas, mask, 1)
    torch.testing.assert_close(one, nstep_targets(r, d, v, gammas, mask, 1) * mask)


def test_tree_backup_cuts_at_an_action_the_policy_would_not_take():
    """Two steps of reward 1, then reward 5 after an action the policy never takes: the target keeps r_0 and the
    critic's V(s_1), not the 5 the exploratory action earned."""
    r = torch.tensor([[[1.0], [5.0], [0.0]]])
    d = torch.zeros(1, 3, 1, dtype=torch.bool)
    v = torch.tensor([[[2.0], [3.0], [4.0]]])
    q = torch.tensor([[[-7.0], [0.0], [0.0]]])
    pi = torch.tensor([[[0.0], [1.0], [1.0]]])
    y = tree_backup_targets(r, d, v, q, pi, torch.tensor([0.5]), torch.ones(1, 3, 1), 3)
    assert float(y[0, 0, 0]) == pytest.approx(1 + 0.5 * 2.0)
