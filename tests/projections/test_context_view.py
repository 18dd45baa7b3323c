"""The context view selection, with no services."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from projections.conversation.context import ContextSettings, ContextView, build_context
from projections.conversation.reducer import MessageRecord, SummaryRecord
from support.examples import examples

NOW = datetime(2026, 8, 8, tzinfo=UTC)


def message(seq: int, role: str, *blocks: dict[str, Any]) -> MessageRecord:
    return MessageRecord(
        "t1", "c1", f"m{seq}", seq, role, tuple(blocks), NOW, f"e{seq}", {}, "user", "u1"
    )


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def use(tool_id: str, name: str = "search") -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": name, "input": {"q": tool_id}}


def result(tool_id: str, content: str = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": content, "is_error": False}


def rendered(view: ContextView) -> list[tuple[str, list[str]]]:
    out = []
    for item in view.items:
        parts = []
        for block in item.content:
            if block["type"] == "text":
                parts.append(block["text"])
            elif block["type"] == "tool_use":
                parts.append(f"use:{block['id']}")
            else:
                parts.append(f"result:{block['tool_use_id']}")
        out.append((item.role, parts))
    return out


CONVERSATION = [
    message(1, "user", text("what is the weather?")),
    message(2, "assistant", text("let me look"), use("t1")),
    message(3, "user", result("t1", "sunny, 21C")),
    message(4, "assistant", text("It is sunny.")),
    message(5, "user", text("and tomorrow?")),
    message(6, "assistant", use("t2", "forecast")),
    message(7, "user", result("t2", "x" * 5000)),
    message(8, "assistant", use("t3")),
]


def test_finished_turns_become_question_and_answer_and_the_active_turn_stays_whole() -> None:
    view = build_context(CONVERSATION, None, ContextSettings(budget_tokens=10_000))
    assert rendered(view) == [
        ("user", ["what is the weather?"]),
        ("assistant", ["It is sunny."]),
        ("user", ["and tomorrow?"]),
        ("assistant", ["use:t2"]),
        ("user", ["result:t2"]),
        ("assistant", ["use:t3"]),  # pending: no result yet
    ]
    assert view.finished_turns == 1


def test_an_oversized_tool_result_is_replaced_by_a_notice() -> None:
    view = build_context(CONVERSATION, None, ContextSettings(10_000, tool_result_max_chars=100))
    notice = view.items[4].content[0]["content"]
    assert "omitted" in notice and "5000 characters" in notice and "forecast" in notice
    assert "narrower" in notice
    assert view.omitted_tool_results == 1
    # The stored message is untouched: the view is a selection, not an edit.
    assert CONVERSATION[6].content[0]["content"] == "x" * 5000


def test_the_budget_drops_whole_units_oldest_first() -> None:
    full = build_context(CONVERSATION, None, ContextSettings(10_000, 100))
    tight = build_context(CONVERSATION, None, ContextSettings(full.token_estimate - 1, 100))
    assert tight.token_estimate <= tight.budget_tokens
    assert rendered(tight) == rendered(full)[2:]  # the finished turn's pair went first
    assert tight.dropped_units == 1


def test_a_summary_stands_for_the_turns_it_was_built_from() -> None:
    summary = SummaryRecord(
        "t1", "c1", 1, "User asked about the weather; sunny.", ("m1", "m2", "m3", "m4"),
        NOW, "s1", {}, "user", "u1",
    )  # fmt: skip
    view = build_context(CONVERSATION, summary, ContextSettings(10_000, 100))
    assert rendered(view)[0] == ("summary", ["User asked about the weather; sunny."])
    assert ("user", ["what is the weather?"]) not in rendered(view)
    assert view.summarised_turns == 1 and view.summary_version == 1


def test_an_empty_conversation_has_an_empty_view() -> None:
    view = build_context([], None, ContextSettings())
    assert view.items == () and view.token_estimate == 0


@st.composite
def conversations(draw: st.DrawFn) -> list[MessageRecord]:
    messages: list[MessageRecord] = []
    open_uses: list[str] = []
    tools = 0
    for _ in range(draw(st.integers(0, 25))):
        seq = len(messages) + 1
        action = draw(st.sampled_from(["ask", "answer", "use", "result", "mixed"]))
        size = draw(st.integers(1, 3000))
        if action == "ask":
            messages.append(message(seq, "user", text("q" * size)))
        elif action == "answer":
            messages.append(message(seq, "assistant", text("a" * size)))
        elif action == "use":
            uses = [f"t{tools + i}" for i in range(draw(st.integers(1, 3)))]
            tools += len(uses)
            open_uses.extend(uses)
            messages.append(message(seq, "assistant", text("using"), *[use(u) for u in uses]))
        elif action == "result" and open_uses:
            answered = draw(st.lists(st.sampled_from(open_uses), min_size=1, unique=True))
            for tool_id in answered:
                open_uses.remove(tool_id)
            messages.append(message(seq, "user", *[result(t, "r" * size) for t in answered]))
        elif action == "mixed" and open_uses:
            tool_id = open_uses.pop(0)
            messages.append(message(seq, "user", result(tool_id, "r" * size), text("also")))
    return messages


@given(conversations(), st.integers(0, 3000), st.integers(10, 5000))
@settings(examples(300, 50), deadline=None)
def test_the_view_never_splits_a_tool_exchange_and_never_exceeds_its_budget(
    messages: list[MessageRecord], budget: int, max_chars: int
) -> None:
    view = build_context(messages, None, ContextSettings(budget, max_chars))
    assert view.token_estimate <= budget
    assert view.token_estimate == sum(item.tokens() for item in view.items)
    used = {b["id"] for i in view.items for b in i.content if b["type"] == "tool_use"}
    answered = {
        b["tool_use_id"] for i in view.items for b in i.content if b["type"] == "tool_result"
    }
    results_anywhere = {
        b["tool_use_id"] for m in messages for b in m.content if b["type"] == "tool_result"
    }
    uses_anywhere = {b["id"] for m in messages for b in m.content if b["type"] == "tool_use"}
    # Every tool_use in the view has its result there too, when one exists ...
    assert used & results_anywhere <= answered
    # ... and every tool result in the view comes with its tool_use.
    assert answered & uses_anywhere <= used
    ids = [item.message_id for item in view.items if item.message_id]
    assert ids == sorted(ids, key=lambda m: int(m[1:]))  # chronological
