#!/usr/bin/python3
"""Tests of check_layering.py on small fake repositories: a tree that follows its table passes, and an
upward include, a file in a folder the table does not cover, a namespace against the rule, and a
malformed table each fail with a message naming the file and the reason.

Usage: test_check_layering.py   (standard library only)
"""

import os
import subprocess
import sys
import tempfile
import unittest

CHECKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "check_layering.py")

TABLE = """# Architecture

| Folder | What it owns | May include |
|---|---|---|
| `base` | the foundation | nothing |
| `middle` | on the foundation | `base` |
| `middle/inner` | a sub-folder that is a unit of its own | `middle` |
| `top` | the top | `middle/inner` |
| `tests` | tests | `top` |

Text after the table.
"""

GOOD_TREE = {
    "base/errors.h": "// Errors.\n#pragma once\n#include <string>\nnamespace touchstone {}\n",
    "base/h5_file.h": "// HDF5.\n#pragma once\nnamespace touchstone::h5 {}\n",
    "middle/thing.h": '// A thing.\n#pragma once\n#include "base/errors.h"\n',
    "middle/sub/part.cpp": '// A part.\n#include "middle/thing.h"\nnamespace touchstone::sub {}\n',
    "middle/inner/core.cu": '// Core.\n#include "middle/sub/part.h"\n#include "cuda_runtime.h"\n',
    "middle/sub/part.h": "// A part.\n#pragma once\n",
    "top/app.cpp": '// App.\n#include "middle/inner/core.cuh"\n#include "base/h5_file.h"\n'
                   "namespace touchstone::top {}\n",
    "middle/inner/core.cuh": '// Core.\n#pragma once\n#include "local.h"\n',
    "middle/inner/local.h": "// Local.\n#pragma once\nnamespace touchstone::middle::inner {}\n",
    "tests/test_app.cpp": '// Test.\n#include "top/app.h"\n#include "support.h"\n'
                          "namespace touchstone::anything {}\n",
    "tests/support.h": "// Support.\n#pragma once\n",
    "top/app.h": "// App.\n#pragma once\n",
    "docs/notes.txt": "not a source file\n",
    "build/CMakeCache.txt": "a build tree: never scanned\n",
    "build/generated.cpp": '#include "top/app.h"\n',
    ".hidden/x.cpp": '#include "top/app.h"\n',
}


def run_checker(tree, table=TABLE):
    with tempfile.TemporaryDirectory() as root:
        for path, text in {**tree, "docs/architecture.md": table}.items():
            os.makedirs(os.path.join(root, os.path.dirname(path)), exist_ok=True)
            with open(os.path.join(root, path), "w", encoding="utf-8") as out:
                out.write(text)
        done = subprocess.run([sys.executable, CHECKER, root], capture_output=True, text=True, check=False)
        return done.returncode, done.stdout.splitlines(), done.stderr


class CheckLayering(unittest.TestCase):
    def test_good_tree_passes(self):
        status, lines, stderr = run_checker(GOOD_TREE)
        self.assertEqual(status, 0, lines + [stderr])
        self.assertEqual(len(lines), 1)
        self.assertIn("12 files in 5 units, 8 project includes and 4 touchstone:: namespaces", lines[0])

    def test_upward_include_fails(self):
        tree = dict(GOOD_TREE)
        tree["base/errors.h"] += '#include "middle/thing.h"\n#include "top/not_written_yet.h"\n'
        tree["middle/sub/part.h"] += '\n#include "top/app.h"\n'
        status, lines, _ = run_checker(tree)
        self.assertEqual(status, 1)
        self.assertEqual(lines, [
            "base/errors.h:5 includes middle/thing.h, which unit base may not include (it is in middle)",
            "base/errors.h:6 includes top/not_written_yet.h, which unit base may not include (it is in top)",
            "middle/sub/part.h:4 includes top/app.h, which unit middle may not include (it is in top)",
        ])

    def test_sub_unit_is_above_its_parent(self):
        tree = dict(GOOD_TREE)
        tree["middle/thing.h"] += '#include "middle/inner/local.h"\n'
        status, lines, _ = run_checker(tree)
        self.assertEqual(status, 1)
        self.assertEqual(lines, ["middle/thing.h:4 includes middle/inner/local.h, which unit middle may not include "
                                 "(it is in middle/inner)"])

    def test_file_in_unknown_folder_fails(self):
        tree = dict(GOOD_TREE)
        tree["extra/new.cpp"] = '// New.\n#include "base/errors.h"\n'
        tree["root.cpp"] = "// At the root.\n"
        status, lines, _ = run_checker(tree)
        self.assertEqual(status, 1)
        self.assertEqual(lines, [
            "extra/new.cpp: its folder extra is in no unit of the table in docs/architecture.md; add the folder there",
            "root.cpp: its folder (the root) is in no unit of the table in docs/architecture.md; add the folder there",
        ])

    def test_wrong_namespace_fails(self):
        tree = dict(GOOD_TREE)
        tree["middle/thing.h"] += "namespace touchstone::thing {}\nnamespace touchstone::top {\n}\n"
        tree["middle/inner/local.h"] += "namespace touchstone::middle {}\n"
        status, lines, _ = run_checker(tree)
        self.assertEqual(status, 1)
        self.assertEqual(lines, [
            "middle/inner/local.h:4 opens namespace touchstone::middle; a file in middle/inner may open touchstone, "
            "touchstone::inner or touchstone::<prefix of its file name> (docs/architecture.md, Namespaces)",
            "middle/thing.h:5 opens namespace touchstone::top; a file in middle may open touchstone, "
            "touchstone::middle or touchstone::<prefix of its file name> (docs/architecture.md, Namespaces)",
        ])

    def test_namespace_alias_is_not_an_opening(self):
        tree = dict(GOOD_TREE)
        tree["middle/thing.h"] += "namespace ns = touchstone::top;\n"
        status, lines, stderr = run_checker(tree)
        self.assertEqual(status, 0, lines + [stderr])

    def test_malformed_table_is_refused(self):
        cases = {
            TABLE.replace("| `top` | the top | `middle/inner` |", "| top | the top | `middle` |"):
                "docs/architecture.md:8: a row is",
            TABLE.replace("`middle/inner` |\n| `tests`", "`nowhere` |\n| `tests`"):
                "top may include nowhere, which has no row",
            TABLE.replace("| `base` | the foundation | nothing |", "| `base` | the foundation | `top` |"):
                "the table has a cycle: base -> top -> middle/inner -> middle -> base",
            TABLE.replace("May include", "Uses"): "expected one table headed",
        }
        for table, message in cases.items():
            status, lines, stderr = run_checker(GOOD_TREE, table)
            self.assertEqual((status, lines), (2, []), message)
            self.assertIn(message, stderr)


if __name__ == "__main__":
    unittest.main()
