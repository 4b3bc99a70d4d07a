"""The deployed job: source records, Debezium decoding, ordering, sources, ingest, CLI."""
