"""Evaluation of saved policies (`amago-eval`, `amago_app.evaluate`): exactly N episodes, statistics, videos."""
