"""The context view: what an agent would send to a model next. Pure.

From a conversation's messages (already redacted) and its latest summary:

- the conversation is cut into turns: a turn starts at a user message that asks something
  (text, and no tool results) while no tool exchange is open; the last turn is the active one;
- a finished turn is reduced to its user question and its final assistant answer (text only),
  and left out when the latest summary was built from that question and answer;
- the active turn is kept whole, each tool_use in one unit with its tool_result; a tool result
  above ``tool_result_max_chars`` is replaced by a notice saying it was omitted and how to ask
  for a narrower one;
- the budget (approximate tokens) is enforced by dropping whole units oldest first, so a
  tool_use is never separated from its tool_result.

Selecting the view deletes nothing: it is recomputed from the stored messages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson

from projections.conversation.reducer import MessageRecord, SummaryRecord

CHARS_PER_TOKEN = 4
MESSAGE_OVERHEAD_TOKENS = 4


@dataclass(frozen=True, slots=True)
class ContextSettings:
    budget_tokens: int = 4000
    tool_result_max_chars: int = 2000


@dataclass(frozen=True, slots=True)
class ContextItem:
    role: str  # "summary", "user" or "assistant"
    content: tuple[dict[str, Any], ...]
    message_id: str | None = None

    def tokens(self) -> int:
        return MESSAGE_OVERHEAD_TOKENS + sum(block_tokens(block) for block in self.content)

    def to_json(self) -> dict[str, Any]:
        item: dict[str, Any] = {"role": self.role, "content": list(self.content)}
        if self.message_id is not None:
            item["message_id"] = self.message_id
        return item


@dataclass(frozen=True, slots=True)
class ContextView:
    items: tuple[ContextItem, ...]
    token_estimate: int
    budget_tokens: int
    finished_turns: int
    summarised_turns: int
    omitted_tool_results: int
    dropped_units: int
    summary_version: int | None = None
    through_message_id: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "items": [item.to_json() for item in self.items],
            "token_estimate": self.token_estimate,
            "budget_tokens": self.budget_tokens,
            "finished_turns": self.finished_turns,
            "summarised_turns": self.summarised_turns,
            "omitted_tool_results": self.omitted_tool_results,
            "dropped_units": self.dropped_units,
            "summary_version": self.summary_version,
            "through_message_id": self.through_message_id,
        }


def _text_tokens(text: str) -> int:
    return -(-len(text) // CHARS_PER_TOKEN)


def block_tokens(block: dict[str, Any]) -> int:
    kind = block.get("type")
    if kind == "text":
        return _text_tokens(block["text"])
    if kind == "tool_use":
        return _text_tokens(block["name"]) + _text_tokens(orjson.dumps(block["input"]).decode())
    return _text_tokens(_result_text(block.get("content")))


def _result_text(content: Any) -> str:
    return content if isinstance(content, str) else orjson.dumps(content).decode()


def _asks(message: MessageRecord) -> bool:
    kinds = {block["type"] for block in message.content}
    return message.role == "user" and "text" in kinds and "tool_result" not in kinds


def split_turns(messages: Sequence[MessageRecord]) -> list[list[MessageRecord]]:
    """A new question starts a turn, unless a tool exchange of the current turn is still
    open (its result comes later): a turn boundary never falls between the two."""
    answered_at = {
        block["tool_use_id"]: index
        for index, message in enumerate(messages)
        for block in message.content
        if block["type"] == "tool_result"
    }
    turns: list[list[MessageRecord]] = []
    open_until = -1
    for index, message in enumerate(messages):
        if not turns or (_asks(message) and index > open_until):
            turns.append([])
        turns[-1].append(message)
        for block in message.content:
            if block["type"] == "tool_use":
                open_until = max(open_until, answered_at.get(block["id"], -1))
    return turns


def _texts(message: MessageRecord) -> tuple[dict[str, Any], ...]:
    return tuple(block for block in message.content if block["type"] == "text")


def _finished_turn(turn: list[MessageRecord]) -> list[ContextItem]:
    items = []
    question = turn[0]
    if _asks(question):
        items.append(ContextItem("user", _texts(question), question.message_id))
    answers = [m for m in turn if m.role == "assistant" and _texts(m)]
    if answers:
        items.append(ContextItem("assistant", _texts(answers[-1]), answers[-1].message_id))
    return items


@dataclass(slots=True)
class _Omissions:
    count: int = 0


def _bounded_result(
    block: dict[str, Any], tool_names: dict[str, str], limit: int, omissions: _Omissions
) -> dict[str, Any]:
    text = _result_text(block.get("content"))
    if len(text) <= limit:
        return block
    omissions.count += 1
    tool = tool_names.get(block["tool_use_id"], "the tool")
    notice = (
        f"[tool result omitted: {len(text)} characters from {tool} "
        f"(tool_use_id {block['tool_use_id']}) exceed the {limit}-character limit of this "
        "view. Ask for a narrower result: repeat the call with a more specific query, a "
        "filter or a smaller page.]"
    )
    return {**block, "content": notice}


def _active_units(
    turn: list[MessageRecord], settings: ContextSettings, omissions: _Omissions
) -> list[list[ContextItem]]:
    """Whole messages, grouped so that a tool_use and its tool_result share a unit."""
    owner_of_use: dict[str, int] = {}
    tool_names: dict[str, str] = {}
    parent = list(range(len(turn)))

    def root(index: int) -> int:
        while parent[index] != index:
            parent[index] = parent[parent[index]]
            index = parent[index]
        return index

    for index, message in enumerate(turn):
        for block in message.content:
            if block["type"] == "tool_use":
                owner_of_use[block["id"]] = index
                tool_names[block["id"]] = f"tool '{block['name']}'"
            elif block["type"] == "tool_result" and block["tool_use_id"] in owner_of_use:
                parent[root(index)] = root(owner_of_use[block["tool_use_id"]])

    units: dict[int, list[ContextItem]] = {}
    for index, message in enumerate(turn):
        content = tuple(
            _bounded_result(block, tool_names, settings.tool_result_max_chars, omissions)
            if block["type"] == "tool_result"
            else block
            for block in message.content
        )
        units.setdefault(root(index), []).append(
            ContextItem(message.role, content, message.message_id)
        )
    return [units[key] for key in sorted(units)]


def build_context(
    messages: Sequence[MessageRecord],
    summary: SummaryRecord | None,
    settings: ContextSettings,
) -> ContextView:
    turns = split_turns(messages)
    finished, active = turns[:-1], turns[-1:] or []
    covered = set(summary.source_message_ids) if summary is not None else set()
    units: list[list[ContextItem]] = []
    if summary is not None:
        units.append([ContextItem("summary", ({"type": "text", "text": summary.text},))])
    summarised = 0
    for turn in finished:
        items = _finished_turn(turn)
        if covered and all(item.message_id in covered for item in items):
            summarised += 1
            continue
        if items:
            units.append(items)
    omissions = _Omissions()
    for turn in active:
        units.extend(_active_units(turn, settings, omissions))

    total = sum(item.tokens() for unit in units for item in unit)
    dropped = 0
    while units and total > settings.budget_tokens:
        total -= sum(item.tokens() for item in units.pop(0))
        dropped += 1
    kept = [item for unit in units for item in unit]
    return ContextView(
        items=tuple(sorted(kept, key=_position(messages))),
        token_estimate=total,
        budget_tokens=settings.budget_tokens,
        finished_turns=len(finished),
        summarised_turns=summarised,
        omitted_tool_results=omissions.count,
        dropped_units=dropped,
        summary_version=summary.summary_version if summary is not None else None,
        through_message_id=messages[-1].message_id if messages else None,
    )


def _position(messages: Sequence[MessageRecord]) -> Any:
    order = {message.message_id: message.seq for message in messages}
    return lambda item: -1 if item.message_id is None else order[item.message_id]
