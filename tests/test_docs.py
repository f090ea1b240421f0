"""The docs (README.md and the MkDocs site in docs/) against the code: every YAML block loads through the
real models, every shell command parses against the real command line it calls (explorer's, Ray's,
optuna-dashboard's, mkdocs', pip's extras, a bench script's flags), `explorer params` commands run,
every Python block is run by a test, the generated reference names every command, option and field,
each field has a description, and `mkdocs build --strict` passes.

Blocks of illustrative output are fenced as ```text and skipped; any other language is an error here.
"""

from __future__ import annotations


import importlib
import importlib.util
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import typer
import yaml
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]
LANGUAGES = {"bash", "yaml", "python", "toml", "text"}  # text: output or a picture, shown as it is
FENCE = re.compile(r"^```(\S*)[^\n]*\n(.*?)^```", re.M | re.S)
PLACEHOLDER = re.compile(r"\b(X|NAME|STUDY|SPACE|[A-Z]+_[A-Z]+)\b")  # studies/X.yaml: a name the reader picks


def _load_gen_ref():
    spec = importlib.util.spec_from_file_location("gen_ref", DOCS / "gen_ref.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


gen_ref = _load_gen_ref()


@dataclass(frozen=True)
class Block:
    page: Path
    line: int
    language: str
    body: str

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(language: str | None = None) -> list[Block]:
    found = [Block(page, page.read_text()[:m.start()].count("\n") + 1, m.group(1), m.group(2))
             for page in PAGES for m in FENCE.finditer(page.read_text())]
    return [b for b in found if language is None or b.language == language]


def by_id(items: list[Block]) -> dict:
    return {"argvalues": items, "ids": [str(b) for b in items]}


# -- the blocks -------------------------------------------------------------------------------------------
def test_every_block_says_what_it_is() -> None:
    unmarked = [f"{b} ```{b.language}" for b in blocks() if b.language not in LANGUAGES]
    assert not unmarked, f"fence each block as one of {sorted(LANGUAGES)}: {unmarked}"
    assert len(blocks("yaml")) >= 3 and len(blocks("bash")) >= 8 and blocks("python")


def _minimal_study() -> dict:
    return {"name": "doc", "space": "space.yaml", "task": {"name": "digits"}, "n_trials": 1}


def _minimal_space() -> dict:
    return {"name": "doc", "family": "image-encoder", "free": {"layers": [1]}}


@pytest.mark.parametrize("block", **by_id(blocks("yaml")))
def test_yaml_block_loads_through_the_models(block: Block, tmp_path: Path) -> None:
    """A space (it names a family) loads as a space; a study (space and task) as a study; a fragment of
    either is validated inside the smallest whole one. A space of explorer's own families is loaded in
    full (feasible configurations counted), a task of explorer's own gets its options checked."""
    from explorer.families import MODULES
    from explorer.space import SpaceSpec, load_space
    from explorer.study.spec import StudySpec

    data = yaml.safe_load(block.body)
    assert isinstance(data, dict), f"{block}: not a mapping"
    if {"family", "fixed", "free", "constraints", "baseline"} & set(data):
        assert set(data) <= set(SpaceSpec.model_fields), f"{block}: not space fields: {set(data) - set(SpaceSpec.model_fields)}"
        whole = data if {"name", "family", "free"} <= set(data) else {**_minimal_space(), **data}
        SpaceSpec.model_validate(whole)
        if whole["family"] in MODULES:  # explorer's own: loaded in full, its feasible configurations counted
            path = tmp_path / "space.yaml"
            path.write_text(yaml.safe_dump(whole))
            assert load_space(path).configs(), f"{block}: no feasible configuration"
    else:
        assert set(data) <= set(StudySpec.model_fields), f"{block}: not study fields: {set(data) - set(StudySpec.model_fields)}"
        study = StudySpec.model_validate({**_minimal_study(), **data})
        task = gen_ref.own_tasks().get(study.task["name"])
        if task is not None:  # a plugin's task is run by tests/test_plugins.py
            task.Options.model_validate({k: v for k, v in study.task.items() if k != "name"})


# -- the shell commands -------------------------------------------------------------------------------------
def commands(body: str) -> list[list[str]]:
    """Each command of a bash block as words: continuations joined, comments dropped, split at && ; |."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        words = shlex.split(line, comments=True)
        current: list[str] = []
        for word in [*words, "&&"]:
            if word in ("&&", ";", "|", "||"):
                if current:
                    out.append(current)
                current = []
            else:
                current.append(word)
    return out


def explorer_command() -> Any:
    from explorer.cli import app

    return typer.main.get_command(app)


def parse(group: Any, prog: str, args: list[str]) -> Any:
    """`args` parsed by a click group and its subcommand as the real command would, without running it."""
    ctx = group.context_class(group, info_name=prog)  # typer's vendored click or the real one, as the group has it
    name, command, rest = group.resolve_command(ctx, list(args))
    if hasattr(command, "resolve_command"):  # a group: its subcommand parses the rest
        return parse(command, f"{prog} {name}", rest)
    return command.make_context(name, rest, parent=ctx)


def check_explorer(args: list[str]) -> None:
    if args == ["--version"]:  # the group's own option: run it
        from explorer.cli import app

        result = CliRunner().invoke(app, args)
        assert result.exit_code == 0 and result.output.startswith("explorer "), result.output
        return
    ctx = parse(explorer_command(), "explorer", args)
    for value in ctx.params.values():
        for path in value if isinstance(value, (list, tuple)) else [value]:
            if isinstance(path, Path) and path.parts[0] in ("studies", "spaces") and not PLACEHOLDER.search(str(path)):
                assert (ROOT / path).exists(), f"{path} does not exist"
    if args[0] == "params":  # cheap: run it, as the reader would
        from explorer.cli import app

        result = CliRunner().invoke(app, args, catch_exceptions=False, env={"COLUMNS": "200"})
        assert result.exit_code == 0, result.output


def check_ray(args: list[str]) -> None:
    from ray.scripts.scripts import cli

    parse(cli, "ray", args)


def check_mkdocs(args: list[str]) -> None:
    from mkdocs.__main__ import cli

    parse(cli, "mkdocs", args)


def flags_in_help(program: str, extra: str) -> Callable[[list[str]], None]:
    """A checker of `program`'s flags against its own --help (a program that is not a click group)."""

    def check(args: list[str]) -> None:
        exe = shutil.which(program, path=str(Path(sys.executable).parent))
        assert exe, f"{program} is not installed (the {extra} extra)"
        usage = subprocess.run([exe, "--help"], capture_output=True, text=True, check=True).stdout
        for flag in [a.split("=")[0] for a in args if a.startswith("-")]:
            assert re.search(rf"(^|\s){re.escape(flag)}\b", usage), f"{program} has no {flag}"

    return check


def check_mlflow(args: list[str]) -> None:
    from mlflow.cli import cli

    parse(cli, "mlflow", args)


def check_pip(args: list[str]) -> None:
    assert args[0] == "install", args
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    for arg in args[1:]:
        named = re.fullmatch(r"(?:\.|explorer)\[([\w,-]+)\]", arg)
        if named:
            assert set(named.group(1).split(",")) <= extras, f"{arg}: pyproject has extras {sorted(extras)}"
        else:
            assert arg in ("-q", "-e", "."), arg


def check_python(args: list[str]) -> None:
    if args[:2] == ["-m", "venv"] or args[:2] == ["-m", "pytest"]:
        return
    if args[0] == "-c":  # a one-liner: it compiles, and every optuna.X.Y it names exists
        compile(args[1], "python -c", "exec")
        for dotted in re.findall(r"\boptuna(?:\.\w+)+", args[1]):
            found = importlib.import_module("optuna")
            for part in dotted.split(".")[1:]:
                assert hasattr(found, part), f"python -c: {dotted} does not exist"
                found = getattr(found, part)
        return
    script = ROOT / args[0]
    assert args[0].startswith("bench/") and script.is_file(), f"python {args[0]}: not a bench script"
    source = script.read_text()
    for flag in [a for a in args[1:] if a.startswith("--")]:
        assert f'"{flag}"' in source, f"{args[0]} has no {flag}"


CHECKERS = {
    "explorer": check_explorer, ".venv/bin/explorer": check_explorer,
    "ray": check_ray, "mkdocs": check_mkdocs, ".venv/bin/mkdocs": check_mkdocs,
    "optuna-dashboard": flags_in_help("optuna-dashboard", "dashboard-server"),
    "mlflow": check_mlflow, "tensorboard": flags_in_help("tensorboard", "tensorboard"),
    "pip": check_pip, ".venv/bin/pip": check_pip,
    "python": check_python, "python3": check_python, ".venv/bin/python": check_python,
    "export": lambda args: None,  # the shell's own
}


@pytest.mark.parametrize("block", **by_id(blocks("bash")))
def test_shell_block_parses_against_the_real_commands(block: Block) -> None:
    for words in commands(block.body):
        program, *args = words
        assert program in CHECKERS, f"{block}: no check for `{program}`; add one to tests/test_docs.py"
        try:
            CHECKERS[program](args)
        except Exception as err:  # a usage error of any click (typer vendors its own), or a failed check
            message = err.format_message() if hasattr(err, "format_message") else str(err)
            pytest.fail(f"{block}: `{shlex.join(words)}`: {message}")


INLINE = re.compile(r"`(?:explorer )?(params|run|resume|status|export|dashboard|recommend|condition)( [^`]*)?`")


def test_commands_named_in_the_text_have_those_options() -> None:
    """Prose such as `recommend --verify --epochs N` or `explorer dashboard A.yaml B.yaml`: the command
    exists and has every option it names; `python bench/X.py --flag`: the script exists and takes it."""
    group, checked, wrong = explorer_command(), 0, []
    for page in PAGES:
        for m in INLINE.finditer(page.read_text()):
            command = group.get_command(group.context_class(group), m.group(1))
            known = {o for p in command.params for o in (*p.opts, *p.secondary_opts)}
            for flag in re.findall(r"(?<![\w-])--?[a-z][\w-]*", m.group(2) or ""):
                checked += 1
                if flag not in known:
                    wrong.append(f"{page.relative_to(ROOT)}: `{m.group(0)}`: no {flag}")
    for page in PAGES:  # `python bench/workers.py --postgres URL`: the script exists and takes the flag
        for m in re.finditer(r"`python (bench/[^`]*)`", page.read_text()):
            try:
                check_python(shlex.split(m.group(1)))
                checked += 1
            except AssertionError as err:
                wrong.append(f"{page.relative_to(ROOT)}: {err}")
    assert not wrong, wrong
    assert checked >= 10


# -- the Python blocks -----------------------------------------------------------------------------------------
def test_every_python_block_is_run_by_a_test() -> None:
    """The From Python example runs in tests/test_api.py; the plugin example's files (each block opening
    with `# <file name>`) are installed and run in tests/test_plugins.py. A new block must join one."""
    import test_api
    import test_plugins

    run = {test_api.docs_block("getting-started.md", "From Python", "python").strip()}
    run |= {body.strip() for body in test_plugins.example_files().values()}
    left = [str(b) for b in blocks("python") + blocks("toml") if b.body.split("\n", 1)[-1].strip() not in run and b.body.strip() not in run]
    assert not left, f"blocks no test runs: {left}"


# -- the generated reference ------------------------------------------------------------------------------------
def test_every_yaml_field_has_a_description() -> None:
    assert gen_ref.models(), "no models found"
    assert not gen_ref.undescribed(), "fields without Field(description=...): " + ", ".join(gen_ref.undescribed())


def test_the_reference_names_every_command_and_option() -> None:
    page = gen_ref.cli_page()
    group = explorer_command()
    for name, command in group.commands.items():
        assert f"## `explorer {name}`" in page, name
        section = page.split(f"## `explorer {name}`", 1)[1].split("\n## ", 1)[0]
        for param in command.params:
            for opt in param.opts if param.param_type_name == "option" else [param.metavar or param.name]:
                assert f"`{opt}" in section or f", {opt}" in section, f"explorer {name}: {opt} not in the reference"


def test_the_reference_names_every_field_task_and_family() -> None:
    from explorer.families import MODULES
    from explorer.space import SpaceSpec
    from explorer.study.spec import StudySpec

    assert set(gen_ref.own_families()) == set(MODULES)
    for page, root, name in ((gen_ref.study_page(), StudySpec, "study"), (gen_ref.space_page(), SpaceSpec, "space")):
        for path, model in gen_ref.sections(root):
            assert f"\n## {path or name} " in page, path
            for field in model.model_fields:
                assert f"| `{field}` |" in page, f"{model.__name__}.{field}"
    space = gen_ref.space_page()
    assert all(f"### {name} " in space for name in MODULES)
    tasks = gen_ref.tasks_page()
    for name, task in gen_ref.own_tasks().items():
        section = tasks.split(f"## {name} ", 1)[1].split("\n## ", 1)[0]
        missing = [f for f in task.Options.model_fields if f"| `{f}` |" not in section]
        assert not missing, f"tasks reference: {name} lacks {missing}"


def test_type_names_read_as_yaml() -> None:
    assert gen_ref.type_name(int | None, {}) == "integer or null"
    assert gen_ref.type_name(list[int], {}) == "list of integers"
    assert gen_ref.type_name(typing.Literal["a", "b"], {}) == "`a` \\| `b`"
    assert gen_ref.type_name(dict[str, int | float | str | bool], {}) == "mapping of string to value"


# -- the pages as a whole -----------------------------------------------------------------------------------------
def test_readme_is_a_landing_page_whose_links_resolve() -> None:
    text = (ROOT / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    for target in re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", text):
        if not target.startswith("http"):
            assert (ROOT / target).exists(), f"README links to {target}, which does not exist"
    first, second = [b.body.strip() for b in blocks("bash") if b.page.name == "README.md"][:2]
    assert second in (ROOT / ".ci" / "run").read_text(), "CI must run the README's test command as written"
    assert first.endswith("explorer run studies/digits-vit-trade.yaml")


def test_every_page_is_in_the_nav() -> None:
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text())
    named: list[str] = []

    def walk(items: list) -> None:
        for item in items:
            value = item if isinstance(item, str) else next(iter(item.values()))
            walk(value) if isinstance(value, list) else named.append(value)

    walk(config["nav"])
    pages = {str(p.relative_to(DOCS)) for p in DOCS.rglob("*.md")} | set(gen_ref.PAGES)
    assert pages == set(named), f"not in the nav: {pages - set(named)}; no such page: {set(named) - pages}"


@pytest.mark.slow  # imports every family (torch, timm, transformers) and renders the site: seconds to a minute
def test_mkdocs_build_is_strict_clean(tmp_path: Path) -> None:
    pytest.importorskip("mkdocs", reason="the docs extra is not installed: pip install -e '.[docs]'")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    for page in ("reference/cli", "reference/study", "reference/space", "reference/tasks", "benchmarks"):
        assert (tmp_path / "site" / page / "index.html").is_file(), page
    assert (tmp_path / "site" / "assets" / "digits-vit-trade.png").stat().st_size > 100_000


def test_the_index_and_the_readme_list_every_how_to_page() -> None:
    """docs/index.md's how-to list left out Trackers (issue 43, item 13)."""
    for page in (DOCS / "index.md", ROOT / "README.md"):
        text = page.read_text()
        prefix = "how-to/" if page.parent == DOCS else "docs/how-to/"
        missing = [p.name for p in sorted((DOCS / "how-to").glob("*.md")) if f"]({prefix}{p.name})" not in text]
        assert not missing, f"{page.relative_to(ROOT)} links no {missing}"


@pytest.mark.skipif(shutil.which("git") is None or not (ROOT / ".git").exists(), reason="not a git checkout")
def test_gitignore_covers_what_the_documented_commands_write() -> None:
    """`explorer export` writes beside the study YAML (studies/NAME.csv and .configs.csv, or .parquet), the API
    example into runs/ (issue 43, item 13): none of it may show as a file to commit."""
    from explorer.export import beside

    written = []
    for study in sorted((ROOT / "studies").rglob("*.yaml")):
        for fmt in ("csv", "parquet"):
            target = study.with_suffix(f".{fmt}").relative_to(ROOT)
            written += [target, beside(target, fmt)]
    example = [b for b in blocks("python") if "explorer.create(" in b.body][0].body
    folder = re.search(r"explorer\.create\(\s*\"([^\"]+)\"", example).group(1)
    written += [Path(folder) / name for name in ("digits-tiny.yaml", "digits-tiny.space.yaml", "digits-tiny.db", "d.html")]
    done = subprocess.run(["git", "check-ignore", "--no-index", "--verbose", "--non-matching", *map(str, written)],
                          cwd=ROOT, capture_output=True, text=True)
    kept = [line.split("\t")[-1] for line in done.stdout.splitlines() if line.startswith("::")]
    assert done.returncode in (0, 1) and not kept, f"not in .gitignore: {kept}"
