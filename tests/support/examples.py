"""How many examples a property test draws.

Two budgets, one per kind of run. The fast suite (``pytest -m "not integration"``, the default)
draws a derandomized few: the same examples on every run, so it is quick and never flaky. The
thorough run, CI's (``ops/test`` sets ``MEMPROJ_TEST_EXAMPLES=thorough``), draws each test's
full count, searching anew every time. A test states both: ``@settings(examples(400, 60))``.
"""

from __future__ import annotations

import os

from hypothesis import settings

THOROUGH = os.environ.get("MEMPROJ_TEST_EXAMPLES") == "thorough"


def examples(thorough: int, fast: int) -> settings:
    if THOROUGH:
        return settings(max_examples=thorough)
    return settings(max_examples=fast, derandomize=True)
