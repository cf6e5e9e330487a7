"""The layers' op families (layers/norms.py, activations.py, linears.py, attention.py, post_norm.py,
expert_stack.py, quant_dispatch.py, gated_delta_ops.py): every candidate a shipped profile names is registered
under that name, every public op has one home (``dispatch`` only re-exports), and the kernels are plain
module-level imports (kernels/common.py is the one place that guards Triton's import)."""
import ast
import json
from pathlib import Path

import pytest

from phyai_ros.layers import dispatch
from phyai_ros.layers.profiles import shipped_dir
from phyai_ros.layers.selector import SELECTOR

LAYERS = Path(dispatch.__file__).resolve().parent
SHIPPED = sorted(shipped_dir().glob("*.json"))


def test_there_are_shipped_profiles():
    assert SHIPPED, shipped_dir()


@pytest.mark.parametrize("path", SHIPPED, ids=[p.name for p in SHIPPED])
def test_every_candidate_a_shipped_profile_names_is_registered(path):
    """A profile selects by (op, candidate name): a renamed or dropped candidate would leave its entries to the
    defaults without a word. Both the choices and the timings (what a re-merge compares) must name registered
    candidates."""
    data = json.loads(path.read_text())
    registered = {op: {c.name for c in cands} for op, cands in SELECTOR.candidates.items()}
    missing = set()
    for device, ops in data.get("devices", {}).items():
        for op, choices in ops.items():
            missing |= {(device, op, name) for name in choices.values() if name not in registered.get(op, ())}
    for device, ops in data.get("timings", {}).items():
        for op, keys in ops.items():
            missing |= {(device, op, name) for results in keys.values() for name in results
                        if name not in registered.get(op, ())}
    assert not missing, sorted(missing)


def test_each_public_op_has_one_home_and_dispatch_only_reexports():
    """Every op the models call is defined in its family module; the facade defines none of its own."""
    homes = {}
    for name in dispatch.__all__:
        obj = getattr(dispatch, name)
        if callable(obj) and name != "SELECTOR":
            assert obj.__module__ != dispatch.__name__, name
            homes[name] = obj.__module__
    assert set(homes.values()) <= {f"phyai_ros.layers.{m}" for m in ("norms", "activations", "linears", "attention",
                                                                      "post_norm", "expert_stack")}
    tree = ast.parse(Path(dispatch.__file__).read_text())
    assert not [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef, ast.Assign))
                and not (isinstance(n, ast.Assign) and n.targets[0].id == "__all__")]


def _imports_in_functions_or_guards(tree: ast.AST):
    """Import statements inside a function, a try block or an ``if`` (TYPE_CHECKING, a guard), with their lines."""
    found = []

    def visit(node, nested):
        for child in ast.iter_child_nodes(node):
            inner = nested or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Try, ast.If))
            if isinstance(child, (ast.Import, ast.ImportFrom)) and nested:
                names = child.module if isinstance(child, ast.ImportFrom) else child.names[0].name
                found.append((child.lineno, names))
            visit(child, inner)

    visit(tree, False)
    return found


@pytest.mark.parametrize("path", sorted(LAYERS.glob("*.py")), ids=lambda p: p.name)
def test_layers_import_the_kernels_at_module_level_only(path):
    """Nothing in the layers imports a kernel (or anything of the package) lazily or behind a guard: a reader
    sees every kernel module an op family uses at its top, and no import cycle hides in a function body."""
    found = [(line, mod) for line, mod in _imports_in_functions_or_guards(ast.parse(path.read_text()))
             if mod and (mod.startswith("phyai_ros") or mod.startswith("triton"))]
    assert not found, found
