"""Benchmark suites with external dependencies, one module per suite.

Importing a module here never fails: the suite's package is imported only when an env is built, and a missing
package raises `ImportError` with one line naming the suite and the `amago_app` extra that installs it.

| module | env option | extra |
|---|---|---|
| `popgym` | `popgym`, `popgym_multidomain` | `popgym` |
| `gymnax` | `gymnax` | `jax` |
| `metaworld` | `metaworld` | `metaworld` |
| `atari` | `atari` | `atari` |
| `babyai` | `babyai` | `minigrid` |
| `xland` | `xland` | `xland` |
| `crafter` | `crafter` | `crafter` |
| `procgen` | `procgen` | `procgen` (no Python 3.11 / numpy 2 wheel) |
| `halfcheetah_vel` | `halfcheetah_vel` | `mujoco` |
| `alchemy` | `alchemy` | `alchemy` (dm_alchemy is not on PyPI) |
"""
