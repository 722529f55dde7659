-- forumpulse schema, migration 0012: which decisions a Kafka topic confirmed it received.
--
-- A decision (ban or unban) goes to the `decisions` table first and then to Kafka `weblogs.decisions`.  A
-- decision still queued in the Kafka client when the owner stops (broker away), or when it is killed, used to be
-- in the table and never on the topic, so a firewall host or decision-API process that consumes the topic never
-- saw that ban or unban.  The Kafka sink writes one row here for each decision the broker confirmed (librdkafka's
-- delivery report, with the topic's name); at start the owner publishes again the latest decision per value that
-- still matters (a ban in force, an unban within the longest ban's duration) and has no row here for its topic.
-- At least once: a confirmation lost between the broker and this table means one more copy on the topic.  Rows
-- are tiny (decisions are capped per minute); the row with the latest `published_at` per (topic, id) stands.
CREATE TABLE IF NOT EXISTS decisions_published
(
    topic        LowCardinality(String),
    id           String,
    published_at DateTime64(3, 'UTC')
)
ENGINE = ReplacingMergeTree(published_at)
ORDER BY (topic, id);
