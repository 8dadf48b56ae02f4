"""The seam between the shared layers and the task families (#61), read from the package's source: the
shared layers name no family and none of a family's concepts, no import points up the layers or makes
a circle, and every family has every hook run.py calls. A rule broken in a file fails here naming the
file and line."""

from __future__ import annotations

import ast
import inspect
import re
import typing
from pathlib import Path

import pytest

import finetune
from finetune.config.data_args import TaskType
from finetune.families import family_for
from finetune.families.family import TaskFamily

PACKAGE = Path(finetune.__file__).parent

NAMING_NO_FAMILY = ("training", "config", "output", "studies", "speed", "distributed", "run.py")
"""What must name no family: the loop, the flags and the run's identity (each family declares its own flags
in finetune/families/<family>/flags.py), checkpoints, the export, studies, speed paths, ranks, the run."""

FAMILY_WORDS = re.compile(
    r"task_type *(==|!=|in)|\"(causal_lm|token_classification|sequence_classification|dpo)\"|calibrat[a-z_]*"
    r"|id2label|num_labels|class_weights|is_regression|multi_label"
)
"""A family named, or one of its concepts (labels, calibration); the project's grep, in Python."""

BELOW_FAMILIES = ("config", "data", "model", "metrics", "training", "output", "speed", "distributed")
"""The shared layers the families build on (and finetune.errors): no import of a family, the run or a
study, even inside a function."""

BUILDS_ON = {"dpo": ("causal_lm",)}
"""The families that build on another's code (DPO trains a causal LM and masks its completions with SFT's
rules: shared, not copied); any other import between families points sideways, and none may point back."""

SEAM = ("finetune.families", "finetune.families.family")

OPTIONAL_PARAMETERS = {"forward_backward": ("window",)}
"""A hook's parameters that only a family with an optional member takes (`normalises_windows`), with a
default: the loop passes them to that family alone."""
"""What a shared layer may import of finetune.families: `family_for`, the Protocol and shared helpers."""


def _files(*names: str) -> list[Path]:
    paths = [PACKAGE / name for name in names]
    return sorted(f for p in paths for f in ([p] if p.suffix == ".py" else p.rglob("*.py")))


def _module(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module(path): path for path in _files(".")}


def _named(source: str) -> list[tuple[int, str]]:
    return [
        (n, m.group()) for n, line in enumerate(source.splitlines(), 1) for m in FAMILY_WORDS.finditer(line)
    ]


def _target(name: str) -> str:
    """The finetune module an import reads: the longest known prefix (a name imported from a module)."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name


def _imports(path: Path, module_level: bool) -> list[tuple[int, str]]:
    """(line, finetune module) of each import in `path`: at module level (as importing it runs them,
    under `if` and `try` too, not under TYPE_CHECKING), or anywhere in it (functions' lazy imports)."""
    tree = ast.parse(path.read_text())

    def statements(body):
        for node in body:
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                continue
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                yield node
            if isinstance(node, (ast.If, ast.Try)):
                for block in (node.body, node.orelse, *(h.body for h in getattr(node, "handlers", ()))):
                    yield from statements(block)

    nodes = statements(tree.body) if module_level else ast.walk(tree)
    found = []
    for node in nodes:
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return [(line, _target(name)) for line, name in found if name.startswith("finetune.")]


def _family_of(module: str) -> str | None:
    """The family package a module is in (None: not in one; the seam itself is in none)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "families" and module not in SEAM else None


def _up_imports(module: str, path: Path) -> list[str]:
    """Each import of `module` that points up: from a shared layer into a family, the run or a study;
    from a family into another family, the run or a study; from the run into a study."""
    top = module.split(".")[1] if module.count(".") else module
    shared = top in BELOW_FAMILIES or module in ("finetune.errors", "finetune.families.family")
    family = _family_of(module)
    wrong = []
    for line, target in _imports(path, module_level=False):
        into_family, into_run = _family_of(target), target == "finetune.run"
        into_study = target.startswith("finetune.studies")
        if (
            (shared and (into_family or into_run or into_study))
            or (top == "studies" and into_family)
            or (family and (into_family not in (None, family, *BUILDS_ON.get(family, ())) or into_run))
            or (family and into_study)
            or (module == "finetune.run" and into_study)
        ):
            wrong.append(f"{_shown(path)}:{line}: {target}")
    return wrong


def _shown(path: Path) -> str:
    return str(path.relative_to(PACKAGE.parent)) if path.is_relative_to(PACKAGE.parent) else str(path)


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while (member := stack.pop()) != node:
                component.append(member)
            if component:
                circles.append(sorted([node, *component]))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return circles


def test_the_shared_layers_name_no_family_nor_its_concepts():
    files = _files(*NAMING_NO_FAMILY)
    assert len(files) > 40, files  # the layers were found
    hits = [f"{_shown(path)}:{line}: {word}" for path in files for line, word in _named(path.read_text())]
    assert not hits, "a family's code in a shared layer (move it into finetune/families/<family>/):\n" + (
        "\n".join(hits)
    )


def test_the_family_words_are_found_where_they_are_written():
    """The check above can fail: each kind of word it looks for is caught in a line that has it."""
    lines = [
        "if config.task_type == 'x':",
        'family = {"causal_lm": 1}',
        "temperature = calibrate_model(run)",
        "model.config.id2label, model.config.num_labels",
        "task.class_weights, task.is_regression, task.multi_label",
    ]
    words = [word for _, word in _named("\n".join(lines))]
    assert words == [
        "task_type ==", '"causal_lm"', "calibrate_model", "id2label", "num_labels", "class_weights",
        "is_regression", "multi_label",
    ]  # fmt: skip
    assert _named("labels = batch.pop('labels')  # the loop's rows, not a family's") == []


def test_no_import_points_up_the_layers():
    wrong = [line for module, path in MODULES.items() for line in _up_imports(module, path)]
    assert not wrong, "imports up the layers (shared < families < run < studies):\n" + "\n".join(wrong)


def test_an_import_up_the_layers_is_caught(tmp_path):
    """The check above can fail: a shared module importing a family's module (lazily, in a function), a
    family importing another's, and the run importing a study are each named with their line."""
    planted = tmp_path / "planted.py"
    planted.write_text(
        "import torch\n"
        "from finetune.families import family_for\n"
        "from finetune.families.family import MicroBatch\n"
        "def f():\n"
        "    from finetune.families.sequence_classification.evaluation import loss_sum\n"
    )
    expected = f"{planted}:5: finetune.families.sequence_classification.evaluation"
    assert _up_imports("finetune.training.loop", planted) == [expected]
    assert _up_imports("finetune.families.causal_lm.family", planted) == [expected]
    assert _up_imports("finetune.families.sequence_classification.card", planted) == []
    planted.write_text("from finetune.studies.seeds import run_seeds\n")
    assert _up_imports("finetune.run", planted) == [f"{planted}:1: finetune.studies.seeds"]


def test_no_module_level_import_makes_a_circle():
    graph = {
        module: {target for _, target in _imports(path, module_level=True) if target != module}
        for module, path in MODULES.items()
    }
    family = graph["finetune.families.sequence_classification.family"]
    assert "finetune.families.sequence_classification.evaluation" in family  # the graph was read
    circles = _circles(graph)
    assert not circles, f"modules that import each other at module level: {circles}"
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("task_type", typing.get_args(TaskType))
def test_every_family_has_every_hook_of_the_seam(task_type):
    """run.py calls each hook of `TaskFamily` on whatever family --task_type names: a family missing one
    (or taking other parameters) would fail only when a run of it reaches that call."""
    family = family_for(task_type)
    assert family.name == task_type
    hooks = {
        name: member
        for name, member in vars(TaskFamily).items()
        if callable(member) and not name.startswith("_")
    }
    assert {"finish", "record_extras", "fit_batch_size", "step_graphs", "subject", "card_parts"} <= set(hooks)
    for name, hook in hooks.items():
        own = getattr(type(family), name, None)
        assert callable(own), f"{type(family).__name__} has no {name}"
        wanted = list(inspect.signature(hook).parameters)
        parameters = inspect.signature(own).parameters
        extra = [p for p in parameters if p not in wanted]  # an optional member's (families/family.py)
        assert [p for p in parameters if p in wanted] == wanted, f"{type(family).__name__}.{name}"
        assert all(p in OPTIONAL_PARAMETERS.get(name, ()) for p in extra), f"{type(family).__name__}.{name}"
        assert all(parameters[p].default is not inspect.Parameter.empty for p in extra)
    for attribute in typing.get_type_hints(TaskFamily):
        assert hasattr(family, attribute), f"{type(family).__name__} has no {attribute}"


def test_the_families_flag_modules_import_only_the_configuration_s_vocabulary():
    """`TrainConfig` is composed of the shared groups and each family's own (finetune/families/<family>/
    flags.py, through the seam): so config names no family, yet --help and a bad flag stay fast and no
    circle forms, those modules import only config's types, the errors and the task table."""
    allowed = (
        "finetune.config.families",
        "finetune.config.system_args",
        "finetune.data.tasks",
        "finetune.errors",
    )
    modules = sorted(PACKAGE.glob("families/*/flags.py"))
    assert len(modules) == len(typing.get_args(TaskType)), modules  # one per built-in family
    for path in modules:
        tree = ast.parse(path.read_text())
        names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
        libraries = {n.split(".")[0] for n in names} - {
            "__future__",
            "dataclasses",
            "math",
            "typing",
            "finetune",
        }
        assert not libraries, (path, libraries)
        assert all(n in allowed for n in names if n.startswith("finetune")), (path, names)
