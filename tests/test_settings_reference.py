"""The settings reference: docs/settings.md is what ``livevec settings --markdown`` renders, every
environment name the code reads is declared by a ``Setting`` the reference shows, and the README's
short settings table stays short."""
from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from online.cli.settings import REGENERATE, collect, render_markdown

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("online", "ps_bridge")
COUNTED = re.compile(r"^(LIVEVEC|DMLC|PS)_[A-Z0-9_]+$")   # the names that must be declared
MAPPINGS = {"env", "environ"}                             # os.environ, and mappings passed around as env
CELL_LIMIT = 160


@pytest.fixture(scope="module")
def reference():
    return collect()


# ----------------------------------------------------------------------------- the scan

def _mapping(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _constants(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n.value for n in node.elts if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return []


def _loop_names(tree: ast.AST) -> dict[str, list[str]]:
    """``for var in ("A", "B"): env.get(var)``: the constant names each loop variable takes."""
    names: dict[str, list[str]] = {}
    for node in ast.walk(tree):
        if (isinstance(node, (ast.For, ast.comprehension)) and isinstance(node.target, ast.Name)
                and isinstance(node.iter, (ast.Tuple, ast.List))):
            names.setdefault(node.target.id, []).extend(_constants(node.iter))
    return names


def environment_reads(source: str) -> Iterator[tuple[str, int]]:
    """(name, line) of every read of a constant name: ``os.environ.get/[]/in``, ``getenv``, and the same
    on a mapping named env or environ (a loop over constant names counts as reading each)."""
    tree = ast.parse(source)
    loops = _loop_names(tree)
    for node in ast.walk(tree):
        key = None
        if isinstance(node, ast.Call):
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr == "get" and _mapping(func.value) in MAPPINGS:
                key = node.args[0] if node.args else None
            elif _mapping(func) == "getenv":
                key = node.args[0] if node.args else None
        elif isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load) and _mapping(node.value) in MAPPINGS:
            key = node.slice
        elif (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], (ast.In, ast.NotIn))
              and _mapping(node.comparators[0]) in MAPPINGS):
            key = node.left
        if key is None:
            continue
        names = loops.get(key.id, []) if isinstance(key, ast.Name) else _constants(key)
        for name in names:
            if COUNTED.match(name):
                yield name, node.lineno


def setting_declarations(source: str) -> Iterator[tuple[str, int]]:
    """(variable, line) of every ``Setting(field, env, ...)`` / ``Setting(..., env=...)``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and _mapping(node.func) == "Setting":
            env = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "env"),
                                                               None)
            for name in _constants(env) if env is not None else []:
                yield name, node.lineno


def _scan(find) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            for name, line in find(path.read_text()):
                found.setdefault(name, []).append(f"{path.relative_to(ROOT)}:{line}")
    return found


# ----------------------------------------------------------------------------- (a) the file is current

def test_docs_settings_is_what_the_command_renders():
    path = ROOT / "docs" / "settings.md"
    rendered = render_markdown()
    current = path.read_text() if path.exists() else ""
    if current != rendered:
        diff = "".join(list(difflib.unified_diff(current.splitlines(True), rendered.splitlines(True),
                                                 "docs/settings.md", "rendered"))[:40])
        pytest.fail(f"docs/settings.md is stale: run `{REGENERATE}`\n{diff}")


def test_rendering_is_deterministic():
    assert render_markdown() == render_markdown()


# ----------------------------------------------------------------------------- (b) every read name is declared

def test_every_environment_name_the_code_reads_is_declared(reference):
    reads = _scan(environment_reads)
    assert reads, "the scan found no reads at all: it is broken"
    declared = reference.variables()
    missing = {name: where for name, where in reads.items() if name not in declared}
    assert not missing, ("read but declared by no Setting in the reference (declare it in the module's "
                         f"SettingGroup, and make sure a component of online/cli/settings.py holds it): {missing}")


def test_every_declared_variable_is_in_the_reference(reference):
    declared = _scan(setting_declarations)
    assert len(declared) > 100
    absent = {name: where for name, where in declared.items() if name not in reference.variables()}
    assert not absent, f"declared but read by no command the reference knows (online/cli/settings.py): {absent}"


def test_the_scan_sees_each_form_of_read():
    source = '''
import os
from os import getenv
os.environ.get("LIVEVEC_A")
os.environ["LIVEVEC_B"]
getenv("DMLC_C", "x")
os.getenv("PS_D")
env.get("LIVEVEC_E")
self.env["LIVEVEC_F"]
"LIVEVEC_G" in os.environ
for var in ("LIVEVEC_H", "PORT_X"):
    env.get(var)
os.environ["LIVEVEC_SET"] = "1"          # a write, not a read
child = {"LIVEVEC_CHILD": "1"}            # a name set for a child
counts.get("LIVEVEC_METRIC")              # not an environment
env.get("HOME")                           # not one of ours
'''
    assert sorted(name for name, _ in environment_reads(source)) == [
        "DMLC_C", "LIVEVEC_A", "LIVEVEC_B", "LIVEVEC_E", "LIVEVEC_F", "LIVEVEC_G", "LIVEVEC_H", "PS_D"]
    declared = 'Setting("a", "LIVEVEC_A"); Setting("p", ("PORT", "PORT0")); Setting("e", env="LIVEVEC_E")'
    assert sorted(n for n, _ in setting_declarations(declared)) == ["LIVEVEC_A", "LIVEVEC_E", "PORT", "PORT0"]


def test_each_setting_that_matters_first_is_in_the_reference(reference):
    from online.cli.settings import FIRST
    assert {name for name, _ in FIRST} <= reference.variables()


# ----------------------------------------------------------------------------- (c) the README's short table

def _readme_settings_table() -> list[str]:
    text = (ROOT / "README.md").read_text()
    start = text.index("### Running the roles yourself")
    end = text.find("\n#", start + 1)
    section = text[start:end if end > 0 else len(text)]
    assert "docs/settings.md" in section, "the README's settings section links the reference"
    rows = [line for line in section.splitlines() if line.startswith("|")]
    assert rows, "the README's settings section has its table"
    return rows


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in re.split(r"(?<!\\)\|", row.strip())[1:-1]]


def test_readme_settings_cells_are_short():
    long = [(cell, len(cell)) for row in _readme_settings_table() for cell in _cells(row) if len(cell) > CELL_LIMIT]
    assert not long, f"README settings cells over {CELL_LIMIT} characters (details go to docs/settings.md): {long}"


def test_readme_settings_are_declared(reference):
    pattern = re.compile(r"\b(LIVEVEC|DMLC|PS)_[A-Z0-9_]+\b")
    named = {m.group(0) for row in _readme_settings_table() for m in pattern.finditer(row)}
    assert named and named <= reference.variables(), named - reference.variables()
