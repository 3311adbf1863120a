"""Config files (zoplan.configfile, zoexec.flags.config_options): a key is any name of
its option (field, flag, HF Trainer alias), an unknown one is one line with the nearest
name, a value of the wrong type is one line, and what --print-config writes reads back
to the same options, in YAML and in JSON."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from zoexec.cli import app
from zoexec.config import SECTIONS
from zoexec.flags import config_options, config_values
from zoplan.configfile import read_config, write_config
from zoplan.errors import ZoError
from zoplan.request import config_keys, field_hints

ALL = tuple(SECTIONS.values())


def _read(tmp_path, text: str, name: str = "run.yaml") -> dict:
    path = tmp_path / name
    path.write_text(text)
    return config_options(path, *ALL)


def test_any_name_of_an_option_is_a_key(tmp_path):
    got = _read(tmp_path, "learning_rate: 1e-3\nmax-steps: 20\n--eval-steps: 4\noutput_dir: r\n"
                          "task: classification\nlabel_words: [terrible, great]\nquiet: true\n")
    assert got == {"lr": 1e-3, "steps": 20, "eval_every": 4, "out": "r", "name": "classification",
                   "label_words": ("terrible", "great"), "quiet": True}
    assert _read(tmp_path, "label-words: 'no,yes'\nlora_targets: q_proj,v_proj\n") == {
        "label_words": ("no", "yes"), "lora_targets": ("q_proj", "v_proj")}


@pytest.mark.parametrize("text, message", [
    ("lerning_rate: 1e-3\n", "unknown option 'lerning_rate' (did you mean 'learning_rate'?)"),
    ("lr: fast\n", "lr must be a finite number, got 'fast'"),
    ("steps: 2.5\n", "steps must be a whole number, got 2.5"),
    ("quiet: 1\n", "quiet must be true or false, got 1"),
    ("report-to: neptune\n", "report-to must be one of none, tensorboard, wandb, mlflow, got 'neptune'"),
    ("- lr\n", "must be a mapping of option names to values (e.g. `batch: 16`), got list"),
    ("lr: 1\nlearning_rate: 2\n", "'learning_rate' and 'lr' are the same option: give it once"),
    ("lr: [1\n", "not valid YAML (line 2: "),
])
def test_a_bad_config_is_one_line(tmp_path, text, message):
    with pytest.raises(ZoError) as err:
        _read(tmp_path, text)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_other_files_are_refused(tmp_path):
    with pytest.raises(ZoError, match="not valid JSON"):
        _read(tmp_path, "{lr: 1}", "run.json")
    with pytest.raises(ZoError, match=r"\.yaml, \.yml or \.json"):
        _read(tmp_path, "lr: 1", "run.toml")
    with pytest.raises(ZoError, match="does not exist|no such|not found|missing"):
        config_options(tmp_path / "none.yaml", *ALL)


@pytest.mark.parametrize("name", ["back.yaml", "back.json"])
def test_print_config_reads_back_to_the_same_options(tmp_path, name):
    options = {"model_path": "m", "data": "train.jsonl", "name": "classification",
               "template": "{sentence} It was", "label_words": ("terrible", "great"),
               "lr": 1e-7, "eps": 1e-3, "steps": 20000, "eval_every": 4000, "out": "runs/x",
               "save_every": "30m", "quiet": True, "timeout_s": 60.0}
    assert write_config(config_values(options), str(tmp_path / name)) is None
    assert config_options(tmp_path / name, *ALL) == options
    text = write_config(config_values(options), "-")
    assert text is not None and "task: classification" in text


def test_the_loader_alone_takes_any_table_of_names(tmp_path):   # zoplan's commands may use it
    (tmp_path / "o.json").write_text('{"--gpus": 8, "model": "opt-13b"}')
    assert read_config(tmp_path / "o.json", {"gpus": "gpus", "model": "model"}) == {
        "gpus": 8, "model": "opt-13b"}


def test_zoplan_and_zoexec_read_a_file_with_one_matcher_and_one_typer(tmp_path):
    """The same mistake is the same line in either command's file; a number written as
    text (YAML reads `1e-3` as a string) is that number in both."""
    (tmp_path / "plan.yaml").write_text("model: tiny-opt\nbatch: '16'\nlora_r: 4\n")
    assert read_config(tmp_path / "plan.yaml", config_keys(), field_hints()) == {
        "model": "tiny-opt", "batch": 16, "lora_r": 4}
    assert _read(tmp_path, "lr: 1e-3\nsteps: '20'\n") == {"lr": 1e-3, "steps": 20}
    lines = []
    for name, text, names, hints in (("plan.yaml", "batch: 2.5\n", config_keys(), field_hints()),
                                     ("run.yaml", "steps: 2.5\n", None, None)):
        (tmp_path / name).write_text(text)
        with pytest.raises(ZoError) as err:
            if names is None:
                config_options(tmp_path / name, *ALL)
            else:
                read_config(tmp_path / name, names, hints)
        lines.append(str(err.value).split(": ", 1)[1])
    assert lines == ["batch must be a whole number, got 2.5", "steps must be a whole number, got 2.5"]


def _eval(tmp_path, *args: str):
    (tmp_path / "d.jsonl").write_text("{}\n")
    return CliRunner().invoke(app, ["eval", str(tmp_path), "--data", str(tmp_path / "d.jsonl"),
                                    *args])


def test_zoexec_eval_takes_a_config_file_of_its_own_options(tmp_path):
    """zoexec eval --config: its options (task, template, evaluation, threads) from the
    file, the command line over them, --print-config writes them; an option eval does
    not take (a run's) is one line naming the nearest it takes."""
    (tmp_path / "eval.yaml").write_text("task: classification\ntemplate: '{sentence} It was'\n"
                                        "label_words: terrible,great\neval-samples: 8\n")
    printed = _eval(tmp_path, "--config", str(tmp_path / "eval.yaml"), "--eval-samples", "4",
                    "--print-config", "-")
    assert printed.exit_code == 0, printed.output
    assert printed.output == ("task: classification\ntemplate: '{sentence} It was'\n"
                              "label_words:\n- terrible\n- great\neval_samples: 4\n")
    (tmp_path / "eval.yaml").write_text("task: classification\nlearning_rate: 1e-3\n")
    refused = _eval(tmp_path, "--config", str(tmp_path / "eval.yaml"))
    assert refused.exit_code == 2 and refused.output.count("\n") == 1, refused.output
    assert "unknown option 'learning_rate'" in refused.output
    (tmp_path / "eval.yaml").write_text("eval_sample: 8\n")
    refused = _eval(tmp_path, "--config", str(tmp_path / "eval.yaml"))
    assert "unknown option 'eval_sample' (did you mean 'eval_samples'?)" in refused.output
