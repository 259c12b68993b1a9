"""The tree's shape, checked from the source: which package may import which, module sizes,
and where settings are read. These rules are the architecture in the README; a change that
breaks one fails here instead of eroding the layout quietly."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# online's subpackages from the bottom up: a package may import only those ranked below it.
# checkpoint and frontend share a rank: neither may import the other. client shares the bottom
# rank, so it may import no other subpackage: it speaks to the front end over HTTP only.
RANKS = {"learner": 0, "client": 0, "stream": 1, "search": 1, "cluster": 2, "checkpoint": 3, "frontend": 3, "deployment": 4,
         "cli": 5}

MAX_MODULE_LINES = 600
# ps_bridge stays a small ps-lite: 3,500 lines until a displaced node had to be told and dropped (a server
# declared dead that kept running held its id, issue #28: +123 lines in the scheduler's book, the postoffice
# and the van), then until a registration lost by a restarted scheduler had to be sent again (+32 lines).
MAX_PS_BRIDGE_LINES = 3700
GRAB_BAGS = {"utils", "util", "helpers", "helper", "common", "misc"}


def _modules(package: str) -> list[Path]:
    return sorted(p for p in (REPO / package).rglob("*.py"))


def _imports(path: Path) -> list[tuple[int, str]]:
    """Every module an import statement names, at any depth (function-level imports too)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names]
    return found


def _subpackage(dotted: str) -> str | None:
    parts = dotted.split(".")
    return parts[1] if len(parts) > 1 and parts[0] == "online" and parts[1] in RANKS else None


def test_ps_bridge_imports_nothing_from_livevec():
    offending = [f"{p.relative_to(REPO)}:{line} imports {name}"
                 for p in _modules("ps_bridge") for line, name in _imports(p)
                 if name == "online" or name.startswith("online.")]
    assert offending == []


def test_the_client_imports_nothing_of_the_server_side():
    # RANKS keeps it from the other subpackages; ps_bridge is beneath everything else, but not the client
    offending = [f"{p.relative_to(REPO)}:{line} imports {name}" for p in _modules("online/client")
                 for line, name in _imports(p)
                 if name.split(".")[0] == "ps_bridge" or (name.startswith("online.") and _subpackage(name) != "client")]
    assert offending == []


def test_ps_bridge_knows_no_livevec_setting():
    offending = [f"{p.relative_to(REPO)}:{i}" for p in _modules("ps_bridge")
                 for i, line in enumerate(p.read_text().splitlines(), 1) if "LIVEVEC" in line.upper()]
    assert offending == []


def test_every_online_module_lives_in_a_subpackage():
    loose = [p.name for p in (REPO / "online").glob("*.py") if p.name not in ("__init__.py", "__main__.py")]
    assert loose == []
    assert sorted(p.name for p in (REPO / "online").iterdir() if p.is_dir() and (p / "__init__.py").exists()) \
        == sorted(RANKS)


@pytest.mark.parametrize("package", sorted(RANKS))
def test_dependencies_point_down(package):
    rank = RANKS[package]
    offending = []
    for path in _modules(f"online/{package}"):
        for line, name in _imports(path):
            target = _subpackage(name)
            if target is not None and target != package and RANKS[target] >= rank:
                offending.append(f"{path.relative_to(REPO)}:{line} imports {name}")
    assert offending == []


@pytest.mark.parametrize("package", sorted(RANKS))
def test_each_subpackage_says_what_it_owns_and_may_import(package):
    doc = ast.get_docstring(ast.parse((REPO / "online" / package / "__init__.py").read_text()))
    assert doc and "May import" in doc


def test_the_direction_check_would_catch_an_upward_import(tmp_path):
    # the rule above must be able to fail: an import of the CLI from the learner is one
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from online.cli.main import main\n")
    assert [RANKS[_subpackage(n)] for _, n in _imports(probe) if _subpackage(n)] == [RANKS["cli"], RANKS["cli"]]


def test_module_sizes():
    big = {str(p.relative_to(REPO)): n for pkg in ("online", "ps_bridge")
           for p in _modules(pkg) if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES}
    assert big == {}
    total = sum(len(p.read_text().splitlines()) for p in _modules("ps_bridge"))
    assert total <= MAX_PS_BRIDGE_LINES


def test_no_grab_bag_modules():
    bags = [str(p.relative_to(REPO)) for pkg in ("online", "ps_bridge") for p in (REPO / pkg).rglob("*")
            if p.stem.lower() in GRAB_BAGS]
    assert bags == []


# Reading the environment for a setting happens in ps_bridge/settings.py alone (through
# declared Settings). Passing ``os.environ`` on as the Mapping to read from is fine; these
# are the other uses, each for a reason that is not a setting.
ENVIRON_USES = {
    "ps_bridge/postoffice.py": "exports DMLC_RANK once assigned, as ps-lite does",
    "online/deployment/local_runner.py": "passes the parent's environment on to the tasks it starts",
}


def _environ_reads(path: Path) -> list[int]:
    lines = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Attribute) and node.attr == "getenv" and getattr(node.value, "id", "") == "os":
            lines.append(node.lineno)
        if isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute) \
                and node.value.attr == "environ" and isinstance(node.ctx, ast.Load):
            lines.append(node.lineno)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and isinstance(node.func.value, ast.Attribute) and node.func.value.attr == "environ" \
                and node.func.attr in ("get", "items", "keys", "values", "copy", "setdefault"):
            lines.append(node.lineno)
    return lines


def test_settings_are_read_only_through_declarations():
    offending = [f"{rel}:{line}" for pkg in ("online", "ps_bridge") for p in _modules(pkg)
                 if (rel := str(p.relative_to(REPO))) not in ENVIRON_USES and rel != "ps_bridge/settings.py"
                 for line in _environ_reads(p)]
    assert offending == []


def test_the_environ_check_would_catch_a_direct_read(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import os\nA = os.environ.get('LIVEVEC_DIM')\nB = os.environ['X']\nC = os.getenv('Y')\n")
    assert _environ_reads(probe) == [2, 3, 4] or sorted(_environ_reads(probe)) == [2, 3, 4]
