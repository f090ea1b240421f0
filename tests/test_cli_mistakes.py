"""Mistakes on the command line (issue 35, item 2): every command with each kind of wrong argument gets a
usage line and one error line and exits 2, as click does, with no traceback unless EXPLORER_DEBUG=1;
`--version`; and the silent surprises and words the issue lists, each with the test that shows it fixed.

The commands run through `explorer.cli.main` in this process (the entry point, its error handling
included); a few run as real subprocesses to show the same end to end."""

from __future__ import annotations

import io
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml
from conftest import TINY_SPACE, write_study

from explorer import cli, cli_app, terminal

ROOT = Path(__file__).resolve().parents[1]
QUICK = {"epochs": 1, "max_steps": 2, "batch_size": 64, "lr": 0.003, "seed": 0}
STUDY = str(ROOT / "studies" / "digits-vit-trade.yaml")
SPACE = str(ROOT / "spaces" / "vit-digits.yaml")


def main(*args: object, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> tuple[int, str, str]:
    """`explorer ARGS` through the entry point: (exit code, stdout, stderr)."""
    monkeypatch.setattr(sys, "argv", ["explorer", *map(str, args)])
    monkeypatch.setattr(cli.faulthandler, "register", lambda *a, **k: None)  # needs a real stderr; capsys has none
    with pytest.raises(SystemExit) as leaving:
        cli.main()
    said = capsys.readouterr()
    return leaving.value.code, said.out, said.err


# One of each kind of parsing mistake for every command: a missing argument, an extra one, an unknown
# option, a value of the wrong type, a choice not offered, a value out of range, a missing option.
MISTAKES = [
    (["statu"], "No such command 'statu'. Did you mean 'status'?"),
    (["--bogus"], "No such option: --bogus"),
    (["run"], "Missing argument 'STUDY'"),
    (["run", "a.yaml", "b.yaml"], "unexpected extra argument"),
    (["run", "a.yaml", "--force=yes"], "--force"),
    (["resume"], "Missing argument 'STUDY'"),
    (["resume", "a.yaml", "--reclaim-all"], "No such option: --reclaim-all"),
    (["status"], "Missing argument 'STUDY'"),
    (["status", "a.yaml", "b.yaml"], "unexpected extra argument(s) (b.yaml)"),
    (["status", "a.yaml", "--list"], "No such option: --list"),
    (["export"], "Missing argument 'STUDY'"),
    (["export", STUDY, "--format", "json"], "'json' is not one of 'csv', 'parquet'"),
    (["export", STUDY, "--out"], "Option '--out' requires an argument"),
    (["dashboard"], "Missing argument 'STUDY'"),
    (["dashboard", STUDY, "--every", "-1"], "--every"),
    (["dashboard", STUDY, "--every", "often"], "--every"),
    (["recommend", STUDY], "Missing option '--budget'"),
    (["recommend", STUDY, "--budget", "4k", "--epochs", "0"], "--epochs"),
    (["recommend", STUDY, "--budget", "4k", "--epochs", "x"], "--epochs"),
    (["params", "--layers", "x"], "Invalid value for '--layers'"),
    (["params", "--format", "xml"], "'xml' is not one of 'table', 'csv', 'json'"),
    (["params", SPACE, SPACE], "unexpected extra argument"),
    (["condition"], "Missing argument 'SPACE'"),
    (["condition", SPACE, "--regime", "wide"], "--regime"),
    (["condition", SPACE, "--seeds", "0"], "--seeds"),
]


COMMANDS = ("params", "run", "resume", "status", "export", "dashboard", "recommend", "condition")
MISTAKES += [([name, "--bogus"], "No such option: --bogus") for name in COMMANDS]  # every command, the generic kinds too
MISTAKES += [([name, SPACE, SPACE, SPACE], "") for name in COMMANDS if name != "dashboard"]  # extra arguments


@pytest.mark.parametrize("args, words", MISTAKES, ids=[" ".join(a)[:40] for a, _ in MISTAKES])
def test_a_mistake_on_the_command_line_is_a_usage_line_and_one_error_line_exit_2(
        args: list[str], words: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    code, out, err = main(*args, monkeypatch=monkeypatch, capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 2 and not out, (code, out, err)
    assert len(lines) == 2 and lines[0].startswith("Usage: explorer") and lines[1].startswith("error: "), err
    command = args[0] if not args[0].startswith("-") and args[0] != "statu" else None
    assert lines[0].startswith(f"Usage: explorer {command} [OPTIONS]" if command else "Usage: explorer [OPTIONS] COMMAND")
    assert words in lines[1] and "Traceback" not in err and "Value error" not in err, err


def test_explorer_debug_shows_the_traceback(monkeypatch: pytest.MonkeyPatch) -> None:
    import typer

    monkeypatch.setenv("EXPLORER_DEBUG", "1")
    monkeypatch.setattr(sys, "argv", ["explorer", "status"])
    monkeypatch.setattr(cli.faulthandler, "register", lambda *a, **k: None)
    with pytest.raises(typer.BadParameter.__mro__[1]):  # click's UsageError, raised for its traceback
        cli.main()


def test_no_command_shows_the_help_on_one_screen_and_exits_2_and_version_prints_it(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    code, out, err = main(monkeypatch=monkeypatch, capsys=capsys)
    assert code == 2 and not out and err.startswith("Usage: explorer [OPTIONS] COMMAND") and len(err.splitlines()) <= 24
    for name in ("params", "run", "resume", "status", "export", "dashboard", "recommend", "condition"):
        line = next(line for line in err.splitlines() if line.strip().startswith(name + " "))
        assert not line.rstrip().endswith("..."), line  # the short help is whole, not cut mid-phrase
    assert "--version" in err
    from importlib.metadata import version

    assert main("--version", monkeypatch=monkeypatch, capsys=capsys) == (0, f"explorer {version('explorer')}\n", "")


def test_the_real_command_answers_mistakes_without_a_traceback() -> None:
    for args, code, words in ((["--version"], 0, "explorer 0.1.0"), (["statu"], 2, "Did you mean 'status'?"),
                              (["params", "--layers", "x"], 2, "Invalid value for '--layers'")):
        proc = subprocess.run([sys.executable, "-m", "explorer.cli", *args], capture_output=True, text=True, timeout=120)
        assert proc.returncode == code and words in proc.stdout + proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and len(proc.stderr.strip().splitlines()) <= 2, proc.stderr


def test_help_labels_arguments_one_way_and_every_option_has_words(monkeypatch: pytest.MonkeyPatch,
                                                                  capsys: pytest.CaptureFixture) -> None:
    import typer

    commands = typer.main.get_command(cli.app).commands
    for name, command in commands.items():
        code, out, _ = main(name, "--help", monkeypatch=monkeypatch, capsys=capsys)
        assert code == 0 and "{" not in out and "<" not in out and "[default: no-" not in out, out
        assert all(p.help for p in command.params if p.name != "help"), (name, [p.name for p in command.params if not p.help])
    params_help = main("params", "--help", monkeypatch=monkeypatch, capsys=capsys)[1]
    assert "Usage: explorer params [OPTIONS] [SPACE]" in params_help and "--layers N" in params_help
    assert "Usage: explorer dashboard [OPTIONS] STUDY..." in main("dashboard", "--help", monkeypatch=monkeypatch, capsys=capsys)[1]


# -- errors explorer finds: one line, exit 1, before anything else --------------------------------------------
def one_line(args: list[object], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> str:
    code, out, err = main(*args, monkeypatch=monkeypatch, capsys=capsys)
    lines = err.strip().splitlines()
    assert code == 1 and not out and len(lines) == 1 and lines[0].startswith("error: "), (code, out, err)
    return lines[0]


def test_export_follows_the_extension_or_refuses_and_an_unwritable_place_is_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    path = write_study(tmp_path / "s", budget=QUICK, n_trials=1)
    assert main("run", path, "--no-dashboard", monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    code, out, _ = main("export", path, "--out", tmp_path / "x.parquet", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and "1 trial (5 queued, never started, left out) ->" in out and "1 configuration at 1 epoch ->" in out
    assert len(pd.read_parquet(tmp_path / "x.parquet")) == 1 and len(pd.read_parquet(tmp_path / "x.configs.parquet")) == 1
    assert "export writes .csv or .parquet" in one_line(["export", path, "--out", tmp_path / "t.json"], monkeypatch, capsys)
    clash = one_line(["export", path, "--out", tmp_path / "t.csv", "--format", "parquet"], monkeypatch, capsys)
    assert "t.csv names a csv file and the format asked is parquet" in clash
    assert "/nonexistent/dir is not a folder" in one_line(["export", path, "--out", "/nonexistent/dir/t.csv"], monkeypatch, capsys)
    assert not (tmp_path / "t.json").exists() and not (tmp_path / "t.csv").exists()


def test_an_oserror_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    path = write_study(tmp_path / "s", budget=QUICK, n_trials=1)
    assert main("run", path, "--no-dashboard", monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    (tmp_path / "file").write_text("not a folder")
    line = one_line(["dashboard", path, "--out", tmp_path / "file" / "d.html"], monkeypatch, capsys)
    assert line.startswith(f"error: {tmp_path / 'file'}") and ("File exists" in line or "Not a directory" in line), line


def test_params_refuses_a_space_with_a_family_and_names_the_defaults_it_counts(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    for extra, flag in ((["--family", "crammed-bert"], "--family"), (["--layers", "3"], "--layers"), (["--dim", "vocab=9"], "--dim")):
        line = one_line(["params", SPACE, *extra], monkeypatch, capsys)
        assert line.startswith(f"error: {flag}: ") and "not both" in line, line
    code, out, _ = main("params", "--family", "crammed-bert", "-f", "json", monkeypatch=monkeypatch, capsys=capsys)
    row = pd.read_json(io.StringIO(out)).iloc[0]
    assert code == 0 and (row["layers"], row["heads"], row["width"], row["mlp"]) == (16, 12, 768, 3072)
    monkeypatch.setattr(cli_app, "out", terminal.console(width=200))  # COLUMNS is read when the console is made
    table = main("params", "--family", "crammed-bert", "--layers", "10", monkeypatch=monkeypatch, capsys=capsys)[1]
    assert "not given, so the family's defaults: heads 12, width 768, mlp 3072" in table and "layers 16" not in table


def test_a_listed_value_no_configuration_can_take_is_one_line_naming_the_field(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    space = tmp_path / "space.yaml"
    space.write_text(yaml.safe_dump({**TINY_SPACE, "free": {"layers": [1, 2], "heads": [1, 3]}, "baseline": None}))
    line = one_line(["params", space], monkeypatch, capsys)
    assert f"{space}: free.heads: 3 fits no configuration (e.g. heads=3 does not divide width=16); remove it" in line
    trimmed = {**TINY_SPACE, "free": {"layers": [1, 2, 40], "heads": [1, 2]}, "baseline": None,
               "constraints": {"param_budget": [None, 10_000]}}
    space.write_text(yaml.safe_dump(trimmed))  # a value only the parameter budget excludes is the budget's job
    assert main("params", space, "-f", "csv", monkeypatch=monkeypatch, capsys=capsys)[0] == 0


def test_what_the_yaml_or_the_machine_make_certain_fails_before_any_banner(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    import torch

    path = write_study(tmp_path / "s", budget=QUICK, n_trials=1)
    assert "does not exist (start it with `explorer run`)" in one_line(["resume", path], monkeypatch, capsys)
    if not torch.cuda.is_available():  # the flag the user passed is the one the message names
        line = one_line(["run", path, "--device", "cuda"], monkeypatch, capsys)
        assert line.startswith("error: --device cuda, but this machine has no GPU") and "pass --device cpu" in line, line
        assert "executor.device" not in line
    blocked = write_study(tmp_path / "b", budget=QUICK, n_trials=1, storage="sqlite:///no/such/folder/s.db")
    assert "cannot open storage" in one_line(["run", blocked], monkeypatch, capsys)
    assert not (tmp_path / "s" / "tiny.db").exists()


def test_two_yamls_with_one_name_sharing_a_database_are_told_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    first = write_study(tmp_path, budget=QUICK, n_trials=1)
    assert main("run", first, "--no-dashboard", monkeypatch=monkeypatch, capsys=capsys)[0] == 0
    other = tmp_path / "other.yaml"  # the same `name:` beside it: the same default database, another question
    other.write_text(yaml.safe_dump({**yaml.safe_load(first.read_text()), "budget": {**QUICK, "lr": 0.01}}))
    line = one_line(["run", other, "--no-dashboard"], monkeypatch, capsys)
    assert f"already holds a study named 'tiny', made from {first.resolve()} (another budget (lr 0.003 -> 0.01))" in line
    assert "give this YAML its own `name:` or `storage:`" in line and "made with another" not in line
    _, _, err = main("status", other, monkeypatch=monkeypatch, capsys=capsys)
    assert " ".join(err.split()).startswith(f"note: {other}: {tmp_path / 'tiny.db'} already holds a study named 'tiny'")


# -- words ----------------------------------------------------------------------------------------------------
def summary_of(values: dict[str, list[float]], params: dict[str, int]) -> pd.DataFrame:
    from explorer import stats

    rows = [{"number": i, "state": "COMPLETE", "arch": k, "seed": s, "params": params[k], "accuracy": v}
            for i, (k, s, v) in enumerate((k, s, v) for k, vs in values.items() for s, v in enumerate(vs))]
    return stats.summarize(pd.DataFrame(rows), "accuracy", [("accuracy", "maximize"), ("params", "minimize")], draws=0)


def test_seed_advice_counts_what_it_lists_and_offers_none_past_the_study_cap() -> None:
    import re

    from explorer.decisions import answer

    rng = np.random.default_rng(1)
    means = {f"layers={d},heads={h}": 0.90 + 0.004 * d - 0.002 * h for d in (1, 2, 3) for h in (1, 2)}
    seeds = {k: 3 if i % 2 else 2 for i, k in enumerate(means)}  # half at the cap of 3
    values = {k: list(m + 0.01 * rng.standard_normal(seeds[k])) for k, m in means.items()}
    post = summary_of(values, {k: 1000 for k in means}).attrs["posterior"]
    said = answer(post, 1000, None, 0.001, cap=3)
    assert not said.decided and said.advice
    if not said.past_cap:  # below the cap: only configurations with room, never more than it leaves
        assert all(seeds[k] + n <= 3 for k, n in said.advice.items()), said.advice
    line = said.seeds_words()
    stated = int(re.search(r"(\d+) more seeds?", line).group(1))
    listed = [int(n) for n in re.findall(r"\((\d+) seeds?\)", line)]
    assert stated == sum(listed) == sum(said.advice.values()) and "(" in line and "seed" in line.split(": ")[-1], line
    capped = answer(post, 1000, None, 0.001, cap=2)  # every configuration at or past the cap
    assert capped.past_cap and "seeds below the study's cap of 2 per configuration cannot decide it" in capped.seeds_words()


def test_predictions_write_their_interval_as_measurements_do() -> None:
    from explorer.decisions import Answer
    from explorer.posterior import Regret
    from explorer.recommend import Recommendation

    said = Answer(150_000, Regret("layers=3,heads=8", 0.02, 0.01, ("layers=3,heads=8",)), 0.01, 0.95)
    rec = Recommendation(budget=150_000, key="layers=3,heads=8", dims={"layers": 3, "heads": 8}, params=102_700,
                         metric="accuracy", value=0.9381, lo=0.921, hi=0.949, kind="predicted", answer=said)
    text = "\n".join(rec.lines())
    assert "use 3 / 8:" in text and "(95% interval 0.921 to 0.949; predicted by the surface, not measured)" in text
    assert "[" not in text


def test_a_one_run_study_says_one_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture) -> None:
    path = write_study(tmp_path, budget=QUICK, n_trials=1)
    code, out, _ = main("run", path, "--no-dashboard", monkeypatch=monkeypatch, capsys=capsys)
    assert code == 0 and "1/1 configurations measured, 1 run;" in out, out
