"""The parts every ``aclpipe`` command module shares: the consoles, the one-line error
wrapper (``user_errors``), list options that also read comma-separated names (``parse_list``,
``names_option``), the ``--task``/``--params``/``--set`` options and reading the params file.

The main app (``aclpipe.cli``) and the study's commands (``aclpipe.study.cli``) both build on
these; nothing here imports torch, the training code or the study.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from aclpipe.data.tasks import SENTENCE_TASKS, TASKS, Task, get_task
from aclpipe.errors import UserError
from aclpipe.extras import missing_extra
from aclpipe.layout import Layout
from aclpipe.method_names import check_method  # predict loads nothing of training

console = Console()
err_console = Console(stderr=True)
state = {"debug": False}  # --debug, set by the main app's callback
LAYOUT = Layout()  # the default pipeline's folders, relative to where aclpipe runs


def names_option(*names: str, what: str = "", default: str = "", hidden: bool = False):
    """A repeatable option of names, each value also read as comma-separated names
    (``parse_list``)."""
    text = names_help(what, default)
    return Annotated[list[str] | None, typer.Option(*names, help=text, hidden=hidden)]


def names_help(what: str, default: str) -> str:
    """The help line of a list option of names (``names_option``)."""
    return f"{what}; repeat the option, or separate names with commas, for several. {default}"


def reports_option(help: str):
    """``--reports``: the folder a study's report command writes under."""
    return Annotated[Path, typer.Option("--reports", help=help)]


MethodsAlias = names_option("--methods", hidden=True)  # an earlier release's; still read

TaskOpt = names_option(
    "--task",
    "-t",
    what=f"GLUE task: {', '.join(TASKS)}; sentence-embedding task: {', '.join(SENTENCE_TASKS)}",
    default="Default: every task in pipeline.tasks of the params file.",
)
ParamsOpt = Annotated[Path, typer.Option("--params", help="Params file (YAML) holding every knob.")]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-S",
        help="Override one param, e.g. --set train.lr=3e-5 (repeatable; same keys "
        "as `dvc exp run -S`).",
    ),
]


def counts(meta: dict) -> str:
    """``train 48, dev 16``: examples per split of a prepared task's meta.json."""
    return ", ".join(f"{s} {v['examples']}" for s, v in meta["splits"].items())


def user_errors(fn):
    """Print a UserError as one line and exit 2; any other error as one line and exit 1."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as err:
            if state["debug"]:
                raise
            err_console.print(f"error: {err}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except ModuleNotFoundError as err:  # an optional install left out (aclpipe.extras)
            if state["debug"] or (missing := missing_extra(err)) is None:
                raise
            err_console.print(f"error: {missing}", markup=False, highlight=False, soft_wrap=True)
            raise typer.Exit(2) from None
        except KeyboardInterrupt:
            err_console.print("interrupted: outputs of the unfinished step were not written")
            raise typer.Exit(130) from None
        except Exception as err:  # a bug, not bad input: still one line unless --debug
            if state["debug"]:
                raise
            err_console.print(
                f"internal error: {type(err).__name__}: {err} (run with --debug for the traceback)",
                markup=False,  # messages may hold brackets, e.g. gloo's [/path:line]
                highlight=False,
                soft_wrap=True,
            )
            raise typer.Exit(1) from None

    return wrapper


def parse_list(values: list[str] | None, option: str, kind: type = str) -> list | None:
    """The values of a repeatable list option, each also split at commas: ``["a, b", "a"]`` ->
    ``["a", "b"]`` (stripped, repeats dropped, an empty item an error); none given -> None."""
    if not values:
        return None
    items = []
    for text in values:
        parts = [part.strip() for part in text.split(",")]
        if not all(parts):
            raise UserError(f"{option} {text!r} has an empty item: give a comma-separated list")
        try:
            items += [kind(part) for part in parts]
        except ValueError:
            raise UserError(
                f"{option} {text!r} is not a comma-separated list of whole numbers"
            ) from None
    return list(dict.fromkeys(items))


def load(params_path: Path, overrides: list[str] | None):
    from aclpipe.config import load_params

    return load_params(params_path, overrides or [])


def task_list(task: list[str] | None, params) -> list[Task]:
    names = parse_list(task, "--task") or params.pipeline.tasks
    if not names:
        raise UserError("no task given and pipeline.tasks is empty: pass --task")
    return [get_task(n) for n in names]


def method_list(method: list[str] | None, default: list[str]) -> list[str]:
    names = parse_list(method, "--method") or default
    if not names:
        raise UserError("no method given and pipeline.methods is empty: pass --method")
    return [check_method(n) for n in names]


def task_methods(task: list[str] | None, method: list[str] | None, params):
    """Every (task, method) pair a stage runs: the options, else pipeline.tasks and .methods;
    all names are checked before the first pair runs."""
    tasks, methods = task_list(task, params), method_list(method, params.pipeline.methods)
    return [(t, m) for t in tasks for m in methods]
