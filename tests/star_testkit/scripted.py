"""A test-only plugin: a toy task and a *scripted* backend (no neural network).

The scripted model answers a question right when it was trained on it, or when
the question's id is "easy" (hash-based), or when the prompt carries a hint;
otherwise it answers wrong. Some hinted answers leak the hint text, so the
hint-leak filter has something to catch. Checkpoints are folders holding
``model.json`` (what was learned, from which init, for how many steps), written
atomically. ``SCRIPTED_KILL=<event>:<n>`` SIGKILLs the process at the n-th such
event, to test resume; ``SCRIPTED_SLEEP=<seconds>`` makes every generation that slow.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import re
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

from star_engine import hookimpl
from star_engine.api import Example, TrainExample, TrainResult, TuningChoice, Verdict
from star_engine.errors import UserError
from star_engine.config.schema import above, at_least, between
from star_engine.config.settings import Section
from star_engine.rundir.fsio import atomic_write_bytes

_counts: dict[str, int] = {}
LIFECYCLE: list[tuple[str, str]] = []
"""What the core asked of a scripted backend in this process, in order: ``("start", "")``
(``Backend.start``) and ``("recorded", checkpoint)`` (``Backend.checkpoint_recorded``)."""


def maybe_kill(event: str) -> None:
    spec = os.environ.get("SCRIPTED_KILL", "")
    if not spec:
        return
    want, _, n = spec.partition(":")
    if want != event:
        return
    _counts[event] = _counts.get(event, 0) + 1
    if _counts[event] >= int(n or 1):
        os.kill(os.getpid(), signal.SIGKILL)


def _h(text: str) -> int:
    return int(hashlib.sha256(text.encode()).hexdigest()[:8], 16)


class ToyTask:
    """Sums of two numbers; class = number of digits of the larger operand."""

    default_checker = "toy_exact"
    default_hint = "toy_hint"
    stop = ("\n\n",)

    def __init__(self, n_train: int = 24, n_dev: int = 12, seed: int = 0):
        self.n = {"train": n_train, "dev": n_dev}
        self.seed = seed

    def load(self, split: str, path: str | None) -> list[Example]:
        if path is not None:  # the toy task reads "a+b" lines when given a file
            out = []
            for i, line in enumerate(Path(path).read_text().splitlines(), 1):
                m = re.fullmatch(r"(\d+)\+(\d+)", line.strip())
                if not m:
                    raise UserError(f"{path}:{i}: expected 'a+b'")
                a, b = int(m.group(1)), int(m.group(2))
                out.append(Example(f"{split}-{i}", f"{a}+{b}", str(a + b), str(len(str(max(a, b))))))
            return out
        rng = random.Random(f"{self.seed}-{split}")
        out = []
        for i in range(self.n[split]):
            d = 1 + i % 3
            a, b = rng.randrange(10 ** (d - 1), 10**d), rng.randrange(0, 10 ** (d - 1) + 1)
            out.append(Example(f"{split}-{i}", f"{a}+{b}", str(a + b), str(d)))
        return out

    def context(self, ex: Example) -> str:
        return f"Q: {ex.question}\nA:"

    def prompt(self, kind: str) -> str:
        return {"rationale": "Q: 1+1\nA: one plus one. The answer is 2.\n\n",
                "direct": "Q: 1+1\nA: The answer is 2.\n\n",
                "hint": "Q: 1+1 (hint: 2)\nA: one plus one. The answer is 2.\n\n",
                "direct_hint": "Q: 1+1 (hint: 2)\nA: The answer is 2.\n\n"}[kind]

    def extract(self, generation: str) -> str | None:
        m = re.search(r"answer is (-?\d+)", generation)
        return m.group(1) if m else None

    def gold_completion(self, ex: Example, direct: bool) -> str:
        return f" The answer is {ex.answer}." if direct else f" add them. The answer is {ex.answer}."

    def seed_examples(self) -> list[TrainExample]:
        return [TrainExample("Q: 2+2\nA:", " two and two. The answer is 4.")]


class ToyTrimTask(ToyTask):
    """The toy task with the optional ``trim``: only the text before ``at`` counts."""

    def __init__(self, at: str = ".", n_train: int = 24, n_dev: int = 12, seed: int = 0):
        super().__init__(n_train, n_dev, seed)
        self.at = at

    def trim(self, generation: str) -> str:
        return generation.split(self.at)[0]


class ToyExact:
    def __init__(self, strip: bool = True):
        self.strip = strip

    def check(self, generation: str, extracted: str | None, gold: str) -> Verdict:
        return Verdict(extracted, extracted is not None and extracted.strip() == gold.strip())


class ToyHint:
    def context(self, task, ex: Example) -> str:
        return f"Q: {ex.question} (hint: {ex.answer})\nA:"

    def leak_strings(self, task, ex: Example) -> tuple[str, ...]:
        return (f"(hint: {ex.answer})",)


class ToyLeakFilter:
    def keep(self, candidates, history):
        return [not any(s in c.rationale for s in c.leak_strings) for c in candidates]


class ToyLinear:
    def __init__(self, per_iteration: int = 3):
        self.k = per_iteration

    def steps(self, iteration: int, n_examples: int, batch_size: int, grad_accum: int) -> int:
        return self.k * iteration if n_examples else 0


@dataclass(frozen=True)
class ToyOptimizer(Section):
    """The scripted backend's optimizer table (it trains nothing with it): the core checks and
    completes ``[*.optimizer]`` by it, as by a real backend's. ``b1`` may be 1 here, for
    ``validate_run`` to refuse."""

    lr: Annotated[float, above(0)] = 1e-6
    warmup_steps: Annotated[int, at_least(0)] = 100
    schedule: Literal["constant", "linear", "cosine"] = "constant"
    b1: Annotated[float, between(0, 1)] = 0.9


class ScriptedBackend:
    """``max_tokens`` (0 = none) is a context length: ``generate`` refuses longer generations,
    and ``validate_run`` refuses them before the run starts."""

    optimizer_table = ToyOptimizer

    def __init__(self, easy_mod: int = 3, leak_mod: int = 2, max_tokens: int = 0):
        self.easy_mod, self.leak_mod, self.max_tokens = easy_mod, leak_mod, max_tokens

    def _check(self, key: str, spec) -> None:
        if self.max_tokens and spec.max_new_tokens > self.max_tokens:
            raise UserError(f"{key}.max_new_tokens: {spec.max_new_tokens} is more than the scripted model's "
                            f"{self.max_tokens} tokens", key=f"{key}.max_new_tokens")

    def validate_run(self, generation, training):
        for key, spec in generation.items():
            self._check(key, spec)
        for key, spec in training.items():
            if (spec.optimizer.b1 if isinstance(spec.optimizer, ToyOptimizer) else spec.optimizer.get("b1", 0.0)) >= 1:
                raise UserError(f"{key}.optimizer.b1: must be < 1", key=f"{key}.optimizer.b1")

    def start(self) -> None:
        LIFECYCLE.append(("start", ""))

    def matmul_gflops(self) -> float:
        """SCRIPTED_GFLOPS: the speed this machine is said to have (unset: 0, not measured)."""
        return float(os.environ.get("SCRIPTED_GFLOPS", "0"))

    def checkpoint_recorded(self, checkpoint: str) -> None:
        """Refuses a call before the stage's record exists (the contract the real backend's
        training snapshots rely on)."""
        if not (Path(checkpoint).parent / "train.json").is_file():
            raise RuntimeError(f"checkpoint_recorded({checkpoint}) before its stage's train.json")
        LIFECYCLE.append(("recorded", checkpoint))

    def _write(self, out: Path, model: dict) -> None:
        tmp = out.with_name(f".tmp-{out.name}")
        tmp.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(tmp / "model.json", json.dumps(model, sort_keys=True).encode())
        maybe_kill("checkpoint")
        os.replace(tmp, out)

    def base(self, workdir: Path, seed: int) -> str:
        out = workdir / "init"
        if not (out / "model.json").exists():
            self._write(out, {"learned": {}, "steps": 0, "lineage": ["init"], "seed": seed})
        return str(out)

    def checkpoint_id(self, checkpoint: str) -> str:
        path = Path(checkpoint) / "model.json"
        if not path.exists():
            raise UserError(f"{checkpoint}: no checkpoint")
        return hashlib.sha256(path.read_bytes()).hexdigest()

    def _load(self, checkpoint: str) -> dict:
        return json.loads((Path(checkpoint) / "model.json").read_text())

    def train(self, init, out, examples, spec, progress=None):
        model = self._load(init)
        learned = dict(model["learned"])
        for i in range(spec.steps):  # noqa: B007
            maybe_kill("train_step")
            if progress:
                progress(1)
        for ex in examples:
            learned[ex.prompt] = ex.completion
        new = {"learned": learned, "steps": spec.steps, "lineage": model["lineage"] + [self.checkpoint_id(init)[:8]],
               "seed": spec.seed, "n_examples": len(examples), "packing": spec.packing, "loss": spec.loss}
        self._write(Path(out), new)
        losses = tuple(round(1.0 / (i + 1), 6) for i in range(spec.steps))
        return TrainResult(str(out), self.checkpoint_id(str(out)), spec.steps,
                           sum(len(e.completion) for e in examples), losses)

    def generate(self, checkpoint, requests, spec, progress=None):
        self._check("generation", spec)
        model = self._load(checkpoint)
        out = []
        for req in requests:
            maybe_kill("generate")
            time.sleep(float(os.environ.get("SCRIPTED_SLEEP", 0)))  # a slow model (tests of concurrent runs)
            # The question is the last "Q: " block of the prompt (after any few-shot examples).
            ctx = req.prompt[req.prompt.rfind("Q: "):]
            q = re.match(r"Q: (\d+)\+(\d+)( \(hint: (\d+)\))?", ctx)
            a, b, hint = int(q.group(1)), int(q.group(2)), q.group(4)
            rng = random.Random(req.seed)
            if ctx in model["learned"]:
                text = model["learned"][ctx]
            elif hint is not None:
                leak = _h(ctx) % self.leak_mod == 0
                text = f" {a} plus {b}{' (hint: ' + hint + ')' if leak else ''}. The answer is {hint}."
            elif _h(f"{a}+{b}") % self.easy_mod == 0:
                text = f" {a} plus {b}. The answer is {a + b}."
            else:
                text = f" {a} plus {b}. The answer is {a + b + rng.randrange(1, 9)}."
            for s in spec.stop:
                text = text.split(s)[0]
            out.append(text)
            if progress:
                progress(1)
        return out

    def describe(self):
        return {"backend": "scripted", "easy_mod": self.easy_mod}


class ScriptedVerifierBackend(ScriptedBackend):
    """The scripted backend that also trains verifiers (``Backend.train_preferences``, ``score``):
    a verifier trained on at least one pair "knows" arithmetic: it scores an answer's text
    (``... a plus b. The answer is c.``) 1 above the reference's score when c = a + b. Every
    model scores a text -0.01 per character (its log-likelihood)."""

    def train_preferences(self, init, out, pairs, spec, progress=None):
        model = self._load(init)
        for _ in range(spec.steps):
            maybe_kill("train_step")
            if progress:
                progress(1)
        new = {**model, "verifier": bool(pairs) and spec.steps > 0, "pairs": [[p.prompt, p.chosen, p.rejected]
                                                                             for p in pairs],
               "beta": spec.beta, "seed": spec.seed, "lineage": model["lineage"] + [self.checkpoint_id(init)[:8]]}
        self._write(Path(out), new)
        losses = tuple(round(0.69 / (i + 1), 6) for i in range(spec.steps))
        return TrainResult(str(out), self.checkpoint_id(str(out)), spec.steps,
                           sum(len(p.chosen) + len(p.rejected) for p in pairs), losses)

    def generate(self, checkpoint, requests, spec, progress=None):
        """As the scripted model, but sampling (temperature > 0) a wrong answer is made right one
        time in three (by the request's seed): a question's samples differ, as a verifier needs."""
        out = super().generate(checkpoint, requests, spec, progress)
        if spec.temperature == 0:
            return out
        fixed = []
        for req, text in zip(requests, out):
            m = re.search(r"(\d+) plus (\d+)\. The answer is (\d+)", text)
            if m and random.Random(req.seed ^ 0x5EED).random() < 1 / 3:
                text = text.replace(f"is {m.group(3)}", f"is {int(m.group(1)) + int(m.group(2))}")
            fixed.append(text)
        return fixed

    def score(self, checkpoint, examples, batch_size, progress=None):
        model = self._load(checkpoint)
        out = []
        for ex in examples:
            m = re.search(r"(\d+) plus (\d+)\. The answer is (\d+)", ex.completion)
            right = bool(m) and int(m.group(1)) + int(m.group(2)) == int(m.group(3))
            out.append(-0.01 * len(ex.completion) + (1.0 if model.get("verifier") and right else 0.0))
            if progress:
                progress(1)
        return out


class ScriptedContextBackend(ScriptedBackend):
    """The scripted backend with a context of ``context`` characters (``Backend.prompt_capacity``:
    the context less ``max_new_tokens``; ``count_tokens``: characters): what is longer counts as
    cut (the scripted model still reads the whole prompt)."""

    def __init__(self, context: int = 64, easy_mod: int = 3, leak_mod: int = 2):
        super().__init__(easy_mod, leak_mod)
        self.context = context

    def prompt_capacity(self, spec) -> int:
        return max(0, self.context - spec.max_new_tokens)

    def count_tokens(self, texts):
        return [len(t) for t in texts]


@hookimpl
def register_tasks(register):
    register("toy", ToyTask)
    register("toy_trim", ToyTrimTask)


@hookimpl
def register_checkers(register):
    register("toy_exact", ToyExact)


@hookimpl
def register_hint_formatters(register):
    register("toy_hint", ToyHint)


@hookimpl
def register_filters(register):
    register("toy_leak", ToyLeakFilter)


@hookimpl
def register_schedules(register):
    register("toy_linear", ToyLinear)


class ToyTuner:
    """Probes the first drawn question (or ``ask``, an id it names) twice at ``temperature`` and
    chooses it: a third-party tuner, registered through ``register_tuners``."""

    def __init__(self, temperature: float = 0.5, ask: str = ""):
        self.temperature, self.ask = temperature, ask

    def tune(self, iteration, questions, probe, seed):
        answers = probe(self.temperature, [self.ask or questions[0].id], 2)
        return TuningChoice(self.temperature, [{"temperature": self.temperature,
                                                "score": sum(a.correct for a in answers[0])}])


@hookimpl
def register_tuners(register):
    register("toy_tuner", ToyTuner)


@hookimpl
def register_backends(register):
    register("scripted", ScriptedBackend)
    register("scripted_ctx", ScriptedContextBackend)
    register("scripted_verifier", ScriptedVerifierBackend)


class ScriptedEngine:
    """A generation engine (``[generation] engine``) over the run's own backend: its texts are the
    backend's; ``provenance`` names the checkpoint's id; ``start``, ``generate`` and ``close`` are
    logged to ``RUN_DIR/engine.log``; the environment's ``SCRIPTED_ENGINE_FAIL_AT`` (1-based)
    makes that ``generate`` call of the process fail, as a server that stops answering."""

    def __init__(self, tag: str = "scripted-engine"):
        self.fail_at, self.tag = int(os.environ.get("SCRIPTED_ENGINE_FAIL_AT", "0")), tag
        self.calls, self.log, self.backend, self.last = 0, None, None, ("", "")

    def _note(self, line: str) -> None:
        with open(self.log, "a") as f:
            f.write(line + "\n")

    def start(self, run_dir, backend):
        self.log, self.backend = Path(run_dir) / "engine.log", backend
        self._note("start")

    def generate(self, checkpoint, requests, spec, progress=None):
        self.calls += 1
        self._note(f"generate {len(requests)}")
        if self.calls == self.fail_at:
            raise UserError(f"server {self.tag}: HTTP 503: overloaded")
        self.last = (f"v-{self.backend.checkpoint_id(checkpoint)[:12]}", self.tag)
        return self.backend.generate(checkpoint, requests, spec, progress)

    def provenance(self):
        return self.last

    def close(self):
        self._note("close")


@hookimpl
def register_engines(register):
    register("scripted_engine", ScriptedEngine)
