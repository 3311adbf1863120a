"""Models by Hub id from the local cache (zoplan.hubcache): a fake cache built here
resolves as huggingface_hub resolves it offline; HF_HUB_CACHE and HF_HOME pick the
cache; a model the cache lacks is one line saying where it looked; zoplan's --model
takes an id too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from zoplan.errors import ZoError
from zoplan.hubcache import hub_cache, is_repo_id, model_folder
from zoplan.models import get_model

CONFIG = {"model_type": "opt", "num_hidden_layers": 2, "hidden_size": 64, "ffn_dim": 256,
          "num_attention_heads": 4, "vocab_size": 128, "max_position_embeddings": 64,
          "word_embed_proj_dim": 64, "do_layer_norm_before": True}


def fake_cache(cache: Path, repo_id: str = "org/tiny", commit: str = "0123abcd") -> Path:
    """A Hub cache holding `repo_id` at main (config.json only)."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text(commit)
    snapshot = repo / "snapshots" / commit
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text(json.dumps(CONFIG))
    return snapshot


def test_an_id_resolves_as_huggingface_hub_does_offline(tmp_path, monkeypatch):
    snapshot = fake_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    assert model_folder("org/tiny") == snapshot
    hub = pytest.importorskip("huggingface_hub")
    assert Path(hub.snapshot_download("org/tiny", local_files_only=True,
                                      cache_dir=str(tmp_path / "hub"))) == snapshot


def test_the_cache_is_chosen_as_huggingface_hub_chooses_it(tmp_path, monkeypatch):
    for name in ("HF_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hub_cache() == tmp_path / ".cache" / "huggingface" / "hub"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert hub_cache() == tmp_path / "hf" / "hub"
    snapshot = fake_cache(tmp_path / "hf" / "hub")
    assert model_folder("org/tiny") == snapshot
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "elsewhere"))
    assert hub_cache() == tmp_path / "elsewhere"


def test_a_folder_is_taken_as_it_is_and_a_missing_model_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    (tmp_path / "org" / "tiny").mkdir(parents=True)   # a folder of that name wins
    assert model_folder("org/tiny") == Path("org/tiny")
    with pytest.raises(ZoError) as err:
        model_folder("HuggingFaceTB/SmolLM2-135M")
    text = str(err.value)
    assert "\n" not in text and str(tmp_path / "hub" / "models--HuggingFaceTB--SmolLM2-135M") in text
    assert "nothing is downloaded" in text
    assert not is_repo_id("runs/x/final") and not is_repo_id("../m") and is_repo_id("gpt2")


def test_zoplan_plans_a_cached_model_by_id(tmp_path, monkeypatch):
    fake_cache(tmp_path / "hub")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hub"))
    spec = get_model("org/tiny")
    assert spec.num_layers == 2 and spec.hidden == 64
    with pytest.raises(ZoError, match="models--org--other"):
        get_model("org/other")
    with pytest.raises(ZoError, match="not in the catalogue"):   # a name: the catalogue's line
        get_model("opt-13x")
