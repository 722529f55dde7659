"""File ingestion into the real engine: independent counts, quarantine with raw bytes, privacy, idempotence."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from forumpulse.pipeline.ingest import ingest_paths
from forumpulse.pipeline.process import Processor, SourceContext, record_dicts
from forumpulse.pipeline.record import DROP_REASONS, RECORD_FIELDS

FIX = Path(__file__).parent / "fixtures"
MIXED = FIX / "ingest" / "mixed.log"
NASA = FIX / "parse" / "NASA_access_log_Aug95.partial_damaged.log"


def count_lines(path: Path) -> int:
    """Lines as a reader independent of the loader sees them: newline count, plus a last unterminated line."""
    data = path.read_bytes()
    return data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)


def table_count(store, table: str) -> int:
    return int(store.query_rows(f"SELECT count() FROM {table}")[0][0])


@pytest.mark.parametrize("fmt", ["common", "auto"])
def test_nasa_damaged_sample_quarantines_exactly_its_89_broken_lines(store, settings, fmt):
    assert NASA.is_file(), "fixture missing: tests/fixtures/parse/NASA_access_log_Aug95.partial_damaged.log"
    [c] = ingest_paths(store, settings, [str(NASA)], fmt=fmt, site="nasa")
    expected_lines = count_lines(NASA)
    assert expected_lines == 1930
    loaded, quarantined = table_count(store, "requests"), table_count(store, "quarantine")
    assert (c.read, c.loaded, c.quarantined) == (expected_lines, loaded, quarantined)
    assert quarantined == 89
    assert loaded + quarantined == expected_lines
    # hostnames as clients are kept as client_host, not lost
    assert int(store.query_rows("SELECT countIf(client_host != '') FROM requests")[0][0]) > 0


def test_mixed_file_every_line_accounted_with_named_reasons_and_raw_bytes(store, settings):
    [c] = ingest_paths(store, settings, [str(MIXED)], fmt="combined", site="forum", origin_host="web1")
    raw_lines = MIXED.read_bytes().split(b"\n")[:-1]
    assert c.read == len(raw_lines) == table_count(store, "requests") + table_count(store, "quarantine")
    assert (table_count(store, "requests"), table_count(store, "quarantine")) == (6, 4)
    q = store.query_rows("SELECT line_no, reason, hex(raw) FROM quarantine ORDER BY line_no")
    assert [int(n) for n, _, _ in q] == [5, 6, 7, 9]
    for n, reason, raw_hex in q:
        assert reason in DROP_REASONS
        assert bytes.fromhex(raw_hex) == raw_lines[int(n)], "quarantine must keep the raw bytes exactly"
    reasons = {int(n): r for n, r, _ in q}
    assert reasons[6] == "empty_line"
    assert reasons[7] == "not_access_log"
    # privacy: the session parameter is gone from url and referer, the rest is kept
    url, ref = store.query_rows("SELECT url, referer FROM requests WHERE url LIKE '%page-3%'")[0]
    assert url == "/threads/election-night-live.4411/page-3"
    assert ref == "https://forum.example/threads/election-night-live.4411/"
    # attribution
    kinds = dict(store.query_rows("SELECT page_kind, count() FROM requests GROUP BY page_kind"))
    assert kinds["topic_view"] == 3 and kinds["reply"] == 1 and kinds["static"] == 1
    assert store.query_rows("SELECT topic_id FROM requests WHERE page_kind = 'reply'") == [(4411,)]
    assert store.query_rows("SELECT bot_name FROM requests WHERE is_bot") == [("Googlebot",)]
    assert store.query_rows("SELECT client FROM requests WHERE method = 'POST'") == [("2001:db8:5::17",)]


def test_reingesting_the_same_file_stores_nothing_twice(store, settings):
    [first] = ingest_paths(store, settings, [str(MIXED)], fmt="combined")
    before = (table_count(store, "requests"), table_count(store, "quarantine"),
              store.query_rows("SELECT sum(requests) FROM site_minute")[0][0])
    [again] = ingest_paths(store, settings, [str(MIXED)], fmt="combined")
    after = (table_count(store, "requests"), table_count(store, "quarantine"),
             store.query_rows("SELECT sum(requests) FROM site_minute")[0][0])
    assert before == after == (6, 4, 6)
    # and the second run says so: the file's 10 lines were ingested before, none was read again
    assert (first.read, first.skipped, again.read, again.skipped) == (10, 0, 0, 10)
    assert again.skipped_from.startswith(str(MIXED))


ELASTIC = FIX / "fastpath" / "elastic_apache_1000.log"


def _totals(store) -> tuple[int, int, int]:
    return (table_count(store, "requests"), table_count(store, "quarantine"),
            int(store.query_rows("SELECT sum(requests) FROM site_minute")[0][0] or 0))


def test_a_file_read_under_another_name_renamed_or_compressed_is_not_stored_again(store, settings, tmp_path,
                                                                                   monkeypatch):
    """The ledger goes by content: another spelling of the path, logrotate's rename and its gzip are the file
    already loaded (before the ledger, each of these stored every line again)."""
    import gzip

    log = tmp_path / "access.log"
    log.write_bytes(ELASTIC.read_bytes())
    [first] = ingest_paths(store, settings, [str(log)], fmt="combined", origin_host="web1")
    want = _totals(store)
    assert first.read == 1000 and want[0] + want[1] == 1000
    monkeypatch.chdir(tmp_path)
    rotated = tmp_path / "access.log.1"
    log.rename(rotated)
    gz = tmp_path / "access.log.2.gz"
    gz.write_bytes(gzip.compress(rotated.read_bytes()))
    again = ingest_paths(store, settings, ["./access.log.1", str(rotated), str(gz)], fmt="combined",
                         origin_host="web1")
    assert [(c.read, c.skipped) for c in again] == [(0, 1000)] * 3
    assert _totals(store) == want
    # another host's file with the same bytes is not this one (kept apart, like the dedup tokens)
    [other] = ingest_paths(store, settings, [str(rotated)], fmt="combined", origin_host="web2")
    assert (other.read, other.skipped) == (1000, 0)


def test_a_backfill_of_rotated_archives_by_a_relative_path_is_the_source_syslog_ng_tails(store, settings, tmp_path,
                                                                                          monkeypatch):
    """``origin_file`` is the absolute path of the file syslog-ng tails, whatever the working directory and
    without the rotation and compression suffixes: a backfill of ``logs/access.log.1.gz`` and ``logs/access.log``
    up to now and the live lines after it are one source.  With the path as typed each file was a source of its
    own that fell silent where its lines ended: a pipeline_gap that never closed, and the site detectors not fed
    for a day after it (user trial 32).  The ledger still names the file itself."""
    import gzip

    from forumpulse.pipeline.ingest import source_file

    (tmp_path / "logs").mkdir()
    lines = ELASTIC.read_bytes().splitlines(keepends=True)
    (tmp_path / "logs" / "access.log.1.gz").write_bytes(gzip.compress(b"".join(lines[:500])))
    log = tmp_path / "logs" / "access.log"
    log.write_bytes(b"".join(lines[500:]))
    monkeypatch.chdir(tmp_path)
    got = ingest_paths(store, settings, ["logs/access.log.1.gz", "logs/access.log"], fmt="combined",
                       origin_host="web1")
    assert [c.read for c in got] == [500, 500]
    assert store.query_rows("SELECT DISTINCT origin_file FROM requests") == [(str(log),)]
    assert sorted(r[0] for r in store.query_rows("SELECT DISTINCT origin_file FROM ingest_files")) == [
        str(log), str(log) + ".1.gz"]
    for name in ("access.log.2", "access.log-20260101.gz", "access.log-2026010112", "access.log-2026-01-01.bz2"):
        assert source_file(f"/var/log/{name}") == "/var/log/access.log"
    for name in ("access.log", "web1.log", "access_log_Jul95", "forum-2024.log"):
        assert source_file(f"/var/log/{name}") == f"/var/log/{name}"


def test_a_grown_file_is_read_from_where_the_last_ingest_ended(store, settings, tmp_path):
    lines = ELASTIC.read_bytes().splitlines(keepends=True)
    log = tmp_path / "access.log"
    log.write_bytes(b"".join(lines[:400]) + MIXED.read_bytes())  # 410 lines, 4 of them quarantined
    [first] = ingest_paths(store, settings, [str(log)], fmt="combined")
    with log.open("ab") as f:
        f.write(b"".join(lines[400:]))  # 600 more
    [second] = ingest_paths(store, settings, [str(log)], fmt="combined")
    assert (first.read, second.read, second.skipped) == (410, 600, 410)
    # the same totals as one ingest of the whole file into an empty store
    got = _totals(store)
    q_lines = store.query_rows("SELECT line_no FROM quarantine ORDER BY line_no")
    store.command("TRUNCATE TABLE requests")
    store.command("TRUNCATE TABLE quarantine")
    store.command("TRUNCATE TABLE ingest_files")  # the ledger too: the same file is to be read again
    store.command("TRUNCATE TABLE site_minute")
    whole = tmp_path / "whole.log"
    whole.write_bytes(log.read_bytes())
    [one] = ingest_paths(store, settings, [str(whole)], fmt="combined")
    assert one.read == 1010 and _totals(store) == got
    assert store.query_rows("SELECT line_no FROM quarantine ORDER BY line_no") == q_lines  # numbered in the file


def test_an_interrupted_ingest_rerun_after_the_file_grew_stores_nothing_twice(store, settings, tmp_path):
    """A store error after some blocks, the log grows, the run is repeated (from a review: the last block's token
    covered a longer chunk by then, so it was stored again).  The ledger's checkpoint after every stored block
    makes the rerun start where the stored blocks end."""
    from forumpulse.pipeline.store import StoreError

    lines = ELASTIC.read_bytes().splitlines(keepends=True)
    log = tmp_path / "access.log"
    log.write_bytes(b"".join(lines[:700]))
    settings.ingest.batch_lines = 300  # blocks of 300 lines: 300, 300, 100
    failing = _FailingStore(store, fail_at=3)
    with pytest.raises(StoreError, match="injected"):
        ingest_paths(failing, settings, [str(log)], fmt="combined", workers=1)
    with log.open("ab") as f:
        f.write(b"".join(lines[700:]))
    [c] = ingest_paths(store, settings, [str(log)], fmt="combined", workers=1)
    assert (c.skipped, c.read) == (600, 400)
    assert table_count(store, "requests") + table_count(store, "quarantine") == 1000


def test_a_copy_shorter_than_the_last_load_resumes_from_a_checkpoint_it_holds(store, settings, tmp_path):
    """A .gz still being written (cut short) of a file loaded further before: it skips to the last checkpoint it
    holds in full, and what it adds past that is what the longer load had (same blocks): nothing doubled; the
    cut line is recorded only up to the last newline, so the intact file reads it whole (from a review)."""
    import gzip

    all_lines = ELASTIC.read_bytes().splitlines(keepends=True)[:1000]
    data = b"".join(all_lines)
    settings.ingest.batch_lines = 200
    log = tmp_path / "access.log"
    log.write_bytes(b"".join(all_lines[:500]))
    ingest_paths(store, settings, [str(log)], fmt="combined")
    log.write_bytes(data)  # grown to 1000 lines
    ingest_paths(store, settings, [str(log)], fmt="combined")
    assert table_count(store, "requests") + table_count(store, "quarantine") == 1000
    packed = gzip.compress(data)
    cut = tmp_path / "access.log.1.gz"
    cut.write_bytes(packed[: len(packed) * 8 // 10])
    [k] = ingest_paths(store, settings, [str(cut)], fmt="combined")
    assert k.error is not None and k.skipped >= 600  # the checkpoints at 200, 400, 500 (first load) and 700
    # what it read past its last checkpoint is a shorter block than the one stored from there: stored again
    # (bounded by one insert block, batch_lines -- the documented limit)
    again = table_count(store, "requests") + table_count(store, "quarantine") - 1000
    assert 0 <= again == k.read - k.already_stored <= 200
    # the intact copy: everything was loaded before, nothing is read
    whole = tmp_path / "access.log.2.gz"
    whole.write_bytes(packed)
    [w] = ingest_paths(store, settings, [str(whole)], fmt="combined")
    assert (w.read, w.skipped) == (0, 1000)


def test_a_last_line_without_newline_is_skipped_while_unchanged_and_read_again_once_completed(store, settings,
                                                                                              tmp_path):
    lines = ELASTIC.read_bytes().splitlines(keepends=True)
    log = tmp_path / "access.log"
    log.write_bytes(b"".join(lines[:10]) + lines[10][:-1])  # the 11th line complete but for its newline
    [a] = ingest_paths(store, settings, [str(log)], fmt="combined")
    [b] = ingest_paths(store, settings, [str(log)], fmt="combined")
    assert (a.read, b.read, b.skipped) == (11, 0, 11)  # unchanged: nothing read again
    log.write_bytes(b"".join(lines[:10]) + lines[10][:40])  # a line being written when it was read
    store.command("TRUNCATE TABLE requests")
    store.command("TRUNCATE TABLE quarantine")
    store.command("TRUNCATE TABLE ingest_files")
    [c] = ingest_paths(store, settings, [str(log)], fmt="combined")
    log.write_bytes(b"".join(lines[:20]))  # completed, and more written
    [d] = ingest_paths(store, settings, [str(log)], fmt="combined")
    assert (c.read, d.skipped, d.read) == (11, 10, 10)  # the completed line is read whole, not its rest alone
    assert table_count(store, "requests") == 20  # every complete line once; the early half stays quarantined
    assert store.query_rows("SELECT reason, count() FROM quarantine GROUP BY reason") == [("truncated", 1)]


def test_a_rewritten_file_is_read_whole_and_another_format_is_loaded_again_with_a_warning(store, settings,
                                                                                          tmp_path):
    log = tmp_path / "access.log"
    data = ELASTIC.read_bytes()
    log.write_bytes(data)
    ingest_paths(store, settings, [str(log)], fmt="combined")
    # the same first line, a byte changed further on: the recorded prefix no longer matches, nothing is skipped
    head, rest = data.split(b"\n", 1)
    changed = head + b"\n" + rest.replace(b"HTTP/1.1\" 200", b"HTTP/1.1\" 404", 1)
    assert changed != data and changed.split(b"\n")[0] == data.split(b"\n")[0]
    log.write_bytes(changed)
    [c] = ingest_paths(store, settings, [str(log)], fmt="combined")
    assert (c.read, c.skipped, c.other_format) == (1000, 0, "")
    # the same bytes under another format: read again, and said
    log.write_bytes(data)
    [a] = ingest_paths(store, settings, [str(log)], fmt="auto")
    assert (a.read, a.skipped) == (1000, 0) and a.other_format.startswith("combined (")


def test_ingest_says_when_a_file_was_ingested_before(tmp_path):
    exe = Path(sys.executable).with_name("forumpulse")
    args = [str(exe), "ingest", "--store", f"chdb:{tmp_path / 'st'}", "--format", "combined", str(MIXED)]
    one = subprocess.run(args, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    two = subprocess.run(args, capture_output=True, text=True, timeout=180, cwd=tmp_path)
    assert one.returncode == two.returncode == 0, one.stderr + two.stderr
    assert "ingested before" not in one.stdout
    assert "its first 10 lines were ingested before" in two.stdout and "nothing new" in two.stdout


def test_records_keep_input_order_and_contract_fields(settings):
    lines = MIXED.read_bytes().split(b"\n")[:-1]
    batch = Processor(settings).process(lines, SourceContext(format="combined"))
    out = record_dicts(batch)
    assert len(out) == len(lines)
    for i, d in enumerate(out):
        if i in (5, 6, 7, 9):
            assert set(d) == {"error", "detail", "line"} and d["error"] in DROP_REASONS
        else:
            assert list(d) == list(RECORD_FIELDS)
    assert out[0]["ts"] == "2026-03-12T12:01:02.000Z"  # +0800 local -> UTC, millisecond precision
    assert out[1]["query"] == "" and out[2]["client_ip"] == "2001:db8:5::17"


def test_parse_command_prints_one_json_object_per_line(tmp_path):
    exe = Path(sys.executable).with_name("forumpulse")
    r = subprocess.run([str(exe), "parse", "--format", "combined", str(MIXED)], capture_output=True, timeout=120)
    assert r.returncode == 0, r.stderr.decode()
    out = [json.loads(x) for x in r.stdout.decode().splitlines()]
    assert len(out) == count_lines(MIXED)
    assert ["error" in d for d in out] == [False] * 5 + [True, True, True, False, True]


def test_ingest_command_end_to_end_on_its_own_store(tmp_path):
    exe = Path(sys.executable).with_name("forumpulse")
    cfg = tmp_path / "fp.yaml"
    cfg.write_text("retention:\n  raw_days: 0\n")
    r = subprocess.run([str(exe), "ingest", "--config", str(cfg), "--store", f"chdb:{tmp_path / 'db'}",
                        "--format", "combined", str(MIXED)], capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode()
    text = r.stdout.decode()
    assert f"{MIXED}: read 10  loaded 6  quarantined 4 (" in text


def _reference_ingest(store, settings, big: Path, batch_lines: int):
    """Ingest ``big`` inline with ``batch_lines`` (one chunk per insert); returns its counts, stored rows and
    quarantine, and empties both tables for the run compared with it."""
    settings.ingest.batch_lines = batch_lines
    [one] = ingest_paths(store, settings, [str(big)], fmt="combined", workers=1, threads=1)
    rows = store.query_rows("SELECT * FROM requests ORDER BY ts, url, client_ip")
    quarantined = store.query_rows("SELECT line_no, reason, raw FROM quarantine ORDER BY line_no")
    store.command("TRUNCATE TABLE requests")
    store.command("TRUNCATE TABLE quarantine")
    store.command("TRUNCATE TABLE ingest_files")  # the ledger too: the same file is to be read again
    return one, rows, quarantined


def test_parallel_workers_give_identical_rows(store, settings, tmp_path):
    big = tmp_path / "big.log"
    big.write_bytes(MIXED.read_bytes() * 700)  # 7,000 lines in 4 chunks
    one, rows_one, q_one = _reference_ingest(store, settings, big, 2000)
    settings.ingest.batch_lines = 1999  # other chunk boundaries, so no block is deduplicated away
    [three] = ingest_paths(store, settings, [str(big)], fmt="combined", workers=1, threads=3)
    assert (three.read, three.loaded, three.quarantined) == (7000, 4200, 2800)
    assert store.query_rows("SELECT * FROM requests ORDER BY ts, url, client_ip") == rows_one
    assert store.query_rows("SELECT line_no, reason, raw FROM quarantine ORDER BY line_no") == q_one
    store.command("TRUNCATE TABLE requests")
    store.command("TRUNCATE TABLE quarantine")
    store.command("TRUNCATE TABLE ingest_files")  # the ledger too: the same file is to be read again
    settings.ingest.batch_lines = 2001  # other chunk boundaries, so no block is deduplicated away
    [two] = ingest_paths(store, settings, [str(big)], fmt="combined", workers=2)
    assert (one.read, one.loaded, one.quarantined) == (two.read, two.loaded, two.quarantined) == (7000, 4200, 2800)
    assert store.query_rows("SELECT * FROM requests ORDER BY ts, url, client_ip") == rows_one
    assert store.query_rows("SELECT line_no, reason, raw FROM quarantine ORDER BY line_no") == q_one


def test_chunks_gathered_into_insert_blocks_store_the_same_rows_once(store, settings, tmp_path, monkeypatch):
    """Parse chunks are gathered into blocks of ``batch_lines`` rows (fewer, cheaper inserts): the same rows and
    quarantine as one chunk per insert, line numbers included, and re-ingesting stores nothing twice."""
    import forumpulse.pipeline.ingest as ingest_mod

    big = tmp_path / "big.log"
    big.write_bytes(MIXED.read_bytes() * 700)  # 7,000 lines
    one, rows_one, q_one = _reference_ingest(store, settings, big, 700)
    monkeypatch.setattr(ingest_mod, "PARSE_CHUNK_LINES", 700)
    settings.ingest.batch_lines = 2500  # blocks of 4 chunks of (at most) 625 lines: 3 blocks
    inserts: list[int] = []
    real_insert = store.insert

    def counting_insert(table, data, dedup_token=None):
        if table == "requests":
            inserts.append(data.num_rows)
        return real_insert(table, data, dedup_token=dedup_token)

    monkeypatch.setattr(store, "insert", counting_insert)
    [gathered] = ingest_paths(store, settings, [str(big)], fmt="combined", workers=1, threads=2)
    assert len(inserts) == 3 and sum(inserts) == 4200
    assert (gathered.read, gathered.loaded, gathered.quarantined) == (one.read, one.loaded, one.quarantined)
    assert store.query_rows("SELECT * FROM requests ORDER BY ts, url, client_ip") == rows_one
    assert store.query_rows("SELECT line_no, reason, raw FROM quarantine ORDER BY line_no") == q_one
    ingest_paths(store, settings, [str(big)], fmt="combined", workers=1, threads=2)  # the same blocks again
    assert store.query_rows("SELECT count() FROM requests")[0][0] == 4200
    assert store.query_rows("SELECT count() FROM quarantine")[0][0] == 2800


@pytest.mark.parametrize("threads", [2, 3])
def test_parse_threads_give_the_same_batches_as_inline_processing(settings, threads):
    """Parse threads each own a Processor (processors are not thread-safe); their batches, taken in submission
    order, equal inline processing chunk for chunk, on varied input (real Apache lines, damaged NASA lines,
    mixed good/bad lines), so nothing depends on which thread got which chunk."""
    from forumpulse.pipeline.ingest import _chunks, _Pool

    data = (FIX / "fastpath" / "elastic_apache_1000.log").read_bytes() + NASA.read_bytes() + MIXED.read_bytes() * 50
    import io

    chunks = list(_chunks(io.BytesIO(data * 3), 700))
    assert len(chunks) > 2 * threads
    ctx = SourceContext(site="forum", origin_host="h", origin_file="f.log", format="auto")
    items = []
    base = 0
    for c, n in chunks:
        items.append((c, ctx, base, "file:f.log"))
        base += n
    inline = Processor(settings)
    want = [inline.process_block(c, ctx, line_no_base=b, source_ref=r) for c, _, b, r in items]
    pool = _Pool(Processor(settings), 1, threads=threads)
    try:
        got = list(pool.map(iter(items)))
    finally:
        pool.close()
    assert [c for c, _ in got] == [c for c, _, _, _ in items]
    for (_, g), w in zip(got, want, strict=True):
        assert g.requests.equals(w.requests)
        assert g.stream.equals(w.stream)
        assert g.quarantine.drop(["ingested_at"]).equals(w.quarantine.drop(["ingested_at"]))
        assert (g.read, g.loaded, g.quarantined, g.by_reason) == (w.read, w.loaded, w.quarantined, w.by_reason)
    assert sum(w.quarantined for w in want) > 0 and sum(w.loaded for w in want) > 0


class _FailingStore:
    """Wraps the real store; the insert of the ``fail_at``-th requests block raises."""

    def __init__(self, inner, fail_at: int) -> None:
        self.inner, self.fail_at, self.requests_inserts = inner, fail_at, 0

    def insert(self, table, data, dedup_token=None):
        if table == "requests":
            self.requests_inserts += 1
            if self.requests_inserts == self.fail_at:
                from forumpulse.pipeline.store import StoreError

                raise StoreError("injected: the server went away")
        self.inner.insert(table, data, dedup_token=dedup_token)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def test_a_failed_background_insert_stops_ingestion_with_its_error_and_nothing_after_it(store, settings, tmp_path):
    """Inserts overlap the processing of the next chunk on a background thread: a failure there must reach the
    caller, and no later chunk may be stored (so a retry of the file resumes cleanly from deduplicated chunks)."""
    from forumpulse.pipeline.store import StoreError

    big = tmp_path / "big.log"
    big.write_bytes(MIXED.read_bytes() * 500)  # 5,000 lines
    settings.ingest.batch_lines = 1000  # 5 chunks
    failing = _FailingStore(store, fail_at=2)
    with pytest.raises(StoreError, match="injected"):
        ingest_paths(failing, settings, [str(big)], fmt="combined", workers=1)
    loaded_first_chunk = table_count(store, "requests")
    assert 0 < loaded_first_chunk < 1000  # only the first chunk's rows (600 parse, 400 quarantined per 1,000)
    assert failing.requests_inserts == 2  # chunks 3..5 never reached the store
    # re-running completes the file from where the stored blocks end (the ledger's checkpoint after each block),
    # nothing is doubled
    [c] = ingest_paths(store, settings, [str(big)], fmt="combined", workers=1)
    assert (c.skipped, c.read, c.loaded + c.quarantined) == (1000, 4000, 4000)
    assert table_count(store, "requests") + table_count(store, "quarantine") == 5000
    assert table_count(store, "requests") == 3000


class _MigrationFails:
    """Wraps the real store; the first migration statement raises (like a server refusing DDL)."""

    def __init__(self, inner) -> None:
        self.inner, self.inserts = inner, 0

    def command(self, sql):
        if sql.startswith("CREATE TABLE IF NOT EXISTS schema_migrations"):
            from forumpulse.pipeline.store import StoreError

            raise StoreError("injected: DDL refused")
        self.inner.command(sql)

    def insert(self, table, data, dedup_token=None):
        self.inserts += 1
        self.inner.insert(table, data, dedup_token=dedup_token)

    def __getattr__(self, name):
        return getattr(self.inner, name)


@pytest.mark.parametrize("lines", [0, 3000])
def test_a_failed_migration_is_raised_and_nothing_is_inserted(store, settings, tmp_path, lines):
    """Migrations run while the first chunks are parsed; their failure must still stop ingestion before any
    insert, also for an empty input (nothing to insert, the error must not be lost)."""
    from forumpulse.pipeline.store import StoreError

    f = tmp_path / "in.log"
    f.write_bytes(MIXED.read_bytes() * (lines // 10))
    settings.ingest.batch_lines = 1000
    failing = _MigrationFails(store)
    with pytest.raises(StoreError, match="DDL refused"):
        ingest_paths(failing, settings, [str(f)], fmt="combined")
    assert failing.inserts == 0


def test_a_gz_cut_short_loads_every_line_before_the_cut_and_reports_the_damage(tmp_path):
    """A truncated .gz (copied while being written, a broken download) loses nothing that can be decompressed:
    every complete line before the cut is loaded, the cut line is parsed or quarantined like any other, and the
    command says what happened and exits 1."""
    import gzip

    data = NASA.read_bytes() * 8
    whole = gzip.compress(data, 6)
    cut = tmp_path / "part.log.gz"
    cut.write_bytes(whole[: len(whole) * 2 // 3])
    # what an independent decompressor recovers before the cut
    d = __import__("zlib").decompressobj(31)
    recovered = d.decompress(cut.read_bytes())
    expected = recovered.count(b"\n") + (0 if recovered.endswith(b"\n") else 1)
    assert 1930 < expected < 8 * 1930
    exe = Path(sys.executable).with_name("forumpulse")
    cfg = tmp_path / "fp.yaml"
    cfg.write_text("retention:\n  raw_days: 0\n  rollup_days: 0\n")
    r = subprocess.run([str(exe), "ingest", "--config", str(cfg), "--store", f"chdb:{tmp_path / 'db'}",
                        "--format", "common", str(cut)], capture_output=True, timeout=300)
    assert r.returncode == 1, r.stderr.decode()
    assert "damaged or cut short" in r.stderr.decode()
    assert f"{cut}: read {expected:,}  " in r.stdout.decode()
    assert "Traceback" not in r.stderr.decode()


class _ReadOnly:
    """A reader without ``readinto`` (like the damage-tolerant .gz reader)."""

    def __init__(self, data: bytes) -> None:
        import io

        self._b = io.BytesIO(data)

    def read(self, n: int = -1) -> bytes:
        return self._b.read(n)


@pytest.mark.parametrize("cuts", ["native", "python"])
@pytest.mark.parametrize("reader", ["readinto", "read"])
def test_reader_blocks_are_the_lines_in_order_at_most_max_lines_each(reader, cuts, monkeypatch):
    """``_chunks`` (reused read buffer) against the plain definition: the input's lines, in order, grouped by
    ``max_lines`` (the last group shorter, a last line without newline kept), whatever the read size — reads
    that end mid-line, blocks bigger than a read, lines longer than a read, empty lines.  Both ways of finding
    the cuts (the native scanner's, Python's ``count``/``find``) are held to it."""
    import io
    import random

    from forumpulse.pipeline import native
    from forumpulse.pipeline.ingest import _chunks

    if cuts == "python":
        monkeypatch.setenv("FORUMPULSE_NATIVE", "0")
    else:
        assert native.scanner() is not None, native.status()

    rng = random.Random(7)
    for _ in range(400):
        data = bytes(rng.choice(b"ab\n\n") for _ in range(rng.randrange(0, 600)))
        if rng.random() < 0.3:
            data += b"x" * rng.randrange(1, 200)  # a long last line, maybe without newline
        max_lines, read_bytes = rng.randrange(1, 40), rng.randrange(1, 90)
        fh = io.BytesIO(data) if reader == "readinto" else _ReadOnly(data)
        got = list(_chunks(fh, max_lines, read_bytes))
        lines = data.splitlines(keepends=True)
        want = [b"".join(lines[i:i + max_lines]) for i in range(0, len(lines), max_lines)]
        assert [c for c, _ in got] == want, (data, max_lines, read_bytes)
        assert [n for _, n in got] == [len(c.splitlines()) for c in want]
