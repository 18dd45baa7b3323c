"""The bounded rebuild of the context view (``advance_context``) against the full one
(``build_context``), with no services: conversations delivered in batches, the store held in
memory the way PostgreSQL holds it (messages, the ``context_turn`` marks, the turn index)."""

from __future__ import annotations

import asyncio
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from projections.conversation.context import (
    Advanced,
    ContextSettings,
    NoFinishedTurns,
    StaleTurnIndex,
    TurnIndex,
    advance_context,
    build_context,
    new_tool_results,
    resumes,
)
from projections.conversation.reducer import MessageRecord, SummaryRecord
from support.examples import examples

NOW = datetime(2026, 8, 8, tzinfo=UTC)


def message(seq: int, role: str, *blocks: dict[str, Any], event: str = "") -> MessageRecord:
    return MessageRecord(
        "t1", "c1", f"m{seq}", seq, role, tuple(blocks), NOW, event or f"e{seq}", {}, "user", "u1"
    )


def summary_of(version: int, sources: Sequence[str], text: str = "summary") -> SummaryRecord:
    return SummaryRecord(
        "t1", "c1", version, text, tuple(sources), NOW, f"s{version}", {}, "user", "u1"
    )


def text(value: str) -> dict[str, Any]:
    return {"type": "text", "text": value}


def use(tool_id: str) -> dict[str, Any]:
    return {"type": "tool_use", "id": tool_id, "name": "search", "input": {"q": tool_id}}


def result(tool_id: str, content: str = "ok") -> dict[str, Any]:
    return {"type": "tool_result", "tool_use_id": tool_id, "content": content, "is_error": False}


@dataclass
class Store:
    """The conversation as PostgreSQL holds it, and the loader's reads of it."""

    messages: list[MessageRecord] = field(default_factory=list)
    summary: SummaryRecord | None = None
    summaries: dict[int, SummaryRecord] = field(default_factory=dict)
    marks: dict[str, int] = field(default_factory=dict)
    index: TurnIndex | None = None
    rows_read: int = 0
    full_rebuilds: int = 0

    async def kept(self, first: int, last: int) -> Sequence[tuple[int, MessageRecord]]:
        found = [(self.marks[m.message_id], m) for m in self.messages if m.message_id in self.marks]
        found = [(turn, m) for turn, m in found if first <= turn <= last]
        self.rows_read += len(found)
        return found

    async def keeping(self, among: Collection[str], last: int) -> Sequence[tuple[int, str]]:
        turns = {turn for m, turn in self.marks.items() if m in among and turn <= last}
        found = [(turn, m) for m, turn in self.marks.items() if turn in turns]
        self.rows_read += len(among) + len(found)
        return found

    async def sources(self, summary_version: int) -> frozenset[str] | None:
        earlier = self.summaries.get(summary_version)
        return None if earlier is None else frozenset(earlier.source_message_ids)

    def summarise(self, summary: SummaryRecord) -> None:
        self.summaries[summary.summary_version] = self.summary = summary

    def rebuild(self, context: ContextSettings, page: int) -> Advanced:
        """What ``store.rebuild_context`` does for one conversation."""
        index = self.index
        tail = [m for m in self.messages if m.seq >= (index.active_seq if index else 1)]
        advanced = None
        if index is not None:
            answered = new_tool_results(index, tail)
            earlier = [
                m.seq
                for m in self.messages
                if any(b["type"] == "tool_use" and b["id"] in answered for b in m.content)
            ]
            if resumes(index, tail, earlier):
                self.rows_read += len(tail)
                try:
                    advanced = asyncio.run(
                        advance_context(index, tail, self.summary, context, self, page)
                    )
                except StaleTurnIndex:
                    advanced = None
        if advanced is None:
            self.full_rebuilds += 1
            self.rows_read += len(self.messages)
            self.marks.clear()
            start = TurnIndex.start(self.messages)
            advanced = asyncio.run(
                advance_context(
                    start, self.messages, self.summary, context, NoFinishedTurns(), page
                )
            )
        self.marks.update(dict(advanced.marks))
        self.index = advanced.index
        return advanced


def full(messages: list[MessageRecord], summary: SummaryRecord | None) -> Store:
    store = Store(list(messages), summary)
    store.rebuild(ContextSettings(), 1)
    return store


# -- generated conversations, in batches ---------------------------------------------------

Step = tuple[str, Any]  # ("messages", [MessageRecord, ...]) or ("summary", SummaryRecord)


@st.composite
def histories(draw: st.DrawFn) -> list[Step]:
    """Messages in batches, with summaries between them. Tool results mostly answer an open
    tool_use, but may also answer one long finished, one never used, or answer twice; tool
    ids are reused; texts may be empty."""
    messages: list[MessageRecord] = []
    steps: list[Step] = []
    open_uses: list[str] = []
    used: list[str] = []
    summaries = 0
    for _ in range(draw(st.integers(0, 12))):
        batch = []
        for _ in range(draw(st.integers(0, 8))):
            seq = len(messages) + 1
            size = draw(st.sampled_from([0, 1, 7, 40, 300, 1500]))
            action = draw(
                st.sampled_from(
                    ["ask", "ask", "answer", "answer", "use", "result", "late", "mixed", "odd"]
                )
            )
            if action == "ask":
                blocks = [text("q" * size)]
            elif action == "answer":
                blocks = [text("a" * size)]
            elif action == "use":
                tool = draw(st.sampled_from([f"t{len(used)}", *used[-2:]]))
                used.append(tool)
                open_uses.append(tool)
                blocks = ([text("using")] if draw(st.booleans()) else []) + [use(tool)]
            elif action == "result" and open_uses:
                tool = open_uses.pop(draw(st.integers(0, len(open_uses) - 1)))
                blocks = [result(tool, "r" * size)]
            elif action == "late" and used:
                # An old tool_use answered (again), or an id never used.
                tool = draw(st.sampled_from([*used, "never"]))
                blocks = [result(tool, "r" * size)]
            elif action == "mixed" and open_uses:
                blocks = [result(open_uses.pop(0), "r" * size), text("also")]
            elif action == "odd":
                # A user message that asks and uses a tool; an assistant with no text.
                tool = f"t{len(used)}"
                used.append(tool)
                open_uses.append(tool)
                blocks = [text("q"), use(tool)] if draw(st.booleans()) else [use(tool)]
            else:
                blocks = [text("x" * size)]
            role = "user" if action in ("ask", "result", "late", "mixed") else "assistant"
            if action == "odd":
                role = draw(st.sampled_from(["user", "assistant"]))
            record = message(seq, role, *blocks)
            messages.append(record)
            batch.append(record)
        steps.append(("messages", batch))
        summarise: bool = draw(st.booleans())
        if messages and summarise:
            summaries += 1
            ids = [m.message_id for m in messages]
            if draw(st.booleans()):
                sources = ids[: draw(st.integers(0, len(ids)))]  # a prefix, as summarisers do
            else:
                sources = draw(st.lists(st.sampled_from(ids), unique=True))
            steps.append(
                ("summary", summary_of(summaries, sources, "s" * draw(st.integers(1, 80))))
            )
    return steps


@given(
    histories(),
    st.integers(0, 2500),
    st.integers(10, 2000),
    st.sampled_from([1, 2, 32]),
)
@settings(examples(400, 60), deadline=None)
def test_the_bounded_rebuild_gives_the_full_rebuilds_view_after_every_batch(
    steps: list[Step], budget: int, max_chars: int, page: int
) -> None:
    context = ContextSettings(budget, max_chars)
    store = Store()
    for kind, step in steps:
        if kind == "summary":
            store.summarise(step)
        else:
            store.messages.extend(step)
        advanced = store.rebuild(context, page)
        assert advanced.view == build_context(store.messages, store.summary, context)
        # What is stored is the same however the conversation was batched.
        once = full(store.messages, store.summary)
        assert (store.index, store.marks) == (once.index, once.marks)


def test_a_late_tool_result_for_a_finished_turn_rebuilds_from_every_message() -> None:
    store = Store()
    context = ContextSettings(10_000, 100)
    store.messages += [
        message(1, "user", text("look it up")),
        message(2, "assistant", use("t1")),
        message(3, "user", result("t1")),
        message(4, "assistant", text("found it")),
        message(5, "user", text("thanks; and another?")),
    ]
    first = store.rebuild(context, 32)
    assert (first.view.finished_turns, store.index and store.index.active_seq) == (1, 5)
    # A second result for t1 reopens the exchange: turns 1 and 2 become one active turn.
    store.messages.append(message(6, "user", result("t1", "more")))
    again = store.rebuild(context, 32)
    assert again.view == build_context(store.messages, None, context)
    assert again.view.finished_turns == 0 and store.full_rebuilds == 2
    assert store.marks == {}


def test_another_incarnation_of_the_conversation_is_not_resumed() -> None:
    store = Store()
    context = ContextSettings()
    store.messages += [message(1, "user", text("hi")), message(2, "assistant", text("hello"))]
    store.rebuild(context, 32)
    # Deleted and begun again with the same ids: the index names events that are gone.
    store.messages = [message(1, "user", text("new"), event="x1")]
    store.messages.append(message(2, "assistant", text("again"), event="x2"))
    advanced = store.rebuild(context, 32)
    assert advanced.view == build_context(store.messages, None, context)
    assert store.full_rebuilds == 2


@pytest.mark.parametrize("summarised", [True, False])
def test_reads_per_batch_stay_bounded_as_the_conversation_grows(summarised: bool) -> None:
    store = Store()
    context = ContextSettings(budget_tokens=400)
    reads = []
    for batch in range(150):
        base = len(store.messages)
        store.messages += [
            message(base + 1, "user", text(f"question {batch}")),
            message(base + 2, "assistant", use(f"t{batch}")),
            message(base + 3, "user", result(f"t{batch}", "r" * 300)),
            message(base + 4, "assistant", text(f"answer {batch} " * 5)),
        ]
        if summarised and batch % 10 == 9:
            store.summarise(summary_of(batch, [m.message_id for m in store.messages[:-8]]))
        before = store.rows_read
        advanced = store.rebuild(context, 32)
        reads.append(store.rows_read - before)
        assert advanced.view == build_context(store.messages, store.summary, context)
    assert store.full_rebuilds == 1
    # 600 messages in, a batch reads what it read at 200: the active turn, the four new
    # messages, and the newest finished turns (a page of 32 of them without a summary; after
    # a summary of all but the newest, only those); a new summary adds a look-up of the 40
    # messages it covers that the one before did not, and of the turns that keep them.
    assert max(reads[50:]) <= max(reads[40:50]) <= (8 + 40 + 20 if summarised else 8 + 2 * 32)
