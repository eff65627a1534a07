"""The README's smoke command, run as written (issue 31, item 2): read from README.md, run by a
shell in a folder holding the shipped experiments, with the real plugins and backend (the tiny
model on the CPU) and ``STAR_ENGINE_DATA`` pointing at a small CommonsenseQA fixture laid out as
the data root. Every stage runs: evaluation, generation, rationalization, the filters, training
(on the gold answers, since the tiny model keeps nothing: said so) and evaluation again; the
few-shot prompt is longer than the tiny model's context, and that is said too."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq

from star_testkit import REPO

CQA = REPO / "plugins" / "cqa" / "tests" / "data" / "train_sample.jsonl"  # 3 questions with answer keys


def readme_smoke_command() -> str:
    readme = (REPO / "README.md").read_text()
    m = re.search(r"Any experiment runs as a CPU smoke test.*?```sh\n(.*?)```", readme, re.DOTALL)
    assert m, "README.md: no smoke command after 'Any experiment runs as a CPU smoke test'"
    lines = [line for line in m.group(1).splitlines() if line.strip()]
    assert len(lines) == 1, lines
    return lines[0]


def test_the_readme_smoke_command_is_a_smoke_run():
    command = readme_smoke_command()
    assert command.startswith("star-engine run experiments/") and command.endswith(" --smoke")


def test_the_readme_smoke_command_runs_every_stage(tmp_path):
    command = readme_smoke_command()
    shutil.copytree(REPO / "experiments", tmp_path / "experiments")
    data = tmp_path / "data"
    (data / "commonsenseqa").mkdir(parents=True)
    for name in ("train_rand_split.jsonl", "dev_rand_split.jsonl"):
        shutil.copy(CQA, data / "commonsenseqa" / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith("STAR_ENGINE_")}
    env.update({"STAR_ENGINE_DATA": str(data), "PATH": os.pathsep.join([str(Path(sys.executable).parent),
                                                                        env.get("PATH", "")])})
    res = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert res.returncode == 0, res.stderr[-3000:]
    name = re.search(r"experiments/(\w+)\.toml", command).group(1)
    run = tmp_path / "runs" / f"{name}_smoke"
    cfg = json.loads((run / "config.json").read_text())
    assert cfg["experiment"]["smoke"] and cfg["task"]["data_root"] == str(data.resolve())
    assert cfg["task"]["data"]["train"] == str(data.resolve() / "commonsenseqa/train_rand_split.jsonl")
    backend = json.loads((run / "manifest.json").read_text())["backend"]
    assert backend["model"]["n_layer"] == 2 and backend["model"]["d_model"] == 128  # the tiny preset
    assert backend["tokenizer"]["kind"] == "byte" and backend["checkpoint_path"] == ""
    it = run / "iterations" / "001"
    for stage in ("generated", "rationalized", "rationales"):  # generation, rationalization, the filters
        assert pq.read_table(it / f"{stage}.parquet").num_rows > 0, stage
    train = json.loads((it / "train.json").read_text())
    assert 1 <= train["steps"] <= 4 and (it / "model").is_dir()  # the training stage ran
    for n in (0, 1):
        assert pq.read_table(run / f"iterations/{n:03d}/eval_dev.parquet").num_rows == 3
    metrics = pq.read_table(run / "metrics.parquet").to_pylist()
    row = next(m for m in metrics if (m["iteration"], m["split"], m["class"]) == (1, "train", "all"))
    assert row["train_steps"] == train["steps"]
    events = [json.loads(x) for x in (run / "events.jsonl").read_text().splitlines()]
    if row["kept"] == 0:  # the tiny random model: trained on the gold answers instead, and said so
        assert row["trained_on"] == "gold_fallback" and (it / "smoke_gold.parquet").is_file()
        assert any(e["event"] == "smoke_gold_fallback" and e["level"] == "warning" for e in events)
        assert "gold" in res.stdout + res.stderr  # the summary says what was trained on
    else:
        assert row["trained_on"] == "kept"
    # CQA's few-shot prompt (~2,200 bytes) does not fit the tiny model's 512 - 96: every prompt is cut.
    assert row["prompts_truncated"] == row["generated"] == 3
    cut = [e for e in events if e["event"] == "prompts_truncated"]
    assert {e["stage"] for e in cut} == {"evaluate dev", "generate", "rationalize"}
    assert all(e["capacity"] == 512 - 96 and e["level"] == "warning" for e in cut)
