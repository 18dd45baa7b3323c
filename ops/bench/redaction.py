"""Redaction time against text length: linear on adversarial text, beside the old ``re`` one.

    .venv/bin/python ops/bench/redaction.py [--repeat 3] [--old-timeout 5] [--write-results]

For every input (an ordinary chat, and texts built to make a regex engine rescan: repeated
private key headers without END, long runs of token characters, ``password=`` repeated,
near-JWTs, ``://user:`` without ``@``, random base64 ...) at 100 KB and at 1 MB, it measures
``projections.redaction.redact_text`` (one RE2 pass with every rule as an alternative): wall
and CPU time, best of ``--repeat`` runs after a warm-up, and the 1 MB / 100 KB ratio (linear:
about 10). Beside it, the same rules as one RE2 pass per rule (1 MB), and the implementation it
replaced (Python ``re``, its patterns copied below), run in a child process that is stopped
after ``--old-timeout`` seconds. No services needed. ``--write-results`` replaces the
"Redaction" section of ops/bench/RESULTS.md with the table (other sections are kept).
"""

from __future__ import annotations

import argparse
import multiprocessing
import platform
import random
import re
import string
import sys
import time
from collections import Counter
from collections.abc import Callable
from importlib.metadata import version
from multiprocessing.connection import Connection
from pathlib import Path

from projections.redaction import RULES, Redactions, Scanner, redact_text

REPO = Path(__file__).resolve().parents[2]
RESULTS_MD = REPO / "ops" / "bench" / "RESULTS.md"
SIZES = (100_000, 1_000_000)
SECTION = "## Redaction"

# ---- the implementation this replaced (projections/conversation/redaction.py), verbatim -------

_OLD_PATTERNS: tuple[tuple[str, re.Pattern[str], int], ...] = (
    (
        "private_key",
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY-----"
            r".*?-----END (?:[A-Z0-9]+ )*PRIVATE KEY-----",
            re.DOTALL,
        ),
        0,
    ),
    ("bearer_token", re.compile(r"(?i)\bbearer\s+([A-Za-z0-9\-._~+/]{16,}=*)"), 1),
    (
        "api_key",
        re.compile(
            r"\b(?:sk-(?:ant-|proj-)?[A-Za-z0-9_\-]{16,}|AKIA[0-9A-Z]{16}|gh[pousr]_[A-Za-z0-9]{30,}"
            r"|xox[abprs]-[A-Za-z0-9\-]{10,}|AIza[0-9A-Za-z_\-]{35})"
        ),
        0,
    ),
    (
        "api_key",
        re.compile(
            r"(?i)\b(?:api[_-]?key|secret[_-]?key|access[_-]?token|client[_-]?secret|auth[_-]?token)"
            r"\b[\"']?\s*[:=]\s*[\"']?([A-Za-z0-9_\-./+]{12,})"
        ),
        1,
    ),
    (
        "password",
        re.compile(
            r"(?i)\b(?:password|passwd|pwd|passphrase)\b[\"']?\s*(?:[:=]|\bis\b)\s*[\"']?([^\s\"',;]{3,})"
        ),
        1,
    ),
)
_OLD_CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")


def _old_luhn_valid(digits: str) -> bool:
    total = 0
    for index, char in enumerate(reversed(digits)):
        value = int(char)
        if index % 2 == 1:
            value *= 2
            if value > 9:
                value -= 9
        total += value
    return total % 10 == 0


def old_redact_text(text: str, found: Redactions) -> str:
    for kind, pattern, group in _OLD_PATTERNS:

        def replace(match: re.Match[str], kind: str = kind, group: int = group) -> str:
            found[kind] += 1
            if group == 0:
                return f"[REDACTED:{kind}]"
            start, end = match.span(group)
            offset = match.start(0)
            whole = match.group(0)
            return whole[: start - offset] + f"[REDACTED:{kind}]" + whole[end - offset :]

        text = pattern.sub(replace, text)

    def card(match: re.Match[str]) -> str:
        digits = re.sub(r"[ -]", "", match.group(0))
        if 13 <= len(digits) <= 19 and _old_luhn_valid(digits):
            found["card_number"] += 1
            return "[REDACTED:card_number]"
        return match.group(0)

    return _OLD_CARD.sub(card, text)


# ---- one RE2 pass per rule, for comparison -----------------------------------------------------

_PER_RULE = tuple(Scanner((rule,)) for rule in RULES)


def per_rule_redact_text(text: str, found: Redactions) -> str:
    for scanner in _PER_RULE:
        text = scanner.redact(text, found)
    return text


# ---- the inputs -------------------------------------------------------------------------------

_CHAT_LINES = (
    "Can you help me debug the deploy? It fails at the migration step.",
    "Sure. What does `kubectl logs deploy/api --tail=50` print?",
    "2024-05-01T12:00:03Z INFO connected to db host=10.0.3.17 port=5432 pool=10",
    "Here is the config:\n```yaml\nreplicas: 3\nimage: registry.example.com/api:1.42.0\n```",
    "The docs at https://docs.example.com/guide/setup#database say the same thing.",
    "I tried it 3 times; the request id was 123e4567-e89b-12d3-a456-426614174000.",
    "Commit 3f2a9c1e4b5d6f708192a3b4c5d6e7f809a1b2c3 changed the retry policy.",
    'The payload was {"user_id": 42, "items": [1, 2, 3], "note": "rush order"}.',
    "Let me think about this step by step. First, the connection pool is exhausted.",
    "Set max_connections to 200 and restart; the password policy needs 12 characters.",
    "Thanks, that fixed it! Total was 1,234.56 EUR for 17 items.",
    "Error: ECONNREFUSED 127.0.0.1:6379 - is redis running? Try `redis-cli ping`.",
    "def retry(fn, attempts=3):\n    for i in range(attempts):\n        try: return fn()",
    "The token budget is 4096 max_tokens; input_tokens=1234 so far.",
    "Bearer of good news: the tests pass on main. Basic checks are green too.",
    "Summary: the user wants a weekly report of failed payments, grouped by region.",
)
# One line in twenty of the chat with credentials holds one.
_CREDENTIAL_LINES = (
    "My test key is sk-ant-api03-Zx9Yw8Vu7Ts6Rq5Po4NmLkJiHg and it still fails.",
    "The staging URL is postgres://app:S3cretPass@db.staging.internal:5432/app now.",
    "curl -H 'Authorization: Bearer 8f2a9c1e4b5d6f7a8b9c0d1e2f3a4b5c' https://api.example.com",
    "export AWS_ACCESS_KEY_ID=AKIAIOSFODNN7EXAMPLE",
)


def _chat_of(credentials: bool) -> Callable[[int, random.Random], str]:
    def build(size: int, rng: random.Random) -> str:
        lines: list[str] = []
        total = 0
        while total < size:
            pool = _CREDENTIAL_LINES if credentials and rng.random() < 0.05 else _CHAT_LINES
            line = rng.choice(pool)
            lines.append(line)
            total += len(line) + 1
        return "\n".join(lines)[:size]

    return build


def _repeated(unit: str) -> Callable[[int, random.Random], str]:
    def build(size: int, rng: random.Random) -> str:
        return (unit * (size // len(unit) + 1))[:size]

    return build


def _random(alphabet: str, line: int = 0) -> Callable[[int, random.Random], str]:
    def build(size: int, rng: random.Random) -> str:
        text = "".join(rng.choices(alphabet, k=size))
        if line:
            text = "\n".join(text[i : i + line] for i in range(0, size, line + 1))
        return text[:size]

    return build


def _begin_then_base64(size: int, rng: random.Random) -> str:
    body = _random(string.ascii_letters + string.digits + "+/", 64)(size, rng)
    return ("-----BEGIN RSA PRIVATE KEY-----\n" + body)[:size]


def _dense_secrets(size: int, rng: random.Random) -> str:
    unit = (
        "AKIAIOSFODNN7EXAMPLE password=hunter22 4111111111111111 Bearer abcdef0123456789abcdef "
        "https://u:p4ss@host ghp_abcdefghijklmnopqrstuvwxyz0123456789\n"
    )
    return _repeated(unit)(size, rng)


TOKEN_CHARS = string.ascii_letters + string.digits + "_-"
INPUTS: tuple[tuple[str, Callable[[int, random.Random], str]], ...] = (
    ("ordinary chat", _chat_of(credentials=False)),
    ("chat, 1 line in 20 with a credential", _chat_of(credentials=True)),
    ("BEGIN headers, no END", _repeated("-----BEGIN RSA PRIVATE KEY-----\n")),
    ("BEGIN headers, one line", _repeated("-----BEGIN RSA PRIVATE KEY-----")),
    ("BEGIN + base64, no END", _begin_then_base64),
    ("token-ish run", _random(TOKEN_CHARS)),
    ("password= repeated", _repeated("password=")),
    ('"password": " unclosed', _repeated('"password": "x ')),
    ("near-JWTs", _repeated("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0 ")),
    ("eyJ-joined tokens", _repeated("eyJa-AKIAIOSFODNN7EXAMPLE-")),
    ("://user: without @", _repeated("://user:")),
    ("Bearer repeated", _repeated("Bearer ")),
    ("digit groups", _repeated("4111 ")),
    ("random base64", _random(string.ascii_letters + string.digits + "+/=", 76)),
    ("dense secrets", _dense_secrets),
)

Implementation = Callable[[str, Redactions], str]


def measure(redact: Implementation, text: str, repeat: int) -> tuple[float, float]:
    """Best wall and CPU seconds of ``repeat`` runs."""
    walls, cpus = [], []
    for _ in range(repeat):
        wall, cpu = time.perf_counter(), time.process_time()
        redact(text, Counter())
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return min(walls), min(cpus)


def _old_child(text: str, connection: Connection) -> None:
    connection.send(measure(old_redact_text, text, 1))


def measure_old(text: str, timeout: float) -> tuple[float, float] | None:
    """The old implementation's wall and CPU seconds, or None when it took over ``timeout``."""
    receive, send = multiprocessing.Pipe(duplex=False)
    child = multiprocessing.get_context("fork").Process(target=_old_child, args=(text, send))
    child.start()
    result: tuple[float, float] | None = None
    if receive.poll(timeout):
        result = receive.recv()
    child.kill()
    child.join()
    return result


def _ms(seconds: float) -> str:
    return f"{1e3 * seconds:,.1f}"


def _cell(measured: tuple[float, float]) -> str:
    return f"{_ms(measured[0])} ({_ms(measured[1])})"


def _ratio(small: tuple[float, float], large: tuple[float, float]) -> str:
    return f"{large[1] / small[1]:.1f}" if small[1] > 0 else "-"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--old-timeout", type=float, default=5.0)
    parser.add_argument("--write-results", action="store_true")
    args = parser.parse_args()

    header = (
        "| input | 100 KB: ms (CPU ms) | 1 MB: ms (CPU ms) | 1 MB / 100 KB, CPU "
        "| one pass per rule, 1 MB: ms (CPU ms) | old `re`, 100 KB: ms (CPU ms) "
        "| old `re`, 1 MB: ms (CPU ms) | old 1 MB / 100 KB, CPU |"
    )
    rows = [header, "|" + "---|" * (header.count(" | ") + 1)]
    print(header)
    for name, build in INPUTS:
        texts = [build(size, random.Random(size)) for size in SIZES]
        redact_text(texts[0], Counter())  # warm-up: RE2 builds its DFA states lazily
        new = [measure(redact_text, text, args.repeat) for text in texts]
        per_rule_redact_text(texts[0], Counter())
        per_rule = measure(per_rule_redact_text, texts[1], args.repeat)
        old = [measure_old(text, args.old_timeout) for text in texts]
        old_cells = [
            f"> {args.old_timeout:g} s (stopped)" if result is None else _cell(result)
            for result in old
        ]
        old_ratio = "-" if old[0] is None or old[1] is None else _ratio(old[0], old[1])
        row = (
            f"| {name} | {_cell(new[0])} | {_cell(new[1])} | {_ratio(new[0], new[1])} "
            f"| {_cell(per_rule)} | {old_cells[0]} | {old_cells[1]} | {old_ratio} |"
        )
        rows.append(row)
        print(row, flush=True)

    if args.write_results:
        write_results(rows, args)


def write_results(rows: list[str], args: argparse.Namespace) -> None:
    cpu = platform.processor() or platform.machine()
    model = (
        next(
            (
                line.split(":", 1)[1].strip()
                for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")
            ),
            cpu,
        )
        if Path("/proc/cpuinfo").exists()
        else cpu
    )
    section = "\n".join(
        [
            SECTION,
            "",
            f"`.venv/bin/python ops/bench/redaction.py --repeat {args.repeat} "
            f"--old-timeout {args.old_timeout:g} --write-results`, "
            f"{time.strftime('%Y-%m-%d')}, {model}, Python {platform.python_version()}, "
            f"google-re2 {version('google-re2')}.",
            "",
            "`projections.redaction.redact_text` (one RE2 pass, every rule an alternative): wall "
            f"and CPU time, best of {args.repeat} runs after a warm-up; the 1 MB / 100 KB ratio "
            "(of CPU time) is about 10 when the time is linear in the length. Beside it, the same "
            "rules as one RE2 pass per rule, and the Python `re` implementation it replaced (one "
            f"run, in a child process stopped after {args.old_timeout:g} s). The machine is "
            "shared: read the ratios.",
            "",
            *rows,
            "",
        ]
    )
    text = RESULTS_MD.read_text() if RESULTS_MD.exists() else "# Benchmark results\n"
    start = text.find(f"\n{SECTION}\n")
    if start < 0:
        text = text.rstrip("\n") + "\n\n" + section
    else:
        following = text.find("\n## ", start + 1)
        end = len(text) if following < 0 else following + 1
        text = text[: start + 1] + section + ("\n" + text[end:] if following >= 0 else "")
    RESULTS_MD.write_text(text)
    print(f"written to {RESULTS_MD.relative_to(REPO)}", file=sys.stderr)


if __name__ == "__main__":
    main()
