"""Dead letters without plaintext: each letter's original is sealed under a key of its own.

A dead letter keeps what a failure needs for diagnosis and replay (the original value, its key,
the error's detail), and that is personal data for as long as the letter lives. So every letter
is sealed (AES-256-GCM) under a fresh data key; the key is stored here, wrapped, with the
letter's owner as far as the message can be read (``owner_of``: tenant, subject, memory,
conversation, the original key) and an expiry at the end of the DLQ retention. The letter on
the topic is then readable exactly while its key row lives:

- an erasure destroys the keys of the letters whose owner it covers (``shred_dead_letters``,
  called by the erasure itself), and a letter born after the erasure of its owner is stored
  erased (``save_keys``);
- the deletion worker destroys every key at its expiry (``destroy_expired``), when the topic's
  retention (the same window, ``DEAD_LETTER_RETENTION_MS``) lets the ciphertext go too.

A letter must never be published before its key row is durable: the projections store the keys
in their batch's transaction, the agents before they publish (``PostgresLetterKeys``).

Each key row names the master key that wrapped it (``master_key_id``); the newest configured
master key wraps new ones, and ``rewrap_letter_keys`` moves the others to it (rotation).

The modules, each importing only those before it:

- ``owner``: the owner of a letter, read from any message (pure);
- ``sealing``: sealing a letter under its data key and opening it again, the key row it
  leaves and the outbox message that carries both (pure);
- ``keys``: the key rows in PostgreSQL: saved, shredded by erasures, expired, re-wrapped;
- ``reading``: the letters as a reader sees them, opened while their key lives.
"""
