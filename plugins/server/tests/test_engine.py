"""``ServerEngine`` (``[generation] engine = "server"``) against the fake server: options refused
in one line naming the key, each checkpoint exported, hashed, recorded and served by name, a
server that does not serve the version asked for refused, texts cut as the backend's sampler
cuts them, ``n`` grouping, LoRA adapters loaded by name (vLLM), provenance."""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

from star_engine import GenRequest, GenSpec, UserError
from star_server import ServerEngine, ServerOptions, cut_at_stop, folder_sha256

sys.path.insert(0, str(Path(__file__).parent))
from fake_openai_server import FakeServer, State  # noqa: E402

SPEC = GenSpec(max_new_tokens=16, temperature=0.0, top_p=1.0, stop=("#",), batch_size=4)


class ExportingBackend:
    """A test double of a backend's export side: a checkpoint is a folder with ``weights.txt``;
    ``export_hf`` copies it with a config; ``fit_prompt`` keeps the last ``capacity`` characters."""

    def __init__(self, capacity: int = 1000, adapters: dict[str, str] | None = None):
        self.capacity = capacity
        self.adapters = adapters or {}  # adapter checkpoint -> its base checkpoint
        self.exports: list[tuple[str, str]] = []

    def checkpoint_id(self, checkpoint: str) -> str:
        return hashlib.sha256((Path(checkpoint) / "weights.txt").read_bytes()).hexdigest()

    def export_hf(self, checkpoint: str, dest: Path) -> dict:
        dest.mkdir()
        (dest / "model.safetensors").write_bytes((Path(checkpoint) / "weights.txt").read_bytes())
        (dest / "generation_config.json").write_text(json.dumps({"eos_token_id": 256, "suppress_tokens": [257]}))
        self.exports.append(("hf", checkpoint))
        return {"files": ["model.safetensors"]}

    def adapter_base(self, checkpoint: str) -> str | None:
        return self.adapters.get(checkpoint)

    def export_adapter(self, checkpoint: str, dest: Path, base_name: str) -> dict:
        dest.mkdir()
        (dest / "adapter_model.safetensors").write_bytes((Path(checkpoint) / "weights.txt").read_bytes())
        (dest / "adapter_config.json").write_text(json.dumps({"base_model_name_or_path": base_name}))
        self.exports.append(("adapter", checkpoint))
        return {"files": ["adapter_model.safetensors"]}

    def fit_prompt(self, prompt: str, spec: GenSpec) -> str:
        return prompt[-self.capacity:]


def checkpoint(tmp_path: Path, name: str, weights: str) -> str:
    path = tmp_path / "ck" / name
    path.mkdir(parents=True)
    (path / "weights.txt").write_text(weights)
    return str(path)


def engine(tmp_path: Path, backend: ExportingBackend, **options) -> ServerEngine:
    e = ServerEngine(ServerOptions(**{"retries": 0, "backoff_seconds": 0.0, **options}))
    e.start(tmp_path / "run", backend)
    return e


@pytest.mark.parametrize("options, key, match", [
    ({}, "generation.server", "either url .* or command"),
    ({"url": "http://x:1", "command": "serve {model} {port}"}, "generation.server", "not both"),
    ({"command": "serve --port {port}"}, "generation.server.command", "no {model} placeholder"),
    ({"url": "ftp://host:21"}, "generation.server.url", "not an http"),
    ({"url": "http://localhost:8000", "load": "restart"}, "generation.server.load", "needs a command"),
    ({"url": "http://localhost:8000", "extra_body": {"seed": 3}}, "generation.server.extra_body", "sets seed"),
])
def test_bad_options_are_one_line_naming_the_key(options, key, match):
    with pytest.raises(UserError, match=match) as e:
        ServerEngine(ServerOptions(**options))
    assert e.value.key == key and "\n" not in str(e.value)


def test_a_backend_without_an_export_is_refused_before_the_run():
    e = ServerEngine(ServerOptions(url="http://localhost:8000"))
    with pytest.raises(UserError, match="no export_hf") as err:
        e.validate(object())
    assert err.value.key == "generation.engine"
    adapters = ServerEngine(ServerOptions(command="serve {model} --port {port}", load="load_lora_adapter"))

    class WholeOnly:
        def export_hf(self, checkpoint, dest):
            raise AssertionError

    with pytest.raises(UserError, match="does not export adapters"):
        adapters.validate(WholeOnly())


def test_cut_at_stop_cuts_before_the_earliest_stop():
    assert cut_at_stop("a\nQ: b#c", ("#", "\nQ:")) == "a"
    assert cut_at_stop("abc", ("", "z")) == "abc"


def test_each_checkpoint_is_exported_hashed_loaded_and_named_in_every_request(tmp_path):
    backend = ExportingBackend(capacity=5)
    ck1, ck2 = checkpoint(tmp_path, "one", "w1"), checkpoint(tmp_path, "two", "w2")
    with FakeServer(State("nothing-yet")) as fake:
        e = engine(tmp_path, backend, url=fake.url, load="load_model", kind="transformers")
        texts = e.generate(ck1, [GenRequest("a long prompt", 11), GenRequest("p2", 12)], SPEC)
        served = json.loads((tmp_path / "run" / "served" / "served.json").read_text())
        (name1, rec1), = served.items()
        folder1 = str(tmp_path / "run" / "served" / name1)
        assert rec1["sha256"] == folder_sha256(Path(folder1)) and rec1["checkpoint"] == ck1
        # the prompt as the backend cuts it, the text cut at the stop string the fake's text holds
        assert texts == ["rompt", "p2"]
        # the two requests go concurrently: the server may see them in either order
        assert sorted((b["prompt"], b["seed"]) for b in fake.state.bodies) == [("p2", 12), ("rompt", 11)]
        assert all(b["model"] == folder1 for b in fake.state.bodies)
        gen = json.loads(fake.state.bodies[0]["generation_config"])  # transformers serve samples only so
        assert gen["do_sample"] is False and gen["top_k"] == 0 and gen["suppress_tokens"] == [257]
        assert e.provenance() == (rec1["sha256"], f"{fake.url} {folder1}")
        assert fake.state.calls == [("/load_model", {"model": folder1})]
        e.generate(ck1, [GenRequest("p3", 13)], SPEC)  # the same version: not loaded, exported or hashed again
        assert len(fake.state.calls) == 1 and len(backend.exports) == 1
        e.generate(ck2, [GenRequest("p4", 14)], SPEC)
        folder2 = fake.state.calls[-1][1]["model"]
        assert folder2 != folder1 and fake.state.bodies[-1]["model"] == folder2
        assert not Path(folder1).exists()  # the export served before is removed (keep_exports = false)
        e.close()


def test_a_reused_export_whose_bytes_changed_is_written_again(tmp_path):
    backend = ExportingBackend()
    ck = checkpoint(tmp_path, "one", "w1")
    with FakeServer(State("x")) as fake:
        e = engine(tmp_path, backend, url=fake.url, load="load_model")
        e.generate(ck, [GenRequest("p", 1)], SPEC)
        folder = Path(fake.state.calls[-1][1]["model"])
        (folder / "model.safetensors").write_text("tampered")
        e.close()
        e2 = engine(tmp_path, backend, url=fake.url, load="load_model")
        e2.generate(ck, [GenRequest("p", 1)], SPEC)
        assert (folder / "model.safetensors").read_text() == "w1" and len(backend.exports) == 2


def test_a_server_that_does_not_list_the_version_is_refused(tmp_path):
    with FakeServer(State("/some/other/model")) as fake:
        e = engine(tmp_path, ExportingBackend(), url=fake.url, load="none")
        with pytest.raises(UserError, match="does not serve model version .*refusing to sample from other weights"):
            e.generate(checkpoint(tmp_path, "one", "w1"), [GenRequest("p", 1)], SPEC)
        assert fake.state.bodies == []  # nothing was sampled


def test_consecutive_samples_of_one_prompt_go_as_one_request_with_n(tmp_path):
    with FakeServer(State("x")) as fake:
        e = engine(tmp_path, ExportingBackend(), url=fake.url, load="load_model", kind="vllm")
        reqs = [GenRequest("q1", 1), GenRequest("q1", 2), GenRequest("q2", 3), GenRequest("q1", 4)]
        texts = e.generate(checkpoint(tmp_path, "one", "w1"), reqs, SPEC)
        sent = sorted((b["prompt"], b["n"], b["seed"]) for b in fake.state.bodies)  # concurrent: any order
        assert sent == [("q1", 1, 4), ("q1", 2, 1), ("q2", 1, 3)]
        assert texts == ["q1", "q1", "q2", "q1"] and "generation_config" not in fake.state.bodies[0]


def test_lora_checkpoints_are_served_as_adapters_over_the_served_base(tmp_path):
    base = checkpoint(tmp_path, "base", "b")
    a1, a2 = checkpoint(tmp_path, "a1", "lora1"), checkpoint(tmp_path, "a2", "lora2")
    backend = ExportingBackend(adapters={a1: base, a2: base})
    with FakeServer(State("x")) as fake:
        e = engine(tmp_path, backend, url=fake.url, load="load_lora_adapter")
        assert e.load == "none"  # a url's whole model is served as it is
        fake.state.model = str(tmp_path / "run" / "served" / backend.checkpoint_id(base)[:16])
        e.generate(base, [GenRequest("p", 1)], SPEC)  # the base itself: the whole model, by its folder
        e.generate(a1, [GenRequest("p", 2)], SPEC)
        path, body = fake.state.calls[-1]
        assert path == "/v1/load_lora_adapter" and body["lora_name"].startswith("star-")
        adapter_config = json.loads((Path(body["lora_path"]) / "adapter_config.json").read_text())
        assert adapter_config["base_model_name_or_path"] == fake.state.model
        assert fake.state.bodies[-1]["model"] == body["lora_name"]
        sha = json.loads((tmp_path / "run" / "served" / "served.json").read_text())[
            Path(body["lora_path"]).name]["sha256"]
        assert e.provenance()[0] == sha and body["lora_name"] == f"star-{sha[:16]}"
        e.generate(a2, [GenRequest("p", 3)], SPEC)
        assert [p for p, _ in fake.state.calls] == ["/v1/load_lora_adapter", "/v1/load_lora_adapter",
                                                    "/v1/unload_lora_adapter"]
        assert fake.state.loras == [fake.state.calls[1][1]["lora_name"]]
        assert backend.exports.count(("hf", base)) == 1  # the base exported once


def test_a_url_that_does_not_answer_is_refused_before_the_run(tmp_path):
    e = ServerEngine(ServerOptions(url="http://127.0.0.1:9", retries=0, timeout_seconds=0.5,
                                   startup_timeout_seconds=0.2))
    with pytest.raises(UserError, match=r"generation.server.url: http://127.0.0.1:9 did not answer GET /v1/models "
                                        r"within 0.2 s") as err:
        e.validate(ExportingBackend())
    assert err.value.key == "generation.server.url" and "\n" not in str(err.value)
