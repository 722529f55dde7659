"""Topic titles and groups: tables shaped for `topic_titles` / `topic_groups` (inserted into real chDB)."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pyarrow as pa
import pytest
from forumpulse.pipeline.config import Settings
from forumpulse.pipeline.enrich import load_topic_titles, topic_group_rows
from forumpulse.pipeline.store import Store

FIX = Path(__file__).parent / "fixtures" / "rules"
STAMP = datetime(2024, 11, 5, 12, 0, tzinfo=UTC)


def test_load_topic_titles() -> None:
    t = load_topic_titles(FIX / "topics.csv", updated_at=STAMP)
    assert t.column_names == ["site", "topic_id", "title", "forum", "updated_at"]
    rows = t.to_pylist()
    assert len(rows) == 5
    assert rows[0]["title"] == "General election 2024: live results, seats"
    assert rows[4]["title"] == 'Ünïcode title with "quotes"' and rows[4]["forum"] == "Off-topic"
    assert {(r["site"], r["topic_id"]) for r in rows} == {("forum", 1), ("forum", 2), ("forum", 3), ("news", 1),
                                                          ("forum", 4)}
    assert all(r["updated_at"] == STAMP for r in rows)
    mtime = load_topic_titles(FIX / "topics.csv").column("updated_at")[0].as_py()
    assert mtime == datetime.fromtimestamp(int((FIX / "topics.csv").stat().st_mtime * 1000) / 1000, tz=UTC)


@pytest.mark.parametrize(("body", "message"), [
    ("forum,x,Title\n", "topic_id 'x'"),
    ("site,topic_id,title\nforum,1\n", ":2: expected"),
    ("forum,0,Zero\n", "out of range"),
])
def test_bad_title_rows_name_the_line(tmp_path: Path, body: str, message: str) -> None:
    p = tmp_path / "t.csv"
    p.write_text(body)
    with pytest.raises(ValueError, match=message):
        load_topic_titles(p)


def test_topic_group_rows_by_ids_and_title_pattern() -> None:
    titles = load_topic_titles(FIX / "topics.csv", updated_at=STAMP)
    s = Settings(topics={"groups": [
        {"name": "election", "site": "forum", "topic_ids": [99], "title_pattern": "(?i)election"},
        {"name": "budget", "site": "news", "title_pattern": "Budget"},
        {"name": "ids-only", "site": "forum", "topic_ids": [3, 3]},
    ]})
    g = topic_group_rows(s, titles, updated_at=STAMP)
    assert g.column_names == ["site", "group_name", "topic_id", "updated_at"]
    got = {(r["site"], r["group_name"], r["topic_id"]) for r in g.to_pylist()}
    assert got == {("forum", "election", 1), ("forum", "election", 2), ("forum", "election", 99),
                   ("news", "budget", 1), ("forum", "ids-only", 3)}
    assert g.num_rows == len(got)
    # without titles only listed ids remain
    assert topic_group_rows(s, None, updated_at=STAMP).num_rows == 2
    with pytest.raises(ValueError, match="title_pattern"):  # refused with the configuration, before any use
        Settings(topics={"groups": [{"name": "x", "title_pattern": "("}]})


def test_tables_insert_into_the_schema(store: Store) -> None:
    titles = load_topic_titles(FIX / "topics.csv", updated_at=STAMP)
    s = Settings(topics={"groups": [{"name": "election", "title_pattern": "(?i)election"}]})
    store.insert("topic_titles", titles)
    store.insert("topic_groups", topic_group_rows(s, titles, updated_at=STAMP))
    rows = store.query_rows("SELECT site, topic_id, title, forum, toUnixTimestamp(updated_at) FROM topic_titles "
                            "ORDER BY site, topic_id")
    assert rows[0] == ("forum", 1, "General election 2024: live results, seats", "Politics",
                       int(STAMP.timestamp()))
    assert len(rows) == 5
    assert store.query_rows("SELECT group_name, topic_id FROM topic_groups ORDER BY topic_id") == [
        ("election", 1), ("election", 2)]


def test_sync_makes_topic_groups_the_configured_groups(store: Store) -> None:
    """A group or a topic removed from topics.groups leaves the table (it was only ever added to, and the
    detectors kept reporting a removed group); a group without members is named; patterns match every title in
    the store, not only a file just loaded; an unchanged configuration writes nothing; no configured group leaves
    the table alone (a command run without the configuration file)."""
    from forumpulse.pipeline.enrich import sync_topic_groups

    store.insert("topic_titles", load_topic_titles(FIX / "topics.csv", updated_at=STAMP))
    v1 = Settings(topics={"groups": [{"name": "election", "site": "forum", "topic_ids": [1, 2]},
                                     {"name": "pets", "site": "forum", "topic_ids": [2, 3]},
                                     {"name": "vote", "site": "forum", "title_pattern": "(?i)election"}]})
    first = sync_topic_groups(store, v1)
    assert (first.memberships, first.removed, first.empty) == (6, 0, ())
    count = store.query_rows("SELECT count() FROM topic_groups")
    again = sync_topic_groups(store, v1)  # unchanged: nothing written, no mutation
    assert (again.memberships, again.removed) == (6, 0) and store.query_rows("SELECT count() FROM topic_groups") == count
    # another titles file loaded later: the pattern still matches the titles already in the store
    store.insert("topic_titles", pa.table({"site": ["forum"], "topic_id": pa.array([9], pa.uint64()),
                                           "title": ["Gardening"], "forum": [""],
                                           "updated_at": pa.array([STAMP], pa.timestamp("ms", tz="UTC"))}))
    assert sync_topic_groups(store, v1).removed == 0
    v2 = Settings(topics={"groups": [{"name": "election", "site": "forum", "topic_ids": [1]},
                                     {"name": "nomatch", "site": "forum", "title_pattern": "no such title"}]})
    second = sync_topic_groups(store, v2)
    assert (second.memberships, second.removed, second.empty) == (1, 5, ("forum/nomatch",))
    assert store.query_rows("SELECT group_name, topic_id FROM topic_groups FINAL ORDER BY group_name, topic_id") == [
        ("election", 1)]
    assert any("nomatch has no topics" in w for w in second.warnings())
    assert any("5 membership(s) no longer in topics.groups" in w for w in second.warnings())
    assert sync_topic_groups(store, Settings()).memberships == 0  # nothing configured: the table is left alone
    assert store.query_rows("SELECT count() FROM topic_groups FINAL") == [(1,)]


def test_sync_on_a_cluster_deletes_on_the_local_tables_or_says_it_could_not() -> None:
    """On a cluster the delete runs ON CLUSTER on the local table the Distributed engine names; an engine this
    cannot read leaves the stale rows and says so (no ALTER on the Distributed table, which takes none)."""
    from forumpulse.pipeline.enrich import sync_topic_groups

    class FakeCluster:
        def __init__(self, engine: str) -> None:
            self.engine, self.commands, self.inserted = engine, [], 0

        def query_rows(self, sql: str) -> list[tuple[object, ...]]:
            if "FROM topic_titles" in sql:
                return []
            if "FROM topic_groups" in sql:
                return [("forum", "old", 7)]
            if "system.tables" in sql:
                return [(self.engine,)]
            raise AssertionError(sql)

        def insert(self, table: str, rows: object) -> None:
            self.inserted += 1

        def command(self, sql: str) -> None:
            self.commands.append(sql)

    s = Settings(topics={"groups": [{"name": "election", "site": "forum", "topic_ids": [1]}]})
    ok = FakeCluster("Distributed('forum-cluster', 'forumpulse', 'topic_groups_local', rand())")
    got = sync_topic_groups(ok, s)
    assert got.removed == 1 and len(ok.commands) == 1
    assert ok.commands[0].startswith("ALTER TABLE `forumpulse`.`topic_groups_local` ON CLUSTER `forum-cluster` DELETE")
    odd = FakeCluster("Distributed(currentDatabase())")
    got = sync_topic_groups(odd, s)
    assert odd.commands == [] and got.kept_stale == 1 and "delete them on the local tables" in got.warnings()[0]
