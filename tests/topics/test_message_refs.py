"""A message source's ref names its conversation unambiguously, whatever the ids hold."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from topics.envelope import message_ref, source_conversation

# Ids of the contract: non-empty, up to 128 characters, with the characters that matter here
# (the separator, the escape character, escape-like sequences) drawn often.
ids = st.text(
    alphabet=st.sampled_from("/%2F5a:.ü ") | st.characters(exclude_categories=["Cs"]),
    min_size=1,
    max_size=128,
)


@given(conversation_id=ids, message_id=ids)
def test_the_conversation_of_a_message_ref_is_the_one_it_was_made_from(
    conversation_id: str, message_id: str
) -> None:
    assert source_conversation("message", message_ref(conversation_id, message_id)) == (
        conversation_id
    )


def test_refs_without_the_escaped_characters_are_written_as_they_are() -> None:
    assert message_ref("conv_71", "msg_993") == "conv_71/msg_993"
    assert source_conversation("message", "conv_71/msg/993") == "conv_71"
    assert source_conversation("message", "support%2Falice/m1") == "support/alice"
    assert source_conversation("message", "50%252F/m1") == "50%2F"
    assert source_conversation("crm", "contact/42") is None
    assert source_conversation("message", "no-separator") is None
    assert source_conversation("message", "/m1") is None
