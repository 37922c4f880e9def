"""The README's commands are the ones CI and users run."""

import os
import re

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _readme_test_command() -> str:
    text = open(os.path.join(REPO, "README.md")).read()
    section = text.split("Set up and run the tests", 1)[1]
    block = re.search(r"```bash\n(.*?)\n```", section, re.S).group(1)
    assert "\n" not in block.strip(), "the README's test command is one line a user types"
    return block.strip()


def test_ci_runs_exactly_the_readme_test_command():
    command = _readme_test_command()
    ci = open(os.path.join(REPO, ".ci", "run")).read().splitlines()
    assert command in [line.strip() for line in ci]
    assert "--durations=15" in command

