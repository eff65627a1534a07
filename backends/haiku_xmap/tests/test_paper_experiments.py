"""The paper-exact experiments (``experiments/cqa_paper.toml``, ``gsm8k_paper.toml``) as CPU
smoke runs with the tiny model swapped in by one ``--set`` (README.md): on small fixtures in
the formats of the real files, and, when ../shared/data is there, on the real data and the
original prompt files. Each run checks, end to end, what makes the file paper-exact: the
prompt is the prompt file's bytes + "\\n\\n" + the question, the stored rationale is what the
original stored, the GSM8K hint is the whole gold solution. Also: the files' settings against
the original's configs/qa_base.json (docs/fidelity.md)."""

from __future__ import annotations

import hashlib
import json
import tomllib
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from star_testkit import SHARED_DATA, STAR_PROMPTS

from star_cqa import CQATask
from star_cqa.task import mark_choice
from star_engine.cli import main
from star_engine.config.registry import option_defaults
from star_gsm8k import GSM8KTask
from star_haiku_xmap.plugin import HaikuXmapBackend

DEFAULT_MODEL = {"backend": "haiku_xmap", **option_defaults(HaikuXmapBackend)}  # config.json's [model], nothing set

ROOT = Path(__file__).resolve().parents[3]
EXPERIMENTS = ROOT / "experiments"
TINY = ["--set", 'model={backend = "haiku_xmap"}']  # the whole [model] table: tiny preset, byte tokenizer
FIXTURES = {  # data file, folder of prompt files in the original's format (written for this project)
    "cqa_paper.toml": (ROOT / "plugins/cqa/tests/data/train_sample.jsonl", ROOT / "plugins/cqa/tests/data/star_format"),
    "gsm8k_paper.toml": (ROOT / "plugins/gsm8k/tests/data/train_sample.jsonl",
                         ROOT / "plugins/gsm8k/tests/data/star_format"),
}
REAL = {
    "cqa_paper.toml": ({"train": SHARED_DATA / "commonsenseqa/train_rand_split.jsonl",
                        "dev": SHARED_DATA / "commonsenseqa/dev_rand_split.jsonl"}, STAR_PROMPTS / "commonsenseqa"),
    "gsm8k_paper.toml": ({"train": SHARED_DATA / "gsm8k/train.jsonl", "test": SHARED_DATA / "gsm8k/test.jsonl"},
                         STAR_PROMPTS / "gsm"),
}
real = pytest.mark.skipif(not STAR_PROMPTS.is_dir(), reason="shared/data is absent")


def paper(name: str) -> dict:
    return tomllib.loads((EXPERIMENTS / name).read_text())


def short_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def smoke(name: str, data: dict[str, Path], prompts: Path, run: Path, *extra: str) -> Path:
    """Run a paper file for one iteration with the tiny model, its data and prompt files
    (same file names) taken from elsewhere."""
    cfg = paper(name)
    sets = [*TINY, "--set", "experiment.iterations=1", "--set", f'experiment.output_dir="{run}"',
            "--set", "task.data={" + ", ".join(f'{k} = "{v}"' for k, v in data.items()) + "}"]
    for key, value in cfg["task"]["options"].items():
        if key.endswith("_file"):
            sets += ["--set", f'task.options.{key}="{prompts / Path(value).name}"']
    assert main(["run", str(EXPERIMENTS / name), "--limit", "8", "--quiet", *sets, *extra]) == 0
    return run


def rows(run: Path, rel: str) -> list[dict]:
    return pq.read_table(run / rel).to_pylist()


def check_cqa_run(run: Path, data: dict[str, Path], prompts: Path) -> None:
    task = CQATask(verbatim=True)
    train = {e.id: e for e in task.load("train", str(data["train"]))}
    prefix = (prompts / "prompts.txt").read_text() + "\n\n"
    hinted_prefix = (prompts / "prompts_answer_key.txt").read_text() + "\n\n"
    generated = rows(run, "iterations/001/generated.parquet")
    assert len(generated) == min(8, len(train))
    for r in generated:  # the prompt, byte for byte; the stored rationale: one line
        assert r["prompt_hash"] == short_hash(prefix + task.context(train[r["question_id"]]))
        assert "\n" not in r["rationale"] and r["checker"] == "exact_lower"
    hinted = rows(run, "iterations/001/rationalized.parquet")
    assert hinted
    for r in hinted:  # prompted with the hint file and " (CORRECT)"; stored hint-free, one line
        ex = train[r["question_id"]]
        assert r["prompt_hash"] == short_hash(hinted_prefix + mark_choice(task.context(ex), ex.answer))
        assert r["prompt"] == task.context(ex) and "\n" not in r["rationale"]
    evals = rows(run, "iterations/001/eval_dev.parquet")
    assert evals and all("\n" not in r["generation"] for r in evals)


def check_gsm_run(run: Path, data: dict[str, Path], prompts: Path) -> None:
    task = GSM8KTask(verbatim=True, gold_answer="raw")
    train = {e.id: e for e in task.load("train", str(data["train"]))}
    prefix = (prompts / "prompts.txt").read_text() + "\n\n"
    hinted_prefix = (prompts / "prompts_answer_key.txt").read_text() + "\n\n"
    generated = rows(run, "iterations/001/generated.parquet")
    hinted = rows(run, "iterations/001/rationalized.parquet")
    assert generated and hinted
    for r in generated:
        ex = train[r["question_id"]]
        assert r["prompt_hash"] == short_hash(prefix + task.context(ex)) and r["gold"] == ex.answer
    for r in hinted:  # the released code's hint: the whole gold solution after the question
        ex = train[r["question_id"]]
        hint = f"Q: {ex.question} ({ex.fields['solution']})\nA:"
        assert r["prompt_hash"] == short_hash(hinted_prefix + hint) and r["prompt"] == task.context(ex)
    for r in generated + hinted:  # stored: the lines up to the first "####" line, or all when none
        lines = r["rationale"].split("\n")
        marked = [i for i, line in enumerate(lines) if "####" in line]
        assert marked in ([], [len(lines) - 1]), r["rationale"]
    if data["train"] == FIXTURES["gsm8k_paper.toml"][0]:
        assert "1,350" in {r["gold"] for r in generated}  # the raw gold, comma kept


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_paper_files_smoke_run_on_fixtures(name, tmp_path):
    path, prompts = FIXTURES[name]
    splits = {"train": path, ("dev" if name == "cqa_paper.toml" else "test"): path}
    run = smoke(name, splits, prompts, tmp_path / "run")
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["training"]["packing"] == "stream" and cfg["training"]["loss"] == "all"
    assert cfg["experiment"]["iterations"] == 1 and cfg["model"] == DEFAULT_MODEL  # the backend's defaults
    (check_cqa_run if name == "cqa_paper.toml" else check_gsm_run)(run, splits, prompts)


def test_gsm8k_paper_trains_packed_on_every_token(tmp_path):
    """The tiny random model gets nothing right, so a smoke run trains nothing; fine-tuning
    on the gold solutions instead runs the paper file's training settings (stream packing,
    loss on every token, 1 x 8 sequences a step). The 3 fixture problems make ~440 byte
    tokens: sequences of 32 (+ 1) give 13 of them, enough for full steps."""
    path, prompts = FIXTURES["gsm8k_paper.toml"]
    run = smoke("gsm8k_paper.toml", {"train": path, "test": path}, prompts, tmp_path / "run",
                "--set", 'model={backend = "haiku_xmap", seq_len = 32}', "--set", 'training.source="gold"',
                "--set", 'task.hint=""',  # no rationalization on gold: the file's hint would have no effect
                "--set", 'training.schedule={name = "exponential_grow", start_steps = 2, grow = 1.2}')
    info = json.loads((run / "iterations/001/train.json").read_text())
    assert info["steps"] == 2 and len(info["losses"]) == 2
    assert info["tokens"] == 2 * 8 * 32  # 8 sequences a step, every token carrying loss


@pytest.mark.real_data
@real
@pytest.mark.parametrize("name", sorted(REAL))
def test_paper_files_smoke_run_on_the_real_data(name, tmp_path):
    data, prompts = REAL[name]
    run = smoke(name, data, prompts, tmp_path / "run")
    (check_cqa_run if name == "cqa_paper.toml" else check_gsm_run)(run, data, prompts)


def test_paper_files_are_the_original_loop():
    for name in sorted(REAL):
        cfg = paper(name)
        exp, task, gen, rat, tr, ev = (cfg[k] for k in ("experiment", "task", "generation", "rationalization",
                                                         "training", "evaluation"))
        assert (exp["iterations"], exp["early_stop_patience"]) == (63, 0), name
        assert task["filters"] == [] and task["checker"] == "exact_lower" and not task["few_shot_train"], name
        opts = task["options"]
        assert (opts["verbatim"], opts["extraction"], opts["stored_completion"]) == (True, "original", "original")
        assert task["data_root"] == "../../shared/data", name  # the data beside the clone, or STAR_ENGINE_DATA
        assert all(v.startswith("star-prompts/") for k, v in opts.items() if k.endswith("_file"))
        assert (gen["max_new_tokens"], gen["temperature"], gen["top_p"], gen["batch_size"]) == (96, 0.01, 0.9, 8)
        assert (ev["temperature"], ev["top_p"], ev["no_prompt"]) == (0.01, 0.9, False), name
        assert gen["n_train_samples"] == 10000 and rat == {"enabled": True, "p_rationalization": 1.0,
                                                           "p_show_hint_save": 0.0}, name
        assert tr["schedule"] == {"name": "exponential_grow", "start_steps": 40, "grow": 1.2}, name
        assert tr["restart_from_base"] and (tr["packing"], tr["loss"]) == ("stream", "all"), name
        m = cfg["model"]
        assert m["preset"] == "gptj-6b" and m["mesh"] == {"dp": 1, "mp": 8} and m["dtype"] == "bfloat16", name
        assert (m["master_dtype"], m["grad_accum_dtype"]) == ("float32", "bfloat16"), name
    assert paper("gsm8k_paper.toml")["task"]["hint"] == {"name": "gsm8k_answer", "template": "({solution})"}
    assert paper("gsm8k_paper.toml")["task"]["options"]["gold_answer"] == "raw"


@pytest.mark.real_data
@real
def test_paper_files_follow_qa_base_json():
    base = json.loads((STAR_PROMPTS / "qa_base.json").read_text())
    for name in sorted(REAL):
        cfg = paper(name)
        tr, opt, m = cfg["training"], cfg["training"]["optimizer"], cfg["model"]
        replicas = base["tpu_size"] // base["cores_per_replica"]
        assert tr["batch_size"] == base["per_replica_batch"] * replicas, name
        assert tr["grad_accum"] == base["gradient_accumulation_steps"], name
        assert m["seq_len"] == base["seq"] and m["mesh"] == {"dp": replicas, "mp": base["cores_per_replica"]}, name
        assert (opt["lr"], opt["end_lr"], opt["warmup_steps"], opt["weight_decay"]) == (
            base["lr"], base["end_lr"], base["warmup_steps"], base["weight_decay"]), name
        assert opt["schedule"] == "constant" and base["lr"] == base["end_lr"], name  # gpt3_schedule with lr == end_lr
    assert {p.name for p in STAR_PROMPTS.iterdir()} == {"LICENSE.txt", "qa_base.json", "commonsenseqa", "gsm"}
