"""The test session's time, like for like: two runs' JUnit reports compared on the tests both
hold.

    .venv/bin/python ops/bench/suite_time.py BEFORE.xml AFTER.xml [--json PATH]

Each run is ``pytest --junitxml=PATH`` (``bash ops/test --junitxml=PATH`` on a fresh clone).
A test is the same test in both when its ``classname`` and ``name`` match. Printed: each run's
session wall time and test count, then for the tests common to both the summed time per top
directory and in all, and their ratio (after / before). A suite that grew is compared on what
it kept; the tests only one side has are summed apart.

Each testcase's ``time`` in pytest's report is its setup, call and teardown together.
"""

from __future__ import annotations

import argparse
import xml.etree.ElementTree as ElementTree
from collections import defaultdict
from pathlib import Path

from environment import print_and_save  # ops/bench/environment.py, beside this script


def testcases(path: Path) -> tuple[float, dict[str, float]]:
    """The session's wall time and each testcase's time, keyed ``classname::name``."""
    root = ElementTree.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise SystemExit(f"{path}: no testsuite element")
    times = {
        f"{case.get('classname')}::{case.get('name')}": float(case.get("time") or 0)
        for case in suite.iter("testcase")
    }
    return float(suite.get("time") or 0), times


def directory(test_id: str) -> str:
    """``tests.streams.api.test_x::test_y`` -> ``tests/streams/api``."""
    module = test_id.split("::", 1)[0].split(".")
    return "/".join(module[:-1]) or module[0]


def apart(mine: dict[str, float], theirs: dict[str, float]) -> dict[str, float]:
    """How many tests only ``mine`` holds, and their summed time."""
    only = set(mine) - set(theirs)
    return {"tests": len(only), "s": round(sum(mine[t] for t in only), 1)}


def compare(before: dict[str, float], after: dict[str, float]) -> dict[str, object]:
    common = sorted(set(before) & set(after))
    per_directory: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for test_id in common:
        sums = per_directory[directory(test_id)]
        sums[0] += before[test_id]
        sums[1] += after[test_id]
        sums[2] += 1
    before_sum = sum(before[t] for t in common)
    after_sum = sum(after[t] for t in common)
    return {
        "common_tests": len(common),
        "common_before_s": round(before_sum, 1),
        "common_after_s": round(after_sum, 1),
        "common_ratio": round(after_sum / before_sum, 3) if before_sum else None,
        "only_before": apart(before, after),
        "only_after": apart(after, before),
        "directories": {
            name: {
                "tests": int(sums[2]),
                "before_s": round(sums[0], 1),
                "after_s": round(sums[1], 1),
                "ratio": round(sums[1] / sums[0], 3) if sums[0] else None,
            }
            for name, sums in sorted(per_directory.items())
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument(
        "--json", type=Path, default=Path(__file__).parent / "results" / "suite_time.json"
    )
    args = parser.parse_args()
    before_wall, before = testcases(args.before)
    after_wall, after = testcases(args.after)
    result = {
        "before": {"report": str(args.before), "session_s": before_wall, "tests": len(before)},
        "after": {"report": str(args.after), "session_s": after_wall, "tests": len(after)},
        **compare(before, after),
    }
    print_and_save(result, args.json)


if __name__ == "__main__":
    main()
