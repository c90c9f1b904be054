#!/usr/bin/python3
"""Checks the layering of docs/architecture.md against the code: every `#include "..."` of every C++
file (.h, .cpp, .cu, .cuh) must name a file its unit may include, every file must lie in a unit's
folder, and every `namespace touchstone::X` opened in a library file must follow the namespace rule.

The units and what each may include come from the table under "Layers" in docs/architecture.md (the
one whose header is | Folder | What it owns | May include |). A unit may include its own files, the
units its row names and, transitively, everything those may include. A sub-folder belongs to the
unit of its nearest listed parent. Standard library only.

Usage: check_layering.py [ROOT]   (ROOT: the repository, by default the one holding this script)
Exit status: 0 when everything follows the table, 1 on violations (one line each), 2 when the table
itself cannot be read.
"""

import os
import re
import sys

DOC = "docs/architecture.md"
TABLE_HEADER = ["Folder", "What it owns", "May include"]
SOURCE_SUFFIXES = (".h", ".cpp", ".cu", ".cuh")
# Units without a layer library: they may open any namespace.
NOT_LIBRARIES = {"tests", "tools", "bench"}

INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"')
NAMESPACE = re.compile(r"^\s*(?:inline\s+)?namespace\s+touchstone::([A-Za-z_][\w:]*)\s*\{")
FOLDER_CELL = re.compile(r"`([A-Za-z0-9_.-]+(?:/[A-Za-z0-9_.-]+)*)/?`")


class TableError(Exception):
    """The layer table is missing or malformed: nothing can be checked against it."""


def read_table(doc_path):
    """Returns {unit folder: [folders it may include directly]} from the layer table."""
    try:
        with open(doc_path, encoding="utf-8") as doc:
            lines = doc.read().splitlines()
    except OSError as error:
        raise TableError(f"cannot read {doc_path}: {error.strerror}") from None
    cells_of = lambda line: [cell.strip() for cell in line.strip().strip("|").split("|")]
    starts = [i for i, line in enumerate(lines) if line.startswith("|") and cells_of(line) == TABLE_HEADER]
    if len(starts) != 1:
        header = f"| {' | '.join(TABLE_HEADER)} |"
        raise TableError(f"{doc_path}: expected one table headed {header}, found {len(starts)}")
    table = {}
    for number in range(starts[0] + 2, len(lines)):
        line = lines[number]
        if not line.startswith("|"):
            break
        cells = cells_of(line)
        where = f"{doc_path}:{number + 1}"
        folder = FOLDER_CELL.fullmatch(cells[0]) if len(cells) == len(TABLE_HEADER) else None
        if folder is None:
            raise TableError(f"{where}: a row is | `folder` | what it owns | `folder`, ... or nothing |")
        if folder.group(1) in table:
            raise TableError(f"{where}: {folder.group(1)} has two rows")
        table[folder.group(1)] = read_include_cell(cells[2], where)
    for unit, below in table.items():
        for name in below:
            if name not in table:
                raise TableError(f"{doc_path}: {unit} may include {name}, which has no row")
    return table


def read_include_cell(cell, where):
    if cell == "nothing":
        return []
    names = [FOLDER_CELL.fullmatch(item.strip()) for item in cell.split(",")]
    if not all(names):
        raise TableError(f"{where}: 'May include' is a comma-separated list of `folder`s, or nothing")
    return [name.group(1) for name in names]


def may_include(table):
    """Every unit's allowed units: itself and the transitive closure of its row. Refuses a cycle."""
    closure = {}

    def visit(unit, path):
        if unit in path:
            raise TableError(f"{DOC}: the table has a cycle: {' -> '.join(path[path.index(unit):] + [unit])}")
        if unit not in closure:
            allowed = {unit}
            for below in table[unit]:
                allowed |= visit(below, path + [unit])
            closure[unit] = allowed
        return closure[unit]

    for unit in table:
        visit(unit, [])
    return closure


def unit_of(path, units):
    """The unit holding repository-relative file `path`: its nearest listed folder, or None."""
    folder = os.path.dirname(path)
    while folder:
        if folder in units:
            return folder
        folder = os.path.dirname(folder)
    return None


def source_files(root):
    """Repository-relative paths of every C++ file, sorted. Hidden folders and build trees (any folder
    with a CMakeCache.txt) are not sources."""
    found = []
    for folder, subfolders, files in os.walk(root):
        subfolders[:] = [name for name in subfolders if not name.startswith(".")
                         and not os.path.exists(os.path.join(folder, name, "CMakeCache.txt"))]
        relative = os.path.relpath(folder, root)
        for name in sorted(files):
            if name.endswith(SOURCE_SUFFIXES):
                found.append(os.path.normpath(os.path.join(relative, name)).replace(os.sep, "/"))
    return sorted(found)


def resolve(root, including, name, units):
    """The repository-relative path `#include "name"` in file `including` reads, as the compiler
    finds it (the including file's folder first, then the repository root), or None for a header
    outside the repository. A missing file still counts as the project's if its first folder is a unit."""
    for candidate in (os.path.join(os.path.dirname(including), name), name):
        candidate = os.path.normpath(candidate).replace(os.sep, "/")
        if not candidate.startswith("../") and os.path.isfile(os.path.join(root, candidate)):
            return candidate
    first_folder = name.split("/")[0]
    if "/" in name and any(unit.split("/")[0] == first_folder for unit in units):
        return os.path.normpath(name).replace(os.sep, "/")
    return None


def namespace_allowed(path, namespace):
    """The rule of docs/architecture.md "Namespaces": touchstone::X where X is the file's folder
    (or its trailing folders, as in cuda::emulation) or a prefix of its file name (h5 for h5_file)."""
    parts = namespace.split("::")
    folders = os.path.dirname(path).split("/")
    if parts == folders[-len(parts):]:
        return True
    stem = os.path.basename(path).split(".")[0]
    return len(parts) == 1 and (stem == parts[0] or stem.startswith(parts[0] + "_"))


def check(root):
    """Returns (violations, summary counts)."""
    table = read_table(os.path.join(root, DOC))
    allowed = may_include(table)
    violations = []
    counts = {"files": 0, "includes": 0, "namespaces": 0}
    for path in source_files(root):
        counts["files"] += 1
        unit = unit_of(path, table)
        if unit is None:
            violations.append(f"{path}: its folder {os.path.dirname(path) or '(the root)'} is in no unit "
                              f"of the table in {DOC}; add the folder there")
            continue
        with open(os.path.join(root, path), encoding="utf-8", errors="replace") as source:
            lines = source.read().splitlines()
        for number, line in enumerate(lines, start=1):
            included = INCLUDE.match(line)
            if included:
                target = resolve(root, path, included.group(1), table)
                if target is None:
                    continue
                counts["includes"] += 1
                target_unit = unit_of(target, table)
                if target_unit is None:
                    violations.append(f"{path}:{number} includes {target}, which is in no unit's folder")
                elif target_unit not in allowed[unit]:
                    violations.append(f"{path}:{number} includes {target}, which unit {unit} may not include "
                                      f"(it is in {target_unit})")
            opened = NAMESPACE.match(line)
            if opened and unit not in NOT_LIBRARIES:
                counts["namespaces"] += 1
                if not namespace_allowed(path, opened.group(1)):
                    folder = os.path.basename(os.path.dirname(path))
                    violations.append(f"{path}:{number} opens namespace touchstone::{opened.group(1)}; a file in "
                                      f"{os.path.dirname(path)} may open touchstone, touchstone::{folder} or "
                                      f"touchstone::<prefix of its file name> ({DOC}, Namespaces)")
    counts["units"] = len(table)
    return violations, counts


def main(argv):
    root = argv[1] if len(argv) > 1 else os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    try:
        violations, counts = check(os.path.abspath(root))
    except TableError as error:
        print(f"check_layering: {error}", file=sys.stderr)
        return 2
    for violation in violations:
        print(violation)
    if violations:
        print(f"check_layering: {len(violations)} violations of the layers in {DOC}", file=sys.stderr)
        return 1
    print(f"check_layering: {counts['files']} files in {counts['units']} units, {counts['includes']} project "
          f"includes and {counts['namespaces']} touchstone:: namespaces follow {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
