"""`amago-eval <run dir | policy .pt | training state> [key=value ...]`: evaluate a saved policy."""

from __future__ import annotations

import sys

from rich.console import Console

from amago_app.cli.errors import one_line_warnings, report_user_errors

USAGE = """usage: amago-eval <run dir | policy .pt | training-state dir> [options] [config overrides]

options:   episodes=N  max_steps=N  sample=true|false  parallel_actors=N  save_trajs_to=DIR  output=FILE  seed=N  cpu=true
overrides: any key of the run's saved config (env.horizon=20, env.parallel_actors=4, ...) or env=<option> to
           evaluate on another env config with the same observation and action spaces."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    console = Console(highlight=False)
    if not argv or argv[0] in ("-h", "--help"):
        console.print(USAGE)
        return 0 if argv else 2
    from amago_app.trainer.evaluate import evaluate  # heavy imports after argument checks

    one_line_warnings("amago-eval")
    with report_user_errors("amago-eval"):
        evaluate(argv[0], argv[1:], console=console)
    return 0


def entry() -> None:
    sys.exit(main())


if __name__ == "__main__":
    entry()
