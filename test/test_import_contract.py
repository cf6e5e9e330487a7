"""The house plan's import rules, checked without import-linter: this walks every module's import statements
itself (``ast``, type-only imports included) so that a blind spot of one tool is not the proof (design.md §1).

- no import cycle between the package's modules;
- family folders import no other family; runtime/, layers/ and control/ import no family; layers/ imports no
  model module, control/ nothing of the package above it.
"""
from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "phyai_ros"
FAMILIES = ("pi", "groot_n17", "cosmos3", "minicpm")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def modules() -> dict:
    """module name -> its file, for phyai_ros and its kernels (phyai_ros.kernels is the top-level kernels/)."""
    found = {module_name(p): p for p in PACKAGE.rglob("*.py")}
    for p in (REPO / "kernels").rglob("*.py"):
        rel = p.relative_to(REPO / "kernels").with_suffix("").parts
        found[".".join(("phyai_ros", "kernels") + tuple(x for x in rel if x != "__init__"))] = p
    return found


def imported(name: str, path: Path, known: dict) -> set:
    """The package modules ``name`` imports anywhere in its file (inside functions and TYPE_CHECKING too)."""
    is_package = path.name == "__init__.py"
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")[: len(name.split(".")) - node.level + (1 if is_package else 0)]
                root = ".".join(base + ([node.module] if node.module else []))
            else:
                root = node.module or ""
            # ``from pkg import sub`` imports the submodule (its package's __init__ runs, but that is not an
            # import of the __init__'s names); the package itself counts when a name is not a submodule
            subs = [f"{root}.{a.name}" for a in node.names]
            targets = [t for t in subs if t in known] + ([root] if any(t not in known for t in subs) else [])
        else:
            continue
        for target in targets:
            while target and target not in known:
                target = target.rpartition(".")[0]
            if target and target != name:
                out.add(target)
    return out


@pytest.fixture(scope="module")
def graph() -> dict:
    known = modules()
    return {name: imported(name, path, known) for name, path in known.items()}


def cycles(graph: dict) -> list:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index, low, on_stack, stack, found = {}, {}, set(), [], []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_the_walk_sees_imports(graph):
    """The walk itself: it finds known edges (relative, absolute, type-only) and a planted cycle."""
    assert "phyai_ros.runtime.runner" in graph["phyai_ros.runtime.stage_runner"]
    assert "phyai_ros.models.pi.runner" in graph["phyai_ros.models.pi.policy"]
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycle(graph):
    assert cycles(graph) == []


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_family_folders_and_shared_rooms_import_no_other_family(graph):
    wrong = []
    for name, targets in graph.items():
        own = next((f for f in FAMILIES if _under(name, f"phyai_ros.models.{f}")), None)
        shared_room = any(_under(name, f"phyai_ros.{room}") for room in ("runtime", "layers", "control", "kernels"))
        for t in targets:
            family = next((f for f in FAMILIES if _under(t, f"phyai_ros.models.{f}")), None)
            if family and (shared_room or (own and family != own)):
                wrong.append(f"{name} -> {t}")
    assert wrong == []


def test_layers_import_no_model_and_control_nothing_above_it(graph):
    above_control = ("phyai_ros.models", "phyai_ros.runtime", "phyai_ros.layers", "phyai_ros.node", "phyai_ros.serve",
                     "phyai_ros.replay", "phyai_ros.policies", "phyai_ros.predict", "phyai_ros.parameters")
    wrong = [f"{n} -> {t}" for n, ts in graph.items() for t in ts
             if (_under(n, "phyai_ros.layers") and _under(t, "phyai_ros.models"))
             or (_under(n, "phyai_ros.control") and any(_under(t, a) for a in above_control))]
    assert wrong == []


def test_import_linter_contracts_pass():
    """The same rules as CI states them (.importlinter), so the two checks cannot disagree unnoticed."""
    exe = Path(sys.executable).with_name("lint-imports")
    if not exe.exists():
        pytest.skip("import-linter is not installed in this environment")
    done = subprocess.run([str(exe), "--no-cache"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
