"""docs/results.md: the benchmark's one page of results. A section per `amago-bench` row (its anchor is the row's
preset name, which preset comments link to), the table region that `amago-bench --report-only` rewrites, links
to it that resolve, the threshold and budget of each preset, and no curve under docs/bench/ that no page shows."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import compose_config, heading_anchors

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "docs" / "results.md"
ROWS = sorted(p.stem for p in (ROOT / "conf" / "experiment" / "bench").glob("*.yaml"))
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def _table_lines(md: str, row: str) -> list[str]:
    """The lines of the generated table (between the markers) that belong to `row`."""
    region = md[md.index(BEGIN):md.index(END)]
    return [line for line in region.splitlines() if line.startswith((f"| {row} ", f"| [{row}]"))]


def test_a_section_per_row_and_one_generated_region():
    md = RESULTS.read_text()
    assert ROWS, "no presets under conf/experiment/bench/"
    missing = [row for row in ROWS if row not in heading_anchors(md)]
    assert not missing, f"docs/results.md has no section (## {missing[0]}) for {missing}"
    assert md.count(BEGIN) == 1 and md.count(END) == 1 and md.index(BEGIN) < md.index(END)
    for row in ROWS:  # one line of the table per row
        lines = _table_lines(md, row)
        assert len(lines) == 1, f"the table has {len(lines)} lines for {row}"


def test_links_to_the_results_page_resolve():
    """`results.md#<anchor>` in the docs, presets, code, scripts and tests names a heading of the page."""
    anchors = heading_anchors(RESULTS.read_text())
    files = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "conf").rglob("*.yaml"),
             *(ROOT / "src").rglob("*.py"), *(ROOT / "scripts").glob("*.py"), *(ROOT / "tests").rglob("*.py")]
    seen = 0
    for path in files:
        for anchor in re.findall(r"results\.md#([\w\-]+)", path.read_text()):
            seen += 1
            assert anchor in anchors, f"{path.relative_to(ROOT)}: results.md#{anchor} is no heading of docs/results.md"
    assert seen, "nothing links a row's section"


def test_every_doc_page_named_outside_docs_exists():
    """A comment, docstring or message that sends the reader to docs/<page>.md names a page that exists."""
    files = [*(ROOT / "conf").rglob("*.yaml"), *(ROOT / "src").rglob("*.py"), *(ROOT / "scripts").glob("*.py"),
             *(ROOT / "tests").rglob("*.py")]
    for path in files:
        for page in re.findall(r"docs/([\w\-/]+\.md)", path.read_text()):
            assert (ROOT / "docs" / page).exists(), f"{path.relative_to(ROOT)} names docs/{page}, which does not exist"


def test_every_curve_under_docs_bench_is_shown():
    """The curves of settings no longer in use go with the text that showed them (git keeps both)."""
    shown = "\n".join(p.read_text() for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")])
    for png in sorted((ROOT / "docs" / "bench").rglob("*.png")):
        name = png.relative_to(ROOT / "docs").as_posix()
        assert name in shown, f"docs/{name} is shown by no page: delete it or show it"


def test_the_page_states_results_not_a_diary():
    md = RESULTS.read_text()
    for pattern, what in [(r"\bMachine [A-Z]\b", "a machine letter"),
                          (r"\bsessions?\b", "how the work was organised"),
                          (r"^#.*\b20\d\d-\d\d-\d\d", "a dated heading"),
                          (r"\bthe row before\b", "a diary's reference")]:
        found = re.search(pattern, md, flags=re.M | re.I)
        assert not found, f"docs/results.md has {what}: {found.group(0)!r}"
    assert "AMD EPYC" in md and "amago-bench --report-only" in md


def _section(md: str, row: str) -> str:
    start = re.search(rf"^## {re.escape(row)}\s*$", md, flags=re.M)
    assert start, f"docs/results.md has no section ## {row}"
    end = re.search(r"^## ", md[start.end():], flags=re.M)
    return md[start.end(): start.end() + end.start() if end else len(md)]


def _numbers(text: str) -> set[float]:
    return {float(n.replace(",", "")) for n in re.findall(r"-?\d[\d,]*(?:\.\d+)?", text)}


@pytest.mark.parametrize("row", ROWS)
def test_the_page_states_each_presets_threshold_and_budget(row):
    """The threshold in a row's table line and the update budget its section opens with are the preset's: a preset
    whose threshold or budget changes without its results being run again fails here."""
    cfg = compose_config([f"+experiment=bench/{row}"], tiny=False)
    md = RESULTS.read_text()
    threshold_cell = _table_lines(md, row)[0].split("|")[2]
    assert float(cfg.bench.threshold) in _numbers(threshold_cell), \
        f"{row}: the table's threshold {threshold_cell.strip()!r} is not the preset's {cfg.bench.threshold}"
    updates = cfg.trainer.epochs * cfg.trainer.train_batches_per_epoch
    opening = _section(md, row).strip().split("\n\n")[0]
    assert f"{updates:,} updates" in opening, \
        f"{row}: the section's first paragraph does not state the preset's budget of {updates:,} updates"


def test_the_table_is_what_the_run_records_give(tmp_path, monkeypatch):
    """The generated region is `amago-bench --report-only`'s output from the records kept under docs/bench/runs at
    the rows' current settings: a preset, a threshold or a budget changed without the row being run again (its
    records then left out as runs at other settings), or a record edited, a figure written by hand, fails here."""
    from amago_app.cli import bench_page, bench_rows

    monkeypatch.chdir(ROOT)  # the region names the records' folder as the command is run: from the repository root
    md = RESULTS.read_text()
    committed = md[md.index(BEGIN):md.index(END) + len(END)]
    regenerated = bench_page.region(bench_rows.row_names(), Path("docs/bench"), tmp_path / "results.md")
    assert regenerated == committed, ("docs/results.md's table is not what the run records give: regenerate it "
                                      "with `amago-bench --report-only` (after running the rows whose settings "
                                      "changed)")
