"""helpers.data, dates task: the committed files, their checks, the generator and the loaders."""

import datetime
import hashlib
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from helpers import data
from helpers.data import (
    DATE_FORMATS,
    DATE_SPLITS,
    DIGITS,
    FIRST_DATE,
    LAST_DATE,
    DataFileError,
    Vocab,
    char_vocabs,
    digit_pairs,
    find_data_dir,
    format_date,
    load_dates,
    make_date_splits,
    ordinal,
    read_date_tsv,
    write_date_splits,
    write_tsv,
)

DATA = Path(__file__).resolve().parents[1] / "data"
FILES = [f"dates_{split}.tsv" for split in DATE_SPLITS]

# --- an oracle written independently of the generator: read a source back into a date ----------
MONTH_NAMES = ["january", "february", "march", "april", "may", "june", "july", "august",
               "september", "october", "november", "december"]
DAY_NAMES = ["monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday"]


def parse_source(text: str) -> datetime.date:
    """Read any of the dataset's formats back into a date, checking weekday and ordinal suffix."""
    words = re.findall(r"[a-z]+", text.lower())
    numbers = re.findall(r"(\d+)(st|nd|rd|th)?", text)
    months = [MONTH_NAMES.index(w) + 1 for w in words if w in MONTH_NAMES]
    months += [[n[:3] for n in MONTH_NAMES].index(w) + 1 for w in words if len(w) == 3 and w in
               [n[:3] for n in MONTH_NAMES] and w not in MONTH_NAMES]  # "may" is both
    days = [w for w in words if w in DAY_NAMES or w in [d[:3] for d in DAY_NAMES]]
    others = set(words) - set(MONTH_NAMES) - {n[:3] for n in MONTH_NAMES} - set(DAY_NAMES) - {
        d[:3] for d in DAY_NAMES} - {"the", "of", "st", "nd", "rd", "th"}
    assert not others, f"unexpected words {others} in {text!r}"
    if months:  # month written as a word: the first number is the day, the last the year
        assert len(months) == 1 and len(numbers) == 2, text
        (day, suffix), (year, _) = numbers
        month = months[0]
    elif len(numbers) == 1:  # yyyymmdd
        digits = numbers[0][0]
        assert len(digits) == 8, text
        year, month, day, suffix = digits[:4], int(digits[4:6]), digits[6:], ""
    else:  # day first: d.m.yy or dd/mm/yyyy
        assert len(numbers) == 3, text
        (day, suffix), (month, _), (year, _) = numbers
        month = int(month)
    year = int(year) if len(year) == 4 else (1900 if int(year) >= 50 else 2000) + int(year)
    date = datetime.date(year, month, int(day))
    if suffix:
        want = {1: "st", 2: "nd", 3: "rd"}.get(int(day) % 10, "th") if int(day) not in (11, 12, 13) else "th"
        assert suffix == want, f"wrong ordinal suffix in {text!r}"
    if days:
        assert len(days) == 1 and days[0][:3] == DAY_NAMES[date.weekday()][:3], f"wrong weekday in {text!r}"
    return date


def readme_sums() -> dict[str, str]:
    text = (DATA / "README.md").read_text()
    return dict(re.findall(r"`(dates_\w+\.tsv)` \| \d+ \| \d+ \| `([0-9a-f]{64})`", text))


# --- the committed files -----------------------------------------------------------------------
def test_splits_regenerate_byte_identically(tmp_path):
    paths = write_date_splits(tmp_path, seed=data.DATES_SEED)
    assert sorted(p.name for p in paths.values()) == sorted(FILES)
    for name in FILES:
        assert (tmp_path / name).read_bytes() == (DATA / name).read_bytes(), f"{name} differs from a regeneration"


def test_sha256_and_sizes_match_the_readme():
    sums = readme_sums()
    assert sorted(sums) == sorted(FILES), "data/README.md must list a sha256 for every dates file"
    readme = (DATA / "README.md").read_text()
    for name in FILES:
        blob = (DATA / name).read_bytes()
        assert hashlib.sha256(blob).hexdigest() == sums[name], f"{name}: sha256 differs from data/README.md"
        rows = blob.count(b"\n") - 1
        assert f"`{name}` | {rows} | {len(blob)} |" in readme, f"{name}: row count or size differs from the README"
        assert len(blob) < 1_000_000, f"{name} is {len(blob)} bytes; keep data files small"


def test_split_sizes_and_no_overlap():
    splits = {split: load_dates(split, DATA) for split in DATE_SPLITS}
    assert {k: len(v) for k, v in splits.items()} == DATE_SPLITS
    for a in DATE_SPLITS:
        assert len({s for s, _ in splits[a]}) == len(splits[a]), f"duplicate sources in {a}"
        for b in DATE_SPLITS:
            if a < b:
                assert not {t for _, t in splits[a]} & {t for _, t in splits[b]}, f"{a} and {b} share a date"
                assert not {s for s, _ in splits[a]} & {s for s, _ in splits[b]}, f"{a} and {b} share a row"


def test_every_target_is_a_real_date_that_its_source_denotes():
    seen_formats = set()
    for split in DATE_SPLITS:
        for src, tgt in load_dates(split, DATA):
            date = datetime.date.fromisoformat(tgt)
            assert FIRST_DATE <= date <= LAST_DATE
            assert parse_source(src) == date, f"{src!r} does not denote {tgt}"
            seen_formats.add(re.sub(r"[a-z]+|\d+", "w", src.lower()))
    assert len(seen_formats) >= 12  # the formats really vary


def test_spot_checks():
    d = datetime.date(2021, 3, 3)  # a Wednesday
    assert format_date(d, "{weekday}, {month} {d} {yyyy}") == "wednesday, march 3 2021"
    assert format_date(d, "{dth} of {Mon}. {yy}") == "3rd of Mar. 21"
    assert format_date(d, "{dd}/{mm}/{yyyy}") == "03/03/2021"
    assert format_date(datetime.date(1999, 12, 31), "{d}.{m}.{yy}") == "31.12.99"
    assert [ordinal(n) for n in (1, 2, 3, 4, 11, 12, 13, 21, 22, 23, 31)] == [
        "1st", "2nd", "3rd", "4th", "11th", "12th", "13th", "21st", "22nd", "23rd", "31st"]
    pairs = dict(load_dates("train", DATA))
    assert pairs["the 18th of june, 1965"] == "1965-06-18"


@given(st.dates(FIRST_DATE, LAST_DATE), st.sampled_from(DATE_FORMATS))
def test_every_format_reads_back(date, fmt):
    assert parse_source(format_date(date, fmt)) == date


def test_format_date_errors():
    with pytest.raises(ValueError, match=r"two-digit year .* got 2050-01-01"):
        format_date(datetime.date(2050, 1, 1), "{d}.{m}.{yy}")
    with pytest.raises(ValueError, match=r"unknown field 'day'"):
        format_date(datetime.date(2000, 1, 1), "{day}")
    with pytest.raises(TypeError, match=r"datetime.date, got str"):
        format_date("2000-01-01", "{d}")


def test_format_date_takes_a_datetime_as_its_date():
    moment = datetime.datetime(2021, 3, 3, 23, 59)
    for fmt in DATE_FORMATS:
        assert format_date(moment, fmt) == format_date(datetime.date(2021, 3, 3), fmt)


def test_generator_is_deterministic_and_seeded():
    a = make_date_splits(seed=5, sizes={"train": 50, "test": 20})
    assert a == make_date_splits(seed=5, sizes={"train": 50, "test": 20})
    assert a != make_date_splits(seed=6, sizes={"train": 50, "test": 20})
    assert [len(v) for v in a.values()] == [50, 20]
    assert len(DATE_FORMATS) == 15 and len(set(DATE_FORMATS)) == 15
    with pytest.raises(ValueError, match=r"sum to at most 36525"):
        make_date_splits(sizes={"train": 36525, "test": 1})


# --- malformed files ---------------------------------------------------------------------------
@pytest.mark.parametrize("body, message", [
    ("source\ttarget\n3 march 2021\t2021-03-03\tx\n", r"bad\.tsv, line 2: expected 2 tab-separated columns.*got 3"),
    ("source\ttarget\nok\t2021-03-03\n3 march 2021\n", r"bad\.tsv, line 3: expected 2 tab-separated columns.*got 1"),
    ("source\ttarget\n\t2021-03-03\n", r"bad\.tsv, line 2: empty source field"),
    ("source\ttarget\n3 march 2021\t\n", r"bad\.tsv, line 2: empty target field"),
    ("source\ttarget\n30 feb 2021\t2021-02-30\n", r"bad\.tsv, line 2: target '2021-02-30' is not a valid ISO date"),
    ("source\ttarget\nx\t03/03/2021\n", r"bad\.tsv, line 2: target '03/03/2021' is not a valid ISO date"),
    ("source\ttarget\nx\t2021-3-3\n", r"bad\.tsv, line 2: target '2021-3-3' is not a valid ISO date"),
    ("src,tgt\nx\t2021-03-03\n", r"bad\.tsv, line 1: expected the header"),
    ("", r"bad\.tsv, line 1: expected the header .*, got an empty file"),
    ("source\ttarget\n", r"bad\.tsv: the file has a header but no rows"),
])
def test_malformed_files_name_file_and_line(tmp_path, body, message):
    path = tmp_path / "bad.tsv"
    path.write_text(body, encoding="utf-8")
    with pytest.raises(DataFileError, match=message):
        read_date_tsv(path)


def test_windows_line_ends_are_read(tmp_path):
    path = tmp_path / "crlf.tsv"
    path.write_bytes(b"source\ttarget\r\n3 march 2021\t2021-03-03\r\n")
    assert read_date_tsv(path) == [("3 march 2021", "2021-03-03")]


def test_write_tsv_round_trip_and_refuses_tabs(tmp_path):
    pairs = [("3 march 2021", "2021-03-03"), ("Mar 4, 2021", "2021-03-04")]
    assert read_date_tsv(write_tsv(pairs, tmp_path / "x.tsv")) == pairs
    with pytest.raises(ValueError, match=r"pair 0 .* contains a tab"):
        write_tsv([("a\tb", "2021-03-03")], tmp_path / "y.tsv")


# --- finding data/ and building vocabularies ---------------------------------------------------
def test_find_data_dir_from_notebook_folders(monkeypatch):
    monkeypatch.delenv("COURSE_DATA_DIR", raising=False)
    for cwd in (DATA.parent / "notebooks", DATA.parent / "notebooks" / "solutions", DATA.parent):
        if cwd.is_dir():
            monkeypatch.chdir(cwd)
            assert find_data_dir() == DATA


def test_find_data_dir_searches_cwd_before_the_module(tmp_path, monkeypatch):
    """On Colab helpers sits in site-packages: the cwd's parents must lead to data/."""
    monkeypatch.delenv("COURSE_DATA_DIR", raising=False)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "README.md").write_text("copy")
    (tmp_path / "notebooks" / "solutions").mkdir(parents=True)
    monkeypatch.chdir(tmp_path / "notebooks" / "solutions")
    assert find_data_dir() == (tmp_path / "data").resolve()


def test_find_data_dir_env_override(tmp_path, monkeypatch):
    monkeypatch.setenv("COURSE_DATA_DIR", str(tmp_path))
    with pytest.raises(FileNotFoundError, match=r"COURSE_DATA_DIR=.*README\.md does not exist"):
        find_data_dir()
    (tmp_path / "README.md").write_text("x")
    blob = write_tsv([("3 march 2021", "2021-03-03")], tmp_path / "dates_test.tsv").read_bytes()
    assert find_data_dir() == tmp_path
    with pytest.raises(DataFileError, match=r"README\.md lists no sha256 for dates_test\.tsv"):
        load_dates("test")
    digest = hashlib.sha256(blob).hexdigest()
    (tmp_path / "README.md").write_text(f"| `dates_test.tsv` | 1 | {len(blob)} | `{digest}` |")
    assert load_dates("test") == [("3 march 2021", "2021-03-03")]
    with pytest.raises(ValueError, match=r"split must be one of \['train', 'valid', 'test'\], got 'dev'"):
        load_dates("dev")


def test_find_data_dir_reports_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.delenv("COURSE_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(data, "__file__", str(tmp_path / "site-packages" / "helpers" / "data.py"))
    with pytest.raises(FileNotFoundError, match=r"found no data/README\.md in .* set COURSE_DATA_DIR"):
        find_data_dir()


def test_char_vocabs_cover_every_split():
    train = load_dates("train", DATA)
    src_vocab, tgt_vocab = char_vocabs(train)
    assert tgt_vocab.itos == ["<pad>", "<s>", "</s>", *"-0123456789"]
    assert {"a", "M", "/", ".", "'", ",", " ", "0"} <= set(src_vocab.itos)
    for split in ("valid", "test"):  # every character of held-out data is known
        for src, tgt in load_dates(split, DATA):
            assert src_vocab.decode(src_vocab.encode(src)) == src
            assert tgt_vocab.decode(tgt_vocab.encode(tgt, bos=True, eos=True)) == tgt
    with pytest.raises(ValueError, match=r"pairs is empty"):
        char_vocabs([])


def test_lesson_01_pieces_unchanged():
    assert DIGITS.itos == ["<pad>", "<s>", "</s>", *"0123456789"] and isinstance(DIGITS, Vocab)
    assert digit_pairs(3, 2, 4, seed=0) == digit_pairs(3, 2, 4, seed=0)
    assert all(t == s[::-1] for s, t in digit_pairs(20, 1, 6, seed=1))


def test_vocab_decode_round_trip_and_bad_ids():
    ids = DIGITS.encode("4071", bos=True, eos=True) + [DIGITS.pad_id, 5]
    assert DIGITS.decode(ids) == "4071" and DIGITS.decode(torch.tensor(ids)) == "4071"
    assert DIGITS.decode(np.array(ids)) == "4071"  # numpy integers are ids too
    with pytest.raises(ValueError, match=r"the id at position 1 \(a token id of this vocabulary\) must be an int "
                                         r"in \[0, 12\], got -1"):
        DIGITS.decode([3, -1])  # not the last symbol, as Python's negative indexing would give
    with pytest.raises(ValueError, match=r"the id at position 0 .* got 40$"):
        DIGITS.decode(torch.tensor([40]))
    with pytest.raises(ValueError, match=r"the id at position 0 .* got 3.0$"):
        DIGITS.decode([3.0])
    with pytest.raises(ValueError, match=r"1-D tensor; got shape \(2, 3\) dtype torch.int64 \(decode a batch row"):
        DIGITS.decode(torch.full((2, 3), 4))
    with pytest.raises(ValueError, match=r"got shape \(3,\) dtype torch.float32"):
        DIGITS.decode(torch.ones(3))


def test_vocab_batch_pads_and_refuses_empty_input():
    assert DIGITS.batch(["12", "3"], eos=True).tolist() == [[4, 5, 2], [6, 2, 0]]
    with pytest.raises(ValueError, match=r"texts is empty: a batch needs at least one text"):
        DIGITS.batch([])
    with pytest.raises(TypeError, match=r"a list of strings, got the single string '12'"):
        DIGITS.batch("12")
