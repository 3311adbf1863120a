"""Row lengths: `zoexec lengths` measures the rows a task's batches pack, and `zoplan
optimize --lengths` prices a batch's expected padded width (zoplan.lengths). Hand
computations of the expected width, the plan's prices with and without lengths, the
plan's round trip, and the bad files refused with one `error:` line."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from zoplan.cli import app as zoplan_app
from zoplan.lengths import RowLengths, expected_width, lengths_document, write_lengths
from zoplan.plan import Plan
from zoplan.workload import Workload

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
CPU4 = str(FIXTURES / "cpu4.json")   # compute-bound: the forward's width shows in the step
BASE = ["--model", "tiny-opt", "--gpus", "1", "--batch", "8", "--profile", CPU4, "-q"]
SMALL = [*BASE, "--seq", "64"]


def test_expected_width_by_hand():
    """Draws with replacement: [4, 8], batch 2: max 4 with probability 1/4, else 8:
    E = 4/4 + 8 x 3/4 = 7. Batch 1: the mean, 6. A cap of 5: 4/4 + 5 x 3/4 = 4.75."""
    assert expected_width([(4, 1), (8, 1)], batch=2, cap=64) == pytest.approx(7.0)
    assert expected_width([(4, 1), (8, 1)], batch=1, cap=64) == pytest.approx(6.0)
    assert expected_width([(4, 1), (8, 1)], batch=2, cap=5) == pytest.approx(4.75)
    # [2, 2, 5], batch 3: P(max = 2) = (2/3)^3 = 8/27; E = 2 x 8/27 + 5 x 19/27 = 111/27
    assert expected_width([(2, 2), (5, 1)], batch=3, cap=64) == pytest.approx(111 / 27)


def _lengths_file(tmp_path, widths, *, rows_per_example=1, name="lengths.json",
                  head_positions=None):
    """A lengths file of `widths`; the head by default at every position of the widest
    row (priced as before head_positions was measured)."""
    data = tmp_path / "train.jsonl"
    if not data.exists():
        data.write_text('{"sentence": "a b", "label": 0}\n')
    doc = lengths_document(data=str(data), task={"name": "classification"}, tokenizer="tok",
                           rows_per_example=rows_per_example, widths=widths,
                           head_positions=head_positions or rows_per_example * max(widths))
    write_lengths(tmp_path / name, doc)
    return tmp_path / name


def _plan(tmp_path, *extra, name="plan.json") -> Plan:
    out = tmp_path / name
    result = CliRunner().invoke(zoplan_app, ["optimize", *SMALL, "-o", str(out), *extra])
    assert result.exit_code == 0, result.output
    return Plan.load(out)


def test_short_rows_price_a_shorter_step_and_full_rows_the_same(tmp_path):
    full = _plan(tmp_path)
    short = _plan(tmp_path, "--lengths", str(_lengths_file(tmp_path, [6, 8, 9, 12])),
                  name="short.json")
    longer = _plan(tmp_path, "--lengths",
                   str(_lengths_file(tmp_path, [64, 70, 100], name="full.json")), name="long.json")
    assert short.workload.seq == full.workload.seq == 64
    assert short.data["workload"]["priced_seq"] == pytest.approx(
        expected_width([(6, 1), (8, 1), (9, 1), (12, 1)], batch=8, cap=64))
    assert short.step_time_s < full.step_time_s
    assert longer.data["workload"]["priced_seq"] == 64
    assert longer.step_time_s == full.step_time_s
    # memory is sized for --seq: the longest row a batch may have
    assert short.data["predicted"]["gpu_mem_bytes"] == full.data["predicted"]["gpu_mem_bytes"]
    assert "lengths" not in full.data["workload"] and "priced_seq" not in full.data["workload"]


def test_rows_of_one_width_price_as_that_seq(tmp_path):
    """Every row 16 tokens: the batch is 16 wide, so the step (every term: GEMMs,
    attention, head) is priced as a plan of --seq 16, while memory stays sized for 64."""
    at16 = CliRunner().invoke(zoplan_app, ["optimize", *BASE, "--seq", "16",
                                           "-o", str(tmp_path / "p16.json")])
    assert at16.exit_code == 0, at16.output
    at16 = Plan.load(tmp_path / "p16.json")
    same = _plan(tmp_path, "--lengths", str(_lengths_file(tmp_path, [16, 16, 16])))
    assert same.data["workload"]["priced_seq"] == 16
    assert same.step_time_s == at16.step_time_s
    assert same.data["predicted"]["gpu_mem_bytes"] > at16.data["predicted"]["gpu_mem_bytes"]


def test_the_head_is_priced_at_the_labelled_positions_only():
    """Rows 16 wide whose head acts at 4 positions each: the head task costs what it
    costs for rows of 4 tokens without lengths (the same tokens through the head), while
    the block forward stays priced at 16."""
    from zoplan.hardware import HardwareProfile
    from zoplan.io import load_json
    from zoplan.models import get_model
    from zoplan.pricing.tasks import task_times

    hw = HardwareProfile.from_dict(load_json(CPU4))
    model = get_model("tiny-opt")

    def times(workload):
        return task_times(model=model, profile=hw, workload=workload, streams=2,
                          tokens=workload.priced_tokens(1), local_ranks=1)

    lengths = RowLengths(sha256="0" * 64, data_sha256="0" * 64, histogram=((16, 3),),
                         head_positions=4)
    at4 = times(Workload(batch=8, seq=4))
    wide = times(Workload(batch=8, seq=64, lengths=lengths))
    everywhere = times(Workload(batch=8, seq=16))
    assert wide["head_s"] == pytest.approx(at4["head_s"], rel=1e-12)
    assert wide["forward_s"] == pytest.approx(everywhere["forward_s"], rel=1e-12)
    assert wide["head_s"] < everywhere["head_s"]
    assert Workload(batch=8, seq=64, lengths=lengths).head_share == 4 / 16


def test_the_plan_keeps_the_lengths_and_reads_them_back(tmp_path):
    path = _lengths_file(tmp_path, [6, 8, 8, 12], rows_per_example=2)
    plan = _plan(tmp_path, "--lengths", str(path))
    lengths = plan.workload.lengths
    assert lengths.histogram == ((6, 1), (8, 2), (12, 1)) and lengths.rows_per_example == 2
    assert lengths.head_positions == 24
    doc = json.loads(path.read_text())
    assert lengths.data_sha256 == doc["data_sha256"]
    assert Workload.from_dict(plan.workload.to_dict()) == plan.workload
    tampered = plan.workload.to_dict() | {"priced_seq": 64}
    with pytest.raises(ValueError, match="priced_seq"):
        Workload.from_dict(tampered)
    with pytest.raises(ValueError, match="histogram"):
        RowLengths(sha256="0" * 64, data_sha256="0" * 64, histogram=((8, 1), (6, 1)))


def _refused(tmp_path, lengths, match):
    out = tmp_path / "plan.json"
    result = CliRunner().invoke(zoplan_app, ["optimize", *SMALL, "-o", str(out),
                                             "--lengths", str(lengths)])
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    assert match in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_bad_lengths_files_are_one_error_line(tmp_path):
    _refused(tmp_path, tmp_path / "nowhere.json", "does not exist")
    (tmp_path / "bad.json").write_text("{not json")
    _refused(tmp_path, tmp_path / "bad.json", "not valid JSON")
    good = json.loads(_lengths_file(tmp_path, [4, 8]).read_text())
    for change, match in (({"count": 3}, "count 3"), ({"histogram": [[8, 1], [4, 1]]}, "sorted"),
                          ({"schema_version": 9}, "schema_version"),
                          ({"data_sha256": "x"}, "64 hex digits")):
        (tmp_path / "changed.json").write_text(json.dumps(good | change))
        _refused(tmp_path, tmp_path / "changed.json", match)
    del good["histogram"]
    (tmp_path / "changed.json").write_text(json.dumps(good))
    _refused(tmp_path, tmp_path / "changed.json", "missing histogram")


def test_lengths_of_another_data_file_are_refused(tmp_path):
    path = _lengths_file(tmp_path, [4, 8])
    (tmp_path / "train.jsonl").write_text('{"sentence": "another file", "label": 1}\n')
    _refused(tmp_path, path, "measure it again")


# ---- zoexec lengths ------------------------------------------------------------------------------
SENTIMENT = ROOT / "examples" / "sentiment-short" / "train.jsonl"
TASK = ["--task", "classification", "--template", "{sentence} It was",
        "--label-words", "terrible,great"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    sys.path.insert(0, str(ROOT / "examples"))
    from make_model import make_model

    return make_model(tmp_path_factory.mktemp("micro") / "model", size="micro", seed=0)


def _zoexec(*args):
    from zoexec.cli import app

    return CliRunner().invoke(app, ["lengths", *args])


def test_zoexec_lengths_measures_the_rows_a_batch_packs(tmp_path, model_dir):
    """Each single-token-candidate example is one row: its prompt's tokens and the label
    word's, as the task's own batch of that example packs them."""
    from zoexec.data.section import TaskOptions
    from zoexec.data.sources import make_task_source
    from zoplan.io import sha256_path
    from zoplan.lengths import load_lengths

    out = tmp_path / "lengths.json"
    result = _zoexec(str(SENTIMENT), "--model-path", str(model_dir), *TASK, "-o", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    spec = TaskOptions(name="classification", template="{sentence} It was",
                    label_words=("terrible", "great"))
    source = make_task_source(SENTIMENT, spec, vocab=10_000, tokenizer_dir=str(model_dir))
    widths = sorted(len(ex.prompt) + 1 for ex in source.examples)
    assert doc["count"] == len(widths) == sum(n for _, n in doc["histogram"])
    assert [w for w, n in doc["histogram"] for _ in range(n)] == widths
    assert doc["rows_per_example"] == 1 and doc["task"] == spec.record()
    assert doc["head_positions"] == 1   # the answer position: single-token label words
    assert doc["data_sha256"] == sha256_path(SENTIMENT)
    assert load_lengths(out).count == len(widths)


def test_zoexec_lengths_takes_a_config_file(tmp_path, model_dir):
    """--config FILE holds lengths' options as `zoexec run --config` reads them (one
    reader): the same lengths file as the flags; an option lengths does not take is one
    line naming it; --print-config writes the options given."""
    config = tmp_path / "lengths.yaml"
    config.write_text(f"model_path: {model_dir}\ntask: classification\n"
                      f"template: '{{sentence}} It was'\nlabel-words: [terrible, great]\n")
    by_flags, by_file = tmp_path / "flags.json", tmp_path / "file.json"
    assert _zoexec(str(SENTIMENT), "--model-path", str(model_dir), *TASK, "-o",
                   str(by_flags)).exit_code == 0
    result = _zoexec(str(SENTIMENT), "--config", str(config), "-o", str(by_file))
    assert result.exit_code == 0, result.output
    assert by_file.read_bytes() == by_flags.read_bytes()
    printed = _zoexec(str(SENTIMENT), "--config", str(config), "--template", "{sentence} So",
                      "--print-config", "-", "-o", str(tmp_path / "none.json"))
    assert printed.exit_code == 0 and "template: '{sentence} So'" in printed.output, printed.output
    assert "label_words:\n- terrible\n- great" in printed.output
    assert not (tmp_path / "none.json").exists()
    config.write_text(f"model_path: {model_dir}\ntemplat: x\n")
    refused = _zoexec(str(SENTIMENT), "--config", str(config), "-o", str(tmp_path / "none.json"))
    assert refused.exit_code == 2 and refused.output.count("\n") == 1, refused.output
    assert "unknown option 'templat' (did you mean 'template'?)" in refused.output


def test_zoexec_lengths_refuses_with_one_line(tmp_path, model_dir):
    out = tmp_path / "lengths.json"
    for args, match in (((str(SENTIMENT), *TASK), "needs --model-path"),
                        ((str(tmp_path / "none.jsonl"), "--model-path", str(model_dir), *TASK),
                         "does not exist"),
                        ((str(SENTIMENT), "--model-path", str(model_dir)), "--task text")):
        result = _zoexec(*args, "-o", str(out))
        assert result.exit_code == 2, result.output
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith("error:") and match in lines[0], result.output
        assert not out.exists()


def test_zoexec_lengths_applies_the_task_preset(tmp_path, model_dir):
    """`--task-preset sst2` sets the task, template and label words, as in `zoexec run`:
    the lengths are those of the preset's classification rows."""
    from zoexec.data.presets import with_preset
    from zoexec.data.section import TaskOptions

    out = tmp_path / "lengths.json"
    result = _zoexec(str(SENTIMENT), "--model-path", str(model_dir), "--task-preset", "sst2",
                     "-o", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    assert doc["task"] == TaskOptions(**with_preset({"task_preset": "sst2"})).record()
    assert doc["task"]["name"] == "classification" and doc["rows_per_example"] == 1


def test_zoexec_lengths_of_multiple_choice_counts_a_row_per_candidate(tmp_path, model_dir):
    """A multiple-choice example packs a row per candidate, each its prompt and that
    candidate: the width is the longest candidate's, and the rows the most candidates
    any example has (a batch pads each example to its most)."""
    data = tmp_path / "mc.jsonl"
    rows = [{"premise": "the acting was", "a": "brilliant", "b": "really charming", "label": 0},
            {"premise": "the acting", "a": "was", "b": "was brilliant", "label": 1}]
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "lengths.json"
    result = _zoexec(str(data), "--model-path", str(model_dir), "--task", "multiple-choice",
                     "--template", "{premise}", "--choices", "{a}|{b}", "-o", str(out))
    assert result.exit_code == 0, result.output
    doc = json.loads(out.read_text())
    # word-level tokenizer: a BOS (if any) + prompt words + the longer candidate's words
    from transformers import AutoTokenizer

    bos = len(AutoTokenizer.from_pretrained(model_dir)("x")["input_ids"]) - 1
    assert doc["rows_per_example"] == 2
    assert doc["head_positions"] == (1 + 2 + 1 + 2) / 2   # each candidate's tokens
    assert [w for w, n in doc["histogram"] for _ in range(n)] == [bos + 2 + 2, bos + 3 + 2]


def test_a_run_on_other_data_than_the_plans_lengths_says_so(tmp_path):
    """The plan priced rows measured on train.jsonl: a run on that file gives no note, a
    run on another file one line naming it (the prediction is not that run's)."""
    from zoexec.options import build_config

    plan = tmp_path / "plan.json"
    _plan(tmp_path, "--lengths", str(_lengths_file(tmp_path, [4, 8])))
    other = tmp_path / "other.jsonl"
    other.write_text('{"sentence": "c d e", "label": 1}\n')
    task = dict(name="classification", template="{sentence} It was", label_words="a,b")
    same = build_config(plan=plan, data=str(tmp_path / "train.jsonl"), steps=1, **task)
    assert not [n for n in same.notes if "other data" in n]
    moved = build_config(plan=plan, data=str(other), steps=1, **task)
    [line] = [n for n in moved.notes if "other data" in n]
    assert str(other) in line and "zoexec lengths" in line
