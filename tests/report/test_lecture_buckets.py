"""The lecture profile's committed recordings (recordings/lecture-buckets-lab/: ResNet-50 and bert-mini, DDP buckets
1-100 MB in two rounds) against SQL and their golden report (tests/report/golden/, as `make reports` writes it): the per-model bucket figure draws what the `steps`
rows hold, the report names every model and size, and the lecture's claims are said from the data (a recording
with its numbers changed changes the figure and the words)."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

import pytest

from ddptop.cli.report import labels
from ddptop.report import bucket_models
from ddptop.report.runs import load

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "recordings" / "lecture-buckets-lab"
REPORT = ROOT / "tests" / "report" / "golden" / "lecture-buckets-lab"  # make reports' report.md, figures.json
SIZES = [1.0, 5.0, 10.0, 25.0, 50.0, 100.0]
WARMUP = 2  # the profile's [sweep] warm-up


def recordings() -> list[Path]:
    found = sorted(FOLDER.glob("*.db"))
    if len(found) != 2:
        pytest.skip("recordings/lecture-buckets-lab/ is not in this checkout")
    return found


def loaded(paths: list[Path]):
    """Each recording as a folder's report loads it, labelled by its file name."""
    return [load(str(p), None, label) for p, label in zip(paths, labels([str(p) for p in paths]))]


def draw(runs, out: Path):
    """The figure as the folder's report draws it (ddptop.cli.report.write)."""
    out.mkdir(exist_ok=True)
    stats = [s for run in runs for s in run.segments]
    return bucket_models.figure(stats, {r.label: r.model for r in runs}, bucket_models.setup(runs), out)


def by_sql(path: Path) -> tuple[str, dict[float, float], dict[float, list[float]]]:
    """(model, bucket MB → the slowest rank's mean s/step pooled over the size's segments by measured steps,
    bucket MB → each segment's) straight from the file: warm-up and sampled steps left out."""
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as db:
        model = json.loads(db.execute("SELECT value FROM meta WHERE key = 'config'").fetchone()[0])["model"]
        rows = db.execute("""
            WITH per_rank AS (
              SELECT g.segment, json_extract(g.config, '$.bucket_mb') AS mb, st.rank, count(*) AS n,
                     avg(st.iter_s) AS step_s
              FROM steps st JOIN segments g ON st.segment = g.segment
              WHERE st.step >= g.step + ? AND NOT st.sampled GROUP BY g.segment, st.rank)
            SELECT segment, mb, n, max(step_s) FROM per_rank GROUP BY segment ORDER BY segment""",
                          (WARMUP,)).fetchall()
    pooled, each = {}, {}
    for _segment, mb, n, step in rows:
        steps, total = pooled.get(float(mb), (0, 0.0))
        pooled[float(mb)] = (steps + n, total + n * step)
        each.setdefault(float(mb), []).append(step)
    return model, {mb: total / steps for mb, (steps, total) in pooled.items()}, each


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    paths = recordings()
    runs = loaded(paths)
    return paths, runs, draw(runs, tmp_path_factory.mktemp("lecture"))


def test_the_figure_draws_each_models_step_time_per_bucket_size_as_sql_computes_it(committed):
    paths, _runs, made = committed
    (axes,) = made.data["axes"]
    drawn = {line["label"]: line for line in axes["lines"]}
    for path in paths:
        model, pooled, each = by_sql(path)
        assert sorted(pooled) == SIZES
        line, rounds = drawn[model], drawn[f"{model}: rounds"]
        assert line["x"] == SIZES and line["y"] == pytest.approx([pooled[mb] for mb in SIZES], rel=1e-9)
        assert sorted(zip(rounds["x"], rounds["y"])) == pytest.approx(
            sorted((mb, v) for mb in SIZES for v in each[mb]), rel=1e-9)
        assert all(len(each[mb]) == 2 for mb in SIZES)  # two rounds of every size
    assert axes["xscale"] == "log" and axes["xticklabels"] == ["1", "5", "10", "25", "50", "100"]


def test_the_committed_report_is_this_codes_and_names_every_model_and_size(committed):
    _paths, runs, made = committed
    assert {r.model for r in runs} == {"resnet50", "bert-mini"}
    shipped = json.loads((REPORT / "figures.json").read_text())["bucket_models"]
    assert shipped["finding"] == made.finding and shipped["axes"][0]["lines"] == made.data["axes"][0]["lines"]
    page = (REPORT / "report.md").read_text()
    assert "### Per-iteration latency vs bucket size, per model" in page and made.finding in page
    for model in ("resnet50", "bert-mini"):
        assert made.finding.count(f"{model}: ") == 1
        for mb in SIZES:
            assert f"{mb:g} MB " in made.finding.split(f"{model}: ")[1].split("s/iteration")[0]
    for claim in ("\"BERT latencies are higher\"", "\"larger buckets work well for BERT\"",
                  "The best bucket size depends on the model", "CS744 lecture notes"):
        assert claim in made.finding


def _scaled(src: Path, dst: Path, factor: float, where: str) -> Path:
    """A copy of a recording whose step times are `factor`× in the segments `where` picks (SQL on bucket_mb)."""
    shutil.copy(src, dst)
    with sqlite3.connect(dst) as db:
        db.execute(f"UPDATE steps SET iter_s = iter_s * ? WHERE segment IN (SELECT segment FROM segments WHERE "
                   f"{where})", (factor,))
    return dst


def test_the_lecture_comparison_follows_the_numbers(committed, tmp_path):
    """bert-mini made 3× slower at buckets under 25 MB: larger buckets "agree", and its line rises there alone;
    made 3× slower from 25 MB up: they do not; made 20× slower everywhere: BERT's latencies are the higher."""
    paths, runs, made = committed
    bert = next(p for p in paths if p.stem.endswith("bert-mini"))
    other = next(r for r in runs if r.model != "bert-mini")
    small = f"json_extract(config, '$.bucket_mb') IN ({json.dumps(SIZES[:3])[1:-1]})"
    before = next(x for x in made.data["axes"][0]["lines"] if x["label"] == "bert-mini")["y"]
    for where, factor, scaled, words in (
            (small, 3.0, range(3), "\"larger buckets work well for BERT\" — agrees: bert-mini is fastest at"),
            (f"NOT {small}", 3.0, range(3, 6), "\"larger buckets work well for BERT\" — does not hold here"),
            ("1", 20.0, range(6), "\"BERT latencies are higher\" — agrees")):
        changed = _scaled(bert, tmp_path / bert.name, factor, where)
        (changed_run,) = loaded([changed])
        remade = draw([changed_run, other], tmp_path / "out")
        assert words in remade.finding, remade.finding
        line = next(x for x in remade.data["axes"][0]["lines"] if x["label"] == "bert-mini")["y"]
        ratios = [a / b for a, b in zip(line, before)]
        assert all(ratios[i] == pytest.approx(factor if i in scaled else 1.0, rel=1e-6) for i in range(6)), ratios
        changed.unlink()
