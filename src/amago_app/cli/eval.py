"""`amago-eval <run dir | policy .pt | training state> [key=value ...]`: evaluate a saved policy."""

from __future__ import annotations

import sys

from rich.console import Console

from amago_app.cli.errors import one_line_warnings, report_user_errors

USAGE = """usage: amago-eval <run dir | policy .pt | training-state dir> [options] [config overrides]

options:   episodes=N  checkpoint=latest|best|EPOCH  sample=true|false  parallel_actors=N  max_steps=N
           video.episodes=N  video.format=mp4|gif|both  video.fps=N  video.dir=DIR
           save_trajs_to=DIR  output=FILE  seed=N  cpu=true  allow_targets=[my_pkg.*]
runs:      a run directory, a policy .pt file, a training-state directory, or a sweep directory (every run in
           it, one table)
overrides: any key of the run's saved config (env.horizon=20, env.parallel_actors=4, ...) or env=<option> to
           evaluate on another env config with the same observation and action spaces."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    # one line per message; in a log file (not a terminal) tables get room instead of wrapping inside cells
    console = Console(highlight=False, soft_wrap=True, width=None if sys.stdout.isatty() else 200)
    if not argv or argv[0] in ("-h", "--help"):
        console.print(USAGE)
        return 0 if argv else 2
    from amago_app.evaluation.evaluate import evaluate  # heavy imports after argument checks

    one_line_warnings("amago-eval")
    with report_user_errors("amago-eval"):
        evaluate(argv[0], argv[1:], console=console)
    return 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
