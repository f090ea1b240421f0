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


def test_run_force_with_a_space_whose_configurations_changed_refuses_in_one_line_and_keeps_the_trials(
        tmp_path: Path, explorer_cli: Cli) -> None:
    """A layer added to the space, then `run --force`: Optuna refuses a categorical parameter's new choices, which
    came out as its traceback; now one line says what to do, and every stored trial stays."""
    path = write_study(tmp_path, budget={"epochs": 1, "max_steps": 2, "batch_size": 128, "lr": 0.003, "seed": 0},
                       n_trials=3)
    assert explorer_cli("run", path, "--no-dashboard").returncode == 0
    space = yaml.safe_load((tmp_path / "space.yaml").read_text())
    space["free"]["layers"] = [1, 2, 3]
    (tmp_path / "space.yaml").write_text(yaml.safe_dump(space))
    forced = explorer_cli("run", path, "--force", "--no-dashboard")
    lines = forced.stderr.strip().splitlines()
    assert forced.returncode == 1 and len(lines) == 1 and "Traceback" not in forced.stderr, forced.stderr
    assert "choices of" in lines[0] and "`name:`" in lines[0], lines[0]
    storage = optuna.storages.RDBStorage(f"sqlite:///{tmp_path / 'tiny.db'}")
    trials = optuna.load_study(study_name="tiny", storage=storage).get_trials()
    assert sum(t.state.name == "COMPLETE" for t in trials) == 3


# -- issue 43: mistakes that deserve a better line ------------------------------------------------------------------
QUICK = {"epochs": 1, "max_steps": 2, "batch_size": 64, "lr": 0.003, "seed": 0}
STORAGE_FORMS = "write sqlite:///PATH, postgresql://USER:PASSWORD@HOST/DB, grpc://HOST:PORT or journal:PATH"


@pytest.mark.parametrize("url, meant", [("sqlit:///x.db", "sqlite:///x.db"), ("studies/x.db", "sqlite:///studies/x.db"),
                                        ("sqlite://x.db", "sqlite:///x.db"), ("postgres://me:secret@db/x", "postgresql://me:***@db/x")])
def test_a_wrong_storage_url_says_what_one_looks_like_and_what_was_meant(url: str, meant: str, tmp_path: Path,
                                                                        explorer_cli: Cli) -> None:
    path = write_study(tmp_path, budget=QUICK, n_trials=1, storage=url)
    run = explorer_cli("run", path, "--no-dashboard")
    lines = run.stderr.splitlines()
    assert run.returncode == 1 and len(lines) == 1 and lines[0].startswith(f"error: {path}: storage: "), run.stderr
    assert STORAGE_FORMS in lines[0] and f"(did you mean {meant}?)" in lines[0] and "secret" not in lines[0], lines[0]
    assert not list(tmp_path.glob("*.db*")) and not (tmp_path / "studies").exists()


def test_a_storage_in_a_missing_folder_names_the_folder_and_a_piped_error_starts_at_once(tmp_path: Path) -> None:
    path = write_study(tmp_path, budget=QUICK, n_trials=1, storage="sqlite:///no/such/folder/s.db")
    run = cli("run", path, "--no-dashboard")  # piped: stderr is no terminal
    assert run.returncode == 1 and run.stderr.splitlines() == [
        f"error: {path}: storage: cannot open storage 'sqlite:///{tmp_path}/no/such/folder/s.db': its folder "
        f"{tmp_path}/no/such/folder does not exist (create it, or give storage: another path)"], run.stderr
    assert "explorer.lock" not in run.stderr


def test_a_yaml_of_the_other_kind_is_named_for_what_it_is(tmp_path: Path, explorer_cli: Cli) -> None:
    study = write_study(tmp_path, budget=QUICK, n_trials=1)
    space = tmp_path / "space.yaml"
    for args in (["params", study], ["condition", study]):
        said = explorer_cli(*args)
        assert said.returncode == 1 and said.stderr.splitlines() == [
            f"error: {study}: this is a study YAML (it names a space and a task), where a space YAML is expected (a "
            "family and its free dimensions, as in spaces/); its space: space.yaml"], said.stderr
    for args in (["status", space], ["run", space], ["recommend", space, "--budget", "4k"]):
        said = explorer_cli(*args)
        assert said.returncode == 1 and said.stderr.splitlines() == [
            f"error: {space}: this is a space YAML (it names a family and its free dimensions), where a study YAML is "
            "expected (a space, a task and n_trials, as in studies/: a study names this file in `space:`)"], said.stderr
        assert "unknown field" not in said.stderr


def test_a_changed_study_names_each_changed_field_with_its_old_and_new_value(tmp_path: Path, explorer_cli: Cli) -> None:
    path = write_study(tmp_path, budget=QUICK, n_trials=1)
    assert explorer_cli("run", path, "--no-dashboard").returncode == 0
    doc = yaml.safe_load(path.read_text())
    doc["budget"].update(lr=0.01, epochs=2)
    path.write_text(yaml.safe_dump(doc))
    run = explorer_cli("run", path, "--no-dashboard")
    assert run.returncode == 1 and run.stderr.splitlines() == [
        f"error: {path}: the stored study was made with another budget (epochs 1 -> 2, lr 0.003 -> 0.01); rerun with "
        "--force to continue it anyway"], run.stderr
    assert explorer_cli("run", path, "--force", "--no-dashboard").returncode == 0
    doc["budget"]["lr"] = 0.02  # said against what the forced run stored, not what the first did
    path.write_text(yaml.safe_dump(doc))
    space = yaml.safe_load((tmp_path / "space.yaml").read_text())
    (tmp_path / "space.yaml").write_text(yaml.safe_dump({**space, "free": {**space["free"], "layers": [1, 2, 3]}}))
    said = explorer_cli("status", path).stderr
    assert ("the stored study was made with another budget (lr 0.01 -> 0.02) and space (free.layers [1, 2] -> [1, 2, 3]); "
            "`explorer run --force` to continue it anyway") in " ".join(said.split()), said


def test_failed_configurations_are_met_with_the_way_to_run_them_again(tmp_path: Path, explorer_cli: Cli) -> None:
    """Item 9: after fixing the cause, a plain `run` trained nothing and said `0/2 configurations measured (2 more
    failed)`; neither it nor the failing run named `--retry-failed`."""
    path = write_study(tmp_path, n_trials=2, sampler={"name": "random", "seed": 0}, trial_timeout_s=0.001,
                       budget={"epochs": 4, "batch_size": 16, "lr": 0.003, "seed": 0})
    failing = explorer_cli("run", path, "--no-dashboard")
    assert failing.returncode == 1 and failing.stderr.splitlines()[-1].endswith(
        f"once the cause is fixed, `explorer run {path} --retry-failed` runs them again"), failing.stderr
    doc = yaml.safe_load(path.read_text())
    doc["trial_timeout_s"] = 600
    path.write_text(yaml.safe_dump(doc))
    for args in (["run", path, "--no-dashboard"], ["status", path]):
        said = explorer_cli(*args)
        flat = " ".join(said.stdout.split())
        assert said.returncode == 0 and "0/2 configurations measured (2 more failed)" in flat, said.stdout
        assert (f"2 configurations failed in every trial: once the cause is fixed, `explorer run {path} --retry-failed` "
                "runs them again") in flat, said.stdout


def test_a_budget_no_measured_configuration_fits_says_why(tmp_path: Path, explorer_cli: Cli) -> None:
    """Item 10: `--budget 5` named no configuration, and a budget whose configurations are not measured yet
    said there were none."""
    path = write_study(tmp_path, budget=QUICK, n_trials=1, sampler={"name": "random", "seed": 0})
    study = explorer.load(path).study
    ostudy = study.open(create=True)
    big = next(c for c in study.configs.values() if c.dims["layers"] == 2)
    dist = {"arch": optuna.distributions.CategoricalDistribution(list(study.configs))}
    ostudy.add_trial(optuna.trial.create_trial(
        params={"arch": big.key}, distributions=dist, values=[0.5, big.params],
        user_attrs={"params": big.params, "accuracy": 0.5, "seed": 0, "layers": 2, "heads": big.dims["heads"],
                    "identity": study.identity_key, "execution": "cpu float32", "device": "cpu"}))
    small = explorer_cli("recommend", path, "--budget", "5")
    assert small.returncode == 1 and small.stderr.splitlines() == [
        "error: budget: no configuration of the space has at most 5 parameters: the smallest, 1 / 1, has 2.8k"], small.stderr
    unmeasured = explorer_cli("recommend", path, "--budget", "3k")
    assert unmeasured.returncode == 1 and unmeasured.stderr.splitlines() == [
        "error: budget: none of the 3 configurations within 3.0k parameters is measured yet (1 configuration measured, "
        "the smallest with 5.0k): `explorer run` with a larger n_trials measures more"], unmeasured.stderr


def test_a_length_past_the_reach_never_reads_as_the_reach() -> None:
    from explorer.transfer import length_refusal, size_refusal

    assert "41 epochs is 2.05x the longest length measured (20); answers are validated to 2x it" in length_refusal(41, 20)
    assert "is 2.001x the largest" in size_refusal(2_001, 1_000) and "2.0x" not in size_refusal(2_001, 1_000)
    assert "100 epochs is 2.5x" in length_refusal(100, 40)


def test_a_port_in_use_suggests_a_free_one(tmp_path: Path, explorer_cli: Cli) -> None:
    import socket

    path = write_study(tmp_path, budget=QUICK, n_trials=1)
    assert explorer_cli("run", path, "--no-dashboard").returncode == 0
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        said = explorer_cli("dashboard", path, "--serve", "--port", port)
    assert said.returncode == 1 and said.stderr.splitlines() == [
        f"error: --port: cannot listen on 127.0.0.1:{port}: Address already in use; pass --port 0 for any free port, "
        "or another --port"], said.stderr
