"""Hostile messages for every topic memproj consumes, each with what must become of it.

``corpus()`` builds, deterministically, a realistic valid stream (``streams.sample``) and,
shuffled in among it, hostile messages drawn with hypothesis: on the input topics every field
of every event type with a wrong type or missing, nesting from 10 to 10,000 levels, huge and
non-finite numbers, duplicate keys, lone surrogates and invalid UTF-8, NUL and control
characters, 900 KB strings and 100,000-element arrays, keys that do not match the body,
non-JSON bytes, JSON that is not an object, unknown event types and schema versions; and on
memproj's own topics (the sealed logs, ``deletion.tombstones``, ``deletion.acks``,
``memory.current``, ``conversation.messages``) forgeries and garbage.

Every message carries an ``Expect``:

- ``VALID``: an event of the valid stream, in one of ``VALID_TENANTS``: never dead-lettered,
  applied exactly as a stream of only the valid events applies it;
- ``DEAD``: certainly invalid under the contract: exactly one dead letter per consuming
  worker, never applied (those in the valid tenants would show in the projection's checksum);
- ``EITHER``: legal but strange, or beyond what the contract decides (a valid event with a
  900 KB ignored field, an integer no 64-bit type holds): one dead letter per consuming worker
  or none, and then decided by its projection (applied or rejected), never lost. Those that
  could change a projection live in ``EDGE_TENANT`` (or ``FORGED_TENANT`` on the outputs).

Hypothesis only chooses (which wrong value, which depth, which field...): the messages are
built from its choices, so that a few hundred choices per example make a few hundred
messages, and the large values are repeated, not drawn. Six derandomized examples make the
corpus, the same on every run of the same code.

``bursts()`` and ``oversized_letters()`` are small corpora of their own, for what the big one
cannot hold without losing its other findings: runs of one poison pill alone on a topic (the
circuit breaker's case), and messages whose dead letter is larger than a Kafka message.

The modules, none importing one listed after it:

- ``plan``: the planned messages and their expectations (``Planned``, ``Expect``), the corpus
  (``Corpus``) and the topics it writes to, with how many workers consume each;
- ``json_surgery``: an event's JSON with a value, a raw fragment or a raw member put in;
- ``contract``: what each field of each event type accepts;
- ``values``: strategies of certainly wrong values, and the hostile literals;
- ``making``: template events, the planned message of an event, one round of choices;
- ``forged_sealed``, ``forged_deletion``, ``forged_records``: forgeries on memproj's own
  topics (the sealed logs; the acknowledgements and tombstones; ``memory.current`` and
  ``conversation.messages``);
- ``input_values``, ``input_messages``: the hostile families of the input topics, at the
  values and at the message as a whole;
- ``corpus``: the valid stream and ``corpus()``;
- ``small_corpora``: ``bursts()`` and ``oversized_letters()``.
"""
