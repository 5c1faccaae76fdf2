"""The package, its tests and its example are Python 3.9 syntax (the oldest Python the
package supports: pyproject.toml requires-python), whatever Python runs the tests."""
import ast
import pathlib
import unittest

ROOT = pathlib.Path(__file__).resolve().parent.parent


class Python39Syntax(unittest.TestCase):
    def test_every_file_parses_as_python_3_9(self) -> None:
        files = sorted(p for d in ("dsec", "tests", "examples", "_build") for p in (ROOT / d).rglob("*.py"))
        self.assertGreater(len(files), 5)
        for f in files:
            with self.subTest(file=str(f.relative_to(ROOT))):
                ast.parse(f.read_text(), filename=str(f), feature_version=(3, 9))

    def test_a_3_10_construct_is_refused_by_the_check(self) -> None:
        with self.assertRaises(SyntaxError):
            ast.parse("match x:\n    case 1:\n        pass\n", feature_version=(3, 9))

    def test_the_package_is_typed(self) -> None:
        self.assertTrue((ROOT / "dsec" / "py.typed").exists())


if __name__ == "__main__":
    unittest.main()
