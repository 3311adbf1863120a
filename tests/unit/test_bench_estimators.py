"""The accuracy benchmark's comparison of estimators (benchmarks/accuracy/accuracy_estimators.py):
its --compare entries, the planner options each makes, and the table from a results
dict (accuracy per evaluation, s/step, training seconds to the baseline's accuracy).
Nothing is run or downloaded."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "accuracy"))
from accuracy_estimators import Entry, parse_compare, plan_args, table_lines  # noqa: E402


def test_entries_and_their_planner_options():
    entries = parse_compare("mezo@3e-5, lowrank@1e-4,sparse+q1@1e-3,mezo+q4@3e-5")
    assert entries == [Entry(estimator="mezo", directions=1, lr=3e-5),
                       Entry(estimator="lowrank", directions=1, lr=1e-4),
                       Entry(estimator="sparse", directions=1, lr=1e-3),
                       Entry(estimator="mezo", directions=4, lr=3e-5)]
    args = argparse.Namespace(lowrank_rank=4, lowrank_every=None, sparse_share=0.5)
    assert plan_args(entries[1], args) == ["--estimator", "lowrank", "--directions", "1",
                                           "--lowrank-rank", "4"]
    assert plan_args(entries[3], args) == ["--estimator", "mezo", "--directions", "4"]
    assert entries[3].tag == "mezo+q4@3e-05"
    for bad in ("adam@1e-4", "lowrank", "mezo+qx@1e-4"):
        with pytest.raises(ValueError, match="give NAME"):
            parse_compare(bad)


def test_the_table_gives_accuracy_seconds_and_the_time_to_the_baseline():
    def run(accs, secs):
        return {"evals": {s: {"accuracy": a, "train_seconds": t}
                          for s, a, t in zip((100, 200), accs, secs, strict=True)},
                "step_seconds": secs[0] / 100}
    results = {"entries": [
        {"entry": "mezo@3e-05", "seeds": {0: run((0.70, 0.80), (400, 800)),
                                          1: run((0.72, 0.82), (400, 800))}},
        {"entry": "lowrank@0.0001", "seeds": {0: run((0.81, 0.83), (300, 600)),
                                              1: run((0.80, 0.84), (300, 600))}},
        {"entry": "sparse@0.0001", "seeds": {0: run((0.6, 0.7), (500, 1000))}}]}
    lines = table_lines(results)
    assert "step 100" in lines[0] and "s to baseline" in lines[0]
    assert "0.8100 +- 0.0141" in lines[1] and "800 (step 200)" in lines[1]
    assert "600 (step 200)" in lines[2]           # 0.805 at step 100: below 0.81
    assert lines[3].rstrip().endswith("not reached")


def test_saved_runs_merge_by_entry_with_their_seeds():
    """Runs saved apart (one seed each, JSON: string keys) make one table."""
    import json

    def saved(seed, acc):
        return json.loads(json.dumps({"settings": {}, "estimators": {"entries": [
            {"entry": "lowrank@0.0001", "seeds": {seed: {
                "evals": {100: {"accuracy": acc, "train_seconds": 500}},
                "step_seconds": 5.0}}}]}}))
    from accuracy_estimators import merged
    both = merged([saved(0, 0.70), saved(1, 0.80)])
    assert list(both["estimators"]["entries"][0]["seeds"]) == ["0", "1"]
    assert "0.7500 +- 0.0707" in table_lines(both["estimators"])[1]


def test_a_zoexec_part_run_joins_the_table_as_its_estimators_entry():
    """`--parts zoexec` (MeZO-SGD's runs) beside the estimators part's: one table, the
    zoexec part's entry first when its file is; training seconds = step x median s/step."""
    from accuracy_estimators import merged
    zoexec = {"settings": {"estimator": "mezo", "directions": 1}, "zoexec_fine_tuned": {
        "steps": 200, "lr": 3e-5, "seeds": {
            "0": {"accuracy": 0.8, "step_seconds": 4.0,
                  "evals": [{"step": 100, "eval_accuracy": 0.7}, {"step": 200, "eval_accuracy": 0.8}]},
            "1": {"note": "exit 2: error: ..."}}}}
    lowrank = {"settings": {}, "estimators": {"entries": [{"entry": "lowrank@0.0001", "seeds": {
        "0": {"evals": {"100": {"accuracy": 0.8, "train_seconds": 300}}, "step_seconds": 3.0}}}]}}
    both = merged([zoexec, lowrank])
    mezo, low = both["estimators"]["entries"]
    assert mezo["entry"] == "mezo@3e-05" and list(mezo["seeds"]) == ["0"]
    assert mezo["seeds"]["0"]["evals"][200] == {"accuracy": 0.8, "train_seconds": 800.0}
    lines = table_lines(both["estimators"])
    assert "800 (step 200)" in lines[1] and "300 (step 100)" in lines[2]


def test_zoexec_parts_saved_apart_merge_their_seeds_and_keep_lora_apart():
    """Seeds of one `--parts zoexec` setting saved to their own files make one summary
    (3 seeds, not the first file's 2); a LoRA run's entry is named as LoRA, not taken
    for full MeZO-SGD at its lr; the zero-shot figure is the file's that has it."""
    import json

    from accuracy_estimators import merged

    def part(seeds, *, tuning="full", lr=3e-5):
        return {"steps": 300, "lr": lr, "eps": 1e-3, "tuning": tuning, "seeds": {
            str(s): {"accuracy": a, "step_seconds": 3.0,
                     "evals": [{"step": 300, "eval_accuracy": a}]} for s, a in seeds}}
    first = {"settings": {}, "zoexec_fine_tuned": part([(0, 0.70), (1, 0.72)])}
    third = {"settings": {}, "zero_shot": {"zoexec": {"eval_accuracy": 0.465}},
             "zoexec_fine_tuned": part([(2, 0.65)])}
    lora = {"settings": {}, "zoexec_fine_tuned": part([(0, 0.585)], tuning="lora", lr=1e-3)}
    out = json.loads(json.dumps(merged([first, third, lora])))
    assert sorted(out["zoexec_fine_tuned"]["seeds"]) == ["0", "1", "2"]
    assert out["zero_shot"]["zoexec"]["eval_accuracy"] == 0.465
    tags = [e["entry"] for e in out["estimators"]["entries"]]
    assert tags == ["mezo@3e-05", "lora:mezo@0.001"]
