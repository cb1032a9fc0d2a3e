"""Every command shown in README.md and docs/*.md works, so none of them rots.

Commands are taken from ```bash code blocks (every line; `\\` continuations joined, `&&` chains split,
comments dropped) and from inline code spans that start with a command of this project and have arguments
(`amago-train env=gym`); inline spans with `<placeholders>`, `[optional parts]`, `a|b` alternatives or `...`
are usage patterns, `amago-train: error: ...` is a message, and the table rows of docs/faults.md are bad
inputs on purpose: none of those are commands. Each command
is checked by the rule for its tool; a command no rule covers fails the test (add a rule, do not skip it):

  amago-train            compose-only, in process, with Hydra's compose API: every group, option and key of the
                         shown overrides must exist and every interpolation of the job config must resolve
                         (--cfg/-p/--help flags are dropped; a sweep contributes its first value per key;
                         `hydra/...` overrides are checked against Hydra's config). The 5-minute tour's
                         training commands run for real with tiny sizes appended (TINY, one or two epochs).
  torchrun / accelerate launch ... -m amago_app.cli.train <overrides>
                         the overrides, compose-only (DDP itself: tests/trainer/test_ddp.py).
  amago-eval, amago-plot, amago-summary
                         run for real on this test's tiny run or sweep: a run or sweep directory the docs name
                         (runs/..., multirun/..., $RUN, $(ls -d ... | tail -1)) stands for it; amago-eval gets
                         `episodes=2` appended.
  amago-convert-minari   `--help` (conversion itself: tests/cli/test_convert_minari.py).
  amago-bench            the shown flags, then `--help` (argparse checks them; a matrix of real training runs
                         takes hours: its own tests run a tiny one).
  python scripts/X.py    the shown flags, then `--help` (argparse checks the flags, the script imports); its
                         `key=value` overrides compose-only; the @slow test below runs it with `--smoke` (toy
                         sizes: a real measurement takes minutes to hours), except compare_original.py, which
                         runs under the original AMAGO's Python (its own tests run it when given a checkout).
  python - <<'PY' ...    the inline program is compiled (syntax), not run (it would download / record data).
  bash scripts/X.sh      `bash -n` (syntax); they create virtual environments / run this suite, which CI does.
  pip, source, tensorboard, RUN=$(...), EXTRAS=... bash scripts/setup.sh
                         not run: they install packages, change the shell, or start a server; `RUN=` defines
                         the run the next commands use (this test's tiny run stands in for it).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import TINY, heading_anchors, wrapped_import_error

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOOLS = ("amago-train", "amago-eval", "amago-plot", "amago-summary", "amago-convert-minari", "amago-bench",
         "python scripts/",
         "torchrun ", "accelerate launch")
TRAIN_MODULE = "amago_app.cli.train"
MODULES = {"amago-train": TRAIN_MODULE, "amago-eval": "amago_app.cli.eval", "amago-plot": "amago_app.cli.plot",
           "amago-summary": "amago_app.cli.summary", "amago-convert-minari": "amago_app.cli.convert_minari",
           "amago-bench": "amago_app.cli.bench"}
#: docs whose table rows list bad inputs on purpose (the fault matrix): their spans are cases, not commands
CASE_TABLES = {"docs/faults.md"}
#: the tour's commands that train for real (with TINY appended): everything else amago-train is compose-only
REAL_TRAIN = {"amago-train", "amago-train -m seed=0,1,2"}


@dataclass(frozen=True)
class Command:
    source: str  # file:line
    text: str
    heredoc: str | None = None  # the body of `python - <<'X' ... X`

    @property
    def id(self) -> str:
        return f"{self.source} {self.text[:60]}"


def extract(path: Path) -> list[Command]:
    text = path.read_text()
    name = path.relative_to(ROOT).as_posix()
    out: list[Command] = []
    lines = text.splitlines()
    i, in_block = 0, False
    while i < len(lines):
        line = lines[i]
        if line.strip().startswith("```"):
            in_block = line.strip() in ("```bash", "```sh", "```shell") if not in_block else False
            i += 1
            continue
        if in_block:
            start = i
            joined = line
            while joined.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                joined = joined.rstrip()[:-1].rstrip() + " " + lines[i].strip()
            heredoc = re.search(r"<<\s*'?(\w+)'?\s*$", joined)
            body = None
            if heredoc:
                end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == heredoc.group(1))
                body = "\n".join(lines[i + 1:end])
                i = end
            command = _strip_comment(joined).strip()
            for part in ([command] if body else command.split("&&")):
                if part.strip():
                    out.append(Command(f"{name}:{start + 1}", part.strip(), body))
        elif not (name in CASE_TABLES and line.lstrip().startswith("|")):
            for span in re.findall(r"`([^`]+)`", line):
                span = span.strip()
                # a bare tool name in prose (`amago-plot`, `accelerate launch`) is a name, not a command
                tool = next((t for t in TOOLS if span.startswith(t)), None)
                named_only = tool is not None and not tool.startswith("python") and span.strip() == tool.strip()
                if tool and not tool.endswith((" ", "/")) and span[len(tool):][:1] not in ("", " "):
                    continue  # `amago-train: error: ...` is a message the tool prints
                if tool and not named_only and not re.search(r"<|(^|\s)\[|\.\.\.|\|", span):
                    out.append(Command(f"{name}:{i + 1}", span))
        i += 1
    return out


def _strip_comment(line: str) -> str:
    """Drop a trailing `# comment` that is outside quotes (shell rules)."""
    quote = None
    for k, c in enumerate(line):
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "#" and (k == 0 or line[k - 1].isspace()):
            return line[:k]
    return line


ALL = [c for doc in DOCS for c in extract(doc)]


# --- fixtures: the tour's tiny run and sweep ------------------------------------------------------------------
_DONE: dict[tuple, subprocess.CompletedProcess] = {}


def _cli(module: str, *args, cwd: Path, timeout: int = 300, once: bool = False) -> subprocess.CompletedProcess:
    """`python -m module args` in `cwd`; with `once`, a command already run with the same arguments is not run
    again (the docs repeat some commands)."""
    key = (module, args, str(cwd))
    if once and key in _DONE:
        return _DONE[key]
    r = subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                       timeout=timeout, env={**os.environ, "OMP_NUM_THREADS": "1"})
    if once and r.returncode == 0:
        _DONE[key] = r
    return r


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """A scratch working directory holding this test's own tiny run and sweep (the docs' runs stand for them)."""
    cwd = tmp_path_factory.mktemp("docs")
    return {"cwd": cwd}


def _tiny_train(args: list[str], cwd: Path, multirun: bool) -> subprocess.CompletedProcess:
    flags = ["--multirun"] if multirun else []
    tiny = [*TINY, "trainer.threads=1", "trainer.epochs=2" if not multirun else "trainer.epochs=1"]
    r = _cli(TRAIN_MODULE, *flags, *args, *tiny, cwd=cwd)
    assert r.returncode == 0, r.stderr[-3000:]
    return r


def _run_dir(ws) -> Path:
    if "run" not in ws:
        _tiny_train([], ws["cwd"], multirun=False)
        ws["run"] = sorted((ws["cwd"] / "runs" / "tmaze-H3").iterdir())[-1]
    return ws["run"]


def _sweep_dir(ws) -> Path:
    if "sweep" not in ws:
        _tiny_train(["seed=0,1,2"], ws["cwd"], multirun=True)
        ws["sweep"] = sorted((ws["cwd"] / "multirun" / "tmaze-H3").iterdir())[-1]
    return ws["sweep"]


# --- the rules ------------------------------------------------------------------------------------------------
def compose_only(overrides: list[str]) -> None:
    """Compose the config the command would run (first value of each sweep) and resolve the job config."""
    from hydra import compose, initialize_config_dir
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf
    from omegaconf.errors import InterpolationResolutionError

    from amago_app.config import config_dir, setup

    if tuple(overrides) in _COMPOSED:  # the docs repeat some commands (README tables and docs/presets.md)
        return
    setup()
    single = []
    for o in OverridesParser.create().parse_overrides(overrides):
        if o.is_sweep_override():
            first = next(iter(o.sweep_string_iterator()))
            single.append(f"{o.get_key_element()}={first}")
        else:
            single.append(o.input_line)
    with initialize_config_dir(config_dir=config_dir(), version_base="1.3"):
        cfg = compose("config", overrides=single, return_hydra_config=True)
    job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
    if OmegaConf.select(job, "resume") in (None, ""):  # resume= reads the saved run: checked by real runs
        try:
            OmegaConf.to_container(job, resolve=True)
        except InterpolationResolutionError as err:  # a resolver that asks a suite (env=popgym's window)
            missing = wrapped_import_error(err)
            if missing is None or "envs need the" not in str(missing):
                raise
            assert "\n" not in str(missing), str(missing)  # one line naming what to install
            pytest.skip(f"the command needs an optional suite: {missing}")
    _COMPOSED.add(tuple(overrides))


_COMPOSED: set[tuple] = set()


def _train_overrides(args: list[str]) -> list[str]:
    """The overrides of an amago-train command line (its flags dropped)."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in ("--cfg", "-c", "--package", "-p", "--info", "--config-name", "-cn", "--config-dir", "-cd"):
            skip = a not in ("--info",)
        elif a.startswith("-"):
            continue
        else:
            out.append(a)
    return out


def _substitute(text: str, ws) -> str:
    """The docs' run and sweep directories -> this test's tiny ones (made on first use)."""
    def run(_=None):
        return str(_run_dir(ws))

    def sweep(_=None):
        return str(_sweep_dir(ws))

    text = re.sub(r"\$\(ls -d multirun/[^)]*\)", sweep, text)
    text = re.sub(r"\$\(ls -d runs/[^)]*\)", run, text)
    if "$RUN" in text:
        text = text.replace("$RUN", run())
    return text


def _path_args(args: list[str], ws) -> list[str]:
    """Positional directory arguments that do not exist here: the docs' runs, replaced by the tiny ones."""
    out = []
    for a in args:
        if not a.startswith("-") and "=" not in a and ("/" in a) and not Path(ws["cwd"], a).exists() \
                and not Path(a).is_absolute():
            a = str(_sweep_dir(ws) if a.startswith("multirun") else _run_dir(ws))
        out.append(a)
    return out


def check(cmd: Command, ws) -> str:
    """Apply the rule for `cmd`; returns what was done (for the test id's log). Fails with the command's output."""
    text = cmd.text
    if cmd.heredoc is not None:
        assert re.match(r"^python3? - <<", text), f"no rule for a heredoc: {text}"
        compile(cmd.heredoc, cmd.source, "exec")
        return "heredoc compiled"
    if re.match(r"^(RUN=|source |pip install|tensorboard |EXTRAS=\S+ bash scripts/setup\.sh$)", text):
        return "not run (installs, shell state or a server)"
    text = _substitute(text, ws)
    args = shlex.split(text)
    tool = args[0].replace(".venv/bin/", "")
    if tool in ("bash",) and args[1].startswith("scripts/"):
        r = subprocess.run(["bash", "-n", str(ROOT / args[1])], capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
        return "bash -n"
    if tool in ("torchrun", "accelerate"):
        assert "-m" in args and args[args.index("-m") + 1] == TRAIN_MODULE, f"no rule for {text}"
        compose_only(_train_overrides(args[args.index("-m") + 2:]))
        return "compose-only"
    if tool == "python" and args[1].startswith("scripts/"):
        overrides = [a for a in args[2:] if "=" in a and not a.startswith("-")]
        assert "argparse" in (ROOT / args[1]).read_text(), \
            f"{args[1]} has no argparse --help: give it one (or a rule here) so the docs test need not run it"
        key = ("script", tuple(args))
        if key not in _DONE:
            r = subprocess.run([sys.executable, str(ROOT / args[1]), *args[2:], "--help"], capture_output=True,
                               text=True, timeout=120)
            assert r.returncode == 0 and "usage:" in r.stdout, r.stderr[-2000:]
            _DONE[key] = r
        if overrides:
            compose_only(overrides)
        return "--help + compose-only"
    assert tool in MODULES, f"{cmd.source}: no rule for {text!r} (add one to tests/docs/test_commands.py)"
    rest = args[1:]
    if tool == "amago-train":
        if cmd.text in REAL_TRAIN:
            multirun = "-m" in rest or "--multirun" in rest
            if multirun:
                _sweep_dir(ws) if rest == ["-m", "seed=0,1,2"] else _tiny_train(_train_overrides(rest), ws["cwd"], True)
            else:
                _run_dir(ws)
            return "real tiny run"
        resume = [a for a in rest if a.startswith("resume=")]
        if resume and not Path(ws["cwd"], resume[0][7:]).exists():
            # continue (a copy of) the tiny run for one more epoch with the shown overrides
            copy = ws["cwd"] / f"resumed-{len(list(ws['cwd'].glob('resumed-*')))}"
            shutil.copytree(_run_dir(ws), copy)
            shown = [a for a in rest if not a.startswith("resume=") and not a.startswith("hydra.")]
            r = _cli(TRAIN_MODULE, f"resume={copy}", *shown, "trainer.epochs=3", "logger.verbose=false",
                     "trainer.threads=1", cwd=ws["cwd"])
            assert r.returncode == 0, r.stderr[-3000:]
            return "real resume of a copy of the tiny run"
        compose_only(_train_overrides(rest))
        return "compose-only"
    if tool == "amago-bench":
        r = _cli(MODULES[tool], *rest, "--help", cwd=ws["cwd"], once=True)
        assert r.returncode == 0 and "usage:" in r.stdout, r.stderr[-2000:]
        return "flags + --help"
    if tool == "amago-convert-minari":
        r = _cli(MODULES[tool], "--help", cwd=ws["cwd"], once=True)
        assert r.returncode == 0, r.stderr[-2000:]
        return "--help"
    rest = _path_args(rest, ws)
    if tool == "amago-eval":
        rest = rest + ["episodes=2"]
    r = _cli(MODULES[tool], *rest, cwd=ws["cwd"], once=True)
    assert r.returncode == 0, f"{text}\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}"
    return "real"


def test_the_docs_show_commands():
    assert len(ALL) > 50
    assert any(c.text.startswith("amago-plot") for c in ALL) and any(c.text.startswith("amago-eval") for c in ALL)


@pytest.mark.parametrize("cmd", ALL, ids=[c.id for c in ALL])
def test_command(cmd, workspace):
    check(cmd, workspace)


# --- the checker itself fails on broken commands ---------------------------------------------------------------
@pytest.mark.parametrize("text, error", [
    ("amago-train trainer.epochz=3", "epochz"),
    ("amago-train traj_encoder=lstm", "lstm"),
    ("amago-train -m hydra/launcher=nope seed=0,1", "nope"),
    ("amago-plot runs/x --x steps", "invalid choice"),
    ("python scripts/bench_update.py --only nothing", "invalid choice"),
    ("amago-fly runs/x", "no rule for"),
])
def test_a_broken_command_fails(text, error, workspace):
    with pytest.raises(Exception, match=re.escape(error)):
        check(Command("test", text), workspace)


def test_extraction(tmp_path):
    md = tmp_path / "x.md"
    md.write_text("intro `amago-train env=gym` and `amago-eval <run> episodes=N` and `amago-plot [dirs]`\n"
                  "```bash\namago-train a=1 \\\n    b=2   # a comment\nbash scripts/setup.sh && .venv/bin/amago-train\n"
                  "```\n```\nepoch 0 (output, not a command)\n```\n")
    global ROOT
    old, ROOT = ROOT, tmp_path
    try:
        texts = [c.text for c in extract(md)]
    finally:
        ROOT = old
    assert texts == ["amago-train env=gym", "amago-train a=1 b=2", "bash scripts/setup.sh", ".venv/bin/amago-train"]


#: scripts that drive another project (run with that project's Python): --help above checks their flags, their own
#: tests run them (tests/scripts/test_compare_original.py, given a checkout of the original AMAGO)
OTHER_ENVIRONMENT = ("python scripts/compare_original.py",)
#: scripts that read a trained run (the docs show a path of the user's): their own tests train one and run them
#: (tests/scripts/test_probe_tmaze_cue.py)
NEEDS_A_RUN = ("python scripts/probe_tmaze_cue.py",)
#: and the same with `--original` (measures a checkout of the original AMAGO beside amago_app; its own test needs one)
SCRIPTS = sorted({c.text for c in ALL if c.text.startswith("python scripts/")
                  and not c.text.startswith(OTHER_ENVIRONMENT + NEEDS_A_RUN) and "--original" not in c.text})


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS)
def test_benchmark_scripts_run_as_shown(script, tmp_path):
    """Each benchmark command as the docs show it, plus `--smoke` (toy sizes, seconds: the measurements
    themselves take minutes to hours), in a scratch directory so its outputs stay out of the checkout."""
    args = shlex.split(script)[1:]
    # --smoke before the shown arguments: after a Hydra override argparse would take it for one more positional
    r = subprocess.run([sys.executable, str(ROOT / args[0]), "--smoke", *args[1:]], cwd=tmp_path,
                       capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip(), "a benchmark prints its figures"


def test_images_and_local_links_exist():
    """Screenshots and links between the docs point at files of the repository."""
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", doc.read_text()):
            if re.match(r"^[a-z]+://", target):
                continue
            assert (doc.parent / target).exists(), f"{doc.name}: {target} does not exist"
    assert (ROOT / "docs" / "img" / "tmaze_success.png").stat().st_size < 200_000  # small enough for a README


def test_links_to_a_section_name_one_that_exists():
    """A link to `page.md#section` (or `#section` on the same page) names a heading that page has: sections are
    renamed as the docs change, and a stale anchor lands the reader at the top of the page."""
    anchors: dict[Path, set[str]] = {}  # per page, read once however many links name it
    for doc in DOCS:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)#([^)\s]+)\)", doc.read_text()):
            page = doc.parent / target if target else doc
            if re.match(r"^[a-z]+://", target) or page.suffix != ".md":
                continue
            if page not in anchors:
                anchors[page] = heading_anchors(page.read_text())
            assert anchor in anchors[page], f"{doc.name}: {target}#{anchor} names no heading of {page.name}"


def test_every_guide_the_readme_links_is_checked():
    """The README points at guides under docs/ (guide-*.md and the others): their commands are checked too, so a
    guide moved into a subfolder the glob above misses fails here instead of going unchecked."""
    linked = {(ROOT / t).resolve() for t in re.findall(r"\]\((docs/[^)#\s]+\.md)", (ROOT / "README.md").read_text())}
    assert any(p.name.startswith("guide-") for p in linked)
    assert linked <= {d.resolve() for d in DOCS}, sorted(str(p) for p in linked - {d.resolve() for d in DOCS})
