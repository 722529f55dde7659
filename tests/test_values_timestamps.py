"""The batch CLF timestamp converter used by the fast path equals the per-value reference, value for value."""

from __future__ import annotations

from forumpulse.pipeline.formats import _values as V
from hypothesis import given, settings
from hypothesis import strategies as st

_DAY = st.sampled_from(["01", "09", "10", "28", "29", "30", "31", "00", "32", "1", "99"])
_MON = st.sampled_from(["Jan", "Feb", "Jun", "Oct", "Dec", "feb", "DEC", "Foo", "Ja"])
_YEAR = st.sampled_from(["1899", "1900", "1970", "2000", "2024", "2199", "2200", "2201", "0000"])
_TWO = st.sampled_from(["00", "09", "13", "23", "24", "59", "60", "61", "ab"])
_ZONE = st.sampled_from(["+0000", "-0700", "+1400", "-9999", "+0059", "-05:00", "Z"])


@st.composite
def clf_texts(draw: st.DrawFn) -> str:
    t = f"{draw(_DAY)}/{draw(_MON)}/{draw(_YEAR)}:{draw(_TWO)}:{draw(_TWO)}:{draw(_TWO)}"
    if draw(st.booleans()) and draw(st.booleans()):
        t += "." + draw(st.sampled_from(["1", "123", "123456789"]))
    t += " " + draw(_ZONE)
    if draw(st.booleans()):
        t = "[" + t
    if draw(st.booleans()):
        t += "]"
    if draw(st.integers(0, 20)) == 0:
        t = t.replace("1", "\u0661")  # an Arabic-Indic digit: not a digit to the ASCII reference
    return t


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(clf_texts(), st.text(max_size=30)), max_size=40))
def test_batch_clf_conversion_equals_the_reference_per_value(texts: list[str]) -> None:
    V._clf_day.clear()
    assert V.clf_timestamps_ms(texts) == [V.clf_timestamp_ms(t) for t in texts]


def test_batch_clf_conversion_known_values() -> None:
    assert V.clf_timestamps_ms(["10/Oct/2000:13:55:36 -0700", "[31/Dec/1999:23:59:60 +0000]", "30/Feb/2000:00:00:00 +0000"]) == [
        971211336000, 946684800000, None]


@settings(max_examples=400, deadline=None)
@given(st.lists(st.one_of(clf_texts(), st.text(max_size=30)), max_size=60))
def test_columnar_clf_conversion_equals_the_batch_converter(texts: list[str]) -> None:
    """The fast path's NumPy conversion (distinct values as byte columns) gives the batch converter's values,
    nulls where it gives None, for well-formed, malformed and out-of-range texts alike."""
    import pyarrow as pa
    from forumpulse.pipeline.fastpath import _clf_column

    V._clf_day.clear()
    got = _clf_column(pa.array(texts, pa.string()).cast(pa.string_view())).to_pylist()
    assert got == V.clf_timestamps_ms(texts)


def test_columnar_clf_conversion_known_values() -> None:
    import pyarrow as pa
    from forumpulse.pipeline.fastpath import _clf_column

    texts = ["10/Oct/2000:13:55:36 -0700", "[31/Dec/1999:23:59:60 +0000]", "30/Feb/2000:00:00:00 +0000",
             "10/Oct/2000:24:00:00 -0700", "10/Oct/2000:13:55:36 -0700", "[10/Oct/2000:13:55:36 -0700",
             "10/Oct/2000:13:55:36.123 -0700", "01/Jan/1900:00:00:00 +0100"]
    got = _clf_column(pa.array(texts, pa.string()).cast(pa.string_view())).to_pylist()
    assert got == [971211336000, 946684800000, None, None, 971211336000, 971211336000, 971211336123,
                   V.clf_timestamp_ms("01/Jan/1900:00:00:00 +0100")]
