"""Where the tests find the checkout's files: one place, so a test file can move between folders
(tests/ mirrors the packages; tests/e2e/ holds the launching ones) without counting dirname()s."""

import os

TESTS = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(TESTS)
SAMPLES = os.path.join(REPO, "samples")
# Small training scripts that tests launch (torchrun, `tracekit record -- python SCRIPT`)
CLI_SCRIPTS = os.path.join(TESTS, "cli", "scripts")
