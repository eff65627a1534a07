"""The HF transformers side of ``star_workload.py --peer``, served from a child
process (``star_workload.py --hf-serve``): for each mix, a random
``GPTJForCausalLM`` of the mix's shape and four timed calls.

- ``static:<mix>``: greedy ``generate`` on length-sorted batches of the mix's
  batch size, left-padded, each batch running to its longest budget
  (``min_new_tokens``, no end-of-text): what a user writes by hand.
- ``continuous:<mix>``: the continuous-batching manager (``init_continuous_batching``,
  one request per prompt with its own ``max_new_tokens``), only when it gives the
  same tokens as ``generate`` for this model (checked at start; see "info").
- ``padded:<mix>``: an AdamW loop over the padded plan's steps, each batch
  right-padded to its longest example, labels -100 on prompts and padding.
- ``packed:<mix>``: the packed plan's steps, each flattened into one row with
  ``position_ids`` restarting per example and no attention mask, from which
  transformers builds a block-diagonal causal mask (checked at start against the
  padded loss of the same examples).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from bench_common import serve, timed_reply
from hf_peer import adamw_step, hf_model


def _shape(mix: dict) -> SimpleNamespace:
    m = mix["model"]
    return SimpleNamespace(dtype="float32", vocab=m["vocab"], d_model=m["d_model"], layers=m["n_layer"],
                           heads=m["n_head"], rotary_dim=m["rotary_dim"], d_ff=m["d_ff"])


def static_generation(model, prompts, budgets, batch: int, pad: int):
    """``run()``: every prompt through ``generate`` in length-sorted batches."""
    import torch

    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    batches = []
    for s in range(0, len(order), batch):
        group = order[s:s + batch]
        T = max(len(prompts[i]) for i in group)
        ids = torch.full((len(group), T), pad, dtype=torch.long)
        mask = torch.zeros((len(group), T), dtype=torch.long)
        for r, i in enumerate(group):
            ids[r, T - len(prompts[i]):] = torch.tensor(prompts[i])
            mask[r, T - len(prompts[i]):] = 1
        batches.append((ids, mask, max(budgets[i] for i in group)))

    def run():
        with torch.inference_mode():
            for ids, mask, n in batches:
                out = model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=n, min_new_tokens=n,
                                     pad_token_id=pad, eos_token_id=None, use_cache=True)
                assert out.shape[1] == ids.shape[1] + n

    return run


def continuous_generation(model, prompts, budgets):
    """``run()`` through transformers' continuous-batching manager, one request per prompt."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, max_new_tokens=max(budgets), eos_token_id=-1)

    def run() -> list[list[int]]:
        manager = model.init_continuous_batching(generation_config=config)
        manager.start()
        try:
            ids = [manager.add_request(p, max_new_tokens=b) for p, b in zip(prompts, budgets)]
            done: dict[str, list[int]] = {}  # request id -> its tokens
            while len(done) < len(ids):
                r = manager.get_result(timeout=60)
                if r is None:
                    raise RuntimeError("continuous batching produced no result within 60 s")
                if r.is_finished():
                    done[r.request_id] = list(r.generated_tokens)
        finally:
            manager.stop(block=True)
        return [done[i] for i in ids]

    return run


def continuous_supported(model, pad: int) -> str:
    """"" when continuous batching gives ``generate``'s greedy tokens, else why not."""
    import torch

    prompts, n = [[5, 6, 7, 8, 9], [11, 12, 13]], 12
    try:
        got = continuous_generation(model, prompts, [n, n])()
    except Exception as exc:  # an unsupported model may fail anywhere inside transformers
        return f"failed: {type(exc).__name__}: {str(exc)[:200]}"
    with torch.inference_mode():
        want = [model.generate(torch.tensor([p]), do_sample=False, max_new_tokens=n, min_new_tokens=n, pad_token_id=pad,
                               eos_token_id=None)[0, len(p):].tolist() for p in prompts]
    if got != want:
        return (f"wrong tokens for {type(model).__name__} (attention implementation "
                f"{model.config._attn_implementation!r}: continuous batching needs the AttentionInterface)")
    return ""


def _examples(mix, step):
    return [(mix["train"][i][0], mix["train"][i][1] + [mix["eos"]]) for i in step]


def padded_batch(mix, step):
    """input_ids, attention_mask, labels (B, longest) of one step, right-padded."""
    import torch

    ex = _examples(mix, step)
    T = max(len(p) + len(c) for p, c in ex)
    ids = torch.full((len(ex), T), mix["pad"], dtype=torch.long)
    mask = torch.zeros((len(ex), T), dtype=torch.long)
    labels = torch.full((len(ex), T), -100, dtype=torch.long)
    for r, (p, c) in enumerate(ex):
        ids[r, :len(p) + len(c)] = torch.tensor(p + c)
        mask[r, :len(p) + len(c)] = 1
        labels[r, len(p):len(p) + len(c)] = torch.tensor(c)
    return {"input_ids": ids, "attention_mask": mask, "labels": labels}


def packed_batch(mix, step):
    """input_ids, position_ids, labels (1, total) of one step: the examples one
    after another, positions restarting at 0, no label on any example's first token."""
    import torch

    ids, pos, labels = [], [], []
    for p, c in _examples(mix, step):
        ids += p + c
        pos += list(range(len(p) + len(c)))
        labels += [-100] * len(p) + c
        labels[len(labels) - len(p) - len(c)] = -100
    as_row = lambda x: torch.tensor([x], dtype=torch.long)
    return {"input_ids": as_row(ids), "position_ids": as_row(pos), "labels": as_row(labels)}


def serve_workload(mixes: dict, a) -> None:
    """Child process: build every mix's model and calls, then answer requests."""
    import torch
    import transformers

    info: dict[str, Any] = {"torch": torch.__version__, "transformers": transformers.__version__, "hf_threads": None}
    calls = {"info": lambda: info}
    for name, mix in mixes.items():
        model = hf_model(_shape(mix), mix["model"]["n_ctx"])
        info["hf_threads"] = torch.get_num_threads()
        info["hf_attn_implementation"] = model.config._attn_implementation
        calls[f"static:{name}"] = timed_reply(static_generation(model, mix["prompts"], mix["budgets"], mix["slots"],
                                                                mix["pad"]))
        why = continuous_supported(model, mix["pad"])
        info[f"hf_{name}_continuous_supported"] = not why
        if why:
            info[f"hf_{name}_continuous_unsupported"] = why
        else:
            calls[f"continuous:{name}"] = timed_reply(continuous_generation(model, mix["prompts"], mix["budgets"]))
        step_fn = adamw_step(model)
        first = mix["plans"]["segments"][0]
        with torch.no_grad():  # the flattened row trains on exactly the padded batch's loss
            a_loss = float(model(**padded_batch(mix, first)).loss)
            b_loss = float(model(**packed_batch(mix, first)).loss)
        info[f"hf_{name}_packed_loss_matches_padded"] = abs(a_loss - b_loss) <= 1e-4 * abs(a_loss)
        for kind, make in (("padded", padded_batch), ("packed", packed_batch)):
            batches = [make(mix, s) for s in mix["plans"]["none" if kind == "padded" else "segments"]]
            step_fn(**batches[0])  # warm-up

            def run(batches=batches):
                for b in batches:
                    step_fn(**b)  # noqa: B023

            calls[f"{kind}:{name}"] = timed_reply(run)
    serve(calls)
