"""Library code never names a command-line flag. Flags are parsed into typed options by the front ends
in tools/, and only they word errors with a flag's name; the libraries below say what an option means
(docs/architecture.md). This scans the C++ sources of every top-level folder except tools/ and tests/
for a string literal holding a flag (`--` and a lower-case letter) and fails on any; comments may
name flags. A new top-level folder is scanned without being listed here.

Usage: test_no_flags.py SOURCE_ROOT   fails with one line per offending literal
       test_no_flags.py --self-test   shows that the scan finds a flag put into a library string and
                                      nothing in comments or front ends (standard library only)
"""
import io
import os
import re
import sys
import tempfile
import unittest

FRONT_ENDS_AND_TESTS = {"tools", "tests"}
CPP_SUFFIXES = (".h", ".hpp", ".cpp", ".cc", ".cu", ".cuh")
FLAG = re.compile(r"--[a-z]")
RAW_PREFIX = re.compile(r"(?:u8|[uUL])?R")


def string_literals(text):
    """Yields (line, contents) of every string literal of C++ source `text`, outside comments and
    character literals; raw strings included. Adjacent literals are separate literals."""
    i, line, n = 0, 1, len(text)
    while i < n:
        c = text[i]
        if c == "\n":
            line += 1
            i += 1
        elif text.startswith("//", i):
            end = text.find("\n", i)
            i = n if end < 0 else end
        elif text.startswith("/*", i):
            end = text.find("*/", i + 2)
            end = n if end < 0 else end + 2
            line += text.count("\n", i, end)
            i = end
        elif c == '"':
            start_line = line
            prefix = re.search(r"[A-Za-z0-9_]*$", text[max(0, i - 64):i]).group(0)
            if RAW_PREFIX.fullmatch(prefix):
                open_paren = text.find("(", i + 1)
                closing = ")" + text[i + 1:open_paren] + '"'
                end = text.find(closing, open_paren + 1)
                end = n if end < 0 else end
                contents, i = text[open_paren + 1:end], min(n, end + len(closing))
            else:
                j = i + 1
                while j < n and text[j] != '"' and text[j] != "\n":
                    j += 2 if text[j] == "\\" else 1
                contents, i = text[i + 1:j], j + 1
            line += contents.count("\n")
            yield start_line, contents
        elif c == "'" and not is_digit_separator(text, i):
            j = i + 1
            while j < n and text[j] != "'" and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        else:
            i += 1


def is_digit_separator(text, i):
    """Whether the quote at `i` separates digits (1'000'000) rather than opening a character literal."""
    token = re.search(r"[A-Za-z0-9_.']*$", text[max(0, i - 64):i]).group(0)
    return token[:1].isdigit()


def flags_in(text):
    """(line, literal) of every string literal of `text` that names a flag."""
    return [(line, contents) for line, contents in string_literals(text) if FLAG.search(contents)]


def library_sources(root):
    """The C++ sources of every top-level folder of `root` but tools/, tests/, hidden folders and
    build trees (a CMakeCache.txt at their top)."""
    for folder in sorted(os.listdir(root)):
        top = os.path.join(root, folder)
        if (folder in FRONT_ENDS_AND_TESTS or folder.startswith(".") or not os.path.isdir(top)
                or os.path.exists(os.path.join(top, "CMakeCache.txt"))):
            continue
        for directory, subdirectories, files in os.walk(top):
            subdirectories[:] = sorted(d for d in subdirectories if not d.startswith("."))
            for name in sorted(files):
                if name.endswith(CPP_SUFFIXES):
                    yield os.path.join(directory, name)


def check(root, out=sys.stdout):
    """Prints every flag named by a library string literal under `root`; returns the exit status."""
    found = 0
    for path in library_sources(root):
        with open(path, encoding="utf-8", errors="replace") as f:
            text = f.read()
        for line, contents in flags_in(text):
            print(f'{os.path.relpath(path, root)}:{line}: "{contents}"', file=out)
            found += 1
    if found:
        print(f"{found} string literal(s) of library code name a command-line flag: parse the flag and word "
              "its errors in the front end (tools/), and let the library say what the option means", file=out)
        return 1
    return 0


class SelfTest(unittest.TestCase):
    def test_a_flag_in_a_string_is_found(self):
        self.assertEqual(flags_in('throw InputError("--fail-at " + spec);'), [(1, "--fail-at ")])
        self.assertEqual(flags_in('x = "a";\nthrow E(path + ": name it with --format");'),
                         [(2, ": name it with --format")])
        self.assertEqual(flags_in(r'"say \"--tolerance\" here"'), [(1, r'say \"--tolerance\" here')])
        self.assertEqual(flags_in('R"(--raw)" "b"'), [(1, "--raw")])
        self.assertEqual(flags_in('u8R"x(a\n--raw)x"'), [(1, "a\n--raw")])
        self.assertEqual(flags_in('/* "--c" */ "--s" // "--c"'), [(1, "--s")])

    def test_comments_and_other_text_are_not_strings(self):
        self.assertEqual(flags_in('// the option --fail-at "step:rank"'), [])
        self.assertEqual(flags_in('/* "quoted --flag"\n spanning "--lines" */ int a;'), [])
        self.assertEqual(flags_in('std::string p = "fp64";  // a config\'s precision (--config)'), [])
        self.assertEqual(flags_in("char q = '\"'; // \"--not-a-string\""), [])
        self.assertEqual(flags_in("int n = 1'000'000; // \"--not\" \"--either\""), [])
        self.assertEqual(flags_in('"a -- b", "x--", "-x", "--", "--9", "--X"'), [])

    def test_lines_are_counted_through_comments_and_raw_strings(self):
        text = '/*\n\n*/ R"(\n)"\n// "--no"\n"--yes"'
        self.assertEqual(flags_in(text), [(6, "--yes")])

    def test_the_tree_scan_finds_a_flag_in_a_library_folder_only(self):
        with tempfile.TemporaryDirectory() as root:
            def write(path, text):
                path = os.path.join(root, path)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w") as f:
                    f.write(text)
            write("common/errors.h", '// a front end names the flag, e.g. "--set"\n#include "common/x.h"\n')
            write("tools/cli/main.cpp", 'throw InputError("--out: missing");\n')
            write("tests/unit/test.cpp", 'run({"--resume"});\n')
            write("build/CMakeCache.txt", "")
            write("build/generated.cpp", 'const char* s = "--generated";\n')
            write("docs/notes.md", 'say "--flag"\n')
            self.assertEqual(check(root, out=io.StringIO()), 0)
            write("checkpoint/fault_injection.cpp", 'int a;\n  throw InputError("--fail-at " + spec);\n')
            write("newlayer/deep/x.cu", 'printf("--comm nccl");\n')
            out = io.StringIO()
            self.assertEqual(check(root, out=out), 1)
            lines = out.getvalue().splitlines()
            self.assertEqual(lines[:2], ['checkpoint/fault_injection.cpp:2: "--fail-at "',
                                         'newlayer/deep/x.cu:1: "--comm nccl"'])
            self.assertIn("2 string literal(s)", lines[2])


if __name__ == "__main__":
    if sys.argv[1:] == ["--self-test"]:
        unittest.main(argv=sys.argv[:1])
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(check(os.path.abspath(sys.argv[1])))
