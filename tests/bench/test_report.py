"""bench/report.py: the tables it writes into docs/benchmarks.md and the README's one headline
table, from the committed bench/results/*.json."""
import json
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


def test_the_stream_rows_spread_is_over_the_runs_of_the_same_path_not_the_instrumented(tmp_path, monkeypatch):
    from bench import report

    runs = tmp_path / report.STREAM_RUNS_DIR
    runs.mkdir()

    def doc(via, p50, p99, edge_names=False):
        names = {"GET /Poll/getUnreadCount (edge stream)" if edge_names else "GET /Poll/getUnreadCount (stream)": {}}
        stack = {"streams_via": via} if via else {"edge": None}
        return {"latency_from": "created", "stack": stack, "endpoints": names,
                "delivery_latency_s": {"p50": p50, "p99": p99}}
    for name, d in (("edge1.json", doc("edge", 0.024, 0.053)), ("edge2.json", doc(None, 0.036, 0.686, True)),
                    ("edge3-strace.json", doc("edge", 0.040, 2.0)), ("nginx1.json", doc("nginx", 0.029, 0.089))):
        (runs / name).write_text(json.dumps(d))
    monkeypatch.setattr(report, "RESULTS_DIR", str(tmp_path))
    # edge2 predates streams_via: its locust names say edge (its stack said no edge)
    assert report._stream_spread(doc("edge", 0.03, 0.1)) == "; over 2 runs p50 24-36 ms, p99 53-686 ms"
    assert report._stream_spread(doc("nginx", 0.03, 0.1)) == ""          # one run: no spread
    # a stream of both resources is another measure: the runs of the count alone are not its spread
    both = dict(doc("edge", 0.03, 0.1), endpoints={"GET /Poll/getUnreadCount,getMessages (edge stream)": {}})
    assert report._stream_resources(both) == "getUnreadCount,getMessages"
    assert report._stream_spread(both) == ""
    for name, p50 in (("edge4.json", 0.02), ("edge5.json", 0.026)):
        (runs / name).write_text(json.dumps(dict(both, delivery_latency_s={"p50": p50, "p99": 0.05})))
    assert report._stream_spread(both) == "; over 2 runs p50 20-26 ms, p99 50-50 ms"
    assert report._stream_spread(doc("edge", 0.03, 0.1)) == "; over 2 runs p50 24-36 ms, p99 53-686 ms"
    assert report._streams_via(doc(None, 0, 0, True)) == "the edge"
