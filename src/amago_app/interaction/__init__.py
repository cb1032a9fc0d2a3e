"""A policy acting in vector envs, used by training and evaluation alike: rollouts and exploration noise."""
