"""What a new user meets first: interrupts, studies with nothing measured, failed configurations run
again, the API as quiet as the command line (issue 19, items 5-8 and 12)."""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import time
import warnings
from collections.abc import Callable
from pathlib import Path

import optuna
import pytest
import yaml
from conftest import write_study
from test_cli_mistakes import main
from typer.testing import CliRunner

import explorer
from explorer.cli import _interrupted, app

runner = CliRunner()
Cli = Callable[..., subprocess.CompletedProcess]
ABSURD_LR = {"epochs": 1, "batch_size": 128, "lr": 1e12, "seed": 0}  # the loss goes to NaN: every trial fails


def cli(*args: object) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "explorer.cli", *map(str, args)], capture_output=True, text=True, timeout=300)


@pytest.fixture
def explorer_cli(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> Cli:
    """`explorer ARGS` through its entry point in this process (`main`, as test_cli_mistakes runs it): the tests
    that read only a command's output and exit code, not what a process boundary does (signals), skip a new
    interpreter's seconds of imports per command."""
    def call(*args: object) -> subprocess.CompletedProcess:
        code, out, err = main(*args, monkeypatch=monkeypatch, capsys=capsys)
        return subprocess.CompletedProcess(args, code, out, err)

    return call


def test_an_interrupt_says_how_to_go_on_for_run_and_resume_only() -> None:
    assert _interrupted(["run", "s.yaml", "--no-dashboard"]) == "interrupted: every finished trial is stored; continue with: explorer resume s.yaml"
    assert _interrupted(["resume", "--reclaim", "s.yaml"]).endswith("explorer resume s.yaml")
    assert _interrupted(["status", "s.yaml"]) == "interrupted"


def test_ctrl_c_while_starting_exits_130_and_the_study_completes_on_run(tmp_path: Path) -> None:
    """SIGINT in the first moments (imports, opening the storage, queueing the grid) exits 130 with the
    resume hint, never 0; whatever it left, `run` then completes the study."""
    path = write_study(tmp_path)
    for delay in (0.5, 2.5):
        proc = subprocess.Popen([sys.executable, "-m", "explorer.cli", "run", str(path), "--no-dashboard"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        time.sleep(delay)
        proc.send_signal(signal.SIGINT)
        out = proc.communicate(timeout=120)[0]
        if proc.returncode == 0:  # it finished before the signal: nothing to check at this delay
            continue
        assert proc.returncode == 130 and f"continue with: explorer resume {path}" in out, out
    done = cli("run", path, "--no-dashboard")
    assert done.returncode == 0 and "6/6 configurations measured" in done.stdout, done.stdout + done.stderr


def test_an_interrupt_inside_generated_code_still_exits_130(tmp_path: Path) -> None:
    """A Ctrl-C that lands while library code runs a string `exec` (dataclasses, typing and torch generate
    code so) is caught like any other, yet CPython then killed `python -m explorer.cli` by SIGINT at exit
    (returncode -2, after the resume hint): deterministic here, the interrupt raised inside such an exec."""
    (tmp_path / "interrupted_in_exec.py").write_text(
        "import sys\nimport explorer.cli as cli\n"
        "cli.app = lambda **kwargs: exec('raise KeyboardInterrupt')\n"
        "sys.argv = ['explorer', 'run', 'study.yaml']\ncli.main()\n")
    proc = subprocess.run([sys.executable, "-m", "interrupted_in_exec"], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 130 and "continue with: explorer resume study.yaml" in proc.stderr, (proc.returncode, proc.stderr)


def test_a_study_whose_trials_all_failed_says_so_in_one_line_each(tmp_path: Path, explorer_cli: Cli) -> None:
    path = write_study(tmp_path, budget=ABSURD_LR, n_trials=2)
    run = explorer_cli("run", path, "--no-dashboard")
    assert run.returncode == 1 and "0/2 configurations measured (2 more failed)" in run.stdout, run.stdout + run.stderr
    assert "runs of the" not in run.stdout  # no replicate line about zero runs
    rec = explorer_cli("recommend", path, "--budget", "4k")
    lines = rec.stderr.strip().splitlines()
    assert rec.returncode == 1 and len(lines) == 1 and "no completed trial to recommend from" in lines[0], rec.stderr


def test_retry_failed_runs_failed_configurations_again_after_the_cause_is_fixed(tmp_path: Path, explorer_cli: Cli) -> None:
    """A cause outside the study's identity (a trial time limit too short): plain `run` trains nothing
    more, `run --retry-failed` measures the failed configurations."""
    path = write_study(tmp_path, n_trials=2, sampler={"name": "random", "seed": 0}, trial_timeout_s=0.001,
                       budget={"epochs": 4, "batch_size": 16, "lr": 0.003, "seed": 0})
    assert explorer_cli("run", path, "--no-dashboard").returncode == 1
    doc = yaml.safe_load(path.read_text())
    doc["trial_timeout_s"] = 600
    path.write_text(yaml.safe_dump(doc))
    again = explorer_cli("run", path, "--no-dashboard")
    assert again.returncode == 0 and "0/2 configurations measured (2 more failed)" in again.stdout, again.stdout + again.stderr
    retried = explorer_cli("run", path, "--retry-failed", "--no-dashboard")
    assert retried.returncode == 0, retried.stdout + retried.stderr
    assert "queued again 2 failed configurations" in retried.stderr and "2/2 configurations measured" in retried.stdout
    ostudy = explorer.load(path).optuna_study()
    complete = ostudy.get_trials(states=(optuna.trial.TrialState.COMPLETE,))
    assert len(complete) == 2 and all("retry_of_failed" in t.user_attrs for t in complete)
    once_more = explorer_cli("run", path, "--retry-failed", "--no-dashboard")  # nothing left to retry: nothing trains
    assert once_more.returncode == 0 and "queued again" not in once_more.stderr
    assert len(explorer.load(path).optuna_study().get_trials(states=(optuna.trial.TrialState.COMPLETE,))) == 2


def test_a_budget_fixed_with_force_measures_the_failed_configurations_again(tmp_path: Path, explorer_cli: Cli) -> None:
    """An absurd lr fixed in the YAML changes the study's identity: `run --force` measures every
    configuration under the new budget and sets the failed trials aside."""
    path = write_study(tmp_path, budget=ABSURD_LR, n_trials=2, sampler={"name": "random", "seed": 0})
    assert explorer_cli("run", path, "--no-dashboard").returncode == 1
    doc = yaml.safe_load(path.read_text())
    doc["budget"]["lr"] = 0.003
    path.write_text(yaml.safe_dump(doc))
    forced = explorer_cli("run", path, "--force", "--no-dashboard")
    assert forced.returncode == 0 and "2/2 configurations measured" in forced.stdout, forced.stdout + forced.stderr
    assert "2 trials of an earlier version of this study" in forced.stdout


def test_help_has_text_for_every_option_and_wraps_to_the_terminal() -> None:
    import typer

    commands = typer.main.get_command(app).commands
    for name in ("run", "resume", "status", "recommend", "export"):
        params = [p for p in commands[name].params if p.name != "help"]
        assert all(p.help for p in params), (name, [p.name for p in params if not p.help])
        result = runner.invoke(app, [name, "--help"], terminal_width=80)
        assert result.exit_code == 0 and "<bool>" not in result.output
        assert all(len(line) <= 80 for line in result.output.splitlines()), result.output


def test_the_python_api_is_as_quiet_as_the_command_line(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    exp = explorer.load(write_study(tmp_path, n_trials=2))
    before = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.INFO)  # Optuna's default, as a fresh notebook has it
    try:
        with warnings.catch_warnings(record=True) as seen, caplog.at_level(logging.INFO, logger="optuna"):
            warnings.simplefilter("always")
            exp.run()
        assert optuna.logging.get_verbosity() == optuna.logging.INFO  # the caller's setting is given back
    finally:
        optuna.logging.set_verbosity(before)
    assert exp.trials()["state"].eq("COMPLETE").sum() == 2 and not [r for r in caplog.records if "finished with value" in r.getMessage()]
    assert not [w for w in seen if issubclass(w.category, optuna.exceptions.ExperimentalWarning)]


def test_run_force_at_a_new_budget_measures_every_configuration_again_and_sets_the_old_trials_aside(tmp_path: Path, explorer_cli: Cli) -> None:
    """Issue 20, defect 5: 1 epoch, then --force at 2 epochs with 2 seeds mixed the budgets ([1-epoch, 2-epoch]
    per configuration, n = 2) and never ran the 2-epoch seed 0. Trials record the identity they ran under."""
    path = write_study(tmp_path, budget={"epochs": 1, "batch_size": 128, "lr": 0.003, "seed": 0})
    assert explorer_cli("run", path, "--no-dashboard").returncode == 0
    doc = yaml.safe_load(path.read_text())
    doc["budget"].update(epochs=2, seeds=2)
    doc["replicates"] = {"policy": "fixed"}
    path.write_text(yaml.safe_dump(doc))
    forced = explorer_cli("run", path, "--force", "--no-dashboard")
    assert forced.returncode == 0, forced.stdout + forced.stderr
    assert "6/6 configurations measured, 12 runs" in forced.stdout and "6 trials of an earlier version" in forced.stdout
    stats = explorer.load(path).stats()
    assert len(stats) == 6 and (stats["n"] == 2).all() and all(sorted(s) == [0, 1] for s in stats["seeds"])
    current = explorer.load(path).measured()
    assert len(current) == 12 and current["curve"].map(len).eq(2).all()  # every read run is a 2-epoch run
