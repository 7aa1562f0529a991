"""The quickstart's summary gives the training time stoker.train printed in the train step's log (rank 0's), not a
second, larger number under the same name: the train step's wall time (its start-up included) is labelled as such
(issue 34 item 21)."""

from __future__ import annotations

from stoker.recipes.llama_pretrain import pipeline_summary
from stoker.train.__main__ import summary_line

RESULT = {"step": 40, "final_loss": 4.1234, "tokens": 163840, "tokens_per_s": 521.8, "world_size": 4, "dp": 2,
          "tp": 2, "resumed_from": None, "num_params": 1000, "seconds": 314.04, "checkpoint": "ck/step-40"}
EVAL = {"val_loss": 4.5, "val_perplexity": 90.0}


def test_the_summary_and_the_train_log_give_one_training_time():
    logged = summary_line(RESULT, RESULT["seconds"])  # what the train step's log shows
    assert ", 314.0 s;" in logged
    first = pipeline_summary("LlamaPretrain", "1", RESULT, EVAL, 512.3, "ck", "out", "0.1 node-hours").splitlines()[0]
    assert "training 314.0 s (train step 512.3 s with its start-up)" in first
    assert "training 512.3 s" not in first


def test_a_result_without_its_time_shows_the_step_time_by_its_name():
    m = {k: v for k, v in RESULT.items() if k != "seconds"}
    first = pipeline_summary("LlamaPretrain", "1", m, EVAL, 512.3, "ck", "out", "-").splitlines()[0]
    assert first.endswith("train step 512.3 s") and "training" not in first
