"""What a user reads: tables that never cut a number, integer counts that stay integers, and
`explorer params` errors in one clean line."""

from __future__ import annotations

from pathlib import Path

import optuna
import pandas as pd
import pytest
from rich.console import Console
from typer.testing import CliRunner

from explorer import cli, cli_app
from explorer.errors import ExplorerError
from explorer.frame import trials_frame

ROOT = Path(__file__).resolve().parents[1]

WIDE = pd.DataFrame({
    "number": [0, 1], "state": ["COMPLETE", "COMPLETE"], "arch": ["layers=12,heads=24", "layers=16,heads=12"],
    "layers": [12, 16], "heads": [24, 12], "params": [119_664_384, 84_265_728], "flops": [12_345_678_901, 9_876_543_210],
    "accuracy": [0.96123, 0.95], "kappa_init_mean": [5.995e6, 2.3e3], "kappa_final_mean": [1.234e5, 7.7e2],
    "train_time_s": [123.4, 99.0], "device": ["cuda:0", "cuda:0"],
})


@pytest.fixture
def narrow(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CLI's console as an 80-column terminal."""
    monkeypatch.setattr(cli_app, "out", Console(width=80))


def test_a_wide_table_on_80_columns_prints_every_number_whole(narrow: None, capsys: pytest.CaptureFixture) -> None:
    cli_app.print_frame(WIDE, cli_app.Format.table, title="trials")
    text = capsys.readouterr().out
    assert "…" not in text
    for number in ("119,664,384", "84,265,728", "12,345,678,901", "5.995e+06", "1.234e+05", "0.9612", "123.4"):
        assert number in text, number
    assert "layers=12,heads=24" in text.replace("│", "").replace(" ", "").replace("\n", "")  # text may fold, whole


def test_a_table_that_fits_stays_within_the_terminal(narrow: None, capsys: pytest.CaptureFixture) -> None:
    cli_app.print_frame(WIDE[["number", "layers", "heads", "params", "accuracy"]], cli_app.Format.table)
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 80 and "84,265,728" in "\n".join(lines)


def test_params_of_a_space_on_80_columns_prints_whole_counts(narrow: None, capsys: pytest.CaptureFixture) -> None:
    result = CliRunner().invoke(cli.app, ["params", str(ROOT / "spaces" / "crammed-bert.yaml")])
    assert result.exit_code == 0, repr(result.exception)
    text = capsys.readouterr().out + result.output
    assert "119,664,384" in text and "84,265,728" in text and "…" not in text


def _study_with_a_waiting_trial(tmp_path: Path) -> optuna.Study:
    """A real SQLite study: one finished trial with its counts, one queued (WAITING) trial without."""
    study = optuna.create_study(storage=f"sqlite:///{tmp_path / 's.db'}", directions=["maximize", "minimize"])
    arch = optuna.distributions.CategoricalDistribution(["layers=1,heads=1", "layers=2,heads=1"])
    study.add_trial(optuna.trial.create_trial(
        values=[0.9, 35_722], params={"arch": "layers=1,heads=1"}, distributions={"arch": arch},
        user_attrs={"layers": 1, "heads": 1, "width": 64, "mlp": 128, "params": 35_722, "flops": 1_197_568, "accuracy": 0.9}))
    study.enqueue_trial({"arch": "layers=2,heads=1"})
    return study


def test_counts_stay_integers_in_frame_table_and_csv_with_a_waiting_trial(tmp_path: Path, narrow: None,
                                                                           capsys: pytest.CaptureFixture) -> None:
    frame = trials_frame(_study_with_a_waiting_trial(tmp_path))
    assert list(frame["state"]) == ["COMPLETE", "WAITING"]
    for col in ("number", "layers", "heads", "width", "mlp", "params", "flops"):
        assert frame[col].dtype == "Int64", col
    assert frame["params"].isna().tolist() == [False, True]
    csv = frame.to_csv(index=False)
    assert ",35722,1197568," in csv and "35722.0" not in csv
    cli_app.print_frame(frame[["number", "state", "layers", "heads", "params", "flops"]], cli_app.Format.table)
    text = capsys.readouterr().out
    assert "35,722" in text and "1,197,568" in text and "nan" not in text and "<NA>" not in text


@pytest.mark.parametrize("args, message", [
    (["--family", "image-encoder", "--width", "64", "--mlp", "128", "--layers", "2", "--heads", "3"], "image-encoder: heads 3 must divide width 64"),
    (["--family", "image-encoder", "--width", "64", "--mlp", "128", "--layers", "0", "--heads", "2"], "image-encoder: layers: Input should be greater than or equal to 1"),
    (["--family", "image-encoder", "--width", "64", "--mlp", "128", "--layers", "2", "--heads", "2", "--dim", "img_sise=8"],
     "image-encoder: img_sise: unknown field (did you mean img_size?)"),
    (["--family", "timm-vit", "--layers", "2", "--heads", "6", "--dim", "model=vit_smal_patch16_224"],
     "timm-vit: model: model 'vit_smal_patch16_224' is not a timm model; did you mean vit_small_patch16_224"),
])
def test_params_of_a_bad_configuration_is_one_clean_line(args: list[str], message: str) -> None:
    result = CliRunner().invoke(cli.app, ["params", *args])
    assert isinstance(result.exception, ExplorerError), result.output
    text = str(result.exception)
    assert text.startswith(message) and "\n" not in text, text
    assert "[type=" not in text and "input_value" not in text and "Value error" not in text, text


def test_explorer_error_drops_pydantic_decoration_from_any_message() -> None:
    raw = ("1 validation error for Dims\n  Value error, heads 5 must divide width 384 [type=value_error, "
           "input_value={'layers': [1, 2]}, input_type=dict]\n    For further information visit https://errors.pydantic.dev/2.14/v/value_error")
    text = str(ExplorerError(raw, source="f.yaml", field="dims"))
    assert "heads 5 must divide width 384" in text
    assert "[type=" not in text and "input_value" not in text and "pydantic.dev" not in text and "\n" not in text, text
