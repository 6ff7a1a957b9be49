"""Hidden states of a Hugging Face causal LM, captured into a data directory (see data.py).

EAGLE-3 feeds its drafter three layers of the verifier (low, middle, high), DFlash
several (five by default, spread over the depth); both train against the verifier's
next-token distribution, which the final hidden state and lm_head give. A capture layer l
is the residual stream entering decoder layer l — HF's hidden_states[l], what vLLM's and
SGLang's EAGLE-3 capture at serving time — and the default layers are EAGLE-3's
(2, n // 2, n - 3), or DFlash's five spread over the depth (--drafter dflash); --layers
captures any others, as many as wanted. The final hidden state is HF's last
hidden_states entry, after the final norm. The verifier's argmax at each position, a
by-product of the same forward, is kept too: a DFlash run trained against the verifier's
token (no soft KL) then never remakes the verifier's logits.

Prompts are batched by a token budget (padded length × rows), never by a sample count, so
one long prompt cannot OOM a batch sized for short ones. Each sample file is written
atomically and existing ones are skipped, so an interrupted extraction resumes.
"""
from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch

from training.data import (DATASET_JSON, TOKEN_COUNTS_FILE, VERIFIER_FILE, sample_path,
                           write_json_atomic, write_tensors_atomic)
from training.packing import VERIFIER_IDS


class ExtractError(Exception):
    """A problem with the inputs; `flag` names the command-line option at fault."""

    def __init__(self, flag: str, message: str):
        super().__init__(message)
        self.flag = flag


DFLASH_LAYERS = 5


def default_layers(num_layers: int, drafter: str = "eagle3") -> list[int]:
    """EAGLE-3's low, middle and high layer; for DFlash, DFLASH_LAYERS spread evenly from
    layer 1 to layer n - 3 (as EAGLE-3's highest), fewer if the verifier is too shallow
    to give that many distinct ones."""
    if drafter == "eagle3":
        return [2, num_layers // 2, num_layers - 3]
    if drafter != "dflash":
        raise ValueError(f"no default capture layers for drafter {drafter!r}")
    low, high = 1, max(1, num_layers - 3)
    if num_layers < 2:
        return [0]
    steps = DFLASH_LAYERS - 1
    return sorted({low + round(i * (high - low) / steps) for i in range(DFLASH_LAYERS)})


def check_layers(layers: list[int], num_layers: int) -> None:
    if not layers or len(set(layers)) != len(layers):
        raise ExtractError("--layers", f"need distinct capture layers, got {layers}")
    if not all(0 <= layer < num_layers for layer in layers):
        raise ExtractError("--layers",
                           f"capture layers must lie in 0..{num_layers - 1}, got {layers}")


def read_prompts(path: Path, tokenizer) -> list[tuple[list[int], list[bool]]]:
    """JSONL, one sample a line: {"input_ids": [...], "loss_mask": [...] (optional)},
    {"text": "..."} (all tokens bear loss) or {"prompt": "...", "completion": "..."} (only
    the completion bears loss). Text needs the model's tokenizer."""
    samples = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise ExtractError("--prompts", f"{path}:{number}: not JSON ({exc})") from None
        if "input_ids" in record:
            ids = [int(t) for t in record["input_ids"]]
            mask = [bool(m) for m in record.get("loss_mask", [True] * len(ids))]
        elif tokenizer is None:
            raise ExtractError("--prompts", f"{path}:{number}: text prompts need a model "
                               "with a tokenizer; give input_ids instead")
        elif "text" in record:
            ids = tokenizer(record["text"])["input_ids"]
            mask = [True] * len(ids)
        elif "prompt" in record and "completion" in record:
            head = tokenizer(record["prompt"])["input_ids"]
            tail = tokenizer(record["completion"], add_special_tokens=False)["input_ids"]
            ids, mask = head + tail, [False] * len(head) + [True] * len(tail)
        else:
            raise ExtractError("--prompts", f"{path}:{number}: expected input_ids, text, "
                               "or prompt and completion")
        if not ids or len(mask) != len(ids):
            raise ExtractError("--prompts", f"{path}:{number}: empty sample or loss_mask "
                               "of the wrong length")
        samples.append((ids, mask))
    if not samples:
        raise ExtractError("--prompts", f"{path} holds no samples")
    return samples


def load_model(spec: str):
    """(model, tokenizer or None): a model directory or hub id, or a config.json, which
    makes a randomly initialised model (seed 0) — for tests and dry runs."""
    # A hub id is `name` or `owner/name`: anything else is a path, and one that is not
    # there is said as such (the hub's loader would call it a malformed repo id).
    if not Path(spec).exists() and (spec.startswith(("/", ".", "~")) or spec.count("/") > 1 or spec.endswith(".json")):
        raise ExtractError("--model", f"no such {'file' if spec.endswith('.json') else 'directory'}: {spec}")
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    path = Path(spec)
    cuda = torch.cuda.is_available()
    if path.is_file() and path.suffix == ".json":
        config = AutoConfig.for_model(**json.loads(path.read_text()))
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_config(config)
        if cuda:
            model = model.to("cuda", torch.bfloat16)
        return model.eval(), None
    try:
        model = AutoModelForCausalLM.from_pretrained(
            spec, dtype=torch.bfloat16 if cuda else torch.float32,
            device_map="auto" if cuda else None)
    except (OSError, ValueError) as exc:
        raise ExtractError("--model", f"cannot load {spec}: {exc}") from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(spec)
    except (OSError, ValueError):
        tokenizer = None
    return model.eval(), tokenizer


def token_budget_batches(lengths: list[int], max_tokens: int) -> list[list[int]]:
    """Indices grouped so that rows × longest row ≤ max_tokens (a longer sample alone)."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    batches: list[list[int]] = []
    for i in order:
        if batches and (len(batches[-1]) + 1) * lengths[batches[-1][0]] <= max_tokens:
            batches[-1].append(i)
        else:
            batches.append([i])
    return batches


@torch.no_grad()
def extract(model, samples: list[tuple[list[int], list[bool]]], out: Path,
            layers: list[int] | None = None, max_tokens_per_batch: int = 16384,
            log=None, drafter: str = "eagle3") -> dict:
    """Write the data directory for `samples`; returns its dataset.json content."""
    log = log or (lambda line: print(line, file=sys.stdout, flush=True))
    config = model.config
    num_layers, hidden, vocab = (config.num_hidden_layers, config.hidden_size,
                                 config.vocab_size)
    layers = default_layers(num_layers, drafter) if layers is None else list(layers)
    check_layers(layers, num_layers)
    out.mkdir(parents=True, exist_ok=True)
    if not (out / VERIFIER_FILE).exists():
        write_tensors_atomic(out / VERIFIER_FILE, {
            "embed_tokens": model.get_input_embeddings().weight.detach().cpu(),
            "lm_head": model.get_output_embeddings().weight.detach().cpu()})

    lengths = [len(ids) for ids, _ in samples]
    todo = [i for i in range(len(samples)) if not sample_path(out, i).exists()]
    device = model.get_input_embeddings().weight.device
    done, fresh, tokens, started = len(samples) - len(todo), 0, 0, time.monotonic()
    log(f"extract: {done}/{len(samples)} (resumed)" if done else f"extract: 0/{len(samples)}")
    for batch in token_budget_batches([lengths[i] for i in todo], max_tokens_per_batch):
        indices = [todo[b] for b in batch]
        width = max(lengths[i] for i in indices)
        input_ids = torch.zeros(len(indices), width, dtype=torch.long)
        attention = torch.zeros(len(indices), width, dtype=torch.long)
        for row, i in enumerate(indices):
            input_ids[row, :lengths[i]] = torch.tensor(samples[i][0])
            attention[row, :lengths[i]] = 1
        forward = model(input_ids=input_ids.to(device), attention_mask=attention.to(device),
                        output_hidden_states=True, use_cache=False)
        states, verifier_ids = forward.hidden_states, forward.logits.argmax(-1).cpu()
        for row, i in enumerate(indices):
            n = lengths[i]
            write_tensors_atomic(sample_path(out, i), {
                "input_ids": input_ids[row, :n].clone(),
                "loss_mask": torch.tensor(samples[i][1], dtype=torch.bool),
                "aux_hidden": torch.cat([states[layer][row, :n].cpu() for layer in layers],
                                        dim=-1),
                "final_hidden": states[-1][row, :n].cpu().clone(),
                VERIFIER_IDS: verifier_ids[row, :n].clone()})
        done, fresh = done + len(indices), fresh + len(indices)
        tokens += sum(lengths[i] for i in indices)
        elapsed = max(time.monotonic() - started, 1e-9)
        log(f"extract: {done}/{len(samples)} [{fresh / elapsed:.1f} samples/s, "
            f"{tokens / elapsed:.0f} tok/s]")

    counts = torch.zeros(vocab, dtype=torch.long)
    for ids, mask in samples:
        loss_bearing = torch.tensor(ids)[torch.tensor(mask, dtype=torch.bool)]
        counts += torch.bincount(loss_bearing, minlength=vocab)
    write_tensors_atomic(out / TOKEN_COUNTS_FILE, {"counts": counts})
    info = {"hidden_size": hidden, "vocab_size": vocab, "num_layers": num_layers,
            "layers": layers, "dtype": str(model.get_input_embeddings().weight.dtype)
            .removeprefix("torch."), "num_samples": len(samples), "lengths": lengths,
            "total_tokens": sum(lengths), "model": getattr(config, "_name_or_path", "")}
    write_json_atomic(out / DATASET_JSON, info)
    return info


def run(model_spec: str, prompts: Path, out: Path, layers: list[int] | None,
        max_tokens_per_batch: int, drafter: str = "eagle3") -> dict:
    if not prompts.is_file():
        raise ExtractError("--prompts", f"no such file: {prompts}")
    model, tokenizer = load_model(model_spec)
    if layers is not None:
        check_layers(layers, model.config.num_hidden_layers)
    return extract(model, read_prompts(prompts, tokenizer), out, layers, max_tokens_per_batch,
                   drafter=drafter)
