"""Offline tasks for the lessons: a character vocabulary and deterministic data generators.

Nothing here downloads anything: every data set is generated from a seed or read from ``data/``.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import random
import re
from pathlib import Path

import torch

from helpers._validate import as_int, positive_int, require_choice, require_type

PAD, BOS, EOS = "<pad>", "<s>", "</s>"


class Vocab:
    """Character vocabulary with <pad>=0, <s>=1, </s>=2, then the given symbols (lesson 01)."""

    def __init__(self, symbols):
        if isinstance(symbols, bytes) or not hasattr(symbols, "__iter__"):
            raise TypeError(f"symbols must be a string or an iterable of strings, got {type(symbols).__name__}")
        symbols = list(symbols)
        wrong = [s for s in symbols if not isinstance(s, str)]
        if wrong:
            raise TypeError(f"symbols must be strings, got {wrong[0]!r} ({type(wrong[0]).__name__})")
        symbols = sorted(set(symbols))
        clash = [s for s in symbols if s in (PAD, BOS, EOS)]
        if clash:
            raise ValueError(f"symbols may not contain the special tokens {clash}")
        self.itos = [PAD, BOS, EOS, *symbols]
        self.stoi = {s: i for i, s in enumerate(self.itos)}
        self.pad_id, self.bos_id, self.eos_id = 0, 1, 2

    def __len__(self) -> int:
        return len(self.itos)

    def __repr__(self) -> str:
        return f"Vocab({len(self)} tokens: {''.join(self.itos[3:])!r} + <pad> <s> </s>)"

    def encode(self, text: str, bos: bool = False, eos: bool = False) -> list[int]:
        """Token ids of ``text``, one per character, optionally framed by <s> and </s>."""
        ids = []
        for i, ch in enumerate(text):
            if ch not in self.stoi:
                raise ValueError(f"character {ch!r} at position {i} of {text!r} is not in the "
                                 f"vocabulary {''.join(self.itos[3:])!r}")
            ids.append(self.stoi[ch])
        return [self.bos_id] * bos + ids + [self.eos_id] * eos

    def decode(self, ids) -> str:
        """Text of ``ids``, stopping at the first </s> and skipping <pad> and <s>."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1 or ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool:
                raise ValueError(f"decode takes one sequence of integer ids, a 1-D tensor; got shape "
                                 f"{tuple(ids.shape)} dtype {ids.dtype} (decode a batch row by row)")
            ids = ids.tolist()
        ids = list(ids)
        for pos, i in enumerate(ids):
            as_int(i, f"the id at position {pos} (a token id of this vocabulary)", 0, len(self) - 1)
        out = []
        for i in ids:
            if i == self.eos_id:
                break
            if i not in (self.pad_id, self.bos_id):
                out.append(self.itos[i])
        return "".join(out)

    def batch(self, texts, bos: bool = False, eos: bool = False) -> torch.Tensor:
        """Encode several texts into one (B, L) LongTensor, right-padded with <pad>."""
        if isinstance(texts, str):
            raise TypeError(f"texts must be a list of strings, got the single string {texts!r}")
        rows = [self.encode(t, bos=bos, eos=eos) for t in texts]
        if not rows:
            raise ValueError("texts is empty: a batch needs at least one text")
        width = max(len(r) for r in rows)
        return torch.tensor([r + [self.pad_id] * (width - len(r)) for r in rows], dtype=torch.long)


DIGITS = Vocab("0123456789")


def digit_pairs(n: int, min_len: int, max_len: int, seed: int, task: str = "reverse"):
    """``n`` (source, target) digit strings with lengths uniform in [min_len, max_len] (lesson 01).

    task "reverse": target is the source reversed; task "copy": target equals the source.
    The same seed always gives the same pairs.
    """
    require_choice(task, "task", ("reverse", "copy"))
    n, min_len = as_int(n, "n", minimum=0), positive_int(min_len, "min_len")
    max_len = as_int(max_len, f"max_len (at least min_len={min_len})", minimum=min_len)
    rng = random.Random(seed)
    pairs = []
    for _ in range(n):
        src = "".join(rng.choice("0123456789") for _ in range(rng.randint(min_len, max_len)))
        pairs.append((src, src[::-1] if task == "reverse" else src))
    return pairs


# --- Human-readable dates -> ISO 8601 dates (lesson 08) -----------------------------------------
#
# Fixed English names: strftime's %A and %B follow the machine's locale, and the committed data
# files must come out byte-identical everywhere.
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september",
          "october", "november", "december")
WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")  # date.weekday()

# Fields of a date format: day d=3 dd=03 dth=3rd; month m=3 mm=03 month=march Month=March
# MONTH=MARCH mon=mar Mon=Mar MON=MAR; year yy=21 yyyy=2021; weekday=saturday Weekday=Saturday
# wdy=sat Wdy=Sat. Numeric formats with separators put the day before the month, so "03/04/2021" means
# 3 April; the compact {yyyy}{mm}{dd} keeps the ISO order (20210403).
DATE_FORMATS = (
    "{weekday}, {month} {d} {yyyy}",  # saturday, march 3 2021
    "{dth} of {Mon}. {yy}",  # 3rd of Mar. 21
    "{dd}/{mm}/{yyyy}",  # 03/03/2021
    "{d} {month} {yyyy}",  # 3 march 2021
    "{Mon} {d}, {yyyy}",  # Mar 3, 2021
    "{Month} {dth}, {yyyy}",  # March 3rd, 2021
    "{Wdy} {d} {Mon} {yyyy}",  # Sat 3 Mar 2021
    "{d}.{m}.{yy}",  # 3.3.21
    "{MONTH} {dd}, {yyyy}",  # MARCH 03, 2021
    "the {dth} of {month}, {yyyy}",  # the 3rd of march, 2021
    "{d}-{Mon}-{yyyy}",  # 3-Mar-2021
    "{Weekday} {d} {Month} {yyyy}",  # Saturday 3 March 2021
    "{yyyy}{mm}{dd}",  # 20210303
    "{dd} {MON} {yy}",  # 03 MAR 21
    "{mon} {d} '{yy}",  # mar 3 '21
)
# A two-digit year yy means 19yy for yy >= 50 and 20yy otherwise, so the range is 100 years.
FIRST_DATE, LAST_DATE = datetime.date(1950, 1, 1), datetime.date(2049, 12, 31)
DATES_SEED = 2017  # the seed of the committed files in data/
DATE_SPLITS = {"train": 30000, "valid": 1000, "test": 2000}  # rows per split, one date per row
TSV_HEADER = "source\ttarget"


class DataFileError(ValueError):
    """A data file that does not have the expected form; the message names the file and line (lesson 08)."""


def ordinal(n: int) -> str:
    """English ordinal of a day number: 1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st (lesson 08)."""
    suffix = "th" if 11 <= n % 100 <= 13 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def format_date(date: datetime.date, fmt: str) -> str:
    """Write ``date`` in the human-readable format ``fmt``, one of DATE_FORMATS (lesson 08)."""
    if isinstance(date, datetime.datetime):
        date = date.date()  # a datetime is a date with a time of day, which no format shows
    require_type(date, "date", datetime.date, "a datetime.date")
    require_type(fmt, "fmt", str, "a format string such as DATE_FORMATS[0]")
    if "{yy}" in fmt and not FIRST_DATE <= date <= LAST_DATE:
        raise ValueError(f"a two-digit year names a date in {FIRST_DATE}..{LAST_DATE} only, got {date}")
    month, weekday = MONTHS[date.month - 1], WEEKDAYS[date.weekday()]
    fields = dict(d=str(date.day), dd=f"{date.day:02d}", dth=ordinal(date.day),
                  m=str(date.month), mm=f"{date.month:02d}", yy=f"{date.year % 100:02d}",
                  yyyy=f"{date.year:04d}", month=month, Month=month.title(), MONTH=month.upper(),
                  mon=month[:3], Mon=month[:3].title(), MON=month[:3].upper(), weekday=weekday,
                  Weekday=weekday.title(), wdy=weekday[:3], Wdy=weekday[:3].title())
    try:
        return fmt.format(**fields)
    except (KeyError, IndexError) as err:
        raise ValueError(f"format {fmt!r} uses the unknown field {err}; known: {sorted(fields)}") from None


def make_date_splits(seed: int = DATES_SEED, sizes: dict | None = None) -> dict[str, list[tuple[str, str]]]:
    """Generate {split: [(human-readable date, ISO date)]} deterministically from ``seed`` (lesson 08).

    Every row has its own date, drawn without replacement from FIRST_DATE..LAST_DATE, so no date
    (and no row) appears in two splits; each row's format is uniform over DATE_FORMATS.
    """
    sizes = dict(DATE_SPLITS if sizes is None else sizes)
    n_dates = LAST_DATE.toordinal() - FIRST_DATE.toordinal() + 1
    if any(n < 0 for n in sizes.values()) or sum(sizes.values()) > n_dates:
        raise ValueError(f"split sizes {sizes} must be >= 0 and sum to at most {n_dates} (one date per row)")
    rng = random.Random(seed)
    ordinals = list(range(FIRST_DATE.toordinal(), LAST_DATE.toordinal() + 1))
    rng.shuffle(ordinals)
    splits, start = {}, 0
    for name, n in sizes.items():
        days = [datetime.date.fromordinal(o) for o in ordinals[start:start + n]]
        splits[name] = [(format_date(day, rng.choice(DATE_FORMATS)), day.isoformat()) for day in days]
        start += n
    return splits


def write_tsv(pairs, path) -> Path:
    """Write (source, target) pairs as a TSV file with the header ``source<TAB>target`` (lesson 08)."""
    path = Path(path)
    lines = [TSV_HEADER]
    for i, (src, tgt) in enumerate(pairs):
        if any(ch in field for field in (src, tgt) for ch in "\t\r\n"):
            raise ValueError(f"pair {i} {(src, tgt)!r} contains a tab or a line break")
        lines.append(f"{src}\t{tgt}")
    path.write_bytes(("\n".join(lines) + "\n").encode("utf-8"))
    return path


def write_date_splits(out_dir="data", seed: int = DATES_SEED) -> dict[str, Path]:
    """Write data/dates_{train,valid,test}.tsv exactly as committed (lesson 08)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    return {name: write_tsv(pairs, out_dir / f"dates_{name}.tsv")
            for name, pairs in make_date_splits(seed).items()}


def find_data_dir() -> Path:
    """The course's data/ folder: $COURSE_DATA_DIR, else data/README.md in the cwd or a parent (lesson 08)."""
    env = os.environ.get("COURSE_DATA_DIR", "").strip()
    if env:
        folder = Path(env).expanduser()
        if not (folder / "README.md").is_file():
            raise FileNotFoundError(f"COURSE_DATA_DIR={env!r} is not the course's data folder: "
                                    f"{folder / 'README.md'} does not exist")
        return folder
    cwd = Path.cwd().resolve()
    # the notebooks run in notebooks/ or notebooks/solutions/; on Colab helpers is installed
    # into site-packages, so its own path does not lead to data/, but the cwd does
    for base in (cwd, *cwd.parents):
        if (base / "data" / "README.md").is_file():
            return base / "data"
    beside = Path(__file__).resolve().parents[1] / "data"  # an editable install
    if (beside / "README.md").is_file():
        return beside
    raise FileNotFoundError(f"found no data/README.md in {cwd} or its parents, nor in {beside.parent}; "
                            "run from inside the course folder or set COURSE_DATA_DIR=/path/to/data")


_ISO_DATE = re.compile(r"\d{4}-\d{2}-\d{2}")


def read_date_tsv(path) -> list[tuple[str, str]]:
    """Read and check a dates TSV file into (source, ISO target) pairs; errors name file and line (lesson 08)."""
    require_type(path, "path", (str, os.PathLike), "a str or a pathlib.Path")
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file {path}")
    try:
        text = path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        line = path.read_bytes()[:err.start].count(b"\n") + 1
        raise DataFileError(f"{path}, line {line}: the file is not UTF-8 text (byte {err.object[err.start]:#04x} "
                            f"at offset {err.start}); save it as UTF-8") from None
    lines = text.split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last line
    if not lines or lines[0].rstrip("\r") != TSV_HEADER:
        got = repr(lines[0]) if lines else "an empty file"
        raise DataFileError(f"{path}, line 1: expected the header {TSV_HEADER!r}, got {got}")
    pairs = []
    for number, line in enumerate(lines[1:], start=2):
        fields = line.rstrip("\r").split("\t")  # tolerate Windows line ends
        if len(fields) != 2:
            raise DataFileError(f"{path}, line {number}: expected 2 tab-separated columns (source, target), "
                                f"got {len(fields)}: {line!r}")
        src, tgt = fields
        if not src.strip() or not tgt.strip():
            raise DataFileError(f"{path}, line {number}: empty {'source' if not src.strip() else 'target'} "
                                f"field: {line!r}")
        try:
            ok = bool(_ISO_DATE.fullmatch(tgt)) and datetime.date.fromisoformat(tgt) is not None
        except ValueError:
            ok = False
        if not ok:
            raise DataFileError(f"{path}, line {number}: target {tgt!r} is not a valid ISO date YYYY-MM-DD")
        pairs.append((src, tgt))
    if not pairs:
        raise DataFileError(f"{path}: the file has a header but no rows")
    return pairs


def load_dates(split: str, data_dir=None) -> list[tuple[str, str]]:
    """(source, target) pairs of the dates split 'train', 'valid' or 'test' from data/ (lesson 08)."""
    require_choice(split, "split", list(DATE_SPLITS))
    folder = find_data_dir() if data_dir is None else Path(data_dir)
    path = folder / f"dates_{split}.tsv"
    pairs = read_date_tsv(path)  # first the line-by-line checks, whose errors say which line is wrong
    check_sha256(path)
    return pairs


def _remake(name: str) -> str:
    """How to make a data file again, in words, for its sha256 error (lesson 08)."""
    if name.startswith("dates_"):
        return "regenerate it with helpers.data.write_date_splits('data')"
    if name == TEXT_FILE:
        return "rebuild it with data/make_shakespeare.py (its docstring has the commands)"
    if name.startswith("minilm_reference"):
        return "rebuild it with data/minilm_reference.py (its docstring has the commands)"
    if name.startswith("gpt_shakespeare"):
        return ("if you re-trained the model on purpose (make train-gpt writes the checkpoint and its log), "
                f"put the new sha256 of {name} in its row of data/README.md")
    return "make it again as data/README.md describes"


def check_sha256(path) -> None:
    """Raise DataFileError unless the file's sha256 is the one data/README.md beside it lists, and
    FileNotFoundError if the file is missing (lesson 08): the one check of every shipped data file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no data file {path}: restore it from the repository (git checkout HEAD -- "
                                f"{path.name}, run in {path.parent})")
    readme = path.parent / "README.md"
    if not readme.is_file():
        raise FileNotFoundError(f"{readme} does not exist: it lists the sha256 that {path.name} is checked against")
    listed = re.search(rf"`{re.escape(path.name)}` \| \d+ \| \d+ \| `([0-9a-f]{{64}})`", readme.read_text("utf-8"))
    if listed is None:
        raise DataFileError(f"{readme} lists no sha256 for {path.name} (a table row "
                            f"| `{path.name}` | rows | bytes | `sha256` |)")
    data = path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != listed.group(1):
        restore = f"rm {path} && git checkout HEAD -- {path.name} (run in {path.parent})"
        if b"\r\n" in data and hashlib.sha256(data.replace(b"\r\n", b"\n")).hexdigest() == listed.group(1):
            raise DataFileError(f"{path} has Windows line ends (CRLF), written by a git checkout with "
                                f"core.autocrlf=true; its sha256 is {actual}, {readme.name} lists {listed.group(1)}. "
                                f"Restore it with its own line ends: {restore} (the repository's .gitattributes "
                                "keeps data files byte-exact)")
        raise DataFileError(f"{path} differs from the committed file: its sha256 is {actual}, {readme.name} "
                            f"lists {listed.group(1)}; restore it: {restore}, or {_remake(path.name)}")


def char_vocabs(pairs) -> tuple[Vocab, Vocab]:
    """Character vocabularies (source, target) of the characters seen in ``pairs`` (lesson 08)."""
    pairs = list(pairs)
    if not pairs:
        raise ValueError("pairs is empty: need at least one (source, target) pair")
    return Vocab("".join(s for s, _ in pairs)), Vocab("".join(t for _, t in pairs))


# --- English text for the GPT of lesson 12 ------------------------------------------------------

TEXT_FILE = "shakespeare.txt"  # ten plays of Shakespeare as plain ASCII text (data/README.md says whence)
TEXT_SPLITS = {"train": 0.90, "valid": 0.05, "test": 0.05}  # shares of the text, in this order


def load_text(split: str, data_dir=None) -> str:
    """The 'train', 'valid' or 'test' part of data/shakespeare.txt, disjoint and in that order (lesson 12).

    The parts are consecutive: each cut lies at the first blank line after its share of the text,
    so no speech is split between two parts. The file's sha256 is checked first.
    """
    require_choice(split, "split", list(TEXT_SPLITS))
    path = (find_data_dir() if data_dir is None else Path(data_dir)) / TEXT_FILE
    check_sha256(path)
    text = path.read_bytes().decode("ascii")
    cuts, share = [0], 0.0
    for name in list(TEXT_SPLITS)[:-1]:
        share += TEXT_SPLITS[name]
        cuts.append(text.index("\n\n", int(share * len(text))) + 2)  # just after a blank line
    cuts.append(len(text))
    i = list(TEXT_SPLITS).index(split)
    return text[cuts[i]:cuts[i + 1]]
