#!/usr/bin/python3
"""The picture at the top of docs/architecture.md is up to date: tools/draw-architecture, run on the
build tree's configure, draws exactly the committed docs/images/architecture.svg. When a layer's links
change, run `tools/draw-architecture BUILD_DIR` and commit the new picture.

Usage: test_architecture_svg.py CMAKE BUILD_DIR SOURCE_DIR   (standard library only)
"""

import difflib
import os
import subprocess
import sys
import tempfile


def main(cmake, build_dir, source_dir):
    committed = os.path.join(source_dir, "docs", "images", "architecture.svg")
    with tempfile.TemporaryDirectory() as scratch:
        drawn = os.path.join(scratch, "architecture.svg")
        subprocess.run([sys.executable, os.path.join(source_dir, "tools", "draw-architecture"), build_dir,
                        "--cmake", cmake, "--out", drawn], check=True)
        with open(drawn, encoding="utf-8") as fresh, open(committed, encoding="utf-8") as old:
            fresh_lines, old_lines = fresh.read().splitlines(), old.read().splitlines()
    if fresh_lines != old_lines:
        sys.stdout.writelines(line + "\n" for line in difflib.unified_diff(
            old_lines, fresh_lines, "docs/images/architecture.svg (committed)", "drawn now", lineterm="", n=1))
        print(f"docs/images/architecture.svg is out of date: run tools/draw-architecture {build_dir} and commit it")
        return 1
    print("docs/images/architecture.svg matches the link graph")
    return 0


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    sys.exit(main(*sys.argv[1:]))
