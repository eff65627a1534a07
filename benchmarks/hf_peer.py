"""The HF transformers side of ``gptj_throughput.py --peer``: ``GPTJForCausalLM``
(torch, CPU) at the benchmark's shapes, dtype and thread count, served from a
child process (``gptj_throughput.py --hf-serve``, so that it gets the same malloc
settings) one timed call per request, so the two runtimes' thread pools never
compete and JAX and HF calls can alternate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from gptj_throughput import _first_call, _timed, matmul_peak, threads

SCRIPT = Path(__file__).resolve().with_name("gptj_throughput.py")


def hf_workloads(a) -> tuple[dict, object, object]:
    """(info, generate(), train_step()) for HF GPTJForCausalLM, warmed up."""
    import numpy as np
    import torch
    from transformers import GPTJConfig, GPTJForCausalLM

    torch.set_num_threads(threads())
    torch.manual_seed(0)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[a.dtype]
    cfg = GPTJConfig(vocab_size=a.vocab, n_positions=max(a.prompt + a.new_tokens, a.train_seq), n_embd=a.d_model,
                     n_layer=a.layers, n_head=a.heads, rotary_dim=a.rotary_dim, n_inner=a.d_ff,
                     resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False)
    model = GPTJForCausalLM(cfg).to(dtype).eval()
    rng = np.random.default_rng(0)
    prompt = torch.from_numpy(rng.integers(0, a.vocab, (a.gen_batch, a.prompt))).long()
    attn = torch.ones_like(prompt)

    def gen():  # greedy, KV cache, no autograd
        with torch.inference_mode():
            o = model.generate(prompt, attention_mask=attn, do_sample=False, max_new_tokens=a.new_tokens,
                                   min_new_tokens=a.new_tokens, pad_token_id=0, eos_token_id=None, use_cache=True)
        assert o.shape == (a.gen_batch, a.prompt + a.new_tokens)

    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.0)
    ids = torch.from_numpy(rng.integers(0, a.vocab, (a.train_batch, a.train_seq))).long()

    def step():
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.eval()
        return float(loss)

    info = {"hf_generate_first_call_s": round(_first_call(gen), 3),
            "hf_train_first_call_s": round(_first_call(step), 3), "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "hf_threads": torch.get_num_threads(), "hf_attn_implementation": model.config._attn_implementation}
    return info, gen, step


def hf_serve(a) -> None:
    """Child process: answer one timed call per request line ("gen", "train", "peak", "info")."""
    info, gen, step = hf_workloads(a)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "info":
            reply = info
        elif cmd == "peak":
            reply = {"peaks": matmul_peak(a.dtype, ("torch",))}
        elif cmd in ("gen", "train"):
            reply = dict(zip(("s", "cpu"), _timed(gen if cmd == "gen" else step)))
        else:
            break
        print(json.dumps(reply), flush=True)


class HFPeer:
    """An HF child process, driven one call at a time."""

    def __init__(self, argv: list[str], wait_policy: str):
        cmd = [sys.executable, str(SCRIPT), "--hf-serve"] + [x for x in argv if x != "--peer"]
        env = dict(os.environ)
        if wait_policy == "passive":
            env["OMP_WAIT_POLICY"] = "PASSIVE"
        self.wait_policy = wait_policy
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)

    def ready(self) -> "HFPeer":
        self._read()  # {"ready": true} once the model is built and warmed up
        return self

    def _read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise SystemExit(f"HF peer died (exit code {self.proc.wait()})")
        return json.loads(line)

    def ask(self, cmd: str) -> dict:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def choose_peers(peers: list[HFPeer]) -> dict[str, HFPeer]:
    """The faster peer per workload, from one probe call of each (the HF side
    gets its best OpenMP wait policy for the load of the moment)."""
    if len(peers) == 1:
        return {"gen": peers[0], "train": peers[0]}
    chosen = {}
    for cmd in ("gen", "train"):
        chosen[cmd] = min(peers, key=lambda p: p.ask(cmd)["s"])
    for p in peers:
        if p not in chosen.values():
            p.close()
    return chosen
