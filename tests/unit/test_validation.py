"""Every number a user gives is checked where its artifact is loaded: finite, of the
right type and within a plausible range, with the field, the value and the unit in one
line (profiles, model configs, plans, traces, layouts, workloads, JSONL data, output
folders, view bounds). tests/integration/test_bad_input.py drives the same through the
command lines."""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import pytest

from zoexec.data.text import JsonlData, check_data
from zoexec.launch.preflight import _check_output_folder
from zoplan.catalogue import CATALOGUE_CONFIGS
from zoplan.errors import ZoError
from zoplan.hardware import HardwareProfile, load_profile, shipped_profiles
from zoplan.io import load_json
from zoplan.layout import Layout
from zoplan.models import catalogue, spec_from_hf_config
from zoplan.plan import Plan, validate_plan
from zoplan.trace import Span, read_trace, write_trace
from zoplan.views.optimize import check_top
from zoplan.views.show import MAX_COLUMNS, chart_columns
from zoplan.workload import Workload

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "fixtures"))
from view_synth import make_plan_data, make_trace_spans  # noqa: E402


# ---- hardware profiles ------------------------------------------------------------------------
def _cpu() -> dict:
    return load_json(shipped_profiles()["cpu"])


PROFILE_CASES = [
    ("bandwidth 1e308", lambda d: d["pcie"].update(h2d_gbps=1e308),
     "pcie.h2d_gbps is 1e+308 GB/s, outside the plausible 0.001..100000 GB/s"),
    ("tflops 1e-300", lambda d: d["compute"].update(peak_tflops=1e-300),
     "compute.peak_tflops is 1e-300 TFLOP/s, outside the plausible 0.0001..100000 TFLOP/s"),
    ("latency of an hour", lambda d: d["collective"].update(latency_us=3.6e9),
     "collective.latency_us is 3.6e+09 us"),
    ("memory of 1e300 GiB", lambda d: d["host"].update(memory_gib=1e300), "host.memory_gib is 1e+300 GiB"),
    ("fractional cores", lambda d: d["host"].update(cores=2.5), "host.cores must be a whole number"),
    ("a billion cores", lambda d: d["host"].update(cores=10**9), "host.cores is 1e+09 cores"),
    ("rank scaling 1e6", lambda d: d["compute"].update(rank_scaling=1e6), "compute.rank_scaling is 1e+06 x"),
    ("cost per parameter 1e-300", lambda d: d["compute"].update(zo_ns_per_param=1e-300),
     "compute.zo_ns_per_param is 1e-300 ns"),
    ("infinite figure", lambda d: d["pcie"].update(d2h_gbps=float("inf")), "pcie.d2h_gbps must be a number"),
    ("boolean figure", lambda d: d["pcie"].update(d2h_gbps=True), "pcie.d2h_gbps must be a number"),
    ("table bandwidth 1e308", lambda d: d["collective"].update(allgather_busbw=[[65536, 1e308]]),
     "collective.allgather_busbw bandwidth is 1e+308 GB/s"),
    ("table size 1e300", lambda d: d["collective"].update(allgather_busbw=[[1e300, 1.0]]),
     "collective.allgather_busbw size is 1e+300 bytes"),
    ("ten million GPUs a node", lambda d: d.update(gpus_per_node=10**7),
     "gpus_per_node must be a whole number in 1..1024"),
    ("nodes 1e12", lambda d: d.update(max_nodes=10**12), "max_nodes must be a whole number in 1..100000"),
    ("reserved beyond memory", lambda d: d["device"].update(reserved_gib=40),
     "device.reserved_gib (40 GiB) leaves nothing of device.memory_gib (32 GiB)"),
    ("section a list", lambda d: d.update(compute=[1]), "section 'compute' must be an object"),
    ("group rank a boolean", lambda d: d["fabric"].update(groups=[[True]]), "fabric.groups names rank True"),
    ("a figure misspelt", lambda d: d["pcie"].update(h2d_gbs=8),
     "pcie.h2d_gbs is not a figure of a profile (pcie has h2d_gbps, d2h_gbps"),
    ("a figure missing", lambda d: d["pcie"].pop("d2h_gbps"), "pcie.d2h_gbps is missing"),
    ("a model that is a number", lambda d: d["device"].update(model=4090),
     "device.model must be a string"),
    ("a flag that is a number", lambda d: d["pcie"].update(pinned=1), "pcie.pinned must be true or false"),
    ("speed check 1e308", lambda d: d.update(speed_check={k: {"median_s": 1e308 if k == "z" else 0.1}
                                                          for k in ("gemm", "memory", "z")}),
     "speed_check.z.median_s is 1e+308 s"),
    ("speed check text", lambda d: d.update(speed_check={k: {"median_s": "fast"}
                                                         for k in ("gemm", "memory", "z")}),
     "speed_check.gemm.median_s must be a number"),
]


@pytest.mark.parametrize("label,change,message", PROFILE_CASES, ids=[c[0] for c in PROFILE_CASES])
def test_a_profile_figure_out_of_range_is_refused_with_its_unit(label, change, message):
    data = _cpu()
    change(data)
    with pytest.raises(ZoError) as info:
        HardwareProfile.from_dict(data, origin="profile p.json")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert str(info.value).startswith("profile p.json: ")   # the file, then the figure


def test_every_shipped_and_fixture_profile_is_within_the_ranges():
    """Every profile this repository ships or tests with loads (its figures in range),
    as the figures its file holds."""
    paths = list(shipped_profiles().values()) + sorted(Path(__file__).parents[1].glob("fixtures/*.json"))
    assert len(paths) >= 12, paths             # 8 shipped, 4 fixtures: none skipped by a wrong glob
    for path in paths:
        profile = load_profile(path)
        stored = {k: v for k, v in load_json(path).items() if k != "max_nodes"}   # read, ignored
        assert profile.to_dict() == stored, path
    zero = _cpu()
    zero["compute"]["overhead_us"] = 0      # figures that may be 0 still may
    assert HardwareProfile.from_dict(zero).figures().compute.overhead_us == 0


# ---- model configs ----------------------------------------------------------------------------
OPT = CATALOGUE_CONFIGS["tiny-opt"]
LLAMA = CATALOGUE_CONFIGS["tiny-llama"]
CONFIG_CASES = [
    ("fractional layers", {**OPT, "num_hidden_layers": 2.7}, "num_hidden_layers must be a whole number, got 2.7"),
    ("boolean layers", {**OPT, "num_hidden_layers": True}, "num_hidden_layers must be a whole number, got True"),
    ("hidden 1e308", {**OPT, "hidden_size": 1e308}, "hidden_size must be a whole number, got 1e+308"),
    ("text layers", {**OPT, "num_hidden_layers": "four"}, "num_hidden_layers must be a whole number"),
    ("layers 1e15", {**OPT, "num_hidden_layers": 10**15}, "num_hidden_layers is 1000000000000000, outside 1..10000"),
    ("negative layers", {**LLAMA, "num_hidden_layers": -4}, "num_hidden_layers is -4, outside 1..10000"),
    ("vocab 1e13", {**OPT, "vocab_size": 10**13}, "vocab_size is 10000000000000, outside 2..16777216"),
    ("positions 1e12", {**OPT, "max_position_embeddings": 10**12}, "max_position_embeddings is"),
    ("OPT ffn 0", {**OPT, "ffn_dim": 0}, "ffn_dim is 0, outside"),
    ("Llama ffn 1e9", {**LLAMA, "intermediate_size": 10**9}, "intermediate_size is 1000000000, outside"),
    ("heads do not divide hidden", {**OPT, "hidden_size": 130},
     "hidden_size (130) is not a multiple of num_attention_heads (4)"),
    ("more heads than hidden", {**OPT, "hidden_size": 4, "num_attention_heads": 8},
     "hidden_size (4) is not a multiple of num_attention_heads (8)"),
    ("kv heads do not divide heads", {**LLAMA, "num_key_value_heads": 3},
     "num_attention_heads (4) is not a multiple of num_key_value_heads (3)"),
    ("head_dim 0", {**LLAMA, "head_dim": 0}, "head_dim is 0, outside 1..16384"),
    ("flag not a boolean", {**OPT, "tie_word_embeddings": "false"}, "tie_word_embeddings must be true or false"),
    ("missing key", {k: v for k, v in OPT.items() if k != "vocab_size"}, "config has no 'vocab_size'"),
    ("model_type a list", {**OPT, "model_type": ["opt"]}, "model_type ['opt'] is not supported"),
]


@pytest.mark.parametrize("label,config,message", CONFIG_CASES, ids=[c[0] for c in CONFIG_CASES])
def test_a_model_config_out_of_bounds_names_its_key(label, config, message):
    with pytest.raises(ZoError) as info:
        spec_from_hf_config(config, name="m")
    assert message in str(info.value) and str(info.value).startswith("model m: ")


def test_the_catalogue_and_null_optional_keys_still_load():
    assert len(catalogue()) == len(CATALOGUE_CONFIGS)
    spec = spec_from_hf_config({**LLAMA, "num_key_value_heads": None, "head_dim": None}, name="m")
    assert spec.num_kv_heads == spec.num_heads and spec.head_dim == 128 // 4


# ---- layouts and workloads ----------------------------------------------------------------------
@pytest.mark.parametrize("kwargs,message", [
    ({"ddp": "2"}, "ddp must be a whole number, got '2'"),
    ({"prefetch": 2.0}, "prefetch must be a whole number, got 2.0"),
    ({"slices": True}, "slices must be a whole number, got True"),
    ({"pertp": 3}, "pertp must be 1 or 2, got 3"),
    ({"ddp": 0}, "ddp must be >= 1, got 0"),
])
def test_layout_degrees_are_whole_numbers(kwargs, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Layout(**kwargs)


@pytest.mark.parametrize("kwargs,message", [
    ({"prefetch": 10**9}, "prefetch must be <= 1024, got 1000000000"),
    ({"ddp": 2**21}, "ddp must be <= 1048576"),
    ({"pertp": 2, "ddp": 2**20}, "= 2097152 ranks, more than 1048576"),
])
def test_layout_bounds_of_a_plan_or_trace(kwargs, message):
    layout = Layout(**kwargs)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        layout.check_bounds()


@pytest.mark.parametrize("kwargs,message", [
    ({"batch": 2.0}, "batch must be a whole number, got 2.0"),
    ({"seq": True}, "seq must be a whole number, got True"),
    ({"batch": 0}, "batch must be >= 1, got 0"),
])
def test_workload_sizes_are_whole_numbers(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Workload(**kwargs)


def test_workload_bounds_of_a_plan():
    with pytest.raises(ValueError, match="seq must be <= 16777216, got 1000000000000"):
        Workload(seq=10**12).check_bounds()


# ---- plans ------------------------------------------------------------------------------------
def _plan() -> dict:
    return make_plan_data(layout=Layout(pertp=2, ddp=2), seq=64)


def _spans(d):
    return d["predicted"]["spans"]


PLAN_CASES = [
    ("step time 1e308", lambda d: d["predicted"].update(step_time_s=1e308),
     "predicted.step_time_s: input should be less than or equal to 1000000000 (got 1e+308)"),
    ("step time 0", lambda d: d["predicted"].update(step_time_s=0), "predicted.step_time_s: input should be greater than 0"),
    ("step time text", lambda d: d["predicted"].update(step_time_s="1"), "predicted.step_time_s: input should be a valid number"),
    ("memory -1e308", lambda d: d["predicted"].update(gpu_mem_bytes=-1e308), "predicted.gpu_mem_bytes"),
    ("tokens per second text", lambda d: d["predicted"].update(tokens_per_s="many"), "predicted.tokens_per_s"),
    ("utilisation text", lambda d: d["predicted"].update(utilisation={"h2d": "high"}), "predicted.utilisation.h2d"),
    ("memory breakdown a number", lambda d: d["predicted"].update(memory=5), "predicted.memory"),
    ("span rank fraction", lambda d: _spans(d)[0].update(rank=0.5), "predicted.spans[0].rank: input should be a valid integer"),
    ("span duration 1e308", lambda d: _spans(d)[1].update(dur_s=1e308), "predicted.spans[1].dur_s"),
    ("span kind unknown", lambda d: _spans(d)[0].update(kind="nap"), "predicted.spans[0].kind"),
    ("span on the wrong lane", lambda d: _spans(d)[0].update(lane="h2d"), "span runs on lane 'compute', not 'h2d'"),
    ("span of a rank the plan has not", lambda d: _spans(d)[0].update(rank=99), "predicted.spans[0] is of rank 99"),
    ("spans not a list", lambda d: d["predicted"].update(spans=5), "predicted.spans: input should be a valid list"),
    ("candidate label a number", lambda d: d["candidates"][0].update(label=1), "candidates[0].label"),
    ("baseline a number", lambda d: d["baselines"].update(zo2=5), "baselines.zo2"),
    ("blocks a number", lambda d: d.update(blocks=4), "blocks: input should be a valid list"),
    ("model a name", lambda d: d.update(model="tiny-opt"), "model: input should be a valid dictionary"),
    ("profile of a TPU", lambda d: d["profile"].update(device_kind="tpu"), "profile.device_kind"),
    ("gpus per node text", lambda d: d["profile"].update(gpus_per_node="8"), "profile.gpus_per_node"),
    ("more ranks a node than the profile's", lambda d: d["profile"].update(gpus_per_node=2),
     "4 ranks per node, but the profile's node has 2"),
    ("layout degree text", lambda d: d["layout"].update(ddp="2"), "layout: ddp must be a whole number"),
    ("batch a float", lambda d: d["workload"].update(batch=4.0), "workload: batch must be a whole number"),
    ("seq beyond the positions", lambda d: d["workload"].update(seq=4096), "seq (4096) exceeds the 512 positions"),
    ("prefetch 1e9", lambda d: d["layout"].update(prefetch=10**9), "layout: prefetch must be <= 1024"),
    ("seq 1e12", lambda d: d["workload"].update(seq=10**12), "workload: seq must be <= 16777216"),
    ("spec hidden 1e12", lambda d: d["model"]["spec"].update(hidden=10**12), "model.spec: hidden is 1000000000000"),
    ("spec hidden fraction", lambda d: d["model"]["spec"].update(hidden=128.5), "model.spec: hidden must be a whole number"),
    ("tool a string", lambda d: d.update(tool="zoplan"), "tool: input should be a valid dictionary"),
]


@pytest.mark.parametrize("label,change,message", PLAN_CASES, ids=[c[0] for c in PLAN_CASES])
def test_a_malformed_plan_is_one_line_naming_the_field(label, change, message):
    data = _plan()
    validate_plan(copy.deepcopy(data), "plan p.json")
    change(data)
    with pytest.raises(ZoError) as info:
        validate_plan(data, "plan p.json")
    text = str(info.value)
    assert message in text and text.startswith("plan p.json: ") and "\n" not in text


def test_a_plan_that_cannot_be_written_is_one_line(tmp_path):
    plan = Plan.from_dict(_plan())
    with pytest.raises(ZoError, match="cannot write the plan to /proc/p.json"):
        plan.save("/proc/p.json")
    with pytest.raises(ZoError, match="cannot write the plan to .*: File name too long"):
        plan.save(tmp_path / ("x" * 300))


# ---- traces -----------------------------------------------------------------------------------
@pytest.fixture
def trace(tmp_path) -> Path:
    write_trace(tmp_path / "t", make_trace_spans(Layout(pertp=2, ddp=2), 4, steps=2),
                {"world_size": 4})
    return tmp_path / "t"


def _append(trace: Path, line: str, rank: int = 0) -> None:
    with open(trace / f"rank{rank}.jsonl", "a") as handle:
        handle.write(line + "\n")


SPAN = {"kind": "h2d", "rank": 0, "start_s": 0.5, "dur_s": 0.1, "block": 0, "step": 1, "lane": "h2d"}
TRACE_CASES = [
    ("meta a list", lambda t: (t / "meta.json").write_text("[]"), "trace meta"),
    ("meta world size text", lambda t: (t / "meta.json").write_text('{"schema_version": 1, "world_size": "4"}'),
     "world_size: input should be a valid integer"),
    ("meta without a version", lambda t: (t / "meta.json").write_text('{"world_size": 4}'), "schema_version: field required"),
    ("meta layout malformed", lambda t: (t / "meta.json").write_text('{"schema_version": 1, "layout": {"pertp": 5}}'),
     "layout: pertp must be 1 or 2"),
    ("meta speed check text", lambda t: (t / "meta.json").write_text(
        '{"schema_version": 1, "speed_check": [{"gemm": {"median_s": "x"}, "memory": {}, "z": {}}]}'),
     "speed_check[0].gemm.median_s"),
    ("meta speed probe 1e308", lambda t: (t / "meta.json").write_text(
        '{"schema_version": 1, "speed_probes": [{"gemm": 1e308}]}'), "speed_probes[0].gemm"),
    ("bad JSON line", lambda t: _append(t, "{oops"), "is not valid JSON"),
    ("NaN in a span", lambda t: _append(t, json.dumps(SPAN).replace("0.5", "NaN")), "NaN is not a finite number"),
    ("start 1e308", lambda t: _append(t, json.dumps({**SPAN, "start_s": 1e308})), "malformed span: start_s"),
    ("negative duration", lambda t: _append(t, json.dumps({**SPAN, "dur_s": -1})), "malformed span: dur_s"),
    ("line a list", lambda t: _append(t, "[1, 2]"), "malformed span: input should be a valid dictionary (got [1, 2])"),
    ("rank a fraction", lambda t: _append(t, json.dumps({**SPAN, "rank": 0.5})), "malformed span: rank"),
    ("unknown lane", lambda t: _append(t, json.dumps({**SPAN, "lane": "gpu"})), "malformed span: lane"),
    ("span of another rank", lambda t: _append(t, json.dumps({**SPAN, "rank": 1})), "a span of rank 1 in the file of rank 0"),
    ("binary span file", lambda t: (t / "rank0.jsonl").write_bytes(b"\xff\xfe\n"), "rank0.jsonl is not a text file"),
    ("span file a folder", lambda t: ((t / "rank3.jsonl").unlink(), (t / "rank3.jsonl").mkdir()), "rank3.jsonl is a folder, not a regular file"),
]


@pytest.mark.parametrize("label,change,message", TRACE_CASES, ids=[c[0] for c in TRACE_CASES])
def test_a_malformed_trace_is_one_line(trace, label, change, message):
    read_trace(trace)
    change(trace)
    with pytest.raises(ZoError) as info:
        read_trace(trace)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_a_trace_of_another_plan_is_refused(trace):
    plan = Plan.from_dict(make_plan_data(layout=Layout(pertp=2, ddp=2)))
    meta, spans = read_trace(trace)
    plan.check_trace(meta, spans, origin="trace t")
    late = spans + [Span(kind="h2d", rank=0, start_s=0.0, dur_s=0.1, block=7)]
    with pytest.raises(ZoError, match="trace t has spans of block 7; model tiny-opt has blocks 0-3"):
        plan.check_trace(meta, late, origin="trace t")
    with pytest.raises(ZoError, match="recorded with 8 ranks; plan has 4"):
        plan.check_trace({**meta, "world_size": 8}, spans, origin="trace t")


def test_a_diverged_loss_in_meta_is_written_as_null_and_reads_back(tmp_path):
    write_trace(tmp_path, [Span(kind="h2d", rank=0, start_s=0.0, dur_s=1.0)],
                {"records": [{"step": 0, "loss": float("nan"), "g": float("inf")}]})
    meta, _ = read_trace(tmp_path)
    assert meta["records"] == [{"step": 0, "loss": None, "g": None}]


# ---- data ------------------------------------------------------------------------------------
def _lines(path: Path, *records) -> Path:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return path


def test_text_with_a_model_folder_without_a_tokenizer_is_refused(tmp_path):
    """transformers builds an empty GPT-2 tokenizer for an OPT folder without tokenizer
    files: every text would become EOS alone."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(OPT))
    data = _lines(tmp_path / "d.jsonl", {"text": "hello world"})
    with pytest.raises(ZoError, match=r"d.jsonl:1: text data needs a tokenizer, and model folder .* has none"):
        JsonlData(data, vocab=512, tokenizer_dir=model)
    with pytest.raises(ZoError, match="text data needs a tokenizer"):
        check_data(str(data), vocab=512, batch=1, seq=1, tokenizer_dir=model)


@pytest.mark.parametrize("records,message", [
    ((), "holds no tokens"),
    (({"input_ids": list(range(10))},), "has 10 tokens, fewer than one batch of the plan (2 x 8 = 16 tokens)"),
    (({"input_ids": [1, 2]}, "{oops"), "d.jsonl:2: not valid JSON"),
    (({"input_ids": [1, float("nan")]},), "d.jsonl:1: not valid JSON (NaN is not a finite number)"),
    (({"input_ids": [1, 2.5]},), "'input_ids' must be a list of integers"),
    (({"input_ids": [1, 600]},), "token id 600 is outside the vocabulary (0..511)"),
    (({"label": 1},), "expected an object with 'text' (string) or 'input_ids'"),
])
def test_data_problems_are_found_before_the_ranks(tmp_path, records, message):
    data = _lines(tmp_path / "d.jsonl", *records)
    with pytest.raises(ZoError) as info:
        check_data(str(data), vocab=512, batch=2, seq=8)
    assert message in str(info.value)


def test_binary_data_and_enough_tokens(tmp_path):
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b'{"input_ids": [1]}\n\xff\xfe\n')
    with pytest.raises(ZoError, match="is not UTF-8 text"):
        check_data(str(binary), vocab=512, batch=1, seq=1)
    check_data(str(_lines(tmp_path / "ok.jsonl", {"input_ids": list(range(16))})), vocab=512,
               batch=2, seq=8)
    check_data("synthetic", vocab=512, batch=2, seq=8)


# ---- output folders and view bounds -------------------------------------------------------------
def test_output_folders_the_os_refuses(tmp_path):
    (tmp_path / "file").write_text("x")
    for path, message in ((tmp_path / "file" / "out", "is a file, not a folder"),
                          (tmp_path / "file", "exists and is not a directory"),
                          (Path("/proc/zoexec-out/run"), "cannot create a folder there"),
                          (tmp_path / ("x" * 300), "File name too long")):
        with pytest.raises(ZoError, match=message):
            _check_output_folder("--out", path)
    _check_output_folder("--out", tmp_path / "new" / "deeper")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]   # the check leaves nothing


class _Console:
    width = 10**8


def test_view_bounds():
    assert chart_columns(None, _Console()) == MAX_COLUMNS
    assert chart_columns(120, _Console()) == 120
    with pytest.raises(ZoError, match="--width 100000000: the chart is drawn at most 1000"):
        chart_columns(10**8, _Console())
    for top in (-1, 10**9):
        with pytest.raises(ZoError, match=f"--top {top}"):
            check_top(top)
    check_top(0)
