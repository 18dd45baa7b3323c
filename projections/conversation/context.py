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

``build_context`` defines the view from all of a conversation's messages. ``advance_context``
gives the same view without them: from the active turn, the newest finished turns that fit the
budget and a ``TurnIndex`` of counts, so that a batch costs what the budget and the batch hold,
not what the conversation has accumulated (the tests check it against ``build_context``).
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

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


# -- the bounded rebuild -------------------------------------------------------------------
#
# Why it is the same view. Call a message a turn start as ``split_turns`` decides it over all
# the messages. If ``c`` is a turn start, ``split_turns(messages)`` is the turns before ``c``
# followed by ``split_turns`` of the messages from ``c`` on: a start at ``c`` means every
# tool_use before ``c`` had its last result before ``c`` (or none), so nothing before ``c``
# reaches past it, and nothing from ``c`` on reaches back. Appending messages keeps ``c`` a
# start unless one of them is a tool result for a tool_use id used before ``c`` (the caller
# checks that; ``resumes``). So with ``c`` the start of the active turn, the finished turns
# before ``c`` never change: their number, the empty first turn, which messages they keep
# (marked with their turn number in the store) and, for an unchanged summary, how many it
# covers are kept in a ``TurnIndex``; only the messages from ``c`` on are read again.
#
# The budget drops whole units oldest first, so it keeps the longest run of newest units
# that fits: the view needs the active turn's units, then finished turns newest first until
# one does not fit (or none is left that the summary does not cover), then the summary.

HISTORY_PAGE = 32  # finished turns read at a time, doubling while the budget has room


class StaleTurnIndex(RuntimeError):
    """A ``TurnIndex`` that does not match the stored turns: rebuild from every message."""


@dataclass(frozen=True, slots=True)
class TurnIndex:
    """What the rebuild of a view keeps of the turns before the active one.

    Every field is a function of the messages and the latest summary, never of how they were
    batched, so a replayed projection holds the same index as the live one.
    """

    through_seq: int = 0  # the last message it covers (0: none)
    through_event_id: str | None = None  # ... and its event, which no other message has
    active_seq: int = 1  # where the active turn starts
    finished: int = 0  # finished turns
    empty_first: bool = False  # the first turn is finished and keeps no item
    summary_version: int | None = None  # the summary ``summarised`` was counted under
    summarised: int = 0  # finished turns that summary covers

    @classmethod
    def start(cls, messages: Sequence[MessageRecord]) -> TurnIndex:
        """The index before any message: the rebuild then reads all of ``messages``."""
        return cls(active_seq=messages[0].seq if messages else 1)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Any) -> TurnIndex | None:
        """The stored index, or None when there is none or it is not one."""
        if not isinstance(value, dict) or set(value) != set(cls.__dataclass_fields__):
            return None
        ints = ("through_seq", "active_seq", "finished", "summarised")
        if not all(type(value[name]) is int for name in ints):
            return None
        if type(value["empty_first"]) is not bool:
            return None
        if not (value["through_event_id"] is None or isinstance(value["through_event_id"], str)):
            return None
        if not (value["summary_version"] is None or type(value["summary_version"]) is int):
            return None
        return cls(**value)


class FinishedTurns(Protocol):
    """The finished turns before a ``TurnIndex``'s active turn, as the store holds them."""

    async def kept(self, first: int, last: int) -> Sequence[tuple[int, MessageRecord]]:
        """The messages that finished turns ``first`` to ``last`` keep, with their turn."""
        ...

    async def keeping(self, among: Collection[str], last: int) -> Sequence[tuple[int, str]]:
        """(turn, message_id) of every message kept by the finished turns up to ``last``
        that keep one of the messages ``among``."""
        ...

    async def sources(self, summary_version: int) -> frozenset[str] | None:
        """The messages a summary of this conversation was built from (None: not stored)."""
        ...


class NoFinishedTurns:
    """For a rebuild from every message: there is nothing before them."""

    async def kept(self, first: int, last: int) -> Sequence[tuple[int, MessageRecord]]:
        raise StaleTurnIndex("no finished turns before the first message")

    async def keeping(self, among: Collection[str], last: int) -> Sequence[tuple[int, str]]:
        raise StaleTurnIndex("no finished turns before the first message")

    async def sources(self, summary_version: int) -> frozenset[str] | None:
        return None


async def _summarised_before(
    index: TurnIndex, covered: frozenset[str], history: FinishedTurns
) -> int:
    """How many of the turns finished before ``index``'s active turn a new summary, built
    from ``covered``, covers. A summary usually extends the one before: then only the turns
    that keep a message new to it are looked at, else every turn that keeps one of its."""
    previous: frozenset[str] | None = frozenset()
    if index.summary_version is not None:
        previous = await history.sources(index.summary_version)
    if previous is not None and previous <= covered:
        # Every turn the previous summary covered, this one covers too.
        found = index.summarised + int(bool(covered) and not previous and index.empty_first)
        among: Collection[str] = covered - previous
    else:
        found, among = int(bool(covered) and index.empty_first), covered
    if among and index.finished:
        turns: dict[int, bool] = {}
        for turn, message_id in await history.keeping(among, index.finished):
            turns[turn] = turns.get(turn, True) and message_id in covered
        found += sum(turns.values())
    return found


@dataclass(frozen=True, slots=True)
class Advanced:
    view: ContextView
    index: TurnIndex
    # (message_id, turn) for the turns this rebuild saw finish: the messages each keeps.
    marks: list[tuple[str, int]] = field(default_factory=list)


def new_tool_results(index: TurnIndex, tail: Iterable[MessageRecord]) -> set[str]:
    """The tool_use ids the messages after ``index`` answer."""
    return {
        block["tool_use_id"]
        for message in tail
        if message.seq > index.through_seq
        for block in message.content
        if block["type"] == "tool_result"
    }


def resumes(index: TurnIndex, tail: Sequence[MessageRecord], earlier_uses: Iterable[int]) -> bool:
    """Whether ``advance_context`` may go on from ``index`` with ``tail`` (the messages from
    ``index.active_seq`` on). ``earlier_uses`` are the seqs of the messages holding a tool_use
    whose id ``new_tool_results`` holds: one before the active turn would reopen finished
    turns."""
    if index.through_seq == 0:
        if index.active_seq != 1 or index.finished or index.empty_first:
            return False
    else:
        if not tail or tail[0].seq != index.active_seq:
            return False
        through = next((m for m in tail if m.seq == index.through_seq), None)
        if through is None or through.event_id != index.through_event_id:
            return False  # another incarnation of the conversation: deleted and begun again
    return all(seq >= index.active_seq for seq in earlier_uses)


def _kept_messages(turn: list[MessageRecord]) -> list[MessageRecord]:
    """The messages a finished turn keeps: its question, and its final answer (``_finished_turn``
    makes them text-only items)."""
    kept = [turn[0]] if _asks(turn[0]) else []
    answers = [m for m in turn if m.role == "assistant" and _texts(m)]
    return kept + answers[-1:]


def _items_of(kept: Iterable[MessageRecord]) -> list[tuple[int, ContextItem]]:
    return [(m.seq, ContextItem(m.role, _texts(m), m.message_id)) for m in kept]


async def advance_context(
    index: TurnIndex,
    tail: Sequence[MessageRecord],
    summary: SummaryRecord | None,
    settings: ContextSettings,
    history: FinishedTurns,
    page: int = HISTORY_PAGE,
) -> Advanced:
    """``build_context`` of the whole conversation, from ``tail`` (its messages from
    ``index.active_seq`` on, in order) and what ``index`` and ``history`` hold of the turns
    before; the caller has checked ``resumes``. Raises ``StaleTurnIndex`` when ``history``
    does not hold the turns ``index`` counts."""
    turns = split_turns(tail)
    closing, active = turns[:-1], (turns[-1] if turns else [])
    kept_of = [_kept_messages(turn) for turn in closing]
    finished = index.finished + len(closing)
    empty_first = index.empty_first or (index.finished == 0 and bool(kept_of) and not kept_of[0])
    covered = frozenset(summary.source_message_ids) if summary is not None else frozenset()

    def is_summarised(kept: list[MessageRecord]) -> bool:
        # As build_context: a turn that keeps nothing counts as summarised by any summary.
        return bool(covered) and all(m.message_id in covered for m in kept)

    version = summary.summary_version if summary is not None else None
    if version == index.summary_version:
        summarised = index.summarised
    else:
        summarised = await _summarised_before(index, covered, history)
    summarised += sum(is_summarised(kept) for kept in kept_of)
    # The finished turns that are units of the view.
    units_finished = finished - (summarised if covered else int(empty_first))

    omissions = _Omissions()
    active_units = _active_units(active, settings, omissions) if active else []
    seq_of = {m.message_id: m.seq for m in active}
    kept_items: list[tuple[int, ContextItem]] = []
    total = kept_units = 0

    def take(unit: list[tuple[int, ContextItem]]) -> bool:
        nonlocal total, kept_units
        tokens = sum(item.tokens() for _, item in unit)
        if total + tokens > settings.budget_tokens:
            return False
        total += tokens
        kept_units += 1
        kept_items.extend(unit)
        return True

    room = all(
        take([(seq_of[item.message_id or ""], item) for item in unit])
        for unit in reversed(active_units)
    )
    remaining = units_finished
    for kept in reversed(kept_of):
        if not (room and remaining):
            break
        if kept and not is_summarised(kept):
            remaining -= 1
            room = take(_items_of(kept))
    # Pages of turns newest first: as many as there are turns left to show, at first (after
    # a summary of all but the newest turns, those are the ones), then twice as many each
    # time summarised turns come between.
    last, page = index.finished, min(page, remaining)
    while room and remaining:
        if last < 1:
            raise StaleTurnIndex(f"{remaining} finished turns are missing from the store")
        first = max(1, last - page + 1)
        by_turn: dict[int, list[MessageRecord]] = {}
        for turn, message in await history.kept(first, last):
            by_turn.setdefault(turn, []).append(message)
        for turn in range(last, first - 1, -1):
            kept = sorted(by_turn.get(turn, []), key=lambda m: m.seq)
            if kept and not is_summarised(kept):
                remaining -= 1
                room = take(_items_of(kept))
                if not (room and remaining):
                    break
        last, page = first - 1, page * 2
    if room and summary is not None:
        take([(-1, ContextItem("summary", ({"type": "text", "text": summary.text},)))])

    all_units = int(summary is not None) + units_finished + len(active_units)
    kept_items.sort(key=lambda pair: pair[0])
    view = ContextView(
        items=tuple(item for _, item in kept_items),
        token_estimate=total,
        budget_tokens=settings.budget_tokens,
        finished_turns=finished,
        summarised_turns=summarised,
        omitted_tool_results=omissions.count,
        dropped_units=all_units - kept_units,
        summary_version=version,
        through_message_id=tail[-1].message_id if tail else None,
    )
    advanced = TurnIndex(
        through_seq=tail[-1].seq if tail else 0,
        through_event_id=tail[-1].event_id if tail else None,
        active_seq=active[0].seq if active else index.active_seq,
        finished=finished,
        empty_first=empty_first,
        summary_version=version,
        summarised=summarised,
    )
    marks = [
        (m.message_id, index.finished + number)
        for number, kept in enumerate(kept_of, start=1)
        for m in kept
    ]
    return Advanced(view, advanced, marks)
