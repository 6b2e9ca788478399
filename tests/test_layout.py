"""layout.py owns every folder and file name: no other module of the package spells one.

A string literal counts as spelling a path when it is joined with ``/``, passed to ``Path()``,
or holds a ``/`` or a file extension, and one of its parts is a name layout.py defines (its
string constants, ``segment_<n>.onnx``, ``<split>.jsonl``). Text for people (messages, help,
docstrings) is not a path and is not checked.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize

from paths import REPO

from aclpipe import layout

PACKAGE = REPO / "src" / "aclpipe"
EXTENSION = re.compile(r"\.(json|jsonl|npz|md|csv|png|onnx|safetensors|yaml|sh)$")
PATTERNS = [re.compile(r"segment_(\d+|\{\})(\.int8)?\.onnx"), re.compile(r"(\w+|\{\})\.jsonl")]
# Words too common to be a path on their own; they count only beside another layout name.
GENERIC = {"model", "tokenizer", "validation", "export", "angles"}


def owned_names() -> set[str]:
    names = set()
    for key, value in vars(layout).items():
        if key.isupper() and isinstance(value, str) and not value.startswith("."):
            names.update(part for part in value.split("/") if part)  # suffixes are not names
    return names


def _strings(source: str) -> list[tuple[str, int, str, str, str]]:
    """Each string literal: (its text, line, the token before it, the one before that, the
    token after it). An f-string is one literal on Python 3.12 too."""
    lines = source.splitlines(keepends=True)
    offsets = [0]
    for line in lines:
        offsets.append(offsets[-1] + len(line))
    skip = (tokenize.NL, tokenize.NEWLINE, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT)
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline) if t.type not in skip]
    f_start = getattr(tokenize, "FSTRING_START", None)
    units, i = [], 0  # (is a string literal, text, line)
    while i < len(tokens):
        token = tokens[i]
        if f_start is not None and token.type == f_start:
            depth, j = 0, i
            while True:
                depth += tokens[j].type == f_start
                depth -= tokens[j].type == tokenize.FSTRING_END
                if depth == 0:
                    break
                j += 1
            start = offsets[token.start[0] - 1] + token.start[1]
            end = offsets[tokens[j].end[0] - 1] + tokens[j].end[1]
            units.append((True, source[start:end], token.start[0]))
            i = j + 1
        else:
            units.append((token.type == tokenize.STRING, token.string, token.start[0]))
            i += 1
    out = []
    for k, (is_string, text, line) in enumerate(units):
        if is_string:
            before = units[k - 1][1] if k else ""
            before2 = units[k - 2][1] if k > 1 else ""
            after = units[k + 1][1] if k + 1 < len(units) else ""
            out.append((text, line, before, before2, after))
    return out


def spelled_paths(source: str, owned: set[str]) -> list[tuple[int, str]]:
    """(line, literal) for each string literal in ``source`` that spells a layout path."""
    found = []
    for text, line, before, before2, after in _strings(source):
        prefix = re.match(r"[A-Za-z]*", text).group(0).lower()
        if "b" in prefix:
            continue
        if "f" in prefix:  # the fixed parts of an f-string; each {...} stands for a name
            value = re.sub(r"\{[^{}]*\}", "{}", text[len(prefix):].strip("'\""))
        else:
            value = ast.literal_eval(text)
        if not isinstance(value, str) or not value or re.search(r"\s", value):
            continue
        joined = "/" in (before, after)
        in_path = before == "(" and before2 in ("Path", "joinpath")
        if not (joined or in_path or "/" in value or EXTENSION.search(value)):
            continue
        parts = [p for p in value.split("/") if p and p != "{}"]
        hits = [p for p in parts if p in owned or any(r.fullmatch(p) for r in PATTERNS)]
        if [p for p in hits if p not in GENERIC] or (hits and len(parts) > 1):
            found.append((line, value))
    return found


def test_the_reader_finds_a_spelled_path_and_skips_text() -> None:
    owned = owned_names()
    source = (
        'a = root / "models" / task\n'
        'b = folder / "metrics.json"\n'
        'c = Path("reports")\n'
        'd = f"runs/{task}/{run}-s{seed}"\n'
        'e = "campaign/params.yaml"\n'
        'f = data / "dev.jsonl"\n'
        'f2 = tmp / f"{split}.jsonl"\n'
        'f3 = f"segment_{end}.onnx"\n'
        'g = "run `aclpipe prepare` first: models/ is empty"\n'  # a message, with spaces
        'h = {"model": 1, "export": 2}\n'  # dict keys, not paths
        'i = model_dir / "export"\n'  # generic alone: not flagged
        'j = b"metrics.json"\n'
    )
    lines = [line for line, _ in spelled_paths(source, owned)]
    assert lines == [1, 2, 3, 4, 5, 6, 7, 8]


def test_no_module_but_layout_spells_a_file_or_folder_name() -> None:
    owned = owned_names()
    found = [
        f"{path.relative_to(REPO)}:{line}: {value!r}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if path != PACKAGE / "layout.py"
        for line, value in spelled_paths(path.read_text(encoding="utf-8"), owned)
    ]
    assert found == [], "ask aclpipe.layout for these names instead: " + "; ".join(found)
