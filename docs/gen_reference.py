"""The reference pages that cannot drift: every CLI command from the Typer app, every params
key from the config dataclasses (type, default, range, the comment beside the field).

mkdocs runs it through ``docs/hooks.py`` on every build (the pages exist only in the built
site); ``python docs/gen_reference.py cli|params`` prints one page.
"""

from __future__ import annotations

import dataclasses
import inspect
import io
import re
import sys
import tokenize
import typing
from typing import Any

import typer.main

PAGES = {"reference/cli.md": "cli", "reference/params.md": "params"}


# -- CLI ---------------------------------------------------------------------------------------


def _walk(command: Any, path: list[str]):
    """(full command path, command) for every leaf command, in the app's order."""
    if hasattr(command, "commands"):  # a group
        for name, sub in command.commands.items():
            if not sub.hidden:
                yield from _walk(sub, [*path, name])
    else:
        yield path, command


def _text(text: str) -> str:
    """Help text as Markdown: <task> stays visible (not an HTML tag)."""
    return text.replace("<", "&lt;").replace(">", "&gt;")


def _cell(text: str) -> str:
    return _text(" ".join(text.split()).replace("|", "\\|"))


def _option_row(param: Any, ctx: Any) -> str:
    names = ", ".join(f"`{n}`" for n in [*param.opts, *param.secondary_opts])
    if param.param_type_name == "argument":
        names = f"`{param.name.upper()}`"
    if getattr(param, "is_flag", False):
        kind = "flag"
    else:
        kind = param.display_type(ctx).strip("<>").lower()
        if param.multiple:
            kind += ", repeatable"
    default = param.default
    if param.required:
        shown = "required"
    elif default is None or default == () or isinstance(default, bool) and not default:
        shown = ""
    else:
        shown = f"`{default}`"
    help_text = getattr(param, "help", None) or ""
    return f"| {names} | {kind} | {shown} | {_cell(help_text)} |"


def cli_markdown() -> str:
    from aclpipe.cli import app

    root = typer.main.get_command(app)
    lines = [
        "# CLI reference",
        "",
        "Generated from the `aclpipe` command at build time; `aclpipe <command> --help` prints "
        "the same. Every command exits with code 2 and one line on input it cannot use "
        "([Bad inputs](../bad_inputs.md)); `aclpipe --debug <command>` shows the traceback.",
        "",
    ]
    for path, command in _walk(root, ["aclpipe"]):
        name = " ".join(path)
        lines += [f"## `{name}`", ""]
        lines += [_text(inspect.cleandoc(command.help or "")), ""]
        ctx = command.context_class(command, info_name=name)
        lines += ["```text", f"{name} {' '.join(command.collect_usage_pieces(ctx))}", "```", ""]
        params = [p for p in command.params if not getattr(p, "hidden", False)]
        if params:
            lines += ["| option | type | default | what it does |", "| --- | --- | --- | --- |"]
            lines += [_option_row(p, ctx) for p in params]
            lines.append("")
    return "\n".join(lines)


# -- params ------------------------------------------------------------------------------------


def _field_comments(cls: type) -> dict[str, str]:
    """Field name -> its comment in ``cls``'s own source: the comment lines just above the
    field and the comment after it on its line."""
    source = inspect.getsource(cls)
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    found: dict[str, str] = {}
    for number, line in enumerate(lines, start=1):
        match = re.match(r"\s{4}(\w+)\s*:", line)
        if not match or line.lstrip().startswith("#"):
            continue
        above: list[str] = []
        previous = number - 1
        while previous in comments and lines[previous - 1].lstrip().startswith("#"):
            above.insert(0, comments[previous])
            previous -= 1
        parts = [*above, comments.get(number, "")]
        found[match.group(1)] = " ".join(p for p in parts if p)
    return found


def _comment(cls: type, name: str) -> str:
    for klass in cls.__mro__:
        if name in vars(klass).get("__annotations__", {}):
            return _field_comments(klass).get(name, "")
    return ""


def _check_text(check: Any) -> str:
    """The range a check admits, in words read from its own code."""
    closure = dict(
        zip(check.__code__.co_freevars, [c.cell_contents for c in check.__closure__ or ()])
    )
    if "choices" in closure:
        return "one of " + ", ".join(f"`{c}`" for c in closure["choices"])
    if "checks" in closure:
        return "; ".join(_check_text(c) for c in closure["checks"])
    known = {"positive": "> 0", "non_negative": ">= 0", "unit": "[0, 1]"}
    if check.__name__ in known:
        return known[check.__name__]
    match = re.search(r"must be (?:in )?(.+?)(?: \(|,? got|\")", inspect.getsource(check))
    if match:
        return match.group(1).strip()
    doc = inspect.getdoc(check)
    return doc.splitlines()[0] if doc else check.__name__.strip("_").replace("_", " ")


def _type_text(hint: Any) -> str:
    text = re.sub(r"typing\.|<class '(\w+)'>", r"\1", str(hint))
    return text.replace("NoneType", "None")


def _default(f: dataclasses.Field) -> str:
    if f.default is not dataclasses.MISSING:
        value = f.default
    elif f.default_factory is not dataclasses.MISSING:
        value = f.default_factory()
    else:
        return "required"
    if value is None:
        return "`null`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    return f"`{value}`"


def _section(title: str, cls: type, intro: str = "") -> list[str]:
    from aclpipe.checks import range_check

    hints = typing.get_type_hints(cls)
    lines = [f"## `{title}`", ""]
    doc = inspect.getdoc(cls)
    if intro:
        lines += [intro, ""]
    if doc and not doc.startswith(cls.__name__ + "("):
        lines += [doc, ""]
    fields = dataclasses.fields(cls)
    if not fields:
        return [*lines, "No knobs.", ""]
    lines += ["| key | type | default | range | meaning |", "| --- | --- | --- | --- | --- |"]
    for f in fields:
        hint = hints[f.name]
        check = range_check(cls, f.name)
        if check is not None:
            allowed = _check_text(check)
        elif typing.get_origin(hint) is typing.Literal:
            allowed = "one of " + ", ".join(f"`{a}`" for a in typing.get_args(hint))
        else:
            allowed = ""
        lines.append(
            f"| `{f.name}` | `{_cell(_type_text(hint))}` | {_cell(_default(f))} | "
            f"{_cell(allowed)} | {_cell(_comment(cls, f.name))} |"
        )
    return [*lines, ""]


def params_markdown() -> str:
    from aclpipe.config import Params
    from aclpipe.training.knobs import KNOBS

    lines = [
        "# Params reference",
        "",
        "Generated from the config dataclasses at build time. `params.yaml` holds one section "
        "per stage; a key left out takes the default below, an unknown key or a value out of "
        "range is an error naming the key. Override any key for one run with "
        "`--set section.key=value` (`aclpipe`) or `-S section.key=value` (`dvc exp run`).",
        "",
    ]
    for f in dataclasses.fields(Params):
        if f.name == "methods":
            continue
        lines += _section(f.name, typing.get_type_hints(Params)[f.name])
    lines += [
        "## `methods.<name>`",
        "",
        "Each method reads only its own section; a knob it does not read is an error. "
        "[Methods](../methods.md) defines each term.",
        "",
    ]
    for name, cls in KNOBS.items():
        section = _section(f"methods.{name}", cls)
        lines += [section[0].replace("## ", "### ", 1), *section[1:]]
    return "\n".join(lines)


def page(kind: str) -> str:
    return {"cli": cli_markdown, "params": params_markdown}[kind]()


if __name__ == "__main__":
    print(page(sys.argv[1] if len(sys.argv) > 1 else "cli"))
