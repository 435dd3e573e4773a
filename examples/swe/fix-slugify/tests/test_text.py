import unittest

from text import slugify


class SlugifyTest(unittest.TestCase):
    def test_plain(self):
        self.assertEqual(slugify("hello"), "hello")

    def test_punctuation_runs(self):
        self.assertEqual(slugify("Hello,  World!"), "hello-world")

    def test_ends(self):
        self.assertEqual(slugify("  --Polar HPC 2--  "), "polar-hpc-2")


if __name__ == "__main__":
    unittest.main()
