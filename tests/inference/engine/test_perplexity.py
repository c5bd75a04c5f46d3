"""Perplexity of a text under the bundled model: English reads as far less surprising than the
same words shuffled."""

from __future__ import annotations

import gc
import math
import random

import psutil
import pytest

from inference.engine.llama import LlamaModel
from inference.engine.perplexity import perplexity
from tests.support.processes import bundled_model_path

pytestmark = pytest.mark.model

PARAGRAPH = (
    "The river rises in the hills north of the town and runs south through farmland for about "
    "forty miles before it reaches the sea. In the spring, when the snow on the hills melts, the "
    "water comes up quickly and sometimes floods the lower fields. The farmers who live along its "
    "banks have built low walls of earth and stone to keep the water out, and most years the "
    "walls hold. The town itself was founded where an old road crossed the river at a shallow "
    "ford, and a stone bridge has stood there for more than three hundred years. Today the bridge "
    "carries only people on foot and bicycles, because a newer and wider bridge was built a mile "
    "downstream for cars and trucks."
)


@pytest.fixture(scope="module")
def model_path():
    return bundled_model_path()


def shuffled(text: str) -> str:
    words = text.split()
    random.Random(7).shuffle(words)
    return " ".join(words)


def test_it_finds_english_far_less_perplexing_than_its_words_shuffled(model_path):
    english = perplexity(model_path, PARAGRAPH)
    nonsense = perplexity(model_path, shuffled(PARAGRAPH))

    assert math.isfinite(english.perplexity)
    assert 1 < english.perplexity < 50
    assert nonsense.perplexity > 10 * english.perplexity


def test_it_scores_every_token_but_the_first_whatever_the_window(model_path):
    model = LlamaModel(str(model_path))
    count = len(model.tokenize(PARAGRAPH, add_special=True, parse_special=False))
    model.close()

    whole = perplexity(model_path, PARAGRAPH, n_ctx=512)
    windowed = perplexity(model_path, PARAGRAPH, n_ctx=32)  # 8 windows of 32

    assert whole.tokens == windowed.tokens == count - 1
    # with 16 to 31 tokens of context instead of all before it, each token is harder to guess
    assert whole.perplexity < windowed.perplexity < 2 * whole.perplexity


def test_it_needs_two_tokens(model_path):
    with pytest.raises(ValueError, match="perplexity needs 2"):
        perplexity(model_path, "")


def test_it_frees_the_model_and_context(model_path):
    perplexity(model_path, PARAGRAPH)
    gc.collect()
    before = psutil.Process().memory_info().rss

    for _ in range(3):
        perplexity(model_path, PARAGRAPH)
    gc.collect()

    # each run maps the 98 MB model and allocates a context; kept, three would add 300 MB
    assert psutil.Process().memory_info().rss - before < 100 * 2**20
