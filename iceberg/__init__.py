"""Everything that touches Iceberg tables: catalog, layouts, log writer, compaction, readers."""
