"""Contract tests: what every adapter of a port must do, written once.

Each module holds abstract test classes (``...Contract``, never collected on their own: their
names do not start with ``Test``). A test module runs one against each backend by subclassing
it and giving its fixtures: the in-memory fake of ``support.fakes`` without a marker, the real
adapter under ``@pytest.mark.integration``. A new adapter (a PostgreSQL vector store, say)
passes when its subclass does: no test is written twice, and a fake cannot drift from the
adapter it stands for. How to run them: docs/testing.md.
"""
