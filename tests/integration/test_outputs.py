"""What a run leaves a person: a one-rank `zoexec run` on a local model folder with a
tokenizer writes final/ (and snapshots), sharded, that AutoTokenizer and
AutoModelForCausalLM load and `generate` runs on, holding exactly the logged updates
(checked by applying them by hand), and that a resume reads back; metrics.jsonl with the
HF Trainer's names, progress lines off a terminal, a summary, and -q's silence;
--report-to tensorboard without the package is one error line before anything is
written."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
from typer.testing import CliRunner

from zoexec.cli import app
from zoplan.handplan import hand_plan
from zoplan.layout import Layout
from zoplan.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from tiny_model import make_model_dir, words_in  # noqa: E402

TEXTS = ["the movie was great and I liked it .", "a boring film , I hated it !",
         "it is fun , the film is good .", "was it bad ? the movie was terrible ."]


def _setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    model = make_model_dir(tmp_path / "model", "tiny-opt", seed=1, words=words_in(TEXTS),
                           chat_template="{% for m in messages %}{{ m['content'] }} {% endfor %}")
    data = tmp_path / "train.jsonl"
    data.write_text("".join(json.dumps({"text": TEXTS[i % 4]}) + "\n" for i in range(60)))
    plan = tmp_path / "plan.json"
    hand_plan(model="tiny-opt", layout=Layout(),
              workload=Workload(batch=4, seq=32, param_dtype="fp32", compute_dtype="fp32")).save(plan)
    return model, data, plan


def _replayed(model: Path, records: list[dict]) -> dict[str, torch.Tensor]:
    """The source model's weights with the logged updates applied by hand (theta -=
    lr * g * z, z regenerated from each step's seed in zo's addressing): what final/
    must hold, whatever the data."""
    from transformers import AutoModelForCausalLM

    from zoexec.maths import zo
    from zoexec.model.families import param_addresses

    lm = AutoModelForCausalLM.from_pretrained(model)
    with torch.no_grad():
        for record in records:
            for _, param, block, index in param_addresses(lm):
                z = zo.z_tensor(record["seed"], block, index, param.shape)
                param.sub_(record["lr"] * record["g"] * z)
    return lm.state_dict()


def _assert_weights(folder: Path, expected: dict[str, torch.Tensor]) -> None:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(folder).state_dict()
    assert set(loaded) == set(expected)
    for name, tensor in expected.items():
        torch.testing.assert_close(loaded[name], tensor, rtol=0, atol=2e-6, msg=name)


def test_final_loads_with_auto_classes_and_generates(tmp_path):
    """final/ and the snapshots are sharded HF folders with the source's tokenizer that
    hold exactly the logged updates; a resume from a sharded final/ goes on from them;
    progress lines every N steps, the summary, and -q's silence."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, data, plan = _setup(tmp_path)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(plan), "--model-path", str(model), "--data", str(data),
                                      "--steps", "4", "--lr", "1e-3", "--out", str(out),
                                      "--save-every", "2", "--max-shard-size", "1MB",
                                      "--log-every", "2"])
    assert result.exit_code == 0, result.output
    final = out / "final"
    assert len(list(final.glob("model-*-of-*.safetensors"))) > 1
    assert (final / "model.safetensors.index.json").is_file()
    for name in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
                 "chat_template.jinja"):
        assert (final / name).is_file(), name
    source_tok = AutoTokenizer.from_pretrained(model)
    for folder in (final, out / "snapshots" / "checkpoint-2"):
        tokenizer = AutoTokenizer.from_pretrained(folder)
        assert tokenizer(TEXTS[0])["input_ids"] == source_tok(TEXTS[0])["input_ids"]
        assert tokenizer.chat_template == source_tok.chat_template
    lm = AutoModelForCausalLM.from_pretrained(final)
    prompt = tokenizer("the movie was", return_tensors="pt")
    generated = lm.generate(**prompt, max_new_tokens=5, do_sample=False)
    assert generated.shape == (1, prompt["input_ids"].shape[1] + 5)
    assert isinstance(tokenizer.decode(generated[0]), str)

    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 4]
    assert {"loss", "learning_rate", "projected_grad", "tokens_per_s"} <= set(rows[0])
    assert "train_runtime" in rows[-1]
    err = result.stderr
    assert [line.split()[2] for line in err.splitlines() if line.startswith("zoexec: step")] == \
        ["1/4", "2/4", "4/4"], err
    assert "zoexec: done: 4 steps (steps 1-4 of 4)" in err and f"model: {final}" in err
    assert f"run folder: {out}" in err and f"tokenizer: in {final}" in err
    assert "shards" in err and "metrics.jsonl" in err

    resumed = CliRunner().invoke(app, ["run", str(plan), "--resume", str(out), "--steps", "6", "-q"])
    assert resumed.exit_code == 0, resumed.output
    # -q: no progress and no summary; what the extension does is still said
    assert resumed.stderr == ("zoexec: the run goes from 4 to 6 steps after step 4: the constant "
                              "lr 0.001 continues\n"), resumed.stderr
    logged = [json.loads(line) for line in (out / "losses.jsonl").read_text().splitlines()]
    assert [r["step"] for r in logged] == list(range(1, 7))
    _assert_weights(final, _replayed(model, logged))      # the first run's final/ + 2 steps
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 4, 5, 6, 6]


def test_report_to_tensorboard_without_the_package_is_one_error(tmp_path, monkeypatch):
    _, _, plan = _setup(tmp_path)
    monkeypatch.setitem(sys.modules, "tensorboard", None)
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)
    out = tmp_path / "run"
    result = CliRunner().invoke(app, ["run", str(plan), "--init", "random", "--steps", "2",
                                      "--out", str(out), "--report-to", "tensorboard"])
    assert result.exit_code == 2, result.output
    assert "needs the tensorboard package" in result.stderr and "Traceback" not in result.output
    assert not out.exists()
