"""The package's imports flow one way (docs/design/layout.md): no cycles, no import against the arrows."""

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGES = ("configs", "pipelines", "tf_transformer")

# Lower ranks are imported by higher ones, never the reverse. Equal ranks may import each other
# only where ALLOWED says so.
RANKS = {
    "configs": 0,
    "tf_transformer": 0,  # the package's __init__: loads tf_transformer.model lazily
    "tf_transformer.constants": 0,
    "tf_transformer.cpu": 0,
    "tf_transformer.files": 0,
    "tf_transformer.formats": 0,  # imports nothing: an export is read without TensorFlow
    "tf_transformer.language_codes": 0,  # sentencepiece only: the server counts tokens without TensorFlow's data
    "pipelines.text_lines": 0,  # imports no project module; every reader of text lines uses it
    "pipelines": 1,
    "tf_transformer.masks": 1,
    "tf_transformer.flops": 1,
    "tf_transformer.attention_views": 1,  # the package's docstring only; each view has its own rank
    "tf_transformer.attention_views.figures": 1,  # matplotlib only
    "tf_transformer.layers": 2,
    "tf_transformer.model": 3,
    "tf_transformer.run_dir": 4,
    "tf_transformer.bleu": 4,
    "tf_transformer.attention_views.maps": 4,  # a model's weights for one translation: training and inference draw them
    "tf_transformer.attention_views.alignment": 5,  # word alignments by the maps' word rule, in the exported graph too
    "tf_transformer.tasks": 5,  # a task's data, targets, scores and decoding defaults: every later stage asks it
    "tf_transformer.decoding": 6,  # the search engine: what runs inside a decoding graph
    # What an export records, read without loading it (plain Python): drivers and servers read it.
    "tf_transformer.exporting.export_info": 7,
    "tf_transformer.training": 8,  # dev BLEU decodes with the engine
    "tf_transformer.inference": 8,  # the drivers: the exported translator, batch translation and scoring
    "tf_transformer.importing": 8,  # models trained elsewhere written as run directories
    "tf_transformer.exporting": 9,  # the artifacts a run becomes: SavedModel, CTranslate2
    "tf_transformer.attention_views.report": 9,  # what tft-attention draws, from a run (translator) or an export
    "tf_transformer.serving": 10,
    "tf_transformer.cli": 11,
}
# The exceptions, each with the names it may take (None: the module as a whole): the root package
# re-exports the model, loaded on first use.
ALLOWED = {
    ("tf_transformer", "tf_transformer.model"): None,
}


def module_name(path: pathlib.Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, pathlib.Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found[module_name(path)] = path
    return found


MODULES = modules()


def imports(name: str) -> list[tuple[str, set[str]]]:
    """``(module, names)`` imported anywhere in ``name`` (deferred imports too), resolved to project modules."""
    tree = ast.parse(MODULES[name].read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(alias.name, set()) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = {alias.name for alias in node.names if f"{node.module}.{alias.name}" in MODULES}
            found += [(f"{node.module}.{sub}", set()) for sub in submodules]
            names = {alias.name for alias in node.names} - submodules
            if names:
                found.append((node.module, names))
        elif isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_EXPORTS" for t in node.targets):
            # A lazy package __init__: each exported name loads a submodule on first use.
            found += [(f"{name}.{value.value}", set()) for value in node.value.values]
    return [(target, names) for target, names in found if target in MODULES]


def rank(name: str) -> tuple[int, str]:
    """The rank of the longest prefix of ``name`` in RANKS, and that prefix."""
    parts = name.split(".")
    for end in range(len(parts), 0, -1):
        prefix = ".".join(parts[:end])
        if prefix in RANKS:
            return RANKS[prefix], prefix
    raise AssertionError(f"{name} has no rank: add it to RANKS and docs/design/layout.md")


def test_every_module_is_ranked():
    assert len(MODULES) > 40
    for name in MODULES:
        rank(name)


def test_no_import_cycles():
    graph = {name: {target for target, _ in imports(name)} for name in MODULES}
    state = {}

    def visit(node, path):
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycle = path[path.index(target) :] + [target]
                pytest.fail("import cycle: " + " → ".join(cycle))
            if target not in state:
                visit(target, path + [target])
        state[node] = "done"

    for name in sorted(graph):
        if name not in state:
            visit(name, [name])


def test_imports_flow_one_way():
    wrong = []
    for name in sorted(MODULES):
        source_rank, source_group = rank(name)
        for target, names in imports(name):
            target_rank, target_group = rank(target)
            if target_group == source_group or target_rank < source_rank:
                continue
            if (source_group, target) in ALLOWED:
                allowed = ALLOWED[source_group, target]
                if allowed is None or names <= allowed:
                    continue
            wrong.append(f"{name} imports {target} {sorted(names) or ''}")
    assert not wrong, "imports against the layering:\n" + "\n".join(wrong)


def test_pipelines_use_only_the_light_definitions_of_the_model_package():
    """The special ids, and the language codes a server also reads without TensorFlow's data modules."""
    for name in MODULES:
        if name.startswith("pipelines"):
            used = {target for target, _ in imports(name) if target.startswith("tf_transformer")}
            assert used <= {"tf_transformer.constants", "tf_transformer.language_codes"}, (name, used)


def test_the_special_ids_are_defined_once():
    definitions = [
        name
        for name, path in MODULES.items()
        for node in ast.parse(path.read_text(encoding="utf-8")).body
        if isinstance(node, ast.Assign)
        and any(getattr(t, "id", None) in {"PAD_ID", "BOS_ID", "EOS_ID", "UNK_ID", "MASK_VALUE"} for t in node.targets)
    ]
    assert definitions == ["tf_transformer.constants"] * 5


def test_the_layout_page_lists_every_module():
    """docs/design/layout.md names each module (its file, under its package's folder) and the rank order."""
    page = (ROOT / "docs" / "design" / "layout.md").read_text(encoding="utf-8")
    missing = [
        name
        for name, path in MODULES.items()
        if path.name != "__init__.py" and path.name not in page and f"{path.stem}/" not in page
    ]
    assert not missing, "modules docs/design/layout.md does not list: " + ", ".join(sorted(missing))
    folders = {name.rsplit(".", 1)[0] for name in MODULES if "." in name}
    assert all(f"{folder.rsplit('.', 1)[-1]}/" in page for folder in folders)
