"""The architecture, checked: no import circle inside aclpipe (imports inside functions and
type-only imports counted too); three floors, the library below the pipeline (config, the
stages, the CLI) below the studies; inside the studies, the statistics core below every study
and each study apart from the others but for the few-shot study on the campaign; knobs apart
from the training code; and the serving path (``aclpipe predict``) loading nothing of
training, the config, the stages or the scoring libraries."""

from __future__ import annotations

import graphlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "aclpipe"
sys.path.insert(0, str(ROOT / "benchmarks"))

import import_graph as walker  # noqa: E402  (benchmarks/import_graph.py: the one import walker)


def import_graph(type_only: bool = False) -> dict[str, set[str]]:
    """Module -> the aclpipe modules it imports anywhere in its file (at run time; with
    ``type_only``, the ``if TYPE_CHECKING:`` imports too)."""
    return walker.import_graph(walker.module_names(), type_only)


def test_no_import_circle() -> None:
    """Not even through an annotation: a type-only import back is the trace of two ideas in
    one module (as layerwise.py's runners and forward_to_exits once were)."""
    graph = import_graph(type_only=True)
    assert "aclpipe.config" in graph["aclpipe.study.campaign.plan"]  # the walk sees imports
    assert "aclpipe.modeling.model" in graph["aclpipe.modeling.layer_guard"]  # the guard on top
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as err:
        raise AssertionError(f"import circle: {' -> '.join(err.args[1])}") from None


# The library: every package the stages call. None of it reads params.yaml's Params or knows a
# stage; each section it takes is its own dataclass (``<package>.config``).
LIBRARY = ("data", "modeling", "training", "evaluation", "early_exit", "exits")
ABOVE_THE_LIBRARY = ("aclpipe.config", "aclpipe.stages", "aclpipe.study", "aclpipe.cli")


def test_no_library_package_imports_config_or_a_stage() -> None:
    graph = import_graph(type_only=True)
    assert "aclpipe.config" in graph["aclpipe.stages.finetune"]  # the walk sees the stages'
    library = [m for m in graph if m.split(".")[1:2] and m.split(".")[1] in LIBRARY]
    assert "aclpipe.training.loop" in library and "aclpipe.exits.export" in library
    for module in library:
        for target in graph[module]:
            assert not target.startswith(ABOVE_THE_LIBRARY), (module, target)


def test_the_pipeline_imports_no_study() -> None:
    """The stages (the trade-off stage among them) and the config stand below every study;
    only the CLI's face adds the studies' commands (``aclpipe.study.cli``)."""
    graph = import_graph(type_only=True)
    assert "aclpipe.stages.tradeoff" in graph["aclpipe.cli"] or any(
        "aclpipe.stages.tradeoff" in graph[m] for m in graph if m.startswith("aclpipe.cli")
    )  # the walk sees the trade-off stage, from the CLI
    for module in (m for m in graph if m.startswith(("aclpipe.stages", "aclpipe.config"))):
        assert not any(t.startswith("aclpipe.study") for t in graph[module]), module
    for module in ("aclpipe.cli", "aclpipe.cli_options"):
        assert {t for t in graph[module] if t.startswith("aclpipe.study")} <= set(STUDY_FACES)


# The studies' floors, bottom first: the statistics core; the gradient-angle experiment and the
# STS study; the seeds campaign (its report summarises the angle runs); the few-shot study, a
# campaign with N as one more axis; then the faces, the command tables (with the campaign
# commands, which run the campaign and the few-shot study alike). An arrow goes down a floor.
STUDY_FACES = ("aclpipe.study", "aclpipe.study.cli", "aclpipe.study.campaign.cli",
               "aclpipe.study.campaign.commands", "aclpipe.study.sts.cli",
               "aclpipe.study.params_cli")  # fmt: skip
STUDY_FLOORS = (
    ("aclpipe.study.stats",),
    ("aclpipe.study.angles", "aclpipe.study.sts"),
    ("aclpipe.study.campaign",),
    ("aclpipe.study.fewshot",),
)


def _study_floor(module: str) -> int | None:
    if module in STUDY_FACES:
        return len(STUDY_FLOORS)
    for height, floor in enumerate(STUDY_FLOORS):
        if any(module == f or module.startswith(f + ".") for f in floor):
            return height
    return None


def test_the_studies_stand_on_the_statistics_core() -> None:
    graph = import_graph(type_only=True)
    studies = [m for m in graph if m.startswith("aclpipe.study")]
    assert "aclpipe.study.stats.paired" in graph["aclpipe.study.fewshot.report"]  # the walk sees
    for module in studies:
        height = _study_floor(module)
        assert height is not None, f"{module}: give it a floor in STUDY_FLOORS or STUDY_FACES"
        for target in (t for t in graph[module] if t.startswith("aclpipe.study")):
            if (
                target == module.rsplit(".", 1)[0]
                or target.rsplit(".", 1)[0] == module.rsplit(".", 1)[0]
            ):
                continue  # its own package, and the package's other modules
            faces = height == len(STUDY_FLOORS) == _study_floor(target)  # tables add sub-apps
            assert _study_floor(target) < height or faces, (module, target)


def test_serving_and_offline_exits_apart() -> None:
    """``early_exit`` is what a serving box needs; export and sweeps (``exits``) stand on it,
    and ``evaluation`` (scores) sits between them, imported by neither serving module."""
    graph = import_graph(type_only=True)
    for module in (m for m in graph if m.startswith("aclpipe.early_exit")):
        for target in graph[module]:
            assert not target.startswith(("aclpipe.exits", "aclpipe.evaluation")), (module, target)
    for module in (m for m in graph if m.startswith("aclpipe.evaluation")):
        assert not any(t.startswith("aclpipe.exits") for t in graph[module]), module


def test_methods_do_not_import_the_config() -> None:
    """Knobs live with their method; config.py asks the catalogue, never the other way."""
    graph = import_graph()
    assert "aclpipe.config" not in graph["aclpipe.training.methods"]
    assert "aclpipe.config" not in graph["aclpipe.training.knobs"]
    assert "aclpipe.training.knobs" in graph["aclpipe.config"]


def test_one_registry_names_every_method() -> None:
    """``aclpipe.method_names.REGISTRY`` is the one list of methods: the knobs table and the
    catalogue follow it, in its order, and every knobs record and builder is in it (a record or
    builder no entry names would be a method half added)."""
    import dataclasses

    from aclpipe.method_names import METHOD_NAMES, REGISTRY
    from aclpipe.training import knobs, methods

    assert tuple(knobs.KNOBS) == tuple(methods.METHODS) == METHOD_NAMES == tuple(REGISTRY)
    for name, (record, builder) in REGISTRY.items():
        assert methods.METHODS[name] == (getattr(knobs, record), getattr(methods, builder))
    records = {
        n for n, v in vars(knobs).items() if n.endswith("Knobs") and dataclasses.is_dataclass(v)
    }
    assert records == {record for record, _ in REGISTRY.values()}
    builders = {n for n in vars(methods) if n.startswith("build_") and n != "build_method"}
    assert builders == {builder for _, builder in REGISTRY.values()}


@pytest.mark.slow
def test_the_method_table_is_torch_free() -> None:
    """The CLI's help and checks, and the config, read the table without the training code."""
    script = "import sys, aclpipe.training.knobs\nprint('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"


def test_inference_never_imports_training_or_the_stages() -> None:
    """Not even the torch-free method table: the CLI reads aclpipe.method_names."""
    graph = import_graph(type_only=True)
    serving = [m for m in graph if m.startswith("aclpipe.early_exit")]
    for module in serving:
        for target in graph[module]:
            assert not target.startswith(ABOVE_THE_LIBRARY), (module, target)
            assert not target.startswith("aclpipe.training"), (module, target)


# scipy is not here: transformers' PreTrainedModel imports it itself (transformers/loss/
# loss_utils.py) when the torch engine loads the model; aclpipe's own modules must not.
FORBIDDEN = ("sklearn", "datasets", "aclpipe.training", "aclpipe.config", "aclpipe.stages",
             "aclpipe.evaluation", "aclpipe.study", "aclpipe.exits")  # fmt: skip
# The studies' command tables (option parsing only; their commands import a study when they run)
# are part of the CLI every command loads.
FACES = ("aclpipe.study", "aclpipe.study.cli", "aclpipe.study.campaign", "aclpipe.study.campaign.cli",
         "aclpipe.study.sts", "aclpipe.study.sts.cli", "aclpipe.study.params_cli")  # fmt: skip


@pytest.mark.slow
def test_serving_modules_import_no_scipy() -> None:
    script = (
        "import sys\nimport aclpipe.cli, aclpipe.early_exit.predict\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('scipy', 'sklearn')))"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.slow
def test_predict_loads_no_training_stack(tmp_path: Path, tiny_model_dir: Path) -> None:
    """`aclpipe predict` end to end in a fresh interpreter, then a look at sys.modules: nothing
    of aclpipe.training (not even the method table), nor the config with its training knobs."""
    from test_predict import save_folder

    folder = save_folder(tmp_path / "model", tiny_model_dir, "sst2", 2)
    script = (
        "import sys, json\n"
        "from aclpipe.cli import app\n"
        f"args = ['predict', '--model', {str(folder)!r}, '--input', {str(tmp_path / 'in.txt')!r},"
        f" '--output', {str(tmp_path / 'out.jsonl')!r}]\n"
        "try:\n    app(args)\nexcept SystemExit as e:\n    assert not e.code, e.code\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    (tmp_path / "in.txt").write_text("a good film\nbad plot\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = json.loads(done.stdout.strip().splitlines()[-1])
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 2
    bad = [
        m for m in loaded
        if m not in FACES and any(m == f or m.startswith(f + ".") for f in FORBIDDEN)
    ]  # fmt: skip
    assert bad == []
