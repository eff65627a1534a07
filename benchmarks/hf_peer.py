"""The HF transformers side of ``gptj_throughput.py --peer``: ``GPTJForCausalLM``
(``LlamaForCausalLM`` for ``--arch llama``; torch, CPU) at the benchmark's shapes, dtype and thread count, served from a
child process (``gptj_throughput.py --hf-serve``, so that it gets the same malloc
settings) one timed call per request (``bench_common.serve``), so the two runtimes'
thread pools never compete and JAX and HF calls can alternate."""

from __future__ import annotations

from bench_common import first_call, matmul_peak, serve, threads, timed_reply


def hf_model(a, n_positions: int):
    """A random ``GPTJForCausalLM`` (``LlamaForCausalLM``) of the benchmark's shape
    in eval mode (no dropout), with torch set to the benchmark's thread count."""
    import torch
    from transformers import GPTJConfig, GPTJForCausalLM

    torch.set_num_threads(threads())
    torch.manual_seed(0)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[a.dtype]
    if getattr(a, "arch", "gptj") == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        cfg = LlamaConfig(vocab_size=a.vocab, hidden_size=a.d_model, intermediate_size=a.d_ff,
                          num_hidden_layers=a.layers, num_attention_heads=a.heads, num_key_value_heads=a.kv_heads,
                          max_position_embeddings=n_positions, attention_dropout=0.0, tie_word_embeddings=False)
        return LlamaForCausalLM(cfg).to(dtype).eval()  # type: ignore[arg-type]  # .to(dtype): torch's
    gcfg = GPTJConfig(vocab_size=a.vocab, n_positions=n_positions, n_embd=a.d_model, n_layer=a.layers,
                     n_head=a.heads, rotary_dim=a.rotary_dim, n_inner=a.d_ff, resid_pdrop=0.0, embd_pdrop=0.0,
                     attn_pdrop=0.0, tie_word_embeddings=False)
    return GPTJForCausalLM(gcfg).to(dtype).eval()  # type: ignore[arg-type]


def adamw_step(model, lr: float = 1e-4):
    """``step(**batch) -> loss``: forward with labels, backward, clip to norm 1, AdamW."""
    import torch

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)

    def step(**batch):
        model.train()
        loss = model(**batch).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        model.eval()
        return float(loss)

    return step


def hf_workloads(a) -> tuple[dict, object, object]:
    """(info, generate(), train_step()) for HF GPTJForCausalLM, warmed up."""
    import numpy as np
    import torch

    model = hf_model(a, max(a.prompt + a.new_tokens, a.train_seq))
    rng = np.random.default_rng(0)
    prompt = torch.from_numpy(rng.integers(0, a.vocab, (a.gen_batch, a.prompt))).long()
    attn = torch.ones_like(prompt)

    def gen():  # greedy, KV cache, no autograd
        with torch.inference_mode():
            o = model.generate(prompt, attention_mask=attn, do_sample=False, max_new_tokens=a.new_tokens,
                                   min_new_tokens=a.new_tokens, pad_token_id=0, eos_token_id=None, use_cache=True)
        assert o.shape == (a.gen_batch, a.prompt + a.new_tokens)

    ids = torch.from_numpy(rng.integers(0, a.vocab, (a.train_batch, a.train_seq))).long()
    adamw = adamw_step(model)

    def step():
        return adamw(input_ids=ids, labels=ids)

    info = {"hf_generate_first_call_s": round(first_call(gen), 3),
            "hf_train_first_call_s": round(first_call(step), 3), "torch": torch.__version__, "transformers": __import__("transformers").__version__,
            "hf_threads": torch.get_num_threads(), "hf_attn_implementation": model.config._attn_implementation}
    return info, gen, step


def hf_serve(a) -> None:
    """Child process: answer "gen", "train" (one timed call), "peak" and "info"."""
    info, gen, step = hf_workloads(a)
    serve({"info": lambda: info, "peak": lambda: {"peaks": matmul_peak(a.dtype, ("torch",))},
           "gen": timed_reply(gen), "train": timed_reply(step)})
