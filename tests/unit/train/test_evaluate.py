"""Samples from a model: greedy, and seeded temperature / top-k sampling that is reproducible."""

from __future__ import annotations

import torch

from stoker.train.evaluate import generate
from stoker.train.model import Llama
from stoker.train.settings import get_model_config


def test_greedy_top_k_and_seeded_sampling():
    torch.manual_seed(0)
    model = Llama(get_model_config("tiny"))
    model.init_weights(0)
    prompt = [1, 5, 9]
    greedy = generate(model, prompt, 8)
    with torch.no_grad():
        assert greedy[0] == int(model(torch.tensor([prompt]))[0, -1].argmax())
    # top-k 1 is greedy whatever the temperature
    assert generate(model, prompt, 8, temperature=5.0, top_k=1, generator=torch.Generator().manual_seed(3)) == greedy
    draw = [generate(model, prompt, 8, temperature=2.0, generator=torch.Generator().manual_seed(s)) for s in (1, 1, 2)]
    assert draw[0] == draw[1] and draw[0] != draw[2]  # the seed decides, nothing else
    assert all(0 <= t < model.cfg.vocab_size for t in draw[2])
