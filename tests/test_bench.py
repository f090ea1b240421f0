"""The benchmark tables and their replay: a table built by explorer's own runs, samplers replayed on the shipped one."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import write_study

ROOT = Path(__file__).parents[1]
sys.path.insert(0, str(ROOT))

from bench.build_tables import read_table  # noqa: E402
from bench.search import FRACTIONS, Table, replay  # noqa: E402


@pytest.mark.slow
def test_build_tables_trains_every_configuration_at_every_seed_and_resumes(tmp_path: Path) -> None:
    study = write_study(tmp_path / "s", budget={"epochs": 2, "batch_size": 128, "lr": 0.003, "seed": 0})
    out = tmp_path / "t.csv.gz"
    cmd = [sys.executable, str(ROOT / "bench" / "build_tables.py"), str(study), "--seeds", "0-1", "--limit", "2", "--out", str(out)]
    first = subprocess.run([*cmd[:4], "0", *cmd[5:]], capture_output=True, text=True, timeout=300)  # seed 0 only: a partial table
    assert first.returncode == 0, first.stderr
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "2 runs stored, 2 to run" in done.stdout and out.exists() and not out.with_suffix("").exists()
    table = read_table(out)
    assert sorted(table["seed"]) == [0, 0, 1, 1] and table["key"].nunique() == 2
    assert all(len(c) == 2 and c[-1] == pytest.approx(m, abs=1e-6) for c, m in zip(table["curve"], table["metric"]))  # curves stored to 6 digits
    assert table["kappa_init"].notna().all() and (table["epochs"] == 2).all()


@pytest.mark.parametrize("prune", [None, ("dominated", 0.5), ("dominated", 0.5, 0.01, 3, 0.018), ("median", 0.5)])
def test_replay_on_the_shipped_table(prune: tuple | None) -> None:
    """One optimizer seed of the default sampler, answered from the 24-configuration table."""
    result = replay("digits-vit", "budget-ei", 0, prune, str(ROOT / "bench" / "data"))
    table = Table.load("digits-vit")
    marks = result["marks"]
    assert sorted(marks) == sorted({math.ceil(f * 24) for f in FRACTIONS})
    assert all(0 <= m["regret"] <= result["empty"] and 0 < m["hv"] <= 1 for m in marks.values())
    assert result["trace"] and all(e < 20 * 13 for e, _ in result["trace"])  # at most the last run past 12 unpruned runs' epochs
    assert table.regret({k: table.mean[k] for k in table.params}) == 0


def test_decide_bench_runs_the_whole_loop_and_prints_its_last_line() -> None:
    """bench/decide.py --quick: 4 simulated studies per row of digits-vit through the seed policy, the
    posterior and the answer (its figures mean nothing at 4; the full run's are in docs/benchmarks/answers.md)."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "decide.py"), "--quick", "--jobs", "1"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert re.fullmatch(r"decide vit@1 [01]\.\d\d [01]\.\d{3} \d\.\d\d cover [01]\.\d\d", lines[-1]), lines[-1]
    assert any("random pick" in line for line in lines) and any("fixed 3 seeds" in line for line in lines)


@pytest.mark.slow
def test_lengths_bench_runs_the_whole_loop_and_prints_its_last_line() -> None:
    """bench/lengths.py --quick: 2 simulated studies of the 10/20/40-epoch table through the posterior over
    lengths, the decide policy and the answer at 40 epochs, beside the brute force, successive halving, the
    shortest-length answer and a random pick (figures that mean nothing at 2; the full run's are in
    docs/benchmarks/answers.md)."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "lengths.py"), "--quick", "--jobs", "1"],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert re.fullmatch(r"lengths within [01]\.\d\d asha [01]\.\d\d uniform [01]\.\d\d decided [01]\.\d\d false [01]\.\d{3} "
                        r"cover (nan|[01]\.\d\d) compute \d+\.\d\d", lines[-1]), lines[-1]
    for floor in ("uniform:", "asha:", "short:", "random:"):
        assert any(line.strip().startswith(floor) for line in lines), floor
    assert any("cover" in line and line.strip().startswith("explorer:") for line in lines)


def test_extrapolate_bench_scores_the_posterior_past_the_data_against_its_floors() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "extrapolate.py"), "--quick"],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    last = done.stdout.strip().splitlines()[-1]
    assert re.fullmatch(r"extrapolate regret \d+\.\d\d baseline \d+\.\d\d coverage [01]\.\d\d worst [01]\.\d\d", last), last
    assert "random" in done.stdout and "keep" in done.stdout


@pytest.mark.slow
def test_gpu_bench_runs_on_the_cpu_and_prints_both_ways_side_by_side() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "gpu.py"), "--configs", "1", "--epochs", "1", "--seeds", "2",
                          "--modes", "none,cudagraphs"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith("device cpu (CPU, 1 thread(s)); 1 configurations x 2 seeds = 2 trials")
    assert "peak used: a 1024^2 matmul in float32" in lines[1]
    rows = [line for line in lines if "trials/h" in line]  # cudagraphs needs CUDA: on the CPU it is the eager rows
    assert [r.split("  ")[0] for r in rows] == ["one by one, none", "seeds as one, none"] and "x 1.00" in rows[0]


def test_tpe_with_optuna_constraints_measures_configurations() -> None:
    """The `tpe-constraints` peer proposes values the space has and learns which combinations are infeasible:
    it measures configurations (it once proposed any integer width between 16 and 64, found none in its asks,
    and sat at the empty study's regret at every budget)."""
    result = replay("digits-wide", "tpe-constraints", 0, None, str(ROOT / "bench" / "data"))
    last = result["marks"][max(result["marks"])]
    assert last["regret"] < result["empty"] / 4 and last["hv"] > 0.5


def test_the_script_prints_the_regret_table() -> None:
    """The script end to end on the small table, few seeds, one worker: every sampler's row and the pruning lines."""
    cmd = [sys.executable, str(ROOT / "bench" / "search.py"), "--tables", "digits-vit", "--seeds", "2", "--few-seeds", "1",
           "--prune-seeds", "2", "--pruners", "dominated:0.5:0.01", "--jobs", "1"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split()[0] for line in proc.stdout.splitlines() if line and not line.startswith((" ", "=="))}
    assert {"random-arch", "nsga2", "tpe", "tpe-constraints", "gp", "budget-ei", "pruning:"} <= rows, proc.stdout
    assert "replays in" in proc.stdout and "CPU-min" in proc.stdout


@pytest.mark.slow
def test_cluster_bench_runs_explorer_and_plain_tune_on_a_simulated_cluster() -> None:
    """bench/cluster.py --quick: 4 fake GPUs on 2 Ray nodes, 2-second stand-in trials through explorer's real Ray
    executor (SQLite, the decide policy) and through plain Ray Tune + OptunaSearch; nothing trained twice or left
    running, and its last line (its figures mean little at this size: the README has the full run's)."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "cluster.py"), "--quick"], capture_output=True, text=True,
                          timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert re.fullmatch(r"cluster busy@2s [01]\.\d\d busy@10s nan suggest_ms \d+\.\d tune_busy@2s [01]\.\d\d", lines[-1]), lines[-1]
    row = next(line for line in lines if "explorer, sqlite" in line)
    assert "trained twice 0" in row and "left running 0" in row, row
    assert re.search(r"Ray worker: PSS \d+ MiB", done.stdout)


def test_continuation_bench_times_a_promotion_beside_the_run_from_scratch() -> None:
    """bench/continuation.py --quick: a 2-epoch run of the default study's model continued to 4 epochs beside the
    4-epoch run from scratch (identical results, 3 epochs trained against 5), and the disk kept per run (the full
    run's figures, at 10 and 20 epochs, are in docs/benchmarks/index.md)."""
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "continuation.py"), "--quick"], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert re.fullmatch(r"continuation ratio \d\.\d\d disk_mb \d+\.\d\d", lines[-1]), lines[-1]
    assert "(3 epochs trained) vs from scratch" in done.stdout and "(5 epochs): " in done.stdout and "identical: yes" in done.stdout
