"""The cleaner: a Spark job that compacts the log into the state and tombstone tables."""
