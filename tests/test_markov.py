"""Markov models, the skip model and masking (minitransformer.markov, chapters 2 and 3), and the
chain figure (minitransformer.plot.chain_graph)."""

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from minitransformer import (  # noqa: E402
    SkipModel,
    Vocabulary,
    chain_graph,
    walk_chain,
    second_order_matrix,
    transition_matrix,
)

COMMANDS = ["Show me my directories please.", "Show me my files please.",
            "Show me my photos please."]
COMMAND_SHARES = [0.2, 0.3, 0.5]
RAN = ["Check whether the battery ran down please.", "Check whether the program ran please."]
RAN_SHARES = [0.4, 0.6]
LOGS = ["Check the program log and find out whether it ran please.",
        "Check the battery log and find out whether it ran down please."]
PROGRAM_PREFIX = "Check the program log and find out whether it ran"
BATTERY_PREFIX = "Check the battery log and find out whether it ran"


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def _row(matrix, vocab, word):
    return dict(zip(vocab.words, matrix[vocab.index(word)].round(10)))


def _nonzero(values, vocab):
    return {vocab[i]: float(values[i]) for i in np.flatnonzero(values)}


# --- the book's numbers -------------------------------------------------------------------

def test_the_only_branch_of_the_three_commands_is_after_my():
    vocab = Vocabulary.from_sentences(COMMANDS)
    matrix = transition_matrix(COMMANDS, vocab, weights=COMMAND_SHARES)
    assert len(vocab) == 7 and matrix.shape == (7, 7)
    assert _nonzero(matrix[vocab.index("my")], vocab) == pytest.approx(
        {"directories": 0.2, "files": 0.3, "photos": 0.5})
    assert _nonzero(matrix[vocab.index("show")], vocab) == {"me": 1.0}
    assert _nonzero(matrix[vocab.index("photos")], vocab) == {"please": 1.0}
    assert not matrix[vocab.index("please")].any()  # the last word is never followed
    assert matrix.sum(axis=1) == pytest.approx([1, 1, 1, 1, 1, 0, 1])


def test_weights_are_shares_so_their_scale_does_not_matter():
    vocab = Vocabulary.from_sentences(COMMANDS)
    np.testing.assert_allclose(transition_matrix(COMMANDS, vocab, weights=[2, 3, 5]),
                               transition_matrix(COMMANDS, vocab, weights=COMMAND_SHARES))
    equal = transition_matrix(COMMANDS, vocab)
    assert equal[vocab.index("my"), vocab.index("files")] == pytest.approx(1 / 3)


def test_sentences_may_be_given_as_word_lists():
    vocab = Vocabulary.from_sentences(COMMANDS)
    as_lists = [s.lower().rstrip(".").split() for s in COMMANDS]
    np.testing.assert_array_equal(transition_matrix(as_lists, vocab),
                                  transition_matrix(COMMANDS, vocab))


def test_first_order_is_unsure_after_ran_and_second_order_is_certain():
    vocab = Vocabulary.from_sentences(RAN)
    n = len(vocab)
    first = transition_matrix(RAN, vocab, weights=RAN_SHARES)
    assert _nonzero(first[vocab.index("ran")], vocab) == pytest.approx({"down": 0.4, "please": 0.6})
    second = second_order_matrix(RAN, vocab, weights=RAN_SHARES)
    assert second.shape == (n * n, n)
    battery_ran = vocab.index("battery") * n + vocab.index("ran")
    program_ran = vocab.index("program") * n + vocab.index("ran")
    assert _nonzero(second[battery_ran], vocab) == {"down": 1.0}
    assert _nonzero(second[program_ran], vocab) == {"please": 1.0}
    # one branch is left: after (whether, the) comes battery or program
    fractional = [i for i in range(n * n) if np.any((second[i] > 0) & (second[i] < 1))]
    assert fractional == [vocab.index("whether") * n + vocab.index("the")]
    assert _nonzero(second[fractional[0]], vocab) == pytest.approx({"battery": 0.4, "program": 0.6})


def test_second_order_pair_row_is_earlier_times_n_plus_recent():
    vocab = Vocabulary(["a", "b", "c"])
    second = second_order_matrix(["a b c", "b a a"], vocab)
    assert _nonzero(second[0 * 3 + 1], vocab) == {"c": 1.0}   # (a, b) -> c
    assert _nonzero(second[1 * 3 + 0], vocab) == {"a": 1.0}   # (b, a) -> a
    assert second.sum() == pytest.approx(2.0)


def test_skip_model_votes_four_to_five_and_masking_makes_it_certain():
    vocab = Vocabulary.from_sentences(LOGS)
    model = SkipModel(LOGS, vocab)
    n = len(vocab)
    assert model.table.shape == (n * n, n)
    assert _nonzero(model.votes(PROGRAM_PREFIX), vocab) == {"down": 4.0, "please": 5.0}
    assert _nonzero(model.votes(BATTERY_PREFIX), vocab) == {"down": 5.0, "please": 4.0}
    mask = np.zeros(n * n, dtype=bool)
    mask[model.feature_index("battery", "ran")] = True
    mask[model.feature_index("program", "ran")] = True
    assert _nonzero(model.votes(PROGRAM_PREFIX, mask), vocab) == {"please": 1.0}
    assert _nonzero(model.votes(BATTERY_PREFIX, mask), vocab) == {"down": 1.0}
    np.testing.assert_array_equal(model.votes(PROGRAM_PREFIX, mask.astype(float)),
                                  model.votes(PROGRAM_PREFIX, mask))


def test_skip_table_rows_for_ran():
    vocab = Vocabulary.from_sentences(LOGS)
    model = SkipModel(LOGS, vocab)
    for word in ["check", "the", "log", "and", "find", "out", "whether", "it"]:
        row = model.table[model.feature_index(word, "ran")]
        assert _nonzero(row, vocab) == {"down": 0.5, "please": 0.5}, word
    assert _nonzero(model.table[model.feature_index("battery", "ran")], vocab) == {"down": 1.0}
    assert _nonzero(model.table[model.feature_index("program", "ran")], vocab) == {"please": 1.0}
    assert not model.table[model.feature_index("ran", "ran")].any()
    assert not model.table[model.feature_index("down", "ran")].any()  # down never precedes ran


def test_features_are_each_distinct_earlier_word_with_the_most_recent_word():
    vocab = Vocabulary.from_sentences(LOGS)
    model = SkipModel(LOGS, vocab)
    active = model.features(PROGRAM_PREFIX)
    assert active.shape == (len(vocab) ** 2,)
    expected = {model.feature_index(w, "ran") for w in
                ["check", "the", "program", "log", "and", "find", "out", "whether", "it"]}
    assert set(np.flatnonzero(active)) == expected
    assert set(np.unique(active)) == {0.0, 1.0}
    repeated = model.features(["the", "log", "the", "ran"])  # "the" twice: counts once
    assert repeated.sum() == 2 and repeated[model.feature_index("the", "ran")] == 1
    assert model.features(["ran", "ran"])[model.feature_index("ran", "ran")] == 1


def test_sampling_is_repeatable_and_follows_the_chain():
    vocab = Vocabulary.from_sentences(COMMANDS)
    matrix = transition_matrix(COMMANDS, vocab, weights=COMMAND_SHARES)
    first = walk_chain(matrix, vocab, "show", rng=np.random.default_rng(0))
    assert first == walk_chain(matrix, vocab, "show", rng=np.random.default_rng(0))
    assert first[:3] == ["show", "me", "my"] and first[-1] == "please" and len(first) == 5
    rng = np.random.default_rng(1)
    middles = [walk_chain(matrix, vocab, "show", rng=rng)[3] for _ in range(2000)]
    shares = {w: middles.count(w) / len(middles) for w in ["directories", "files", "photos"]}
    assert shares == pytest.approx({"directories": 0.2, "files": 0.3, "photos": 0.5}, abs=0.04)


def test_sampling_stops_at_max_len():
    vocab = Vocabulary(["a", "b"])
    loop = np.array([[0.0, 1.0], [1.0, 0.0]])
    walked = walk_chain(loop, vocab, "a", rng=np.random.default_rng(0), max_len=5)
    assert walked == ["a", "b", "a", "b", "a"]
    assert walk_chain(loop, vocab, "b", rng=np.random.default_rng(0), max_len=1) == ["b"]


# --- invariants -------------------------------------------------------------------------

WORDS = ["a", "b", "c", "d"]
corpora = st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=8), min_size=1, max_size=5)


@st.composite
def corpus_and_weights(draw):
    sentences = draw(corpora)
    weights = draw(st.lists(st.floats(0.01, 10), min_size=len(sentences), max_size=len(sentences)))
    return sentences, weights


@settings(max_examples=60, deadline=None)
@given(corpus_and_weights())
def test_rows_sum_to_one_or_zero(data):
    sentences, weights = data
    vocab = Vocabulary(WORDS)
    for matrix in (transition_matrix(sentences, vocab, weights),
                   second_order_matrix(sentences, vocab, weights),
                   SkipModel(sentences, vocab, weights).table):
        sums = matrix.sum(axis=1)
        assert np.all((np.isclose(sums, 1.0)) | (sums == 0.0))
        assert np.all(matrix >= 0)
    followed = {w for s in sentences for w in s[:-1]}
    sums = transition_matrix(sentences, vocab, weights).sum(axis=1)
    assert {w for w, total in zip(WORDS, sums) if total > 0} == followed


@settings(max_examples=60, deadline=None)
@given(corpora, st.lists(st.sampled_from(WORDS), min_size=2, max_size=8),
       st.lists(st.booleans(), min_size=16, max_size=16))
def test_votes_are_sums_of_table_rows_and_a_mask_of_ones_changes_nothing(sentences, prefix, bits):
    model = SkipModel(sentences, Vocabulary(WORDS))
    active = model.features(prefix)
    rows = [i for i in range(16) if active[i]]
    np.testing.assert_allclose(model.votes(prefix), model.table[rows].sum(axis=0))
    np.testing.assert_array_equal(model.votes(prefix, np.ones(16)), model.votes(prefix))
    mask = np.array(bits)
    kept = [i for i in rows if mask[i]]
    np.testing.assert_allclose(model.votes(prefix, mask), model.table[kept].sum(axis=0))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3), min_size=1, max_size=5))
def test_without_room_to_skip_the_skip_model_is_the_second_order_model(sentences):
    # in sentences of at most three words the only earlier word is the one right before
    vocab = Vocabulary(WORDS)
    np.testing.assert_allclose(SkipModel(sentences, vocab).table,
                               second_order_matrix(sentences, vocab))


@settings(max_examples=40, deadline=None)
@given(corpora, st.integers(0, 2**32 - 1))
def test_samples_only_take_transitions_the_corpus_has(sentences, seed):
    vocab = Vocabulary(WORDS)
    matrix = transition_matrix(sentences, vocab)
    words = walk_chain(matrix, vocab, sentences[0][0], rng=np.random.default_rng(seed), max_len=12)
    assert 1 <= len(words) <= 12
    pairs = {(s[i], s[i + 1]) for s in sentences for i in range(len(s) - 1)}
    assert all(pair in pairs for pair in zip(words, words[1:]))


# --- bad input ----------------------------------------------------------------------------

def test_a_word_outside_the_vocabulary_is_named():
    vocab = Vocabulary(["a", "b"])
    with pytest.raises(KeyError, match=r"'z' in sentence 1 \('a z'\) is not in the vocabulary"):
        transition_matrix(["a b", "a z"], vocab)
    with pytest.raises(KeyError, match="'z' in sentence 0"):
        second_order_matrix(["z a b"], vocab)
    model = SkipModel(["a b a"], vocab)
    with pytest.raises(KeyError, match="'z' in the prefix is not in the vocabulary"):
        model.features(["a", "z"])
    with pytest.raises(KeyError, match="'z' in the feature"):
        model.feature_index("z", "a")
    with pytest.raises(KeyError, match="'z' in start"):
        walk_chain(np.eye(2), vocab, "z", rng=np.random.default_rng(0))


def test_weights_must_match_the_sentences_and_sum_to_a_positive_number():
    vocab = Vocabulary(["a", "b"])
    with pytest.raises(ValueError,
                       match=r"one number per sentence: got shape \(3,\) for 2 sentences"):
        transition_matrix(["a b", "b a"], vocab, weights=[0.2, 0.3, 0.5])
    with pytest.raises(ValueError, match="must sum to a positive number"):
        second_order_matrix(["a b", "b a"], vocab, weights=[0, 0])
    with pytest.raises(ValueError, match="finite and non-negative"):
        SkipModel(["a b", "b a"], vocab, weights=[1.5, -0.5])
    with pytest.raises(ValueError, match="finite and non-negative"):
        transition_matrix(["a b", "b a"], vocab, weights=[1.0, float("nan")])


def test_corpus_and_vocabulary_types_are_checked():
    vocab = Vocabulary(["a", "b"])
    with pytest.raises(TypeError, match="not a single string"):
        transition_matrix("a b", vocab)
    with pytest.raises(ValueError, match="sentences is empty"):
        transition_matrix([], vocab)
    with pytest.raises(TypeError, match="vocab must be a Vocabulary, got list"):
        transition_matrix(["a b"], ["a", "b"])


def test_a_prefix_shorter_than_two_words_is_refused():
    model = SkipModel(["a b a"], Vocabulary(["a", "b"]))
    with pytest.raises(ValueError, match=r"at least two words .* got 1: \['a'\]"):
        model.features(["a"])
    with pytest.raises(ValueError, match="got 0"):
        model.votes("")


def test_a_mask_of_the_wrong_shape_or_kind_is_refused():
    model = SkipModel(["a b a"], Vocabulary(["a", "b"]))
    with pytest.raises(ValueError, match=r"mask must have shape \(4,\) .* got \(2,\)"):
        model.votes(["a", "b"], mask=np.ones(2))
    with pytest.raises(TypeError, match="booleans or numbers"):
        model.votes(["a", "b"], mask=np.array(["x"] * 4))


def test_walk_chain_checks_matrix_rng_and_max_len():
    vocab = Vocabulary(["a", "b"])
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError,
                       match=r"shape \(2, 2\) for a vocabulary of 2 words, got \(3, 3\)"):
        walk_chain(np.eye(3), vocab, "a", rng=rng)
    with pytest.raises(ValueError, match="finite, non-negative"):
        walk_chain(np.array([[0.5, -0.5], [1, 0]]), vocab, "a", rng=rng)
    with pytest.raises(TypeError, match="rng must be a numpy Generator"):
        walk_chain(np.eye(2), vocab, "a", rng=0)
    with pytest.raises(ValueError, match="max_len must be at least 1, got 0"):
        walk_chain(np.eye(2), vocab, "a", rng=rng, max_len=0)
    with pytest.raises(TypeError, match=r"max_len must be an int, got float \(2.0\)"):
        walk_chain(np.eye(2), vocab, "a", rng=rng, max_len=2.0)
    assert walk_chain(np.eye(2), vocab, "a", rng=rng, max_len=np.int64(1)) == ["a"]


def test_the_old_name_sample_is_gone():
    import minitransformer
    import minitransformer.markov
    assert not hasattr(minitransformer, "sample")
    assert not hasattr(minitransformer.markov, "sample")


# --- the chain figure -------------------------------------------------------------------

def test_chain_graph_draws_every_word_and_labels_every_transition():
    vocab = Vocabulary.from_sentences(COMMANDS)
    matrix = transition_matrix(COMMANDS, vocab, weights=COMMAND_SHARES)
    ax = chain_graph(matrix, vocab, title="three commands")
    texts = [t.get_text() for t in ax.texts if t.get_text()]
    assert set(vocab.words) <= set(texts)
    labels = sorted(t for t in texts if t not in vocab.words)
    assert labels == ["0.20", "0.30", "0.50"] + ["1.00"] * 5
    arrows = [t for t in ax.texts if isinstance(t, matplotlib.text.Annotation) and t.arrow_patch]
    assert len(arrows) == int((matrix > 0).sum()) == 8
    assert ax.get_title() == "three commands"


def test_chain_graph_places_words_left_to_right_along_the_chain():
    vocab = Vocabulary.from_sentences(COMMANDS)
    ax = chain_graph(transition_matrix(COMMANDS, vocab), vocab)
    x = {t.get_text(): t.get_position()[0] for t in ax.texts if t.get_text() in vocab.words}
    assert x["show"] < x["me"] < x["my"] < x["files"] < x["please"]
    assert x["directories"] == x["files"] == x["photos"]


def test_chain_graph_handles_loops_and_leaves_out_unused_words():
    vocab = Vocabulary(["a", "b", "c", "unused"])
    matrix = np.array([[0.5, 0.5, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]])
    _, ax = plt.subplots()
    assert chain_graph(matrix, vocab, ax=ax) is ax
    texts = [t.get_text() for t in ax.texts]
    assert "unused" not in texts and "↻ 0.50" in texts


def test_chain_graph_refuses_bad_matrices():
    vocab = Vocabulary(["a", "b"])
    with pytest.raises(ValueError, match=r"square transition matrix, got shape \(2, 3\)"):
        chain_graph(np.zeros((2, 3)), vocab)
    with pytest.raises(ValueError, match=r"shape \(3, 3\) does not match 2 words"):
        chain_graph(np.eye(3), vocab)
    with pytest.raises(ValueError, match="non-negative"):
        chain_graph(-np.eye(2), vocab)
