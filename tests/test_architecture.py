"""The tree's shape, checked from the source: which package may import which, module sizes,
and where settings are read. These rules are the architecture in the README; a change that
breaks one fails here instead of eroding the layout quietly."""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# online's subpackages from the bottom up: a package may import only those ranked below it.
# checkpoint and frontend share a rank: neither may import the other. client shares the bottom
# rank, so it may import no other subpackage: it speaks to the front end over HTTP only.
RANKS = {"learner": 0, "client": 0, "stream": 1, "search": 1, "cluster": 2, "checkpoint": 3, "frontend": 3, "deployment": 4,
         "cli": 5}

MAX_MODULE_LINES = 600
# ps_bridge stays a small ps-lite: ps-lite's rendezvous, barriers, heartbeats and recovery, plus telling a displaced
# node it was replaced (a node declared dead that kept running holds an id another took) and sending again a
# registration a restarted scheduler lost.
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


# The writing rules: code, comments and docs say what the code is and why, in the present tense. A run's number or
# an issue's points at nothing a reader can open: the decisions and their figures are in docs/design/, the history
# in git. The character classes keep this file, and its compiled form, from matching the pattern.
JOURNAL_REFERENCE = re.compile(r"sessio[n]s? [0-9]|issu[e]s? #?[0-9]", re.IGNORECASE)
JOURNAL_TREES = ("online", "ps_bridge", "tests", "docs", "bench", "README.md")
BINARY_SUFFIXES = {".pyc", ".so", ".o", ".png", ".jpg", ".gz", ".xz", ".npz", ".npy", ".bin"}
MAX_MODULE_DOCSTRING_LINES = 40


def _text_files(*trees: str) -> list[Path]:
    found = []
    for tree in trees:
        root = REPO / tree
        paths = [root] if root.is_file() else sorted(root.rglob("*"))
        found += [p for p in paths if p.is_file() and "__pycache__" not in p.parts
                  and ".pytest_cache" not in p.parts and p.suffix not in BINARY_SUFFIXES]
    return found


def _journal_references(paths: list[Path]) -> list[str]:
    hits = []
    for path in paths:
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        hits += [f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path}:{number}: {line.strip()[:100]}"
                 for number, line in enumerate(text.splitlines(), 1) if JOURNAL_REFERENCE.search(line)]
    return hits


def test_no_run_or_issue_numbers_in_the_code_and_docs():
    hits = _journal_references(_text_files(*JOURNAL_TREES))
    assert hits == [], f"{len(hits)} lines cite a run or an issue by number:\n" + "\n".join(hits[:60])


def test_the_reference_check_would_catch_one(tmp_path):
    probe = tmp_path / "probe.md"
    # joined at run time: a constant the compiler folds would put the references in this file's .pyc
    lines = [" ".join(["measured in", "Session", "12"]), " ".join(["see", "issue", "#28"]), " ".join(["as in", "issue", "13"]),
             "sessions and issues, fine", "PKCS#8, fine"]
    probe.write_text("\n".join(lines) + "\n")
    assert [h.rsplit(":", 2)[0].endswith("probe.md") for h in _journal_references([probe])] == [True, True, True]


def _module_docstring_lines(path: Path) -> int:
    doc = ast.get_docstring(ast.parse(path.read_text(), str(path)), clean=False)
    return len(doc.splitlines()) if doc else 0


def test_module_docstrings_say_what_the_module_is_in_at_most_40_lines():
    long = {str(p.relative_to(REPO)): n for pkg in ("online", "ps_bridge", "bench") for p in _modules(pkg)
            if (n := _module_docstring_lines(p)) > MAX_MODULE_DOCSTRING_LINES}
    assert long == {}, "module docstrings over 40 lines (a design belongs in docs/design/)"


# Cross-references into the docs name an anchor (``docs/operations.md#checkpoints``), never a section number: an
# anchor is an explicit ``<a id="...">`` or a heading's slug, as GitHub makes it.
DOC_LINK = re.compile(r"(docs/[\w./-]+\.md)#([\w-]+)")
LOCAL_LINK = re.compile(r"\]\(#([\w-]+)\)")


def _anchors(doc: Path) -> set[str]:
    text = doc.read_text()
    ids = set(re.findall(r'<a id="([\w-]+)"', text))
    for heading in re.findall(r"^#+ (.+)$", text, re.MULTILINE):
        ids.add(re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-"))
    return ids


def test_every_link_into_the_docs_names_an_anchor_that_exists():
    broken, anchors = [], {}
    for path in _text_files("README.md", "docs", "online", "ps_bridge", "bench", "tests", "deploy"):
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue
        links = DOC_LINK.findall(text)
        if path.suffix == ".md" and path.is_relative_to(REPO / "docs"):
            links += [(str(path.relative_to(REPO)), slug) for slug in LOCAL_LINK.findall(text)]
        for doc, slug in links:
            target = REPO / doc
            if target.is_file() and slug not in anchors.setdefault(doc, _anchors(target)):
                broken.append(f"{path.relative_to(REPO)}: {doc}#{slug}")
    assert broken == []
