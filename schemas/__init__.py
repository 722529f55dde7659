"""forumpulse.schemas: versioned ClickHouse migrations, cluster DDL and Kafka message contracts (data files)."""
