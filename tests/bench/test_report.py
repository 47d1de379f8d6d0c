"""bench/report.py: the tables it writes into docs/benchmarks.md and the README's one headline
table, from the committed bench/results/*.json."""
import os
import shutil

from bench import report
from plurksite.config import ROOT


def test_the_readme_headline_and_the_docs_tables_are_what_report_writes(tmp_path):
    """Both files hold exactly what `bench/report.py --write-readme` writes now: rewriting them
    changes nothing."""
    for name in ("README.md", "docs/benchmarks.md"):
        start, end = ((report.HEADLINE_START, report.HEADLINE_END) if name == "README.md"
                      else (report.START, report.END))
        text = open(os.path.join(ROOT, name)).read()
        assert text.count(start) == 1 and text.count(end) == 1, name
        copy = tmp_path / os.path.basename(name)
        shutil.copy(os.path.join(ROOT, name), copy)
        written = report.headline() if name == "README.md" else report.tables()
        assert report._write_between(str(copy), start, end, written)
        assert copy.read_text() == text, "run .venv/bin/python bench/report.py --write-readme"


def test_the_headline_has_one_row_per_peer_comparison():
    rows = report.headline_rows()
    assert len(rows) >= 8
    assert all(len(row) == 3 and row[0] and row[1] for row in rows)
    table = report.headline()
    assert table.startswith("| comparison") and "docs/benchmarks.md" in table


def test_a_file_without_markers_is_left_alone(tmp_path):
    other = tmp_path / "other.md"
    other.write_text("no markers\n")
    assert not report._write_between(str(other), report.START, report.END, "tables")
    assert other.read_text() == "no markers\n"
