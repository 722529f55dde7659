-- forumpulse schema, migration 0013: the `decisions` table deduplicates a block inserted twice.
--
-- Its writers already send an insert token per block (the hash of the block's decision ids): a decision insert
-- retried after an error the store answered although it had taken the block (a ClickHouse server's timeout),
-- and a spool file loaded again after a crash between its insert and its removal, carry the token of the first
-- insert.  0001 created `decisions` without `non_replicated_deduplication_window`, so on one node the token was
-- ignored and such a block landed twice (the "Recent decisions" panel and counts of bans showed it twice).  The
-- window counts parts, as on the loaders' tables (schemas/README.md); a cluster's replicated tables deduplicate
-- by default, so the cluster DDL leaves this statement out.
ALTER TABLE decisions MODIFY SETTING non_replicated_deduplication_window = 1000;
