"""Every `explorer` command the docs show, run as a reader runs it with `COLUMNS=80` and its output piped: no
line wider than 80 columns but one that is a path or URL alone, which cannot be broken (issue 43).

How it stays real and fast. The commands run in a temporary folder laid out like the checkout (studies/,
spaces/), in the docs' order (README.md, then the pages of docs/ by name), each once. The default study and
space there are small stand-ins under the same names and of the same shape: the default width and MLP,
1 to 3 layers x 2 or 8 heads (35.7k to 102.7k parameters, so the documented budgets mean what they say), a
ladder of 1 and 2 epochs where the default has 10 and 20, the decide policy over 2 seeds, a baseline. The
first documented command, `explorer run studies/digits-vit-trade.yaml`, trains it; the others read it,
continue it or train beside it (`recommend --verify --epochs`). studies/digits-wide.yaml is a one-length
stand-in trained before them; any other file the docs name (spaces/hf/) is the checkout's own.

What cannot run on this machine is substituted, as `substitute` says: a cluster's address (`--address auto`,
`HOST:6379`) becomes a local Ray cluster (`--executor ray`), an MLflow server a local MLflow store, `--epochs N`
is scaled to the stand-in's ladder (20 epochs -> 2), `--serve` listens on a free port, and a command that runs
until Ctrl-C (`--watch`, `--serve`) is interrupted once it said where its output is.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from rich.cells import cell_len
from test_docs import PAGES, blocks, commands

ROOT = Path(__file__).resolve().parents[1]
WIDTH = 80
EXPLORER = ("explorer", ".venv/bin/explorer")
INLINE = re.compile(r"`explorer ((?:params|run|resume|status|export|dashboard|recommend|condition) [^`]*)`")
LADDER = (1, 2)  # the stand-in's lengths, for the default study's 10 and 20 epochs
UNTIL_INTERRUPTED = ("--watch", "--serve")


def documented(folder: Path) -> list[list[str]]:
    """Every explorer command of the docs' shell blocks and of their prose (one a reader can run as written: it
    names its study, space or family, with no `...` and no placeholder but studies/X.yaml), in the docs'
    order, each once as it runs in `folder` (`substitute`)."""
    found: list[list[str]] = []
    for page in PAGES:
        for block in (b for b in blocks("bash") if b.page == page):
            found += [words[1:] for words in commands(block.body) if words[0] in EXPLORER]
        for m in INLINE.finditer(page.read_text()):
            words = m.group(1).split()
            named = any(w.endswith(".yaml") or w == "--family" for w in words)
            if named and not any("..." in w or "[" in w or re.fullmatch(r"[A-Z]+\.yaml", Path(w).name) for w in words):
                found.append(words)
    return [list(c) for c in dict.fromkeys(tuple(substitute(c, folder)) for c in found)]


def substitute(args: list[str], folder: Path) -> list[str]:
    """A documented command as it runs here (see the module's words): the same command, else the nearest one
    this machine can run."""
    out: list[str] = []
    rest = iter(args)
    for word in rest:
        if word == "--address":  # a cluster: a local Ray here
            next(rest)
            word = "--executor"
            out += [] if "--executor" in args else [word, "ray"]
            continue
        if word == "--epochs":  # the default study's ladder (10, 20) is the stand-in's (1, 2)
            out += [word, str(max(1, round(int(next(rest)) * LADDER[-1] / 20)))]
            continue
        if word == "--port":
            next(rest)
            continue
        if word.startswith("mlflow=http"):  # a tracking server: a local store
            word = f"mlflow=sqlite:///{folder.resolve() / 'server.mlflow.db'}"
        out.append("studies/digits-vit-trade.yaml" if word == "studies/X.yaml" else word)
    return out + (["--port", "0"] if "--serve" in out else [])


def stand_ins(folder: Path) -> None:
    """studies/ and spaces/ as the docs name them: the default study and space small, digits-wide smaller."""
    shutil.copytree(ROOT / "spaces" / "hf", folder / "spaces" / "hf")
    (folder / "studies").mkdir()
    space = yaml.safe_load((ROOT / "spaces" / "vit-digits.yaml").read_text())
    space.update(free={"layers": [1, 2, 3], "heads": [2, 8]}, baseline={"layers": 3, "heads": 2})
    (folder / "spaces" / "vit-digits.yaml").write_text(yaml.safe_dump(space))
    study = yaml.safe_load((ROOT / "studies" / "digits-vit-trade.yaml").read_text())
    study.update(budget={**study["budget"], "epochs": list(LADDER), "seeds": 2, "batch_size": 128}, n_trials=6,
                 executor={"name": "local", "cpu": 1})
    (folder / "studies" / "digits-vit-trade.yaml").write_text(yaml.safe_dump(study))
    (folder / "spaces" / "digits-wide.yaml").write_text(yaml.safe_dump({
        **space, "name": "digits-wide", "fixed": {**space["fixed"], "width": 32, "mlp": 64},
        "free": {"layers": [1, 2], "heads": [2, 4]}, "baseline": None}))
    (folder / "studies" / "digits-wide.yaml").write_text(yaml.safe_dump({
        "name": "digits-wide", "space": "../spaces/digits-wide.yaml", "task": {"name": "digits"},
        "budget": {"epochs": 1, "batch_size": 128, "lr": 0.005}, "sampler": {"name": "grid"}, "n_trials": 4}))


def run(args: list[str], folder: Path, env: dict[str, str]) -> tuple[int, str]:
    """`explorer ARGS` in `folder`, piped: its exit code and stdout and stderr together; one that runs until
    Ctrl-C gets it once it said where its output is."""
    command = [sys.executable, "-m", "explorer.cli", *args]
    if not any(flag in args for flag in UNTIL_INTERRUPTED):
        done = subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=600)
        return done.returncode, done.stdout + done.stderr
    proc = subprocess.Popen(command, cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    said = []
    for line in proc.stdout:  # the dashboard's path (--watch: and how often), or the live page's URL
        said.append(line)
        if line.startswith("dashboard: http") or line.startswith("rendered again"):
            break
    proc.send_signal(signal.SIGINT)
    rest, _ = proc.communicate(timeout=120)
    return proc.returncode, "".join(said) + rest


def too_wide(text: str) -> list[str]:
    """The lines wider than WIDTH columns that are not a path or URL alone (which no wrapping can shorten)."""
    return [line for line in text.splitlines() if cell_len(line) > WIDTH
            and not (len(line.split()) == 1 and "/" in line)]


def test_every_command_of_the_docs_is_found_and_substituted_as_said(tmp_path: Path) -> None:
    found = documented(tmp_path)
    names = {c[0] for c in found}
    assert names >= {"run", "resume", "status", "export", "dashboard", "recommend", "condition", "params", "--version"}, names
    assert ["run", "studies/digits-vit-trade.yaml"] == found[0]  # README's first command trains the stand-in
    assert ["recommend", "studies/digits-vit-trade.yaml", "--budget", "100k", "--verify", "--epochs", "6"] in found
    assert ["run", "studies/digits-vit-trade.yaml", "--executor", "ray"] in found  # --address auto, HOST:6379, X.yaml
    assert not [c for c in found if "--address" in c or "studies/X.yaml" in c or "8050" in c]
    assert all(c[-2:] == ["--port", "0"] for c in found if "--serve" in c)
    assert ["run", "studies/digits-wide.yaml", "--tracking", f"mlflow=sqlite:///{tmp_path.resolve() / 'server.mlflow.db'}"] in found


@pytest.mark.slow  # trains the stand-in and runs some 25 commands, a few seconds each
def test_every_documented_command_fits_80_columns_in_a_pipe(tmp_path: Path) -> None:
    stand_ins(tmp_path)
    env = {**os.environ, "COLUMNS": str(WIDTH), "HOME": str(tmp_path / "home"),  # Ray's token, MLflow's files: the reader's home
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    env.pop("NO_COLOR", None)
    import explorer

    explorer.load(tmp_path / "studies" / "digits-wide.yaml").run()
    problems = []
    for args in documented(tmp_path):
        code, said = run(args, tmp_path, env)
        expected = (0, 130) if any(flag in args for flag in UNTIL_INTERRUPTED) else (0,)  # Ctrl-C: the server ends, or 130
        if code not in expected:
            problems.append(f"explorer {' '.join(args)}: exit {code}\n{said[-2000:]}")
        problems += [f"explorer {' '.join(args)}: {cell_len(line)} columns: {line}" for line in too_wide(said)]
    assert not problems, "\n".join(problems)
    assert (tmp_path / "dashboards" / "digits-vit-trade.html").is_file()  # the commands ran where the reader's would
    assert (tmp_path / "studies" / "digits-vit-trade.parquet").is_file()
