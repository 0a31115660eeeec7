"""Token data (trainscale.data.tokens): the shipped byte corpus, nanoGPT's and llm.c's files
written in their real formats, the pre-flight checks, and the windows each rank reads."""

import numpy as np
import pytest

from trainscale.data import tokens


def test_the_corpus_is_real_text_split_nine_to_one():
    train, val = tokens.byte_corpus()
    assert len(train) + len(val) == 1_036_481
    assert abs(len(val) / (len(train) + len(val)) - 0.1) < 1e-5
    text = bytes(train[:2000]).decode("ascii")
    assert "HAMLET" in text and "Elsinore" in text
    assert int(train.max()) < tokens.BYTE_VOCAB


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_nanogpt_and_llmc_files_are_told_apart_by_the_magic(tmp_path, dtype):
    ids = np.arange(5000) % 300
    bare = tokens.open_tokens(tokens.write_nanogpt(ids, tmp_path / "a.bin", dtype), dtype)
    shard = tokens.open_tokens(tokens.write_llmc(ids, tmp_path / "b.bin", dtype))  # no dtype given
    for f in (bare, shard):
        assert f.tokens == 5000 and f.dtype == np.dtype(dtype)
        assert np.array_equal(f.ids(), ids)
    assert (bare.offset, shard.offset) == (0, 1024)
    header = np.fromfile(tmp_path / "b.bin", dtype=np.int32, count=3)
    assert header.tolist() == [20240520 if dtype == "uint16" else 20240801,
                               1 if dtype == "uint16" else 7, 5000]  # fmt: skip


def test_header_none_reads_a_shard_as_bare_ids(tmp_path):
    path = tokens.write_llmc(np.arange(600), tmp_path / "s.bin")
    assert tokens.open_tokens(path, header="none").tokens == 512 + 600


def test_bad_files_name_the_key_and_the_fix(tmp_path):
    with pytest.raises(tokens.TokenDataError, match="datasets.mine.train: .* does not exist"):
        tokens.open_tokens(tmp_path / "nope.bin", where="datasets.mine.train")
    odd = tmp_path / "odd.bin"
    odd.write_bytes(b"\x01\x00\x02")
    with pytest.raises(tokens.TokenDataError, match="not a whole number of uint16 tokens"):
        tokens.open_tokens(odd)
    with pytest.raises(tokens.TokenDataError, match="no llm.c header"):
        tokens.open_tokens(tokens.write_nanogpt(np.arange(600), tmp_path / "n.bin"), header="llmc")
    cut = tmp_path / "cut.bin"
    cut.write_bytes(tokens.write_llmc(np.arange(600), tmp_path / "c.bin").read_bytes()[:-2])
    with pytest.raises(tokens.TokenDataError, match="header says 600 tokens"):
        tokens.open_tokens(cut)


def test_preflight_finds_ids_beyond_the_vocabulary_and_too_few_tokens(tmp_path):
    from trainscale.data import tokensets

    f = tokens.open_tokens(tokens.write_nanogpt(np.arange(1000), tmp_path / "t.bin"))
    assert tokens.check(f, vocab_size=1000, where="k") == []
    (big,) = tokens.check(f, vocab_size=500, where="datasets.x.train")
    assert "holds id 999, not below vocab_size 500" in big and big.startswith("datasets.x.train")
    source = tokens.TokenSource(str(f.path), str(f.path), 1000)
    info = tokensets.info("x", source, 10)  # 1000 ids: 99 windows of 10
    assert tokensets.short("x", info, 10, ranks=3, batch=33) is None
    few = tokensets.short("x", info, 10, ranks=2, batch=50)
    assert "fewer than one batch of 50 for each of 2 ranks (1001 tokens)" in few


def test_ranks_read_disjoint_seeded_windows_that_cover_the_epoch():
    count = tokens.window_count(10_001, 100)
    assert count == 100
    parts = [tokens.rank_windows(count, r, 3, seed=0, epoch=1) for r in range(3)]
    assert all(len(p) == 33 for p in parts)
    joined = np.concatenate(parts)
    assert len(set(joined.tolist())) == 99  # disjoint; one window left so all ranks get 33
    again = tokens.rank_windows(count, 1, 3, seed=0, epoch=1)
    assert np.array_equal(again, parts[1])
    assert not np.array_equal(tokens.rank_windows(count, 1, 3, seed=0, epoch=2), parts[1])


def test_windows_are_inputs_and_next_token_targets():
    ids = np.arange(1000) * 7
    x, y = tokens.window_batch(ids, np.array([0, 3]), seq_len=10)
    assert x.shape == y.shape == (2, 10) and x.dtype == np.int64
    assert x[1].tolist() == (np.arange(30, 40) * 7).tolist()
    assert y[1].tolist() == (np.arange(31, 41) * 7).tolist()
